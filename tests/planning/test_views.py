"""Pages and decisions over HTTP: login everywhere, roles on the server, clear errors that change nothing."""

from __future__ import annotations

import pytest
from django.test import Client
from django.urls import reverse

from planning.models import Plan, PlanEvent, PlanStep
from runtime.cycle import agent_cycle
from tests.factories import AgentFactory, GoalFactory, NeedFactory, PlanFactory, PlanStepFactory

pytestmark = pytest.mark.django_db


@pytest.mark.parametrize("name", ["dashboard", "agent-detail", "plan-detail"])
def test_pages_require_login(name: str) -> None:
    plan = PlanFactory()
    args = [] if name == "dashboard" else [plan.agent.pk if name == "agent-detail" else plan.pk]
    response = Client().get(reverse(name, args=args))
    assert response.status_code == 302
    assert response["Location"].startswith("/accounts/login/")


def test_login_page_has_labelled_fields() -> None:
    response = Client().get("/accounts/login/")
    assert response.status_code == 200
    assert b"Username" in response.content and b"Password" in response.content


def test_dashboard_lists_agents_with_plan_and_escapes_names(viewer_client: Client) -> None:
    plan = PlanFactory(agent__name="<script>alert(1)</script>", goal__description="Get food")
    PlanStepFactory(plan=plan, description="Find work", status=PlanStep.Status.COMPLETED)
    PlanStepFactory(plan=plan, description="Buy <b>bread</b>", status=PlanStep.Status.RUNNING)
    html = viewer_client.get("/").content.decode()
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html and "<script>alert(1)" not in html
    assert "Get food" in html
    assert "Buy &lt;b&gt;bread&lt;/b&gt;" in html
    assert "1/2 steps" in html


def test_plan_page_step_rows_escape_every_text_and_show_decisions_to_operators_only(
        operator_client: Client, viewer_client: Client) -> None:
    hostile = '<img src=x onerror="alert(1)">'
    shown = "&lt;img src=x onerror=&quot;alert(1)&quot;&gt;"
    plan = PlanFactory(status=Plan.Status.ACTIVE)
    PlanStepFactory(plan=plan, key='k"1', position=1, description=hostile, tool="file.read",
                    tool_input={"path": hostile}, expected_outcome=hostile, depends_on=["<b>0</b>"],
                    tools_needed=["file.read", hostile], status=PlanStep.Status.FAILED, result=hostile * 60,
                    error=hostile, failure_reason=hostile, retries=1, elapsed_ms=12)
    waiting = PlanStepFactory(plan=plan, key="<2>", position=2, description="Wait", precheck=hostile,
                              action_hint=hostile, status=PlanStep.Status.AWAITING_APPROVAL, risk=PlanStep.Risk.RISKY)
    page = operator_client.get(plan.get_absolute_url()).content.decode()
    assert "<img" not in page and "<b>0</b>" not in page
    steps = page[page.index('id="plan-step-list"'):page.index("</ol>", page.index('id="plan-step-list"'))]
    assert '<li id="step-k&quot;1" class="step status-failed"' in steps
    assert f'<b class="desc">{shown}</b>' in steps and f"· expects: {shown}" in steps
    # The input as an operator approves it (key=value, written content previewed; issue 50), escaped.
    assert f'input <code>path=&quot;{shown.replace("&quot;", "\\&quot;")}&quot;</code>' in steps
    assert '· after <a href="#step-&lt;b&gt;0&lt;/b&gt;">&lt;b&gt;0&lt;/b&gt;</a>' in steps
    assert f"· tools needed: file.read, {shown}" in steps and "· retries 1/2 · took 12 ms" in steps
    assert steps.count(f"→ {shown}") == 1 and "…</div>" in steps  # a long result cut at 400 characters
    assert f'✗ {shown}' in steps and f'<div class="error small">{shown}</div>' in steps
    assert f"Pre-check: {shown}" in steps and f"action <code>{shown}</code>" in steps
    assert '<span class="tag warn">risky</span>' in steps
    approve = f'hx-post="/steps/{waiting.pk}/approve/"'
    assert approve in steps and 'hx-confirm="Skip step &lt;2&gt;?"' in steps
    viewed = viewer_client.get(plan.get_absolute_url()).content.decode()
    assert f'<b class="desc">{shown}</b>' in viewed and approve not in viewed and "Skip step" not in viewed


def test_dashboard_query_count_does_not_grow_with_agents(viewer_client: Client, django_assert_max_num_queries) -> None:  # type: ignore[no-untyped-def]
    for _ in range(3):
        plan = PlanFactory()
        PlanStepFactory.create_batch(3, plan=plan)
        NeedFactory.create_batch(2, agent=plan.agent)
    # Session, user, Django's has_perm (the user's own and its groups' permissions), the page's reads (the failing
    # agents' candidates among them, read apart from the counts: selectors.failing_agent_ids).
    with django_assert_max_num_queries(14) as small:
        viewer_client.get("/")
    for _ in range(20):
        plan = PlanFactory()
        PlanStepFactory.create_batch(3, plan=plan)
        NeedFactory.create_batch(2, agent=plan.agent)
    with django_assert_max_num_queries(len(small.captured_queries)):
        viewer_client.get("/")


def test_plan_page_shows_decisions_to_operators_only(operator_client: Client, viewer_client: Client) -> None:
    step = PlanStepFactory(status=PlanStep.Status.AWAITING_APPROVAL, requires_permission=True)
    url = reverse("plan-detail", args=[step.plan.pk])
    operator_html = operator_client.get(url).content.decode()
    viewer_html = viewer_client.get(url).content.decode()
    for label in (">Approve<", ">Decline<", ">Feedback<"):
        assert label in operator_html
        assert label not in viewer_html


def test_viewer_decision_is_forbidden_and_changes_nothing(viewer_client: Client) -> None:
    step = PlanStepFactory(status=PlanStep.Status.AWAITING_APPROVAL)
    for url, data in [(reverse("step-approve", args=[step.pk]), {}),
                      (reverse("step-decline", args=[step.pk]), {"feedback": "no"}),
                      (reverse("plan-cancel", args=[step.plan.pk]), {}),
                      (reverse("agent-status", args=[step.plan.agent.pk]), {"status": "paused"})]:
        assert viewer_client.post(url, data).status_code == 403
    step.refresh_from_db()
    assert step.status == PlanStep.Status.AWAITING_APPROVAL
    assert PlanEvent.objects.count() == 0


def test_operator_approves_step_over_htmx_and_sees_it(operator_client: Client) -> None:
    step = PlanStepFactory(status=PlanStep.Status.AWAITING_APPROVAL, description="Buy food", plan__agent__name="Ann",
                           plan__goal_text="Have a meal")
    response = operator_client.post(reverse("step-approve", args=[step.pk]), HTTP_HX_REQUEST="true")
    assert response.status_code == 200
    assert (f'<p class="flash success" role="status">Approved step {step.key} of Ann&#x27;s plan “Have a meal” (v1).</p>'
            in response.content.decode())
    step.refresh_from_db()
    assert step.status == PlanStep.Status.PENDING


def test_plan_and_agent_decisions_confirm_what_happened(operator_client: Client) -> None:
    step = PlanStepFactory(status=PlanStep.Status.AWAITING_APPROVAL, plan__agent__name="Ann", plan__goal_text="Have a meal")
    plan, agent = step.plan, step.plan.agent
    cancelled = operator_client.post(reverse("plan-cancel", args=[plan.pk]), HTTP_HX_REQUEST="true").content.decode()
    assert '<p class="flash success" role="status">Cancelled Ann&#x27;s plan “Have a meal” (v1).</p>' in cancelled
    paused = operator_client.post(reverse("agent-status", args=[agent.pk]), {"status": "paused"}, HTTP_HX_REQUEST="true")
    assert '<p class="flash success" role="status">Paused Ann.</p>' in paused.content.decode()
    # Without htmx the confirmation comes after the redirect, said the same way.
    page = operator_client.post(reverse("agent-status", args=[agent.pk]), {"status": "running"}, follow=True)
    assert '<p class="flash success" role="status">Resumed Ann.</p>' in page.content.decode()


def test_second_decision_on_same_step_is_refused_with_message(operator_client: Client) -> None:
    step = PlanStepFactory(status=PlanStep.Status.AWAITING_APPROVAL)
    url = reverse("step-approve", args=[step.pk])
    assert operator_client.post(url, HTTP_HX_REQUEST="true").status_code == 200
    response = operator_client.post(url, HTTP_HX_REQUEST="true")
    assert response.status_code == 409
    assert "no longer awaiting approval" in response.content.decode()
    assert response["HX-Retarget"] == "#flash"
    assert PlanEvent.objects.filter(kind=PlanEvent.Kind.STEP_APPROVED).count() == 1


def test_decline_without_feedback_is_refused(operator_client: Client) -> None:
    step = PlanStepFactory(status=PlanStep.Status.AWAITING_APPROVAL)
    response = operator_client.post(reverse("step-decline", args=[step.pk]), {"feedback": ""}, HTTP_HX_REQUEST="true")
    assert response.status_code == 400
    assert "Feedback is required" in response.content.decode()
    step.refresh_from_db()
    assert step.status == PlanStep.Status.AWAITING_APPROVAL


def test_decline_with_feedback_is_recorded(operator_client: Client, operator: object) -> None:
    step = PlanStepFactory(status=PlanStep.Status.AWAITING_APPROVAL)
    response = operator_client.post(reverse("step-decline", args=[step.pk]), {"feedback": "Use the market"},
                                    HTTP_HX_REQUEST="true")
    assert response.status_code == 200
    event = PlanEvent.objects.get(kind=PlanEvent.Kind.STEP_DECLINED)
    assert event.actor == operator and event.reason == "Use the market"


def test_post_without_csrf_token_is_rejected(operator: object) -> None:
    client = Client(enforce_csrf_checks=True)
    client.force_login(operator)
    step = PlanStepFactory(status=PlanStep.Status.AWAITING_APPROVAL)
    assert client.post(reverse("step-approve", args=[step.pk])).status_code == 403
    step.refresh_from_db()
    assert step.status == PlanStep.Status.AWAITING_APPROVAL


def test_plan_approve_buttons_and_modes(operator_client: Client) -> None:
    plan = PlanFactory(status=Plan.Status.AWAITING_APPROVAL, approval_mode=Plan.ApprovalMode.PENDING)
    html = operator_client.get(reverse("plan-detail", args=[plan.pk])).content.decode()
    for label in ("Approve all", "Step by step", "Cancel plan"):
        assert label in html
    response = operator_client.post(reverse("plan-approve", args=[plan.pk]), {"mode": "bogus"}, HTTP_HX_REQUEST="true")
    assert response.status_code == 400
    plan.refresh_from_db()
    assert plan.status == Plan.Status.AWAITING_APPROVAL


def test_an_external_agents_plan_awaiting_approval_can_be_declined_with_feedback(operator_client: Client,
                                                                                 viewer_client: Client) -> None:
    external = PlanFactory(agent=AgentFactory(kind="external"), status=Plan.Status.AWAITING_APPROVAL,
                           approval_mode=Plan.ApprovalMode.PENDING)
    built_in = PlanFactory(status=Plan.Status.AWAITING_APPROVAL, approval_mode=Plan.ApprovalMode.PENDING)
    assert "Decline with feedback" in operator_client.get(reverse("plan-detail", args=[external.pk])).content.decode()
    assert "Decline with feedback" not in viewer_client.get(reverse("plan-detail", args=[external.pk])).content.decode()
    assert "Decline with feedback" not in operator_client.get(reverse("plan-detail", args=[built_in.pk])).content.decode()
    operator_client.post(reverse("plan-replan", args=[external.pk]), {"reason": "Ask finance first"},
                         HTTP_HX_REQUEST="true")
    external.refresh_from_db()
    assert (external.status, external.replan_reason) == (Plan.Status.AWAITING_APPROVAL, "operator: Ask finance first")
    # Declined once, the form is gone until the agent's next version arrives.
    assert "Decline with feedback" not in operator_client.get(reverse("plan-detail", args=[external.pk])).content.decode()


def test_plan_awaiting_approval_shows_the_planners_confidence_with_steps_summary_and_restatement(
        operator_client: Client) -> None:
    """Seed 002 step 7: before approving, the operator sees the steps, the thinking summary, the restatement
    and the planner's confidence."""
    plan = PlanFactory(status=Plan.Status.AWAITING_APPROVAL, approval_mode=Plan.ApprovalMode.PENDING, confidence=0.73,
                       thinking_summary="Work first, then buy food.", who="Jen", what="Get food", why="She is hungry")
    PlanStepFactory(plan=plan, key="1", position=1, description="Work a shift")
    html = operator_client.get(reverse("plan-detail", args=[plan.pk])).content.decode()
    assert "confidence 73%" in html
    assert "Work first, then buy food." in html and "Work a shift" in html
    assert "She is hungry" in html and "Approve all" in html



def test_agent_page_shows_needs_goals_and_give_goal_form(operator_client: Client) -> None:
    agent = AgentFactory(name="Jen")
    NeedFactory(agent=agent, name="hunger", satisfaction=0.1)
    GoalFactory(agent=agent, description="Find a cozy place to eat", progress=0.4)
    html = operator_client.get(reverse("agent-detail", args=[agent.pk])).content.decode()
    assert "hunger" in html and "10%" in html
    assert "Find a cozy place to eat" in html and "progress 40%" in html
    assert "Give goal" in html


def test_give_goal_then_runner_plans_it(operator_client: Client) -> None:
    agent = AgentFactory(kind="tool")
    response = operator_client.post(reverse("agent-goal", args=[agent.pk]), {"description": "List the workspace",
                                                                             "horizon": "short_term"})
    assert response.status_code == 302
    goal = agent.goals.get()
    assert goal.description == "List the workspace"
    agent_cycle(agent_id=agent.pk, runner="runner-test")
    plan = Plan.objects.get(goal=goal)
    assert plan.status == Plan.Status.AWAITING_APPROVAL and plan.steps.exists()


def test_pages_send_a_content_security_policy_with_script_nonce(viewer_client: Client) -> None:
    response = viewer_client.get("/")
    policy = response["Content-Security-Policy"]
    assert "script-src 'self' 'nonce-" in policy and "object-src 'none'" in policy
    nonce = policy.split("'nonce-")[1].split("'")[0]
    assert f'nonce="{nonce}"' in response.content.decode()  # htmx and our script carry it; nothing else runs


def test_plan_and_agent_pages_query_count_does_not_grow_with_steps(viewer_client: Client, django_assert_max_num_queries) -> None:  # type: ignore[no-untyped-def]
    from tests.factories import ExperienceFactory, LLMCallFactory, PlanEventFactory

    plan = PlanFactory()

    def grow(n: int) -> None:
        steps = PlanStepFactory.create_batch(n, plan=plan)
        for step in steps:
            PlanEventFactory(plan=plan, step=step)
            LLMCallFactory(plan=plan, agent=plan.agent)
            ExperienceFactory(agent=plan.agent, step=step)

    grow(2)
    urls = [reverse("plan-detail", args=[plan.pk]), reverse("agent-detail", args=[plan.agent.pk])]
    counts = []
    for url in urls:
        with django_assert_max_num_queries(25) as captured:
            assert viewer_client.get(url).status_code == 200
        counts.append(len(captured.captured_queries))
    grow(15)
    for url, count in zip(urls, counts, strict=True):
        with django_assert_max_num_queries(count):
            viewer_client.get(url)


def test_give_goal_errors_are_shown_on_the_agent_page(operator_client: Client) -> None:
    agent = AgentFactory(kind="tool")
    response = operator_client.post(reverse("agent-goal", args=[agent.pk]), {"description": "   ", "horizon": "short_term"},
                                    follow=True)
    assert "Goal: This field is required." in response.content.decode()
    response = operator_client.post(reverse("agent-goal", args=[agent.pk]), {"description": "x", "horizon": "forever"},
                                    follow=True)
    assert "Select a valid choice" in response.content.decode()
    assert not agent.goals.exists()


def test_choice_errors_name_their_field(operator_client: Client) -> None:
    agent = AgentFactory(kind="tool")
    response = operator_client.post(reverse("agent-goal", args=[agent.pk]), {"description": "x", "horizon": "forever"},
                                    follow=True)
    html = response.content.decode()
    assert "Horizon: Select a valid choice" in html and "None:" not in html


@pytest.mark.parametrize("answer", ["convert\x00it", "convert \u202eit", "\x1b[31mconvert"])
def test_clarify_answer_with_bad_characters_is_a_400_saying_why(operator_client: Client, answer: str) -> None:
    plan = PlanFactory(status=Plan.Status.CLARIFYING, clarification_question="Which file?")
    response = operator_client.post(reverse("plan-clarify", args=[plan.pk]), {"answer": answer})
    assert response.status_code == 400
    assert "Answer:" in response.content.decode() and "Nothing was changed" in response.content.decode()
    plan.refresh_from_db()
    assert plan.clarification_answer == "" and plan.status == Plan.Status.CLARIFYING
