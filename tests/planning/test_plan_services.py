"""The planner's and the runner's writes go through services: each changes its rows, records its event on the
plan's timeline, and pushes the plan to open pages once the transaction commits (never before)."""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone

from agents.models import Agent
from planner_site import events
from planning import services
from planning.engine.validate import PlanSpec, StepSpec
from planning.models import Plan, PlanEvent, PlanStep
from tests.factories import AgentFactory, PlanFactory, PlanStepFactory

pytestmark = pytest.mark.django_db


@pytest.fixture
def pushed(monkeypatch: pytest.MonkeyPatch) -> list[set[int]]:
    """The plans each push named, in order."""
    sent: list[set[int]] = []
    monkeypatch.setattr(events.publisher, "publish", lambda *, agents, plans: sent.append(set(plans)))
    return sent


def validating(kind: str = Agent.Kind.TOOL) -> Plan:
    return PlanFactory(agent=AgentFactory(kind=kind), status=Plan.Status.VALIDATING)


def spec(*actions: str) -> PlanSpec:
    steps = [StepSpec(key=str(i), description=f"Do {a}", action_hint=a, estimated_cycles=2)
             for i, a in enumerate(actions, start=1)]
    return PlanSpec(goal="Eat well", thinking_summary="Shop, then cook.", confidence=0.7, risks=[], steps=steps)


def start_new() -> Plan:
    return services.plan_start(agent=AgentFactory(kind=Agent.Kind.TOOL), goal_text="List files", goal=None,
                                    previous=None, reason="", actor_label="runner r1")


def start_next() -> Plan:
    previous = PlanFactory(agent=AgentFactory(kind=Agent.Kind.TOOL), status=Plan.Status.ACTIVE)
    PlanStepFactory(plan=previous)
    return services.plan_start(agent=previous.agent, goal_text=previous.goal_text, goal=previous.goal,
                                    previous=previous, reason="step 1 failed", actor_label="runner r1")


def reject() -> Plan:
    plan = validating()
    services.attempt_reject(plan=plan, model="big-model", reasons=["unknown tool x"], output="{}",
                                 hints=["use file.list"], actor_label="runner r1")
    return plan


def accept() -> Plan:
    plan = validating(Agent.Kind.PERSONA)
    return services.plan_accept(plan=plan, spec=spec("go to store", "cook"), flags=[], model="m", kept=[],
                                     actor_label="runner r1")


def ask() -> Plan:
    return services.plan_ask(plan=validating(), question="Which folder?", model="m", actor_label="runner r1")


def fail() -> Plan:
    return services.plan_fail(plan=validating(), headline="no model answered", actor_label="runner r1")


def retry() -> Plan:
    plan = PlanFactory(agent=AgentFactory(kind=Agent.Kind.TOOL), status=Plan.Status.FAILED,
                       failure_reason="no model answered\nbig-model: 500",
                       retry_at=timezone.now() - timedelta(seconds=1))
    retried = services.plan_retry_start(agent=plan.agent, runner="runner r1")
    assert retried is not None
    return retried


def step_started() -> Plan:
    step = PlanStepFactory(plan=PlanFactory(status=Plan.Status.ACTIVE), tool="file.list")
    assert services.step_start(step=step, runner="runner r1") is not None
    return step.plan


def replan_scheduled() -> Plan:
    plan = PlanFactory(status=Plan.Status.ACTIVE)
    assert services.plan_replan_schedule(plan=plan, runner="runner r1", reason="steps 2 can never run") is not None
    return plan


WRITES: dict[str, tuple[Callable[[], Plan], str, Callable[[Plan], bool]]] = {
    # name: (the write, the event it records on the plan, what a user sees changed)
    "plan started": (start_new, PlanEvent.Kind.CREATED, lambda p: p.status == Plan.Status.VALIDATING),
    "next version started": (start_next, PlanEvent.Kind.CREATED,
                             lambda p: p.previous is not None and p.previous.status == Plan.Status.REPLANNED
                             and p.previous.events.filter(kind=PlanEvent.Kind.REPLANNED).exists()),
    "attempt rejected": (reject, PlanEvent.Kind.ATTEMPT_REJECTED, lambda p: p.retry_hints == ["use file.list"]),
    "plan accepted": (accept, PlanEvent.Kind.VALIDATED,
                      lambda p: p.status == Plan.Status.ACTIVE and p.steps.count() == 2),
    "question asked": (ask, PlanEvent.Kind.CLARIFICATION_ASKED,
                       lambda p: "asks: Which folder?" in Agent.objects.get(pk=p.agent_id).waiting_reason),
    "planning failed": (fail, PlanEvent.Kind.PLAN_FAILED,
                        lambda p: p.retry_at is not None
                        and Agent.objects.get(pk=p.agent_id).plan_retry_at == p.retry_at),
    "planning retried": (retry, PlanEvent.Kind.PLAN_RETRIED,
                         lambda p: p.status == Plan.Status.ACTIVE and p.replan_reason.startswith("automatic retry 1")),
    "tool step started": (step_started, PlanEvent.Kind.STEP_STARTED,
                          lambda p: p.steps.get().status == PlanStep.Status.RUNNING),
    "replan scheduled": (replan_scheduled, PlanEvent.Kind.REPLAN_REQUESTED,
                         lambda p: p.replan_reason == "steps 2 can never run"),
}


@pytest.mark.parametrize("name", list(WRITES))
def test_a_planner_write_records_its_event_and_pushes_after_commit(
    name: str, pushed: list[set[int]], django_capture_on_commit_callbacks: Any,
) -> None:
    write, kind, visible = WRITES[name]
    with django_capture_on_commit_callbacks(execute=False) as callbacks:
        plan = write()
    assert not pushed  # nothing is pushed before the commit
    for callback in callbacks:
        callback()
    plan = Plan.objects.get(pk=plan.pk)
    assert visible(plan)
    event = plan.events.get(kind=kind)
    assert event.actor_label == "runner r1" and event.agent_id == plan.agent_id
    assert any(plan.pk in plans for plans in pushed)


def test_plan_accept_inserts_all_its_steps_at_once(django_assert_max_num_queries: Any) -> None:
    small, big = validating(Agent.Kind.PERSONA), validating(Agent.Kind.PERSONA)
    with django_assert_max_num_queries(20) as few:
        services.plan_accept(plan=small, spec=spec("cook", "eat"), flags=[], model="m", kept=[], actor_label="r")
    with django_assert_max_num_queries(len(few.captured_queries)):
        services.plan_accept(plan=big, spec=spec(*["cook", "eat", "sleep", "work", "relax", "socialize"]),
                                  flags=[], model="m", kept=[], actor_label="r")
    assert big.steps.count() == 6


def test_a_replan_is_scheduled_once_and_not_on_a_plan_no_longer_active() -> None:
    plan = PlanFactory(status=Plan.Status.ACTIVE)
    services.plan_replan_schedule(plan=plan, runner="r", reason="steps 2 can never run")
    assert services.plan_replan_schedule(plan=plan, runner="r", reason="steps 2 can never run") is None
    cancelled = PlanFactory(status=Plan.Status.CANCELLED)
    assert services.plan_replan_schedule(plan=cancelled, runner="r", reason="x") is None
    assert PlanEvent.objects.filter(kind=PlanEvent.Kind.REPLAN_REQUESTED).count() == 1
    assert Plan.objects.get(pk=cancelled.pk).replan_reason == ""


def test_restatement_is_pushed_to_the_plan_page(pushed: list[set[int]], django_capture_on_commit_callbacks: Any) -> None:
    plan = validating()
    with django_capture_on_commit_callbacks(execute=True):
        services.plan_restatement_save(plan=plan, restatement={"who": "Archivist", "what": "list files"})
    plan.refresh_from_db()
    assert (plan.who, plan.what, plan.why) == ("Archivist", "list files", "")
    assert pushed == [{plan.pk}]


def test_a_retry_taken_meanwhile_records_nothing() -> None:
    plan = PlanFactory(agent=AgentFactory(kind=Agent.Kind.TOOL), status=Plan.Status.ACTIVE)
    Agent.objects.filter(pk=plan.agent_id).update(plan_retry_at=timezone.now() - timedelta(seconds=1))
    assert services.plan_retry_start(agent=plan.agent, runner="r") is None
    assert not PlanEvent.objects.filter(kind=PlanEvent.Kind.PLAN_RETRIED).exists()
    assert Agent.objects.get(pk=plan.agent_id).plan_retry_at is None  # the stale time is cleared
