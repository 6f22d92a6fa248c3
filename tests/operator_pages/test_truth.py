"""Say what is true: decisions do what their names say, and events are named for what happened."""

from __future__ import annotations

import re

import pytest
from django.test import Client
from django.urls import reverse

from agents.models import Agent
from agents.tools import undo_dir_for
from goals.models import Goal
from planning import services
from planning.models import Plan, PlanEvent, PlanStep
from tests.factories import AgentFactory, GoalFactory, PlanEventFactory, PlanFactory, PlanStepFactory

pytestmark = pytest.mark.django_db


def test_approve_all_approves_risky_steps_so_none_waits_again(operator) -> None:  # type: ignore[no-untyped-def]
    plan = PlanFactory(status=Plan.Status.AWAITING_APPROVAL, approval_mode=Plan.ApprovalMode.PENDING)
    safe = PlanStepFactory(plan=plan)
    risky = PlanStepFactory(plan=plan, requires_permission=True, risk="risky")
    services.plan_approve(plan=plan, user=operator, mode=Plan.ApprovalMode.ALL)
    plan.refresh_from_db()
    for step in (safe, risky):
        step.refresh_from_db()
        assert not step.needs_approval(plan)
    assert PlanEvent.objects.get(kind=PlanEvent.Kind.PLAN_APPROVED).detail["approved_steps"] == [safe.key, risky.key]


def test_step_by_step_still_asks_for_every_step(operator) -> None:  # type: ignore[no-untyped-def]
    plan = PlanFactory(status=Plan.Status.AWAITING_APPROVAL, approval_mode=Plan.ApprovalMode.PENDING)
    step = PlanStepFactory(plan=plan)
    services.plan_approve(plan=plan, user=operator, mode=Plan.ApprovalMode.STEP)
    plan.refresh_from_db()
    step.refresh_from_db()
    assert step.needs_approval(plan)


def test_skipping_a_step_is_logged_as_step_skipped(operator) -> None:  # type: ignore[no-untyped-def]
    step = PlanStepFactory()
    PlanStepFactory(plan=step.plan)
    services.step_skip(step=step, user=operator)
    event = PlanEvent.objects.get(step=step)
    assert event.get_kind_display() == "Step skipped"


def test_replan_request_is_logged_as_replan_requested(operator) -> None:  # type: ignore[no-untyped-def]
    plan = PlanFactory()
    services.plan_replan_request(plan=plan, user=operator, reason="Use the other shop")
    event = PlanEvent.objects.get(plan=plan)
    assert event.get_kind_display() == "Replan requested" and event.reason == "Use the other shop"


def test_cancelled_unstarted_plan_shows_no_steps_done(viewer_client: Client, operator) -> None:  # type: ignore[no-untyped-def]
    plan = PlanFactory()
    PlanStepFactory.create_batch(2, plan=plan)
    services.plan_cancel(plan=plan, user=operator)
    html = viewer_client.get(reverse("plan-detail", args=[plan.pk])).content.decode()
    assert "0/2 steps done" in html
    assert "0/2 steps" in viewer_client.get("/").content.decode()


def test_giving_a_goal_is_an_event_naming_its_giver(operator_client: Client) -> None:
    agent = AgentFactory(kind=Agent.Kind.TOOL)
    operator_client.post(reverse("agent-goal", args=[agent.pk]), {"description": "Convert data.csv", "horizon": "short_term"})
    goal = Goal.objects.get(agent=agent)
    assert goal.source_lessons == []
    event = PlanEvent.objects.get(kind=PlanEvent.Kind.GOAL_GIVEN)
    assert event.plan is None and event.agent == agent
    assert event.actor_label == "olga" and event.reason == "Convert data.csv"


def test_a_goal_given_while_a_plan_runs_says_it_is_queued_with_its_place(operator_client: Client) -> None:
    agent = AgentFactory(kind=Agent.Kind.TOOL)
    PlanFactory(agent=agent, goal_text="Summarize notes.txt", version=1)
    GoalFactory(agent=agent, description="An earlier given goal", horizon=Goal.Horizon.SHORT, confidence=1.0)
    response = operator_client.post(reverse("agent-goal", args=[agent.pk]),
                                    {"description": "Convert data.csv", "horizon": "short_term"}, follow=True)
    html = response.content.decode()
    assert "Goal given; it is queued behind the open plan “Summarize notes.txt” (v1), number 2 in the agent" in html


def test_a_goal_given_to_an_idle_agent_is_planned_next_cycle(operator_client: Client) -> None:
    agent = AgentFactory(kind=Agent.Kind.TOOL)
    response = operator_client.post(reverse("agent-goal", args=[agent.pk]),
                                    {"description": "Convert data.csv", "horizon": "short_term"}, follow=True)
    assert "Goal given; the agent plans it next cycle." in response.content.decode()


def test_pausing_an_idle_agent_is_recorded(operator) -> None:  # type: ignore[no-untyped-def]
    agent = AgentFactory()
    services.agent_set_status(agent=agent, user=operator, status=Agent.Status.STOPPED)
    event = PlanEvent.objects.get(agent=agent)
    assert event.get_kind_display() == "Agent stopped" and event.actor_label == "olga"


def test_events_of_plans_name_their_agent(operator) -> None:  # type: ignore[no-untyped-def]
    step = PlanStepFactory(status=PlanStep.Status.AWAITING_APPROVAL)
    services.step_approve(step=step, user=operator)
    assert PlanEvent.objects.get().agent_id == step.plan.agent_id


def test_a_step_the_operator_skipped_counts_as_done_on_load_as_in_pushes(viewer_client: Client, operator) -> None:  # type: ignore[no-untyped-def]
    plan = PlanFactory(status=Plan.Status.ACTIVE)
    first, _ = PlanStepFactory.create_batch(2, plan=plan)
    services.step_skip(step=first, user=operator, reason="found one already")
    html = viewer_client.get(reverse("plan-detail", args=[plan.pk])).content.decode()
    assert "1/2 steps done" in html  # what the live header says after the skip (tests/browser/test_live.py)
    assert "1/2 steps" in viewer_client.get("/").content.decode()
    assert "1/2" in viewer_client.get(reverse("agent-detail", args=[plan.agent_id])).content.decode()


# --- the dashboard says what is true ---------------------------------------------------------------------------


def agent_row(html: str, agent: Agent) -> str:
    start = html.index(f'id="agent-row-{agent.pk}"')
    return html[start:html.index("</tr>", start)]


def test_dashboard_row_shows_the_plan_waited_on_not_a_later_cancelled_one(viewer_client: Client) -> None:
    waited = PlanStepFactory(status=PlanStep.Status.AWAITING_APPROVAL, key="2", plan__goal_text="Catch up with Sam").plan
    agent = waited.agent
    Agent.objects.filter(pk=agent.pk).update(waiting_reason="step 2 awaits approval")
    later = PlanFactory(agent=agent, goal_text="Buy a new phone", status=Plan.Status.CANCELLED)
    assert later.created_at >= waited.created_at
    row = agent_row(viewer_client.get(reverse("dashboard")).content.decode(), agent)
    assert f'<a href="{waited.get_absolute_url()}">Catch up with Sam</a>' in row
    assert f'Waiting: <a href="{waited.get_absolute_url()}">step 2 awaits approval</a>' in row
    assert "Buy a new phone" not in row


def test_dashboard_counts_agree_with_the_inbox(viewer_client: Client) -> None:
    agent = AgentFactory(kind=Agent.Kind.TOOL, waiting_reason="plan v1 awaits approval")
    asking = PlanFactory(agent=agent, status=Plan.Status.AWAITING_APPROVAL, approval_mode=Plan.ApprovalMode.PENDING)
    PlanEventFactory(plan=asking, kind=PlanEvent.Kind.VALIDATED)
    step = PlanStepFactory(plan__agent=agent, status=PlanStep.Status.AWAITING_APPROVAL, requires_permission=True)
    PlanEventFactory(plan=step.plan, step=step, kind=PlanEvent.Kind.STEP_AWAITING)
    html = viewer_client.get(reverse("dashboard")).content.decode()
    inbox = re.search(r'id="inbox-count"[^>]*data-count="(\d+)"', html)
    assert inbox is not None and inbox.group(1) == "2"  # the navigation's "Inbox 2"
    assert "<b>2</b> items in the inbox" in html  # the dashboard counts the same items
    assert "<b>1</b> agent waiting for an operator" in html  # and says that it counts agents here


def test_an_agent_still_waiting_on_one_step_says_so_after_it_plans_anew_or_another_is_decided(
        operator, viewer_client: Client) -> None:  # type: ignore[no-untyped-def]
    """A persona plans its next goal while a step of another plan awaits approval, and an operator decides one of
    two waiting steps: the row still says what waits, and the dashboard counts the agent as waiting, as the inbox
    still lists the step."""
    agent = AgentFactory(kind=Agent.Kind.PERSONA)
    first = PlanStepFactory(plan__agent=agent, plan__status=Plan.Status.ACTIVE, key="2", status=PlanStep.Status.PENDING,
                            requires_permission=True)
    services.step_request_approval(step=first, runner="runner-test")
    goal = GoalFactory(agent=agent, description="Visit the library")
    services.plan_start(agent=agent, goal=goal, goal_text=goal.description, previous=None, reason="",
                        actor_label="runner-test")
    agent.refresh_from_db()
    assert agent.waiting_reason == "step 2 awaits approval"

    second = PlanStepFactory(plan__agent=agent, plan__status=Plan.Status.ACTIVE, key="5", status=PlanStep.Status.PENDING)
    services.step_request_approval(step=second, runner="runner-test")
    services.step_approve(step=second, user=operator)
    agent.refresh_from_db()
    assert agent.waiting_reason == "step 2 awaits approval"
    html = viewer_client.get(reverse("dashboard")).content.decode()
    assert "<b>1</b> agent waiting for an operator" in html

    services.step_decline(step=first, user=operator, feedback="Not today")
    agent.refresh_from_db()
    assert agent.waiting_reason == ""  # nothing waits any more


def test_roll_back_is_offered_only_where_undo_copies_were_kept(operator_client: Client) -> None:
    external = PlanStepFactory(plan__agent__kind=Agent.Kind.EXTERNAL, status=PlanStep.Status.COMPLETED,
                               tool="file.write", risk="risky")  # run by the external agent: the server kept nothing
    html = operator_client.get(external.plan.get_absolute_url()).content.decode()
    assert "Roll back" not in html
    ran = PlanStepFactory(plan__agent__kind=Agent.Kind.TOOL, status=PlanStep.Status.COMPLETED, tool="file.write",
                          risk="risky")
    undo = undo_dir_for(ran.plan.agent.workspace, str(ran.pk))
    undo.mkdir(parents=True)
    (undo / "manifest.json").write_text('{"entries": []}', encoding="utf-8")
    html = operator_client.get(ran.plan.get_absolute_url()).content.decode()
    assert f"Roll back step {ran.key}?" in html


def test_the_current_step_shown_is_the_one_the_runner_takes_next() -> None:
    """One rule for the runner, the dashboard row and the plan page: a pending step whose dependency failed
    is not current; the next step that can run is (before, the pages showed the blocked one)."""
    from planning.models import step_current
    from planning.selectors import dashboard_rows, plan_context

    plan = PlanFactory(status=Plan.Status.ACTIVE)
    PlanStepFactory(plan=plan, key="1", position=1, status=PlanStep.Status.COMPLETED)
    PlanStepFactory(plan=plan, key="2", position=2, status=PlanStep.Status.FAILED)
    PlanStepFactory(plan=plan, key="3", position=3, depends_on=["2"], description="Blocked by 2")
    PlanStepFactory(plan=plan, key="4", position=4, description="Free to run")
    steps = list(plan.steps.order_by("position"))
    assert step_current(steps).key == "4"  # type: ignore[union-attr]
    [row] = dashboard_rows(agent_ids=[plan.agent_id])
    assert row.step is not None and row.step.description == "Free to run"
    assert plan_context(plan.pk)["current"].key == "4"
    awaiting = PlanStepFactory(plan=plan, key="5", position=5, status=PlanStep.Status.AWAITING_APPROVAL)
    assert step_current(list(plan.steps.order_by("position"))) == awaiting  # an operator's turn comes first
