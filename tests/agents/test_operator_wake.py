"""An operator's decision takes effect at once, not after the rest of the agent's cycle interval: every event with
a user as its actor sends `operator_acted` once its write commits (agents/signals.py), and both runtimes bring
the agent's next cycle forward (agents/services.py cycle_soon_on_decision in every process, then
runtime/embedded.py or runtime/tasks.py chain_soon_on_decision).
So a tool agent that waits for a person and nothing else cycles every RUNNER_WAITING_SECONDS at most, not every
two seconds (agents/services.py agent_cycle_count)."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any
from unittest import mock

import pytest
from channels.db import database_sync_to_async
from django.conf import settings
from django.db import transaction
from django.utils import timezone

from agents.models import Agent
from agents.services import agent_cycle_count, agent_cycle_soon
from agents.signals import operator_acted
from planning import services as planning
from planning.models import Plan, PlanEvent, PlanStep
from runtime import embedded
from runtime.embedded import Scheduler
from tests.factories import AgentFactory, PlanFactory, PlanStepFactory, UserFactory
from tests.runners import runagents, runner_env

pytestmark = pytest.mark.django_db

LONG_INTERVAL = 600.0  # seconds: far longer than any of these tests waits


@pytest.fixture
def acted() -> Iterator[list[int]]:
    """The agent ids `operator_acted` was sent for, in order."""
    seen: list[int] = []

    def receiver(sender: object, agent_id: int, **kwargs: Any) -> None:
        seen.append(agent_id)

    operator_acted.connect(receiver, dispatch_uid="test.acted")
    yield seen
    operator_acted.disconnect(dispatch_uid="test.acted")


def waiting_plan(*, interval: float = LONG_INTERVAL) -> Plan:
    """A tool agent, not due for `interval` seconds (as after the cycle that planned), whose plan of one
    `file.list` step awaits approval."""
    agent = AgentFactory(kind=Agent.Kind.TOOL, cycle_interval=interval,
                         next_cycle_at=timezone.now() + timedelta(seconds=interval),
                         waiting_reason="plan v1 awaits approval")
    plan = PlanFactory(agent=agent, status=Plan.Status.AWAITING_APPROVAL, approval_mode=Plan.ApprovalMode.PENDING)
    PlanStepFactory(plan=plan, key="1", position=1, tool="file.list", tool_input={"path": "."},
                    requires_permission=False)
    return plan


def test_an_operators_decision_is_sent_after_commit_and_a_runners_event_is_not(
        acted: list[int], django_capture_on_commit_callbacks: Any) -> None:
    plan = waiting_plan()
    with django_capture_on_commit_callbacks(execute=True):
        planning.event_record(plan=plan, kind=PlanEvent.Kind.VALIDATED, actor_label="runner r1")
    assert acted == []  # the runner's own work: its chain goes on as it is
    with django_capture_on_commit_callbacks(execute=False) as callbacks:
        planning.plan_approve(plan=plan, user=UserFactory(role="operators"), mode=Plan.ApprovalMode.ALL)
        assert acted == []  # not before the commit
    for callback in callbacks:
        callback()
    assert acted == [plan.agent_id]


def test_a_decision_rolled_back_sends_nothing(acted: list[int]) -> None:
    plan = waiting_plan()
    with pytest.raises(RuntimeError), transaction.atomic():
        planning.plan_approve(plan=plan, user=UserFactory(role="operators"), mode=Plan.ApprovalMode.ALL)
        raise RuntimeError("the request failed after the approval")
    assert acted == []
    assert Plan.objects.get(pk=plan.pk).status == Plan.Status.AWAITING_APPROVAL


def test_a_goal_given_and_an_admin_edit_are_decisions_too(acted: list[int],
                                                           django_capture_on_commit_callbacks: Any) -> None:
    agent = AgentFactory(kind=Agent.Kind.TOOL)
    user = UserFactory(role="operators")
    with django_capture_on_commit_callbacks(execute=True):
        planning.agent_give_goal(agent=agent, user=user, description="Tidy the workspace")
    from planning.services.audit import admin_event_record

    with django_capture_on_commit_callbacks(execute=True):
        admin_event_record(user=user, agent_id=agent.pk, plan_id=None, what="cycle interval",
                           diff={"cycle_interval": [2.0, 5.0]})
    assert acted == [agent.pk, agent.pk]


def test_only_a_driven_agents_later_cycle_is_brought_forward() -> None:
    later = timezone.now() + timedelta(seconds=LONG_INTERVAL)
    tool = AgentFactory(kind=Agent.Kind.TOOL, next_cycle_at=later)
    paused = AgentFactory(kind=Agent.Kind.TOOL, status=Agent.Status.PAUSED, next_cycle_at=later)
    external = AgentFactory(kind=Agent.Kind.EXTERNAL, next_cycle_at=later)
    overdue_at = timezone.now() - timedelta(seconds=30)
    overdue = AgentFactory(kind=Agent.Kind.PERSONA, next_cycle_at=overdue_at)
    assert [agent_cycle_soon(agent_id=a.pk) for a in (tool, paused, external, overdue)] == [True, False, False, False]
    rows = dict(Agent.objects.values_list("pk", "next_cycle_at"))
    assert rows[tool.pk] <= timezone.now()
    assert rows[paused.pk] == later and rows[external.pk] == later
    assert rows[overdue.pk] == overdue_at  # already due: its place among the overdue is kept


def step_status(plan: Plan) -> str:
    return PlanStep.objects.get(plan=plan).status


async def step_done(plan: Plan, *, within: float = 30.0) -> None:
    """Wait for the plan's step to be done; fail after `within` seconds (the agent's interval is ten minutes)."""
    deadline = time.monotonic() + within
    while await database_sync_to_async(step_status)(plan) != PlanStep.Status.COMPLETED:
        assert time.monotonic() < deadline, "the approved step waited for the agent's interval"
        await asyncio.sleep(0.05)


@pytest.mark.django_db(transaction=True)
async def test_the_embedded_scheduler_runs_an_approved_step_at_once() -> None:
    """The agent is due in ten minutes and the scheduler looks on its own once an hour: only the approval
    can start the cycle that runs the step."""
    plan, user = await database_sync_to_async(lambda: (waiting_plan(), UserFactory(role="operators")))()
    scheduler = Scheduler(runner_id="awake", tick=3600, notify=False, prune_seconds=0)
    task = asyncio.create_task(scheduler.run())
    try:
        await asyncio.sleep(0.3)
        assert await database_sync_to_async(step_status)(plan) == PlanStep.Status.PENDING  # nothing due
        await database_sync_to_async(planning.plan_approve)(plan=plan, user=user, mode=Plan.ApprovalMode.ALL)
        await step_done(plan)
    finally:
        scheduler.stop()
        await asyncio.wait_for(task, timeout=30)
    assert sum(scheduler.done.values()) >= 1
    agent = await database_sync_to_async(Agent.objects.get)(pk=plan.agent_id)
    assert agent.next_cycle_at > timezone.now() + timedelta(seconds=LONG_INTERVAL / 2)  # then its interval again


@pytest.mark.django_db(transaction=True)
async def test_a_decision_made_during_the_agents_cycle_is_not_lost() -> None:
    """The cycle under way read the plan before the approval, and ends by setting its next cycle ten minutes
    ahead: the approval still makes the agent due when that cycle ends."""
    plan, user = await database_sync_to_async(lambda: (waiting_plan(), UserFactory(role="operators")))()
    await database_sync_to_async(Agent.objects.filter(pk=plan.agent_id).update)(next_cycle_at=None)  # due now
    started, approved = threading.Event(), threading.Event()
    real = embedded.cycle_run

    def cycle_run(agent_id: int, runner: str, kind: str = "") -> str:
        if not started.is_set():  # the first cycle: it read the plan awaiting approval, and waits on
            started.set()
            assert approved.wait(30)
            agent_cycle_count(agent=Agent.objects.get(pk=agent_id))
            return "waiting: plan awaiting approval"
        return real(agent_id, runner, kind)

    scheduler = Scheduler(runner_id="awake", tick=3600, notify=False, prune_seconds=0)
    with mock.patch.object(embedded, "cycle_run", cycle_run):
        task = asyncio.create_task(scheduler.run())
        try:
            assert await asyncio.to_thread(started.wait, 30)
            await database_sync_to_async(planning.plan_approve)(plan=plan, user=user, mode=Plan.ApprovalMode.ALL)
            approved.set()
            await step_done(plan)
        finally:
            approved.set()
            scheduler.stop()
            await asyncio.wait_for(task, timeout=30)


@pytest.mark.skipif(settings.SCALE_OUT, reason="on the scale-out stack `runagents` is the engine's worker (the test below)")
@pytest.mark.django_db(transaction=True)
def test_a_runagents_process_of_its_own_on_sqlite_runs_an_approved_step_at_its_next_tick(tmp_path: Path) -> None:
    """The decision is made in another process than the scheduler's (a web process beside `runagents`): the
    agent is due in the database, and the scheduler finds it when it next looks (RUNNER_TICK_SECONDS)."""
    plan = waiting_plan()
    runner = runagents(runner_env(tmp_path), "--runner-id", "beside")
    try:
        assert runner.stdout is not None and "started" in runner.stdout.readline()
        planning.plan_approve(plan=plan, user=UserFactory(role="operators"), mode=Plan.ApprovalMode.ALL)
        asyncio.run(step_done(plan))
    finally:
        runner.terminate()
        _out, err = runner.communicate(timeout=60)
    assert "Traceback" not in err, err


@pytest.mark.skipif(not settings.SCALE_OUT, reason="the job engine's workers: the scale-out stack (PostgreSQL); "
                                                     "it runs in the scale-out pass of `make test`")
@pytest.mark.django_db(transaction=True)
def test_a_runner_process_runs_an_approved_step_at_once(tmp_path: Path) -> None:
    """The agent's next cycle waits in the engine for ten minutes: the approval replaces it by one due now, and
    the agent's chain goes on from there with one cycle waiting, not two."""
    from procrastinate.contrib.django.models import ProcrastinateJob

    from runtime.tasks import agent_lock, app_of_jobs, cycle_defer

    plan = waiting_plan()
    # Its chain as the cycle that planned left it: the first cycle its creation deferred is gone, the next waits.
    for job_id in ProcrastinateJob.objects.filter(lock=agent_lock(plan.agent_id)).values_list("id", flat=True):
        app_of_jobs().job_manager.cancel_job_by_id(job_id, delete_job=True)
    assert cycle_defer(plan.agent_id, after=LONG_INTERVAL, kind=Agent.Kind.TOOL)
    runner = runagents(runner_env(tmp_path), "--runner-id", "awake")
    try:
        deadline = time.monotonic() + 60
        assert runner.stdout is not None and "started" in runner.stdout.readline()
        planning.plan_approve(plan=plan, user=UserFactory(role="operators"), mode=Plan.ApprovalMode.ALL)
        while step_status(plan) != PlanStep.Status.COMPLETED:
            assert time.monotonic() < deadline, "the approved step did not run"
            time.sleep(0.05)
        while ProcrastinateJob.objects.filter(lock=agent_lock(plan.agent_id), status="doing").exists():
            assert time.monotonic() < deadline, "the cycle did not end"
            time.sleep(0.05)
        waiting = ProcrastinateJob.objects.filter(lock=agent_lock(plan.agent_id), status="todo")
        assert waiting.count() == 1
        assert waiting.get().scheduled_at > timezone.now() + timedelta(seconds=LONG_INTERVAL / 2)
    finally:
        runner.terminate()
        _out, err = runner.communicate(timeout=60)
    assert "Traceback" not in err, err


def due_in(agent: Agent) -> float:
    """Seconds until the agent's next cycle."""
    agent.refresh_from_db()
    assert agent.next_cycle_at is not None
    return (agent.next_cycle_at - timezone.now()).total_seconds()


def test_a_tool_agent_waiting_for_a_person_comes_back_after_the_waiting_time(settings: Any) -> None:
    from runtime.cycle import agent_cycle

    settings.RUNNER_WAITING_SECONDS = 30.0
    plan = waiting_plan(interval=2.0)
    assert agent_cycle(agent_id=plan.agent_id, runner="r", kind="tool") == "waiting: plan awaiting approval"
    assert 25 < due_in(plan.agent) <= 30

    # A failed planning's automatic retry, due sooner, keeps its time.
    Agent.objects.filter(pk=plan.agent_id).update(plan_retry_at=timezone.now() + timedelta(seconds=10))
    agent_cycle(agent_id=plan.agent_id, runner="r", kind="tool")
    assert 5 < due_in(plan.agent) <= 10

    # Steps still to do behind a step awaiting approval wait for a person too; a runnable one does not.
    Agent.objects.filter(pk=plan.agent_id).update(plan_retry_at=None)
    Plan.objects.filter(pk=plan.pk).update(status=Plan.Status.ACTIVE, approval_mode=Plan.ApprovalMode.STEP)
    PlanStep.objects.filter(plan=plan).update(status=PlanStep.Status.AWAITING_APPROVAL)
    agent_cycle(agent_id=plan.agent_id, runner="r", kind="tool")
    assert 25 < due_in(plan.agent) <= 30
    PlanStep.objects.filter(plan=plan).update(status=PlanStep.Status.PENDING, approved_by=UserFactory())
    assert agent_cycle(agent_id=plan.agent_id, runner="r", kind="tool").startswith("1 done")
    assert due_in(plan.agent) <= 2


def test_the_waiting_time_off_keeps_the_interval(settings: Any) -> None:
    from runtime.cycle import agent_cycle

    settings.RUNNER_WAITING_SECONDS = 0.0
    plan = waiting_plan(interval=2.0)
    agent_cycle(agent_id=plan.agent_id, runner="r", kind="tool")
    assert due_in(plan.agent) <= 2


@pytest.mark.skipif(not settings.SCALE_OUT, reason="the job engine's chains: the scale-out stack (PostgreSQL); "
                                                     "it runs in the scale-out pass of `make test`")
def test_a_chain_defers_the_next_cycle_of_an_agent_waiting_for_a_person_after_the_waiting_time() -> None:
    from procrastinate.contrib.django.models import ProcrastinateJob

    from runtime import tasks

    plan = waiting_plan(interval=2.0)
    for job_id in ProcrastinateJob.objects.filter(lock=tasks.agent_lock(plan.agent_id)).values_list("id", flat=True):
        tasks.app_of_jobs().job_manager.cancel_job_by_id(job_id, delete_job=True)  # the first, from its creation
    context = mock.Mock(additional_context={"runner": "test-runner"}, worker_name="w")
    assert tasks.agent_cycle_run(context, plan.agent_id, "tool") == "waiting: plan awaiting approval"
    job = ProcrastinateJob.objects.get(lock=tasks.agent_lock(plan.agent_id), status="todo")
    assert (job.scheduled_at - timezone.now()).total_seconds() > settings.RUNNER_WAITING_SECONDS - 5
