"""The runner: leases keep an agent with one runner, agents are shared fairly among live runners, a slot
is refilled as soon as it frees, database errors are waited out, and /healthz counts live runners only."""

from __future__ import annotations

import asyncio
import logging
from datetime import timedelta
from typing import Any
from unittest import mock

import pytest
from agents.runner import Runner, agents_claim, agents_release, runner_gone, runner_heartbeat
from channels.db import database_sync_to_async
from django.db import OperationalError
from django.test import Client
from django.utils import timezone

from agents import runner as runner_module
from agents.models import Agent, RunnerHeartbeat
from tests.factories import AgentFactory, GoalFactory

pytestmark = pytest.mark.django_db


def test_two_runners_never_claim_the_same_agent() -> None:
    AgentFactory.create_batch(4, kind="tool")
    first = agents_claim(runner="a", limit=3, exclude=set())
    second = agents_claim(runner="b", limit=10, exclude=set())
    assert len(first) == 3 and len(second) == 1
    assert not set(first) & set(second)
    assert set(Agent.objects.filter(lease_owner="a").values_list("pk", flat=True)) == set(first)


def test_expired_lease_is_taken_over() -> None:
    agent = AgentFactory(kind="tool", lease_owner="dead-runner", lease_expires_at=timezone.now() - timedelta(seconds=1))
    assert agents_claim(runner="b", limit=5, exclude=set()) == [agent.pk]
    agent.refresh_from_db()
    assert agent.lease_owner == "b"


def test_live_lease_is_respected_and_release_frees_it() -> None:
    AgentFactory(kind="tool", lease_owner="a", lease_expires_at=timezone.now() + timedelta(seconds=30))
    assert agents_claim(runner="b", limit=5, exclude=set()) == []
    agents_release(runner="a")
    assert len(agents_claim(runner="b", limit=5, exclude=set())) == 1


def test_paused_and_not_due_agents_are_not_claimed() -> None:
    AgentFactory(kind="tool", status=Agent.Status.PAUSED)
    AgentFactory(kind="tool", next_cycle_at=timezone.now() + timedelta(hours=1))
    assert agents_claim(runner="a", limit=5, exclude=set()) == []


def test_claim_takes_never_run_agents_then_the_longest_overdue_first() -> None:
    now = timezone.now()
    late = AgentFactory(kind="tool", next_cycle_at=now - timedelta(minutes=5))
    later = AgentFactory(kind="tool", next_cycle_at=now - timedelta(minutes=1))
    new = AgentFactory(kind="tool", next_cycle_at=None)
    assert agents_claim(runner="a", limit=2, exclude=set()) == [new.pk, late.pk]
    assert agents_claim(runner="b", limit=2, exclude=set()) == [later.pk]


def test_claim_gives_back_the_leases_of_ended_cycles_so_another_runner_takes_them() -> None:
    agents = AgentFactory.create_batch(2, kind="tool")
    assert len(agents_claim(runner="a", limit=2, exclude=set())) == 2
    assert agents_claim(runner="b", limit=2, exclude=set()) == []
    # Runner a's cycle of the first agent ended: its next claim hands the lease back (and takes nothing).
    assert agents_claim(runner="a", limit=0, exclude=set(), release={agents[0].pk}) == []
    assert agents_claim(runner="b", limit=2, exclude=set()) == [agents[0].pk]


def test_fair_share_divides_running_agents_among_live_runners_only() -> None:
    AgentFactory.create_batch(60, kind="tool")
    now = timezone.now()
    RunnerHeartbeat.objects.create(name="b", seen_at=now)
    RunnerHeartbeat.objects.create(name="c", seen_at=now)
    RunnerHeartbeat.objects.create(name="killed", seen_at=now - timedelta(minutes=5))
    _held, share = runner_heartbeat(runner="a", in_flight=set(), cycles=0)
    assert share == 20  # 60 agents, 3 live runners (a, b, c); the killed one does not count
    # At its share, a runner drives its own agents and takes no more.
    mine = agents_claim(runner="a", limit=100, exclude=set(), share=share)
    assert len(mine) == 20
    Agent.objects.filter(pk__in=mine).update(next_cycle_at=None)
    assert sorted(agents_claim(runner="a", limit=100, exclude=set(), share=share)) == sorted(mine)


def test_a_runner_over_its_share_gives_the_excess_back_but_never_an_agent_under_way() -> None:
    agents = AgentFactory.create_batch(6, kind="tool")
    assert len(agents_claim(runner="a", limit=10, exclude=set())) == 6  # alone, it took them all
    RunnerHeartbeat.objects.create(name="b", seen_at=timezone.now())  # another runner joins
    busy = {agents[4].pk, agents[5].pk}
    held, share = runner_heartbeat(runner="a", in_flight=busy, cycles=6)
    assert (held, share) == (busy, 3)
    kept = set(Agent.objects.filter(lease_owner="a").values_list("pk", flat=True))
    assert kept == busy | {agents[0].pk}  # the two under way, then the earliest due
    assert len(agents_claim(runner="b", limit=10, exclude=set(), share=3)) == 3


def test_heartbeat_renews_leases_and_reports_one_taken_over() -> None:
    mine, taken = AgentFactory.create_batch(2, kind="tool")
    agents_claim(runner="a", limit=2, exclude=set())
    Agent.objects.filter(pk=taken.pk).update(lease_owner="b")  # a's lease expired during an outage; b took it
    Agent.objects.filter(pk=mine.pk).update(lease_expires_at=timezone.now() + timedelta(seconds=1))
    held, _share = runner_heartbeat(runner="a", in_flight={mine.pk, taken.pk}, cycles=3)
    assert held == {mine.pk}
    mine.refresh_from_db()
    assert mine.lease_expires_at is not None and mine.lease_expires_at > timezone.now() + timedelta(seconds=5)
    beat = RunnerHeartbeat.objects.get(name="a")
    assert (beat.in_flight, beat.cycles) == (2, 3)


def test_clean_stop_frees_all_agents_but_those_in_a_cycle_and_leaves_the_live_runners() -> None:
    busy, idle = AgentFactory.create_batch(2, kind="tool")
    agents_claim(runner="a", limit=2, exclude=set())
    runner_heartbeat(runner="a", in_flight={busy.pk}, cycles=0)
    runner_gone(runner="a", keep={busy.pk})
    assert set(Agent.objects.filter(lease_owner="a").values_list("pk", flat=True)) == {busy.pk}
    assert agents_claim(runner="b", limit=5, exclude=set()) == [idle.pk]
    assert not RunnerHeartbeat.objects.exists()


def test_healthz_needs_no_login_and_counts_only_live_runners() -> None:
    now = timezone.now()
    RunnerHeartbeat.objects.create(name="runner a", seen_at=now)
    RunnerHeartbeat.objects.create(name="runner b", seen_at=now - timedelta(seconds=1))
    RunnerHeartbeat.objects.create(name="runner killed", seen_at=now - timedelta(minutes=2))
    # Leases of a killed runner that have not expired yet do not make it count.
    AgentFactory(lease_owner="runner killed", lease_expires_at=now + timedelta(seconds=30))
    response = Client().get("/healthz")
    assert response.status_code == 200
    assert response.json() == {"status": "ok", "database": "ok", "runners": 2}


def test_healthz_outage_answers_503_without_connection_details() -> None:
    failure = OperationalError('connection to server at "db.internal" (10.0.0.7), port 5433 failed: '
                               'FATAL: database "planner_prod" does not exist')
    with mock.patch.object(RunnerHeartbeat.objects, "live", side_effect=failure):
        response = Client().get("/healthz")
    assert response.status_code == 503
    assert response.json() == {"status": "error", "database": "unreachable"}
    for secret in ("db.internal", "10.0.0.7", "5433", "planner_prod"):
        assert secret not in response.content.decode()


@pytest.mark.django_db(transaction=True)
async def test_runner_drives_each_agent_n_cycles_and_releases_leases() -> None:
    await database_sync_to_async(lambda: AgentFactory.create_batch(3, kind="tool", cycle_interval=0))()
    runner = Runner(runner_id="test-runner", cycles=2, tick=0.01)
    await runner.run()
    counts = await database_sync_to_async(lambda: sorted(Agent.objects.values_list("cycle_count", flat=True)))()
    assert counts == [2, 2, 2]
    assert not await database_sync_to_async(lambda: Agent.objects.exclude(lease_owner="").exists())()
    assert not await database_sync_to_async(lambda: RunnerHeartbeat.objects.exists())()


@pytest.mark.django_db(transaction=True)
async def test_a_freed_slot_is_refilled_at_once_not_on_the_next_tick() -> None:
    await database_sync_to_async(lambda: AgentFactory.create_batch(3, kind="tool", cycle_interval=0))()
    # One slot and an hour-long tick: six cycles one after another can only finish if every ended cycle
    # wakes the claim loop (a tick-driven loop would sit out the hour after the first).
    runner = Runner(runner_id="one-slot", cycles=2, concurrency=1, tick=3600)
    await asyncio.wait_for(runner.run(), timeout=60)
    assert sum(runner.done.values()) == 6


@pytest.mark.django_db(transaction=True)
async def test_an_agent_due_later_is_claimed_when_it_falls_due_not_on_the_tick() -> None:
    """With nothing waiting, a freed slot does not send the runner to the database: it asks again when the
    next agent falls due (here 0.3 s after each cycle), however long the tick."""
    await database_sync_to_async(lambda: AgentFactory(kind="tool", cycle_interval=0.3))()
    claims = 0
    real = runner_module.agents_claim_next

    def counted(**kwargs: Any) -> Any:
        nonlocal claims
        claims += 1
        return real(**kwargs)

    runner = Runner(runner_id="timely", cycles=3, tick=3600)
    with mock.patch.object(runner_module, "agents_claim_next", counted):
        await asyncio.wait_for(runner.run(), timeout=30)
    assert runner.done[next(iter(runner.done))] == 3
    assert claims <= 4  # one per cycle, and the one that finds the run done


@pytest.mark.django_db(transaction=True)
async def test_runner_waits_out_database_errors_and_carries_on(caplog: pytest.LogCaptureFixture) -> None:
    await database_sync_to_async(lambda: AgentFactory.create_batch(2, kind="tool", cycle_interval=0))()
    real_claim = runner_module.agents_claim
    failures = iter([True, True, True])

    def flaky_claim(**kwargs: Any) -> list[int]:
        if next(failures, False):
            raise OperationalError("terminating connection due to administrator command")
        return real_claim(**kwargs)

    runner = Runner(runner_id="flaky", cycles=1, tick=0.01)
    with mock.patch.object(runner_module, "agents_claim", flaky_claim), caplog.at_level(logging.WARNING, "planner.runner"):
        await asyncio.wait_for(runner.run(), timeout=60)
    assert sum(runner.done.values()) == 2
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
    runner = Runner(runner_id="bounded", cycles=1, tick=0.01)
    await asyncio.wait_for(runner.run(), timeout=60)
    assert len(llm_server.requests) == 12
    # Six agents at once, but never more than two calls to either model (so at most four in all).
    assert 2 <= llm_server.max_in_flight <= 4


@pytest.mark.django_db(transaction=True)
async def test_agents_waiting_for_models_hold_no_thread(settings: Any, llm_server: Any) -> None:
    """Twelve agents plan at once on two cycle threads: every restatement is in flight at the same time,
    which blocked threads could never do (two at most), and every plan is made."""
    import threading

    from planning.models import Plan

    await listing_agents(llm_server, 12, restate_delay=1.5, plan_delay=0.1)  # time for all twelve to ask
    settings.LLM_MODELS = {"planner": ["planner"], "fast": ["fast"]}
    settings.LLM_TIMEOUT_SECONDS = 30
    before = {t.ident for t in threading.enumerate()}
    runner = Runner(runner_id="parked", cycles=1, tick=0.01, concurrency=12, threads=2)
    await asyncio.wait_for(runner.run(), timeout=60)
    assert llm_server.max_in_flight == 12
    assert await database_sync_to_async(
        lambda: Plan.objects.filter(status=Plan.Status.AWAITING_APPROVAL).count())() == 12
    started = [t.name for t in threading.enumerate() if t.ident not in before and t.name.startswith("runner-cycle")]
    assert len(started) <= 2


def test_planning_left_by_a_dead_runner_fails_even_for_an_agent_no_runner_claims() -> None:
    """A paused agent is never claimed again: its plan must not stay "validating" past the lease."""
    from agents.runner import plans_orphaned_fail

    from planning.models import Plan
    from tests.factories import PlanFactory

    expired = timezone.now() - timedelta(seconds=1)
    old = timezone.now() - timedelta(hours=1)
    paused = AgentFactory(kind="tool", status=Agent.Status.PAUSED, lease_owner="dead-runner", lease_expires_at=expired)
    orphan = PlanFactory(agent=paused, status=Plan.Status.VALIDATING)
    held = AgentFactory(kind="tool", lease_owner="live-runner", lease_expires_at=timezone.now() + timedelta(minutes=1))
    under_way = PlanFactory(agent=held, status=Plan.Status.VALIDATING)
    external = AgentFactory(kind=Agent.Kind.EXTERNAL)
    api_planning = PlanFactory(agent=external, status=Plan.Status.VALIDATING)
    fresh_agent = AgentFactory(kind="tool")
    just_started = PlanFactory(agent=fresh_agent, status=Plan.Status.VALIDATING)
    Plan.objects.filter(pk__in=[orphan.pk, under_way.pk, api_planning.pk]).update(updated_at=old)

    assert plans_orphaned_fail(runner="sweeper") == 1
    orphan.refresh_from_db()
    assert orphan.status == Plan.Status.FAILED
    assert "planning interrupted" in orphan.failure_reason
    for plan in (under_way, api_planning, just_started):  # a live lease, the API's planning, a plan just begun
        plan.refresh_from_db()
        assert plan.status == Plan.Status.VALIDATING


def test_a_beat_landing_after_a_clean_stop_does_not_bring_the_runner_back() -> None:
    """A heartbeat still on its way when the runner stopped must not make it count as live afterwards."""
    runner_heartbeat(runner="stopping", in_flight=set(), cycles=3)
    runner_gone(runner="stopping", keep=set())
    runner_heartbeat(runner="stopping", in_flight=set(), cycles=3, create=False)
    assert not RunnerHeartbeat.objects.filter(name="stopping").exists()
    runner_heartbeat(runner="starting", in_flight=set(), cycles=0)  # a runner's first beat creates its row
    assert RunnerHeartbeat.objects.live().filter(name="starting").exists()


def test_cycle_threads_fit_the_connection_pool(settings: Any) -> None:
    """Each cycle thread may hold a connection: a runner never has more of them than its process's pool
    serves beside the loop's own database thread and pruning."""
    settings.RUNNER_THREADS = 8
    options = settings.DATABASES["default"].setdefault("OPTIONS", {})
    with mock.patch.dict(options, {"pool": {"max_size": 5}}):
        assert Runner(runner_id="small-pool").threads == 3
    with mock.patch.dict(options, {"pool": {"max_size": 2}}):
        assert Runner(runner_id="tiny-pool").threads == 1
    without = {k: v for k, v in options.items() if k != "pool"}
    with mock.patch.dict(options, without, clear=True):
        assert Runner(runner_id="no-pool").threads == 8
