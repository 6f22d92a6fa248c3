"""The approvals inbox: what waits for a person, decided in place, with its count on every page."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from agents.models import Agent
from planning.models import Plan, PlanEvent, PlanStep
from tests.factories import AgentFactory, PlanEventFactory, PlanFactory, PlanStepFactory

pytestmark = pytest.mark.django_db


def waiting_step(**kwargs: object) -> PlanStep:
    step = PlanStepFactory(status=PlanStep.Status.AWAITING_APPROVAL, requires_permission=True, risk="risky", **kwargs)
    PlanEventFactory(plan=step.plan, step=step, kind=PlanEvent.Kind.STEP_AWAITING)
    return step


def waiting_plan(**kwargs: object) -> Plan:
    kwargs.setdefault("agent__kind", Agent.Kind.TOOL)
    plan = PlanFactory(status=Plan.Status.AWAITING_APPROVAL, approval_mode=Plan.ApprovalMode.PENDING, **kwargs)
    PlanStepFactory(plan=plan, tool="file.read", tool_input={"path": "a.txt"}, action_hint="")
    PlanStepFactory(plan=plan, tool="file.write", tool_input={"path": "b.txt"}, action_hint="", requires_permission=True,
                    risk="risky")
    PlanEventFactory(plan=plan, kind=PlanEvent.Kind.VALIDATED)
    return plan


def test_inbox_lists_waiting_steps_and_plans_oldest_first_with_details(viewer_client: Client) -> None:
    newer = waiting_step(plan__agent__name="Bob", description="Meet Sam for dinner")
    older_plan = waiting_plan(agent__name="Intern", goal__description="Convert data.csv")
    PlanEvent.objects.filter(plan=older_plan).update(created_at=timezone.now() - timedelta(minutes=30))
    PlanStepFactory(status=PlanStep.Status.PENDING, description="Not waiting")
    html = viewer_client.get(reverse("inbox")).content.decode()
    assert html.index("Convert data.csv") < html.index("Meet Sam for dinner")  # oldest first
    assert "Bob" in html and "Intern" in html and "waiting 30 min" in html
    assert "requires permission: <span class=\"tag warn\">yes" in html
    assert "Not waiting" not in html
    assert "<title>Inbox 2 · Agent planner</title>" in html
    assert newer.plan.goal_text in html


def test_inbox_empty_state_is_a_sentence(viewer_client: Client) -> None:
    html = viewer_client.get(reverse("inbox")).content.decode()
    assert "Nothing waits for you: no step or plan needs a decision right now." in html


def test_every_page_shows_the_inbox_count_in_its_navigation(viewer_client: Client) -> None:
    waiting_step()
    waiting_plan()
    for url in ("/", reverse("inbox")):
        html = viewer_client.get(url).content.decode()
        assert 'id="inbox-link">Inbox <span id="inbox-count"' in html
        assert 'data-count="2"' in html


def test_viewer_sees_no_decisions_and_may_not_decide(viewer_client: Client) -> None:
    step = waiting_step()
    plan = waiting_plan()
    html = viewer_client.get(reverse("inbox")).content.decode()
    assert ">Approve<" not in html and ">Approve all<" not in html
    for url, data in [(reverse("inbox-step-approve", args=[step.pk]), {}),
                      (reverse("inbox-step-decline", args=[step.pk]), {"feedback": "no"}),
                      (reverse("inbox-plan-approve", args=[plan.pk]), {"mode": "all"}),
                      (reverse("inbox-plan-cancel", args=[plan.pk]), {})]:
        assert viewer_client.post(url, data).status_code == 403
    assert PlanEvent.objects.filter(actor__isnull=False).count() == 0


def test_operator_approves_a_step_in_place(operator_client: Client) -> None:
    step = waiting_step(plan__agent__name="Bob")
    response = operator_client.post(reverse("inbox-step-approve", args=[step.pk]), {"version": step.plan.version},
                                    HTTP_HX_REQUEST="true")
    html = response.content.decode()
    assert response.status_code == 200
    assert f"Approved step {step.key} of Bob&#x27;s plan “{step.plan.goal_text}” (v1)." in html
    assert "Nothing waits for you" in html and 'id="inbox-announce"' in html
    step.refresh_from_db()
    assert step.status == PlanStep.Status.PENDING and step.approved_by is not None


def test_decline_needs_feedback_and_changes_nothing_without(operator_client: Client) -> None:
    step = waiting_step()
    response = operator_client.post(reverse("inbox-step-decline", args=[step.pk]), {"feedback": "  "},
                                    HTTP_HX_REQUEST="true")
    assert response.status_code == 400
    assert "Feedback is required" in response.content.decode()
    step.refresh_from_db()
    assert step.status == PlanStep.Status.AWAITING_APPROVAL
    response = operator_client.post(reverse("inbox-step-decline", args=[step.pk]), {"feedback": "Too pricey"},
                                    HTTP_HX_REQUEST="true")
    assert response.status_code == 200
    step.refresh_from_db()
    assert step.status == PlanStep.Status.DECLINED
    assert PlanEvent.objects.get(kind=PlanEvent.Kind.STEP_DECLINED).reason == "Too pricey"


def test_second_decision_on_the_same_step_is_refused_with_a_reason(operator_client: Client) -> None:
    step = waiting_step()
    url = reverse("inbox-step-approve", args=[step.pk])
    assert operator_client.post(url, HTTP_HX_REQUEST="true").status_code == 200
    response = operator_client.post(url, HTTP_HX_REQUEST="true")
    assert response.status_code == 409
    # Issue 50: who decided first, not "someone else may have decided it".
    assert "olga approved it at" in response.content.decode() and "Nothing was changed." in response.content.decode()
    assert PlanEvent.objects.filter(kind=PlanEvent.Kind.STEP_APPROVED).count() == 1


def test_decision_on_a_stale_version_is_refused_with_the_current_version(operator_client: Client) -> None:
    plan = waiting_plan()
    newer = PlanFactory(agent=plan.agent, goal=plan.goal, goal_text=plan.goal_text, version=2, previous=plan,
                        status=Plan.Status.AWAITING_APPROVAL)
    Plan.objects.filter(pk=plan.pk).update(status=Plan.Status.REPLANNED)
    response = operator_client.post(reverse("inbox-plan-approve", args=[plan.pk]), {"mode": "all", "version": 1},
                                    HTTP_HX_REQUEST="true")
    html = response.content.decode()
    assert response.status_code == 409
    assert "You were looking at version 1, but the plan is now version 2" in html
    assert newer.get_absolute_url() in html
    assert not PlanEvent.objects.filter(kind=PlanEvent.Kind.PLAN_APPROVED).exists()


def test_approve_all_in_the_inbox_approves_risky_steps_too(operator_client: Client) -> None:
    plan = waiting_plan()
    response = operator_client.post(reverse("inbox-plan-approve", args=[plan.pk]), {"mode": "all", "version": 1},
                                    HTTP_HX_REQUEST="true")
    assert response.status_code == 200
    assert not plan.steps.filter(approved_by__isnull=True).exists()
    event = PlanEvent.objects.get(kind=PlanEvent.Kind.PLAN_APPROVED)
    assert event.reason == "approved all 2 steps"


def test_cancel_plan_from_the_inbox(operator_client: Client) -> None:
    plan = waiting_plan()
    response = operator_client.post(reverse("inbox-plan-cancel", args=[plan.pk]), {"version": 1}, HTTP_HX_REQUEST="true")
    assert response.status_code == 200
    plan.refresh_from_db()
    assert plan.status == Plan.Status.CANCELLED


def test_waiting_policy_marks_old_items_urgent_and_puts_them_first(viewer_client: Client) -> None:
    calm = waiting_step(plan__agent__name="Calm", description="Calm step")
    hurried = waiting_step(plan__agent__name="Hurried", description="Hurried step")
    Agent.objects.filter(pk=hurried.plan.agent_id).update(escalate_after_minutes=10)
    PlanEvent.objects.filter(step=calm).update(created_at=timezone.now() - timedelta(hours=2))
    PlanEvent.objects.filter(step=hurried).update(created_at=timezone.now() - timedelta(minutes=11))
    html = viewer_client.get(reverse("inbox")).content.decode()
    assert html.index("Hurried step") < html.index("Calm step")
    assert html.count(">urgent<") == 1
    hurried.refresh_from_db()
    assert hurried.status == PlanStep.Status.AWAITING_APPROVAL  # never decided by itself


def test_inbox_query_count_with_a_thousand_items(viewer_client: Client, django_assert_max_num_queries) -> None:  # type: ignore[no-untyped-def]
    agent = AgentFactory()
    plans = Plan.objects.bulk_create([
        Plan(agent=agent, goal_text=f"goal {i}", status=Plan.Status.ACTIVE, approval_mode="all") for i in range(500)
    ] + [Plan(agent=agent, goal_text=f"whole plan {i}", status=Plan.Status.AWAITING_APPROVAL) for i in range(500)])
    PlanStep.objects.bulk_create([
        PlanStep(plan=p, key="1", position=1, description=f"step of {p.goal_text}",
                 status=PlanStep.Status.AWAITING_APPROVAL if p.status == Plan.Status.ACTIVE else PlanStep.Status.PENDING)
        for p in plans
    ])
    # 11 since issue 50: one query for the persona's repeats ("3rd time today"), whatever the number of items.
    with django_assert_max_num_queries(11):
        response = viewer_client.get(reverse("inbox"))
    assert response.content.decode().count('<li id="inbox-') == 1000


# -- the planner's questions are inbox items --------------------------------------------------------


def asking_plan(name: str = "Archivist") -> Plan:
    """A tool agent whose unclear goal made the planner ask (the offline model asks for "Do the thing")."""
    from planning.planner import plan_generate
    from tests.factories import GoalFactory

    agent = AgentFactory(name=name, kind=Agent.Kind.TOOL)
    agent.workspace.mkdir(parents=True, exist_ok=True)
    (agent.workspace / "data.csv").write_text("a,b\n1,2\n")
    goal = GoalFactory(agent=agent, description="Do the thing", source_needs=[])
    plan = plan_generate(agent=agent, goal_text=goal.description, goal=goal)
    assert plan.status == Plan.Status.CLARIFYING
    return plan


def test_a_question_of_the_planner_is_in_the_inbox_ordered_and_counted(viewer_client: Client) -> None:
    plan = asking_plan()
    PlanEvent.objects.filter(plan=plan).update(created_at=timezone.now() - timedelta(minutes=20))
    waiting_step(plan__agent__name="Bob", description="Meet Sam for dinner")
    html = viewer_client.get(reverse("inbox")).content.decode()
    assert f'id="inbox-question-{plan.pk}"' in html
    assert "Planner asks a question" in html and "The planner asks: What should I do for" in html
    assert html.index("Do the thing") < html.index("Meet Sam for dinner")  # asked 20 min ago: older first
    assert "waiting 20 min" in html
    assert "<title>Inbox 2 · Agent planner</title>" in html and 'data-count="2"' in html
    assert viewer_client.get(reverse("inbox-count")).content == b"2"
    assert 'name="answer"' not in html  # a viewer reads the question but cannot answer it


def test_answering_in_the_inbox_resumes_planning_and_the_question_leaves(operator_client: Client) -> None:
    from runtime.cycle import agent_cycle

    plan = asking_plan()
    html = operator_client.get(reverse("inbox")).content.decode()
    assert f'hx-post="{reverse("inbox-plan-clarify", args=[plan.pk])}"' in html and 'name="answer"' in html
    response = operator_client.post(reverse("inbox-plan-clarify", args=[plan.pk]),
                                    {"answer": "convert data.csv to JSON", "version": 1}, HTTP_HX_REQUEST="true")
    html = response.content.decode()
    assert response.status_code == 200
    assert "Answer given to Archivist; the agent plans again with it next cycle." in html
    assert f'id="inbox-question-{plan.pk}"' not in html and "Nothing waits for you" in html
    plan.refresh_from_db()
    assert plan.clarification_answer == "convert data.csv to JSON"
    assert plan.events.get(kind=PlanEvent.Kind.CLARIFIED).actor.get_username() == "olga"  # type: ignore[union-attr]

    agent_cycle(agent_id=plan.agent_id, runner="r")
    resumed = Plan.objects.get(previous=plan)
    assert resumed.status == Plan.Status.AWAITING_APPROVAL and resumed.steps.filter(tool="file.convert").exists()
    html = operator_client.get(reverse("inbox")).content.decode()
    assert f'id="inbox-plan-{resumed.pk}"' in html and f'id="inbox-question-{plan.pk}"' not in html


def test_an_empty_answer_in_the_inbox_changes_nothing(operator_client: Client, viewer_client: Client) -> None:
    plan = asking_plan()
    url = reverse("inbox-plan-clarify", args=[plan.pk])
    response = operator_client.post(url, {"answer": "  ", "version": 1}, HTTP_HX_REQUEST="true")
    assert response.status_code == 400
    assert "Write an answer to the planner&#x27;s question. Nothing was changed." in response.content.decode()
    assert viewer_client.post(url, {"answer": "convert it", "version": 1}).status_code == 403
    plan.refresh_from_db()
    assert plan.status == Plan.Status.CLARIFYING and plan.clarification_answer == ""


def test_the_agent_page_shows_the_waiting_question_not_no_open_plans(operator: object, viewer_client: Client) -> None:
    from planning.services import plan_clarify

    plan = asking_plan()
    html = viewer_client.get(reverse("agent-detail", args=[plan.agent_id])).content.decode()
    assert "No open plans." not in html
    assert "The planner asks: What should I do for" in html and f"#inbox-question-{plan.pk}" in html
    plan_clarify(plan=plan, user=operator, answer="convert data.csv to JSON")  # type: ignore[arg-type]
    html = viewer_client.get(reverse("agent-detail", args=[plan.agent_id])).content.decode()
    assert "No open plans." not in html and "Replan scheduled: operator answered" in html  # until the runner plans


def test_versions_page_lists_the_version_that_asked_then_the_plan(operator: object, operator_client: Client) -> None:
    from planning.services import plan_clarify
    from runtime.cycle import agent_cycle

    plan = asking_plan()
    plan_clarify(plan=plan, user=operator, answer="convert data.csv to JSON")  # type: ignore[arg-type]
    agent_cycle(agent_id=plan.agent_id, runner="r")
    resumed = Plan.objects.get(previous=plan)
    for shown in (plan, resumed):
        html = operator_client.get(reverse("plan-versions", args=[shown.pk])).content.decode()
        assert "only one version so far" not in html
        assert html.index(">version 1<") < html.index(">version 2<")
        assert "The planner asked: What should I do for" in html and "answer: convert data.csv to JSON" in html


def test_operator_declines_an_external_agents_plan_with_feedback_in_place_and_it_leaves_the_inbox(
        operator_client: Client, viewer_client: Client) -> None:
    """The inbox item of an external agent's plan offers Decline with feedback (operators only; the agent makes a
    new version with it); once declined, the plan waits for the agent, not for a person: it leaves the list and
    the count, and a second decline (another operator, a stale page) is refused with nothing changed."""
    plan = waiting_plan(agent__name="Research bot", agent__kind=Agent.Kind.EXTERNAL)
    # A persona's plan has no plan-level decline (a built-in tool agent's has one since issue 50).
    persona_plan = waiting_plan(agent__name="Bob", agent__kind=Agent.Kind.PERSONA)
    url = reverse("inbox-plan-decline", args=[plan.pk])
    html = operator_client.get(reverse("inbox")).content.decode()
    assert html.count("Decline with feedback") == 1 and f'hx-post="{url}"' in html  # not the persona's
    assert url not in viewer_client.get(reverse("inbox")).content.decode()
    assert viewer_client.post(url, {"reason": "no", "version": 1}).status_code == 403
    empty = operator_client.post(url, {"reason": "  ", "version": 1}, HTTP_HX_REQUEST="true")
    assert empty.status_code == 400 and "Feedback is required to decline a plan" in empty.content.decode()
    not_external = operator_client.post(reverse("inbox-plan-decline", args=[persona_plan.pk]),
                                        {"reason": "no", "version": 1}, HTTP_HX_REQUEST="true")
    assert not_external.status_code == 409 and "Nothing was changed" in not_external.content.decode()
    assert not Plan.objects.exclude(replan_reason="").exists()

    response = operator_client.post(url, {"reason": "Search the finance drive first", "version": plan.version},
                                    HTTP_HX_REQUEST="true")
    html = response.content.decode()
    assert response.status_code == 200
    assert "Declined Research bot&#x27;s plan" in html and "the agent makes a new version with your feedback" in html
    assert f'id="inbox-plan-{plan.pk}"' not in html and 'data-count="1"' in html  # only Bob's plan still waits
    plan.refresh_from_db()
    assert plan.status == Plan.Status.AWAITING_APPROVAL and plan.replan_reason.endswith("Search the finance drive first")
    event = plan.events.get(kind=PlanEvent.Kind.REPLAN_REQUESTED)
    assert (event.actor.username, event.reason) == ("olga", "Search the finance drive first")
    page = operator_client.get(reverse("inbox")).content.decode()
    assert "Research bot" not in page and "<title>Inbox 1 · Agent planner</title>" in page

    again = operator_client.post(url, {"reason": "Something else", "version": plan.version}, HTTP_HX_REQUEST="true")
    assert again.status_code == 409 and "waits for the agent&#x27;s next version" in again.content.decode()
    assert plan.events.filter(kind=PlanEvent.Kind.REPLAN_REQUESTED).count() == 1
