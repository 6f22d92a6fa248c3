"""The embedded runtime (runtime/embedded.py): one process drives every agent as it falls due, one
cycle at a time per agent; a slot is refilled as soon as it frees; database errors are waited out; planning
cut off when the process last stopped fails with its reason; /healthz counts the process's scheduler."""

from __future__ import annotations

import asyncio
import logging
from datetime import timedelta
from typing import Any
from unittest import mock

import pytest
from channels.db import database_sync_to_async
from django.conf import settings
from django.db import OperationalError
from django.test import Client
from django.utils import timezone

from agents.models import Agent
from planning.models import Plan
from runtime import embedded
from runtime.cycles import plans_orphaned_fail
from runtime.embedded import Scheduler, agents_due
from tests.factories import AgentFactory, GoalFactory, PlanFactory

pytestmark = pytest.mark.django_db


def test_due_agents_are_never_run_ones_then_the_longest_overdue() -> None:
    now = timezone.now()
    late = AgentFactory(kind="tool", next_cycle_at=now - timedelta(minutes=5))
    AgentFactory(kind="tool", next_cycle_at=now - timedelta(minutes=1))
    new = AgentFactory(kind="tool", next_cycle_at=None)
    soon = now + timedelta(minutes=3)
    AgentFactory(kind="tool", next_cycle_at=soon)
    due, later = agents_due(exclude=set(), limit=2)
    assert [d.pk for d in due] == [new.pk, late.pk]
    assert later is not None and later <= now  # the overdue one left out falls due first


def test_paused_external_and_busy_agents_are_not_due() -> None:
    AgentFactory(kind="tool", status=Agent.Status.PAUSED)
    AgentFactory(kind=Agent.Kind.EXTERNAL)
    busy = AgentFactory(kind="tool")
    assert agents_due(exclude={busy.pk}, limit=5) == ([], None)


@pytest.mark.skipif(settings.SCALE_OUT, reason="the scale-out stack counts the engine's workers (tests/agents/test_engine.py)")
def test_healthz_needs_no_login_and_counts_the_running_scheduler() -> None:
    assert Client().get("/healthz").json() == {"status": "ok", "database": "ok", "runners": 0}
    with mock.patch.object(embedded, "current", Scheduler(runner_id="here")):
        response = Client().get("/healthz")
    assert response.status_code == 200
    assert response.json() == {"status": "ok", "database": "ok", "runners": 1}


def test_healthz_outage_answers_503_without_connection_details() -> None:
    failure = OperationalError('connection to server at "db.internal" (10.0.0.7), port 5433 failed: '
                               'FATAL: database "planner_prod" does not exist')
    with mock.patch("planner_site.health.runners_live", side_effect=failure):
        response = Client().get("/healthz")
    assert response.status_code == 503
    assert response.json() == {"status": "error", "database": "unreachable"}
    for secret in ("db.internal", "10.0.0.7", "5433", "planner_prod"):
        assert secret not in response.content.decode()


@pytest.mark.django_db(transaction=True)
async def test_scheduler_drives_each_agent_n_cycles() -> None:
    await database_sync_to_async(lambda: AgentFactory.create_batch(3, kind="tool", cycle_interval=0))()
    scheduler = Scheduler(runner_id="test-runner", cycles=2, tick=0.01)
    await asyncio.wait_for(scheduler.run(), timeout=60)
    counts = await database_sync_to_async(lambda: sorted(Agent.objects.values_list("cycle_count", flat=True)))()
    assert counts == [2, 2, 2]
    assert embedded.current is None  # a stopped scheduler no longer counts as a runner


@pytest.mark.django_db(transaction=True)
async def test_personas_due_together_run_in_passes_each_cycle_once() -> None:
    """As on the scale-out stack, the personas due together run as one pass (one read, one transaction); each
    still has its cycles one at a time, numbered, none doubled or lost; a tool agent runs its own."""
    from agents.models import Experience
    from tests.runners import personas

    agents = await database_sync_to_async(personas)(4)
    tool = await database_sync_to_async(lambda: AgentFactory(kind="tool", cycle_interval=0))()
    passes: list[list[int]] = []
    real = embedded.personas_run

    def watched(agent_ids: list[int], runner: str) -> Any:
        passes.append(list(agent_ids))
        return real(agent_ids, runner)

    scheduler = Scheduler(runner_id="passes", cycles=3, tick=0.01)
    with mock.patch.object(embedded, "personas_run", watched):
        await asyncio.wait_for(scheduler.run(), timeout=60)

    def check() -> None:
        for agent in agents:
            agent.refresh_from_db()
            cycles = sorted(Experience.objects.filter(agent=agent).values_list("cycle", flat=True))
            assert agent.cycle_count >= 3 and cycles == list(range(1, agent.cycle_count + 1))
        tool.refresh_from_db()
        assert tool.cycle_count >= 3

    await database_sync_to_async(check)()
    assert any(len(ids) > 1 for ids in passes)  # several personas in one pass
    assert all(tool.pk not in ids for ids in passes)
    assert all(len(set(ids)) == len(ids) for ids in passes)


@pytest.mark.django_db(transaction=True)
async def test_an_agent_never_runs_two_cycles_at_once() -> None:
    agent = await database_sync_to_async(lambda: AgentFactory(kind="tool", cycle_interval=0))()
    running = 0
    most = 0
    real = embedded.cycle_run

    def watched(agent_id: int, runner: str, kind: str = "") -> str:
        nonlocal running, most
        running += 1
        most = max(most, running)
        try:
            import time

            time.sleep(0.05)
            return real(agent_id, runner, kind)
        finally:
            running -= 1

    scheduler = Scheduler(runner_id="one-at-a-time", cycles=5, tick=0.001)
    with mock.patch.object(embedded, "cycle_run", watched):
        await asyncio.wait_for(scheduler.run(), timeout=60)
    assert scheduler.done[agent.pk] == 5
    assert most == 1


@pytest.mark.django_db(transaction=True)
async def test_a_freed_slot_is_refilled_at_once_not_on_the_next_tick() -> None:
    await database_sync_to_async(lambda: AgentFactory.create_batch(3, kind="tool", cycle_interval=0))()
    # One slot and an hour-long tick: six cycles one after another can only finish if every ended cycle
    # wakes the loop (a tick-driven loop would sit out the hour after the first).
    scheduler = Scheduler(runner_id="one-slot", cycles=2, concurrency=1, tick=3600)
    await asyncio.wait_for(scheduler.run(), timeout=60)
    assert sum(scheduler.done.values()) == 6


async def looks_of(scheduler: Scheduler) -> int:
    """Run the scheduler to its end; how many times it looked in the database for due agents."""
    looks = 0
    real = embedded.agents_due

    def counted(**kwargs: Any) -> Any:
        nonlocal looks
        looks += 1
        return real(**kwargs)

    with mock.patch.object(embedded, "agents_due", counted):
        await asyncio.wait_for(scheduler.run(), timeout=30)
    return looks


@pytest.mark.django_db(transaction=True)
async def test_an_agent_due_later_runs_when_it_falls_due_not_on_the_tick() -> None:
    """With nothing waiting, an ended cycle does not send the scheduler to the database: it looks again
    when the next agent falls due (here 0.3 s after each cycle), however long the tick."""
    await database_sync_to_async(lambda: AgentFactory(kind="tool", cycle_interval=0.3))()
    scheduler = Scheduler(runner_id="timely", cycles=3, tick=3600)
    looks = await looks_of(scheduler)
    assert scheduler.done[next(iter(scheduler.done))] == 3
    assert looks <= 5  # about one per cycle, and the one that finds the run done


@pytest.mark.django_db(transaction=True)
async def test_an_agent_that_had_its_cycles_sends_the_scheduler_to_the_database_no_more() -> None:
    """With --cycles, an agent whose cycles are done falls due no more for this scheduler: its cycle's end is no
    reason to look again (a round of many agents looked once per ended cycle), only the last one's end is (to
    find the run done)."""
    await database_sync_to_async(lambda: AgentFactory.create_batch(5, kind="tool", cycle_interval=0))()
    scheduler = Scheduler(runner_id="once-each", cycles=1, tick=3600)
    looks = await looks_of(scheduler)
    assert sum(scheduler.done.values()) == 5
    assert looks == 2  # the one that starts the five, the one that finds the run done


@pytest.mark.django_db(transaction=True)
async def test_scheduler_waits_out_database_errors_and_carries_on(caplog: pytest.LogCaptureFixture) -> None:
    await database_sync_to_async(lambda: AgentFactory.create_batch(2, kind="tool", cycle_interval=0))()
    real = embedded.agents_due
    failures = iter([True, True, True])

    def flaky(**kwargs: Any) -> Any:
        if next(failures, False):
            raise OperationalError("terminating connection due to administrator command")
        return real(**kwargs)

    scheduler = Scheduler(runner_id="flaky", cycles=1, tick=0.01)
    with mock.patch.object(embedded, "agents_due", flaky), caplog.at_level(logging.WARNING, "planner.runner"):
        await asyncio.wait_for(scheduler.run(), timeout=60)
    assert sum(scheduler.done.values()) == 2
    tries = [r.getMessage() for r in caplog.records if "database unreachable" in r.getMessage()]
    assert len(tries) == 3 and "try 3" in tries[-1]
    assert any("answers again" in r.getMessage() for r in caplog.records)


async def listing_agents(llm_server: Any, count: int, *, restate_delay: float, plan_delay: float) -> None:
    """`count` tool agents with the goal "List the workspace", and the server's answers for each: a
    restatement from the "fast" model, a one-step plan from the "planner" model."""
    from tests.llm_server import answer

    restate = '<json>{"who": "A", "what": "list", "when": "now", "where": "here", "why": "asked"}</json>'
    plan = ('<json>{"goal": "List", "steps": [{"id": "1", "tool": "file.list", "intent": "List the files", '
            '"input": {"path": "."}, "requiresPermission": false}]}</json>')

    def agents() -> None:
        for agent in AgentFactory.create_batch(count, kind=Agent.Kind.TOOL, cycle_interval=0):
            GoalFactory(agent=agent, description="List the workspace", source_needs=[])

    await database_sync_to_async(agents)()
    llm_server.script("fast", *[answer(restate, delay=restate_delay) for _ in range(count)])
    llm_server.script("planner", *[answer(plan, delay=plan_delay) for _ in range(count)])


@pytest.mark.django_db(transaction=True)
async def test_calls_to_one_model_are_bounded_per_process(settings: Any, llm_server: Any) -> None:
    await listing_agents(llm_server, 6, restate_delay=0.2, plan_delay=0.2)
    settings.OPENAI_BASE_URL, settings.OPENAI_API_KEY = llm_server.base_url, "k"
    settings.LLM_MODELS = {"planner": ["planner"], "fast": ["fast"]}
    settings.LLM_CONCURRENCY_PER_MODEL = 2
    scheduler = Scheduler(runner_id="bounded", cycles=1, tick=0.01)
    await asyncio.wait_for(scheduler.run(), timeout=60)
    assert len(llm_server.requests) == 12
    # Six agents at once, but never more than two calls to either model (so at most four in all).
    assert 2 <= llm_server.max_in_flight <= 4


@pytest.mark.django_db(transaction=True)
async def test_agents_wait_for_their_models_together(settings: Any, llm_server: Any) -> None:
    """Twelve agents plan at once: every restatement is in flight at the same time, and every plan is made."""
    await listing_agents(llm_server, 12, restate_delay=1.5, plan_delay=0.1)  # time for all twelve to ask
    settings.LLM_MODELS = {"planner": ["planner"], "fast": ["fast"]}
    settings.LLM_TIMEOUT_SECONDS = 30
    scheduler = Scheduler(runner_id="together", cycles=1, tick=0.01, concurrency=12)
    await asyncio.wait_for(scheduler.run(), timeout=60)
    assert llm_server.max_in_flight == 12
    assert await database_sync_to_async(
        lambda: Plan.objects.filter(status=Plan.Status.AWAITING_APPROVAL).count())() == 12


def test_planning_left_by_a_dead_cycle_fails_for_an_agent_no_cycle_drives() -> None:
    """A paused agent is driven no more: its plan must not stay "validating" for good."""
    old = timezone.now() - timedelta(hours=1)
    paused = AgentFactory(kind="tool", status=Agent.Status.PAUSED)
    orphan = PlanFactory(agent=paused, status=Plan.Status.VALIDATING)
    driven = AgentFactory(kind="tool")
    under_way = PlanFactory(agent=driven, status=Plan.Status.VALIDATING)
    external = AgentFactory(kind=Agent.Kind.EXTERNAL)
    api_planning = PlanFactory(agent=external, status=Plan.Status.VALIDATING)
    fresh_agent = AgentFactory(kind="tool")
    just_started = PlanFactory(agent=fresh_agent, status=Plan.Status.VALIDATING)
    Plan.objects.filter(pk__in=[orphan.pk, under_way.pk, api_planning.pk]).update(updated_at=old)

    assert plans_orphaned_fail(runner="sweeper", busy={driven.pk}) == 1
    orphan.refresh_from_db()
    assert orphan.status == Plan.Status.FAILED
    assert "planning interrupted" in orphan.failure_reason
    for plan in (under_way, api_planning, just_started):  # a cycle under way, the API's planning, a plan just begun
        plan.refresh_from_db()
        assert plan.status == Plan.Status.VALIDATING


@pytest.mark.django_db(transaction=True)
async def test_a_restarted_process_fails_the_planning_it_left_and_plans_again() -> None:
    """The embedded process is the only driver: planning "validating" when it starts was cut off by its
    last stop, whatever its age, and the agent plans again."""
    def left_behind() -> Plan:
        agent = AgentFactory(kind="tool", cycle_interval=0)
        goal = GoalFactory(agent=agent, description="List the workspace", source_needs=[])
        return PlanFactory(agent=agent, goal=goal, status=Plan.Status.VALIDATING)

    plan = await database_sync_to_async(left_behind)()
    scheduler = Scheduler(runner_id="restarted", cycles=1, tick=0.01)
    await asyncio.wait_for(scheduler.run(), timeout=60)
    await database_sync_to_async(plan.refresh_from_db)()
    assert plan.status == Plan.Status.FAILED
    assert plan.failure_reason.startswith("planning interrupted")


@pytest.mark.django_db(transaction=True)
@pytest.mark.skipif(settings.SCALE_OUT, reason="embedded stack only: on the scale-out stack runagents is a worker "
                                              "whose changes reach open pages through Redis")
def test_runagents_on_sqlite_says_pages_show_its_changes_when_reloaded(tmp_path: Any) -> None:
    """`runagents` on SQLite still drives the agents, and says at start that open pages show its changes on reload
    (no socket between processes: nothing is listened on or sent to)."""
    from tests.runners import personas, runagents, runner_env

    agent = personas(1)[0]
    runner = runagents(runner_env(tmp_path), "--cycles", "1", "--runner-id", "alone")
    _out, err = runner.communicate(timeout=120)
    assert runner.returncode == 0, err
    lines = [line for line in err.splitlines() if "embedded stack: open pages show this process's changes" in line]
    assert len(lines) == 1, err
    assert "manage.py serve" in lines[0] and "scale-out" in lines[0]
    agent.refresh_from_db()
    assert agent.cycle_count >= 1  # it drove the agent
    assert not [path for path in tmp_path.rglob("*") if path.is_socket()]
