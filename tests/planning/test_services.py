"""Operator decisions through the services: recorded once, with who and why; refused cleanly when stale."""

from __future__ import annotations

import pytest
from django.db import transaction

from goals.models import Goal
from goals.system import MAX_GOALS
from planning import services
from planning.engine.schedule import IllegalTransition
from planning.models import Plan, PlanEvent, PlanStep
from planning.services import transactions
from tests.factories import AgentFactory, GoalFactory, PlanFactory, PlanStepFactory

pytestmark = pytest.mark.django_db


def awaiting_step(**kwargs: object) -> PlanStep:
    return PlanStepFactory(status=PlanStep.Status.AWAITING_APPROVAL, requires_permission=True, **kwargs)


def test_step_approve_records_operator_and_frees_step(operator: object) -> None:
    step = awaiting_step()
    event = services.step_approve(step=step, user=operator)
    step.refresh_from_db()
    assert step.status == PlanStep.Status.PENDING
    assert step.approved_by == operator
    assert event.kind == PlanEvent.Kind.STEP_APPROVED
    assert event.actor == operator and event.actor_label == "olga"


def test_step_approve_twice_is_refused_and_applied_once(operator: object) -> None:
    step = awaiting_step()
    services.step_approve(step=step, user=operator)
    with pytest.raises(services.StepNotAwaitingApproval, match="no longer awaiting approval"):
        services.step_approve(step=step, user=operator)
    assert PlanEvent.objects.filter(step=step, kind=PlanEvent.Kind.STEP_APPROVED).count() == 1


def test_step_decline_after_approval_is_refused(operator: object) -> None:
    step = awaiting_step()
    services.step_approve(step=step, user=operator)
    with pytest.raises(services.StepNotAwaitingApproval):
        services.step_decline(step=step, user=operator, feedback="too late")
    step.refresh_from_db()
    assert step.status == PlanStep.Status.PENDING
    assert not PlanEvent.objects.filter(kind=PlanEvent.Kind.STEP_DECLINED).exists()


def test_step_decline_requires_feedback_and_changes_nothing_without(operator: object) -> None:
    step = awaiting_step()
    with pytest.raises(services.DecisionError, match="Feedback is required"):
        services.step_decline(step=step, user=operator, feedback="   ")
    step.refresh_from_db()
    assert step.status == PlanStep.Status.AWAITING_APPROVAL
    assert step.plan.events.count() == 0


def test_step_decline_records_feedback_and_asks_for_replan(operator: object) -> None:
    step = awaiting_step()
    event = services.step_decline(step=step, user=operator, feedback="Buy cheaper food at the market")
    step.refresh_from_db()
    step.plan.refresh_from_db()
    assert step.status == PlanStep.Status.DECLINED
    assert "Buy cheaper food" in step.plan.replan_reason
    assert event.reason == "Buy cheaper food at the market" and event.actor == operator


def test_plan_approve_step_by_step_sets_mode(operator: object) -> None:
    plan = PlanFactory(status=Plan.Status.AWAITING_APPROVAL, approval_mode=Plan.ApprovalMode.PENDING)
    services.plan_approve(plan=plan, user=operator, mode="step")
    plan.refresh_from_db()
    assert plan.status == Plan.Status.ACTIVE and plan.approval_mode == Plan.ApprovalMode.STEP
    with pytest.raises(services.PlanNotAwaitingApproval):
        services.plan_approve(plan=plan, user=operator, mode="all")
    assert plan.events.filter(kind=PlanEvent.Kind.PLAN_APPROVED).count() == 1


def test_plan_approve_unknown_mode_changes_nothing(operator: object) -> None:
    plan = PlanFactory(status=Plan.Status.AWAITING_APPROVAL)
    with pytest.raises(services.DecisionError, match="Unknown approval mode"):
        services.plan_approve(plan=plan, user=operator, mode="everything")
    plan.refresh_from_db()
    assert plan.status == Plan.Status.AWAITING_APPROVAL


def test_plan_cancel_skips_open_steps_and_keeps_done_ones(operator: object) -> None:
    plan = PlanFactory()
    done = PlanStepFactory(plan=plan, status=PlanStep.Status.COMPLETED)
    open_step = PlanStepFactory(plan=plan)
    services.plan_cancel(plan=plan, user=operator, reason="not needed")
    done.refresh_from_db()
    open_step.refresh_from_db()
    assert done.status == PlanStep.Status.COMPLETED
    assert open_step.status == PlanStep.Status.SKIPPED
    with pytest.raises(services.DecisionError, match="already cancelled"):
        services.plan_cancel(plan=plan, user=operator)


def test_cancelling_a_plan_cancels_its_running_step_rather_than_calling_it_skipped(operator: object) -> None:
    plan = PlanFactory()
    running = PlanStepFactory(plan=plan, key="1", position=1, status=PlanStep.Status.RUNNING)
    waiting = awaiting_step(plan=plan, key="2", position=2)
    later = PlanStepFactory(plan=plan, key="3", position=3)
    rolled_back = PlanStepFactory(plan=plan, key="4", position=4, status=PlanStep.Status.ROLLED_BACK)
    event = services.plan_cancel(plan=plan, user=operator, reason="not needed")
    statuses = dict(plan.steps.values_list("key", "status"))
    assert statuses == {"1": PlanStep.Status.CANCELLED, "2": PlanStep.Status.SKIPPED, "3": PlanStep.Status.SKIPPED,
                        "4": PlanStep.Status.ROLLED_BACK}
    assert event.detail == {"skipped": ["2", "3"], "cancelled": ["1"]}
    assert event.reason == "not needed; step 1 was running and is cancelled, its outcome not known"
    cancelled = PlanEvent.objects.get(kind=PlanEvent.Kind.STEP_CANCELLED)
    assert cancelled.step_id == running.pk and cancelled.actor == operator and cancelled.actor_label == "olga"
    # The runner's tool ends after the cancel: its result changes nothing, the step stays cancelled.
    services.step_finish(step=running, runner="runner-1", succeeded=True, result="done")
    running.refresh_from_db()
    assert running.status == PlanStep.Status.CANCELLED and running.result == ""
    assert waiting.pk and later.pk and rolled_back.pk


def test_the_state_machine_cancels_only_a_running_step_and_a_cancelled_step_is_final() -> None:
    pending = PlanStepFactory()
    with pytest.raises(IllegalTransition, match="cannot go from pending to cancelled"):
        services.step_move(step=pending, status=PlanStep.Status.CANCELLED)
    running = PlanStepFactory(status=PlanStep.Status.RUNNING)
    services.step_move(step=running, status=PlanStep.Status.CANCELLED)
    with pytest.raises(IllegalTransition, match="a running step cannot become skipped|from running to skipped"):
        services.step_move(step=PlanStepFactory(status=PlanStep.Status.RUNNING), status=PlanStep.Status.SKIPPED)
    for status in (PlanStep.Status.RUNNING, PlanStep.Status.PENDING, PlanStep.Status.COMPLETED):
        with pytest.raises(IllegalTransition, match="cancelled is final"):
            services.step_move(step=running, status=status)


def test_steps_an_outside_agent_reports_follow_the_plans_steps_each_recorded() -> None:
    plan = PlanFactory()
    PlanStepFactory(plan=plan, key="1", position=1, status=PlanStep.Status.COMPLETED)
    added = services.steps_reported(plan=plan, actor_label="Researcher (A2A)", reported=[
        services.StepReport(PlanStep(key="m2", description="Found three sources", status=PlanStep.Status.COMPLETED),
                            "Found three"),
        services.StepReport(PlanStep(key="a1", description="Artifact report", status=PlanStep.Status.RUNNING),
                            "Artifact report")])
    assert [(s.key, s.position) for s in added] == [("m2", 2), ("a1", 3)]
    assert list(plan.events.order_by("pk").values_list("step__key", "kind", "actor_label")) == [
        ("m2", PlanEvent.Kind.STEP_COMPLETED, "Researcher (A2A)"), ("a1", PlanEvent.Kind.STEP_STARTED,
                                                                    "Researcher (A2A)")]
    with pytest.raises(ValueError, match="completed, running or awaiting approval, not pending"):
        services.steps_reported(plan=plan, actor_label="Researcher (A2A)",
                                reported=[services.StepReport(PlanStep(key="x", description="x"), "x")])
    assert plan.steps.count() == 3


def test_a_step_an_outside_agent_reported_before_moves_only_as_the_state_machine_allows() -> None:
    plan = PlanFactory()
    done = PlanStepFactory(plan=plan, key="1", position=1, status=PlanStep.Status.COMPLETED, result="first")
    done.result = "again"
    with pytest.raises(IllegalTransition):
        services.steps_reported(plan=plan, actor_label="Helper (AG-UI)", reported=[
            services.StepReport(done, "ran it again", path=(PlanStep.Status.RUNNING,), fields=("result",))])
    done.refresh_from_db()
    assert (done.status, done.result) == (PlanStep.Status.COMPLETED, "first") and not plan.events.exists()
    (asked,) = services.steps_reported(plan=plan, actor_label="Helper (AG-UI)", reported=[
        services.StepReport(PlanStep(description="May I send it?", status=PlanStep.Status.AWAITING_APPROVAL),
                            "the agent asks: May I send it?", detail={"interrupt": "i1"})])
    approved = PlanStep.objects.get(pk=asked.pk)
    assert (approved.key, approved.position, approved.status) == ("s2", 2, PlanStep.Status.AWAITING_APPROVAL)
    approved.status = PlanStep.Status.PENDING
    approved.save()
    approved.result = "sent"
    services.steps_reported(plan=plan, actor_label="Helper (AG-UI)", reported=[services.StepReport(
        approved, "sent", path=(PlanStep.Status.RUNNING, PlanStep.Status.COMPLETED), fields=("result",))])
    approved.refresh_from_db()
    assert (approved.status, approved.result) == (PlanStep.Status.COMPLETED, "sent")
    assert list(plan.events.order_by("pk").values_list("step__key", "kind", "detail")) == [
        ("s2", PlanEvent.Kind.STEP_AWAITING, {"interrupt": "i1"}), ("s2", PlanEvent.Kind.STEP_COMPLETED, {})]


def test_agent_pause_is_recorded_on_the_open_plan(operator: object) -> None:
    plan = PlanFactory()
    services.agent_set_status(agent=plan.agent, user=operator, status="paused")
    plan.agent.refresh_from_db()
    assert plan.agent.status == "paused"
    assert plan.events.get(kind=PlanEvent.Kind.AGENT_PAUSED).actor == operator


def test_agent_give_goal_refuses_empty_and_duplicate(operator: object) -> None:
    agent = AgentFactory(kind="tool")
    with pytest.raises(services.DecisionError, match="Describe the goal"):
        services.agent_give_goal(agent=agent, user=operator, description="  ")
    services.agent_give_goal(agent=agent, user=operator, description="Convert data.csv to JSON")
    with pytest.raises(services.DecisionError, match="already has this goal"):
        services.agent_give_goal(agent=agent, user=operator, description="convert data.csv to json")
    assert agent.goals.count() == 1


def test_agent_give_goal_refuses_an_eleventh_active_goal(operator: object) -> None:
    agent = AgentFactory(kind="persona")
    for n in range(MAX_GOALS):
        GoalFactory(agent=agent, description=f"Goal {n}")
    GoalFactory(agent=agent, description="Done before", status=Goal.Status.COMPLETED)  # not active: not counted
    with pytest.raises(services.DecisionError, match=r"already has 10 active goals.*Nothing was changed\.$"):
        services.agent_give_goal(agent=agent, user=operator, description="Learn to cook")
    assert agent.goals.filter(status=Goal.Status.ACTIVE).count() == MAX_GOALS
    assert not PlanEvent.objects.filter(kind=PlanEvent.Kind.GOAL_GIVEN).exists()


def test_step_finish_retries_then_fails_and_asks_for_replan() -> None:
    step = PlanStepFactory(status=PlanStep.Status.RUNNING, max_retries=2)
    for expected_retry in (1, 2):
        step = services.step_finish(step=step, runner="r", succeeded=False, error="disk full")
        assert step.status == PlanStep.Status.PENDING and step.retries == expected_retry
        step.status = PlanStep.Status.RUNNING
        step.save()
    step = services.step_finish(step=step, runner="r", succeeded=False, error="disk full")
    assert step.status == PlanStep.Status.FAILED
    step.plan.refresh_from_db()
    assert "failed after 2 retries" in step.plan.replan_reason


def test_step_finish_never_completes_twice() -> None:
    step = PlanStepFactory(status=PlanStep.Status.RUNNING)
    services.step_finish(step=step, runner="r", succeeded=True, result="ok")
    services.step_finish(step=step, runner="r2", succeeded=True, result="again")
    assert PlanEvent.objects.filter(step=step, kind=PlanEvent.Kind.STEP_COMPLETED).count() == 1
    step.refresh_from_db()
    assert step.result == "ok"


def test_completing_last_step_completes_plan_and_advances_goal() -> None:
    step = PlanStepFactory(status=PlanStep.Status.RUNNING)
    goal = step.plan.goal
    before = goal.progress
    services.step_finish(step=step, runner="r", succeeded=True, result="ok")
    step.plan.refresh_from_db()
    goal.refresh_from_db()
    assert step.plan.status == Plan.Status.COMPLETED
    assert goal.progress == pytest.approx(before + 0.3)


def test_step_skip_releases_dependents_and_is_recorded(operator: object) -> None:
    plan = PlanFactory()
    first = PlanStepFactory(plan=plan, key="a", status=PlanStep.Status.AWAITING_APPROVAL)
    PlanStepFactory(plan=plan, key="b", depends_on=["a"])
    event = services.step_skip(step=first, user=operator, reason="not needed today")
    first.refresh_from_db()
    assert first.status == PlanStep.Status.SKIPPED and event.reason == "not needed today"
    from planning.engine.schedule import steps_runnable

    assert steps_runnable([(s.key, s.status, s.depends_on) for s in plan.steps.all()]) == ["b"]
    with pytest.raises(services.DecisionError, match="only steps not yet started"):
        services.step_skip(step=first, user=operator)


# --- lock order and conflicts --------------------------------------------------------------------------------


class DeadlockDetected(Exception):
    sqlstate = "40P01"  # what psycopg's DeadlockDetected carries


@pytest.mark.django_db(transaction=True)  # the retry needs the service to own its transaction, as in a request
def test_a_deadlocked_decision_is_retried_and_applied_once(operator: object, monkeypatch: pytest.MonkeyPatch) -> None:
    from django.db import OperationalError

    step = awaiting_step()
    real_lock = transactions.plan_lock
    calls = []

    def lock_that_deadlocks_once(pk: int) -> Plan:
        calls.append(pk)
        if len(calls) == 1:
            raise OperationalError("deadlock detected") from DeadlockDetected()
        return real_lock(pk)

    # step_approve locks through step_lock, which looks plan_lock up in planning/services/transactions.py
    monkeypatch.setattr(transactions, "plan_lock", lock_that_deadlocks_once)
    services.step_approve(step=step, user=operator)
    assert len(calls) == 2
    step.refresh_from_db()
    assert step.status == PlanStep.Status.PENDING
    assert PlanEvent.objects.filter(step=step, kind=PlanEvent.Kind.STEP_APPROVED).count() == 1


@pytest.mark.django_db(transaction=True)
def test_other_database_errors_are_not_retried(operator: object, monkeypatch: pytest.MonkeyPatch) -> None:
    from django.db import OperationalError

    calls = []

    def broken_lock(pk: int) -> Plan:
        calls.append(pk)
        raise OperationalError("server closed the connection unexpectedly")

    monkeypatch.setattr(transactions, "plan_lock", broken_lock)
    with pytest.raises(OperationalError):
        services.step_approve(step=awaiting_step(), user=operator)
    assert len(calls) == 1


def test_step_lock_takes_the_plan_first() -> None:
    """Plan, then step: the one order every service and the cycle use, so none can wait on another."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    step = awaiting_step()
    with transaction.atomic(), CaptureQueriesContext(connection) as queries:
        locked = services.step_lock(step.pk)
    assert locked.plan.pk == step.plan_id
    tables = [q["sql"].split(" FROM ")[1].split()[0].strip('"') for q in queries.captured_queries if " FROM " in q["sql"]]
    # The step's plan id (no lock), then the plan locked, then the step locked.
    assert tables == ["planning_planstep", "planning_plan", "planning_planstep"]


def test_a_failed_or_declined_step_keeps_why_in_its_failure_reason(operator: object) -> None:
    step = PlanStepFactory(status=PlanStep.Status.RUNNING, max_retries=0)
    step = services.step_finish(step=step, runner="r", succeeded=False, error="disk full")
    step.refresh_from_db()
    assert (step.status, step.failure_reason) == (PlanStep.Status.FAILED, "disk full")
    declined = awaiting_step()
    services.step_decline(step=declined, user=operator, feedback="Too expensive")
    declined.refresh_from_db()
    assert declined.failure_reason == f"declined by {operator.get_username()}: Too expensive"  # type: ignore[attr-defined]
