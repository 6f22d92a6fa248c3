"""The scale-out runtime on the job engine (runtime/tasks.py, worker.py), in this process against the
test database: personas are driven in passes, one chain of passes per shard; every other driven agent has one
chain of cycles, started by a start pass of its shard (which plans the first goals of the agents starting
together), runs them one at a time, and the chain stops for a paused agent and starts again when it runs;
/healthz counts the engine's live workers."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from channels.db import database_sync_to_async as sync_to_async
from django.conf import settings
from django.test import Client

from agents.models import Agent, Experience

pytestmark = [
    pytest.mark.skipif(not settings.SCALE_OUT, reason="the job engine runs on PostgreSQL: the scale-out pass of "
                                                       "`make test` runs these"),
    pytest.mark.django_db(transaction=True),
]


def cycle_jobs(prefix: str = "agent:") -> list[tuple[str, str]]:
    from procrastinate.contrib.django.models import ProcrastinateJob

    return sorted(ProcrastinateJob.objects.filter(lock__startswith=prefix).values_list("lock", "status"))


async def run_worker(*, cycles: int, timeout: float = 60) -> None:
    from runtime.worker import worker_run

    await asyncio.wait_for(worker_run(runner_id="test-worker", stop=asyncio.Event(), cycles=cycles), timeout)


async def test_each_agent_runs_its_cycles_once_each_with_one_chain() -> None:
    from tests.factories import AgentFactory
    from tests.runners import personas

    agents = await sync_to_async(personas)(5)
    tool = await sync_to_async(AgentFactory)(kind="tool", cycle_interval=0)
    await run_worker(cycles=3)

    def check() -> None:
        for agent in [*agents, tool]:
            agent.refresh_from_db()
            assert agent.cycle_count >= 3
        for agent in agents:
            cycles = sorted(Experience.objects.filter(agent=agent).values_list("cycle", flat=True))
            assert cycles == list(range(1, agent.cycle_count + 1))  # none doubled, none lost
        # One next pass waiting per shard of personas and one next cycle for the tool agent (the queueing
        # locks), none left "doing" by a clean stop; a persona has a cycle job of its own only while its
        # cycle needs one (a plan to make), never a chain.
        # Five personas make one shard (shards_wanted: far below RUNNER_SHARD_CYCLES_PER_SECOND).
        assert cycle_jobs("personas:") == [("personas:0/1", "todo")]
        assert cycle_jobs() == [(f"agent:{tool.pk}", "todo")]

    await sync_to_async(check)()


async def test_a_paused_agents_chain_ends_and_a_resumed_one_gets_a_new_chain() -> None:
    from runtime.tasks import agents_unscheduled, cycle_defer
    from tests.factories import AgentFactory

    paused = await sync_to_async(AgentFactory)(kind="tool", cycle_interval=0, status=Agent.Status.PAUSED)
    assert await sync_to_async(cycle_defer)(paused.pk)  # e.g. deferred just before the operator paused it
    await run_worker(cycles=1)  # no driven agent: returns once the paused agent's cycle ran
    assert await sync_to_async(cycle_jobs)() == []  # "not running": no next cycle

    await sync_to_async(Agent.objects.filter(pk=paused.pk).update)(status=Agent.Status.RUNNING)
    assert await sync_to_async(agents_unscheduled)() == [paused.pk]
    assert await sync_to_async(cycle_defer)(paused.pk)
    assert not await sync_to_async(cycle_defer)(paused.pk)  # one waiting cycle per agent
    assert await sync_to_async(agents_unscheduled)() == []


async def test_a_tool_agent_created_or_resumed_has_its_chain_started_at_once() -> None:
    """No wait for the sweep (up to RUNNER_SWEEP_SECONDS): the write that makes a tool agent driven, from any
    process, defers a start pass of its shard when it commits, and that pass defers the agent's first cycle. A
    persona waits for its shard's pass, a paused or external agent for nothing, and an edit that leaves the status
    alone defers nothing."""
    from django.contrib.auth.models import User
    from procrastinate.contrib.django.models import ProcrastinateJob

    from planning.services import agent_set_status
    from runtime.tasks import start_lock, start_shard, tools_start_pass
    from tests.factories import AgentFactory

    def starts(*agents: Agent) -> list[tuple[str, str]]:
        return sorted({(start_lock(*start_shard(a.pk)), "todo") for a in agents})

    def check() -> None:
        tool = AgentFactory(kind="tool")
        AgentFactory(kind="persona")
        AgentFactory(kind="external")
        paused = AgentFactory(kind="tool", status=Agent.Status.PAUSED)
        assert cycle_jobs("starts:") == starts(tool)
        assert cycle_jobs() == []

        paused.name = "renamed"
        paused.save(update_fields=["name"])
        assert cycle_jobs("starts:") == starts(tool)
        paused.status = Agent.Status.RUNNING  # set running by a write of its status (an import, a script)
        paused.save(update_fields=["status"])
        assert cycle_jobs("starts:") == starts(tool, paused)
        assert cycle_jobs() == []

        # The start passes (here run in line) give each agent, with no goal to plan, its first cycle at once.
        passes = [tools_start_pass(*shard, runner="test") for shard in {start_shard(a.pk) for a in (tool, paused)}]
        assert [sum(counts) for counts in zip(*passes, strict=True)] == [0, 2, 0]  # none planned, both chained
        assert cycle_jobs() == sorted([(f"agent:{tool.pk}", "todo"), (f"agent:{paused.pk}", "todo")])
        assert tools_start_pass(*start_shard(tool.pk), runner="test") == (0, 0, False)  # chained: not taken again

        # An operator who pauses and resumes it brings its cycle forward at once (agents/signals.py): still one
        # waiting cycle.
        operator = User.objects.create_user("resumer")
        agent_set_status(agent=tool, user=operator, status=Agent.Status.PAUSED)
        agent_set_status(agent=tool, user=operator, status=Agent.Status.RUNNING)
        assert cycle_jobs() == sorted([(f"agent:{tool.pk}", "todo"), (f"agent:{paused.pk}", "todo")])

        # A whole-row save that neither creates the agent nor sets its status starts nothing (were its job under
        # way, a second one would bring its next cycle forward).
        ProcrastinateJob.objects.all().delete()  # type: ignore[misc]
        tool.refresh_from_db()
        tool.save()
        assert cycle_jobs("") == []

    await sync_to_async(check)()


async def test_an_agent_whose_first_cycle_could_not_be_deferred_is_still_created_and_the_sweep_starts_it() -> None:
    """The defer runs after the commit: a database hiccup there loses nothing an operator did."""
    from unittest import mock

    from django.db import OperationalError

    from runtime import tasks
    from tests.factories import AgentFactory

    with mock.patch.object(tasks, "start_defer", side_effect=OperationalError("the server closed the connection")):
        agent = await sync_to_async(AgentFactory)(kind="tool")
    assert await sync_to_async(Agent.objects.filter(pk=agent.pk).exists)()
    assert await sync_to_async(cycle_jobs)("") == []
    assert await sync_to_async(tasks.agents_unscheduled)() == [agent.pk]  # the sweep's next round starts it


def test_a_cycle_job_and_its_successors_defer_check_out_one_connection() -> None:
    """A cycle job's cycle and the defer of its successor share one connection from the pool: one checkout, so
    one of the pool's checks (a round trip each), not one for the cycle and another for the chain."""
    from unittest import mock

    from psycopg_pool import ConnectionPool

    from agents.connections import connection_release
    from runtime import tasks
    from tests.factories import AgentFactory

    agent = AgentFactory(kind="tool", cycle_interval=5)  # no goal: an idle cycle
    connection_release()
    context = mock.Mock(additional_context={"runner": "test-runner"}, worker_name="w")
    with mock.patch.object(ConnectionPool, "check_connection", autospec=True) as check:
        assert tasks.agent_cycle_run(context, agent.pk, "tool") == "idle: no goal"
    assert check.call_count == 1
    agent.refresh_from_db()
    assert agent.cycle_count == 1
    assert cycle_jobs() == [(f"agent:{agent.pk}", "todo")]  # its next cycle waits


async def test_healthz_counts_the_engines_live_workers() -> None:
    from runtime.worker import worker_run

    client = Client()
    assert (await sync_to_async(client.get)("/healthz")).json()["runners"] == 0
    stop = asyncio.Event()
    worker = asyncio.create_task(worker_run(runner_id="healthy", stop=stop))
    try:
        for _ in range(100):
            if (await sync_to_async(client.get)("/healthz")).json()["runners"] == 1:
                break
            await asyncio.sleep(0.05)
        else:
            pytest.fail("the worker never counted as live")
    finally:
        stop.set()
        await asyncio.wait_for(worker, 30)
    assert (await sync_to_async(client.get)("/healthz")).json()["runners"] == 0  # a clean stop leaves at once


async def test_a_cycle_job_whose_end_was_lost_is_finished_and_frees_its_agent() -> None:
    """A cut connection can lose the engine's "finished" write after a cycle returned: the job would stay
    "doing" under a live worker and hold the agent's lock for good. The worker finishes it."""
    import contextlib
    import time
    from unittest import mock

    from django.db import OperationalError, connection
    from procrastinate import exceptions
    from procrastinate.contrib.django import app

    from runtime import tasks
    from tests.factories import AgentFactory

    agent = await sync_to_async(AgentFactory)(kind="tool", cycle_interval=0)
    assert await sync_to_async(tasks.cycle_defer)(agent.pk)  # its first cycle, as its start pass defers it
    assert await sync_to_async(cycle_jobs)() == [(f"agent:{agent.pk}", "todo")]

    def lost_end() -> int:
        with connection.cursor() as cursor:  # what the engine left: the job still "doing"
            cursor.execute("UPDATE procrastinate_jobs SET status = 'doing' WHERE lock = %s RETURNING id",
                           [f"agent:{agent.pk}"])
            return int(cursor.fetchone()[0])

    job_id = await sync_to_async(lost_end)()
    # Its task returned here ten seconds ago; no worker took it (the engine's finish, unguarded, is used).
    tasks._returned[job_id] = (time.monotonic() - 10, None)
    worker_app = app.with_connector(app.connector.get_worker_connector())

    def cut_then_read() -> list[int]:
        with contextlib.suppress(OperationalError), connection.cursor() as cursor:  # as pg_terminate_backend does
            cursor.execute("SELECT pg_terminate_backend(pg_backend_pid())")
        with pytest.raises(OperationalError):
            tasks.jobs_doing_among([job_id])
        return tasks.jobs_doing_among([job_id])  # the settling thread connects afresh

    assert await sync_to_async(cut_then_read)() == [job_id]
    async with worker_app.open_async():
        # Rounds cut off by the database (the read, the finish) finish nothing and forget nothing: the next
        # round finishes the job.
        read_cut = OperationalError("the connection is closed")
        with mock.patch.object(tasks, "jobs_doing_among", side_effect=read_cut), pytest.raises(OperationalError):
            await tasks.jobs_unfinished_settle(worker_app)
        cut = exceptions.ConnectorException("Database error.")
        with mock.patch.object(worker_app.job_manager, "finish_job_by_id_async", side_effect=cut):
            assert await tasks.jobs_unfinished_settle(worker_app) == 0
        assert await sync_to_async(cycle_jobs)() == [(f"agent:{agent.pk}", "doing")]
        assert await tasks.jobs_unfinished_settle(worker_app) == 1
    assert await sync_to_async(cycle_jobs)() == []  # the lock is free: the sweep starts the agent's next chain
    assert job_id not in tasks._returned


async def test_a_connection_cut_while_the_next_cycle_is_deferred_is_tried_again() -> None:
    """The chain goes on: a connection cut just as a cycle defers its successor (after the pool's check) is
    recovered and the defer tried once more, instead of failing the job and leaving the chain to the sweep."""
    from unittest import mock

    from django.db import OperationalError
    from procrastinate.contrib.django.models import ProcrastinateJob

    from runtime import tasks
    from tests.factories import AgentFactory

    agent = await sync_to_async(AgentFactory)(kind="tool", cycle_interval=5)
    await sync_to_async(ProcrastinateJob.objects.all().delete)()  # type: ignore[misc]  # its first cycle ran
    real = tasks.cycle_defer
    calls: list[int] = []

    def cut_once(agent_id: int, *, after: float = 0.0, kind: str = "") -> bool:
        calls.append(agent_id)
        if len(calls) == 1:
            raise OperationalError("terminating connection due to administrator command")
        return real(agent_id, after=after, kind=kind)

    with mock.patch.object(tasks, "cycle_defer", cut_once):
        await sync_to_async(tasks.chain_next)(agent.pk)
    assert calls == [agent.pk, agent.pk]
    assert await sync_to_async(cycle_jobs)() == [(f"agent:{agent.pk}", "todo")]
    # The job carries the kind the chain just read: the tool agent's cycle reads only its row, not a persona's.
    job = await sync_to_async(ProcrastinateJob.objects.get)(lock=f"agent:{agent.pk}")  # type: ignore[misc]
    assert job.args == {"agent_id": agent.pk, "kind": "tool"}


def test_a_shards_next_pass_comes_the_gap_after_this_one_started_and_at_once_after_a_long_pass(settings: Any) -> None:
    """Passes of a shard start at most every RUNNER_PASS_GAP_SECONDS, counted from the start of a pass: a
    persona is at most that late, and a pass that took the whole gap is followed at once, so a busy shard's
    passes never fall further apart than their own length (a persona falling a whole interval behind would
    start afresh and lose a cycle)."""
    from datetime import timedelta

    from django.utils import timezone
    from procrastinate.contrib.django.models import ProcrastinateJob

    from runtime.tasks import pass_lock, pass_next
    from tests.runners import personas

    settings.RUNNER_PASS_GAP_SECONDS, settings.RUNNER_SWEEP_SECONDS = 1.0, 2
    shards = settings.RUNNER_PERSONA_SHARDS
    overdue = timezone.now() - timedelta(seconds=1)
    # Every shard has personas, all of them due already.
    Agent.objects.filter(pk__in=[a.pk for a in personas(shards * 2)]).update(next_cycle_at=overdue)

    def next_pass_in(elapsed: float) -> float:
        ProcrastinateJob.objects.filter(lock=pass_lock(0, shards)).delete()  # type: ignore[misc]
        before = timezone.now()
        pass_next(0, shards, backlog=False, elapsed=elapsed)
        job = ProcrastinateJob.objects.get(lock=pass_lock(0, shards))  # type: ignore[misc]
        return (job.scheduled_at - before).total_seconds()

    assert 0.65 <= next_pass_in(0.3) <= 0.75 + 0.5  # the rest of the gap (the slack: this test's own statements)
    assert next_pass_in(1.4) <= 0.2  # the pass took longer than the gap: the next one at once
    assert 0.95 <= next_pass_in(0.0) <= 1.5


def test_the_personas_make_as_many_shards_as_their_cycles_need(settings: Any) -> None:
    """One shard per RUNNER_SHARD_CYCLES_PER_SECOND of the running personas' cycles (a persona cycles at most once
    a pass), at most RUNNER_PERSONA_SHARDS, none without personas: a small fleet's passes are not split four
    ways (each pass costs its job and its fixed statements), and the sweep starts a chain for each shard."""
    from runtime.tasks import shards_unscheduled, shards_wanted
    from tests.factories import AgentFactory
    from tests.runners import personas

    settings.RUNNER_SHARD_CYCLES_PER_SECOND, settings.RUNNER_PERSONA_SHARDS = 1.0, 4
    settings.RUNNER_PASS_GAP_SECONDS = 1.0
    AgentFactory(kind="tool", cycle_interval=0.1)  # not a persona: no shard
    paused = personas(3, cycle_interval=1.0)
    Agent.objects.filter(pk__in=[a.pk for a in paused]).update(status=Agent.Status.PAUSED)
    assert shards_wanted() == 0 and shards_unscheduled() == (0, [])  # no running persona: no pass at all
    personas(3, cycle_interval=2.0)  # 1.5 cycles a second
    assert shards_wanted() == 2
    assert shards_unscheduled() == (2, [0, 1])
    personas(1, cycle_interval=0.0)  # at most once a pass: 1 / RUNNER_PASS_GAP_SECONDS, 2.5 a second in all
    assert shards_wanted() == 3
    personas(10, cycle_interval=2.0)
    assert shards_wanted() == 4  # RUNNER_PERSONA_SHARDS at most


def test_when_the_fleet_wants_other_shards_the_old_chains_end_before_the_new_start(settings: Any) -> None:
    """A chain of another number of shards ends at its next pass without passing; until none of it waits or
    runs, the sweep starts no chain of the new number, so no persona is ever in two passes at once."""
    from unittest import mock

    from procrastinate.contrib.django.models import ProcrastinateJob

    from runtime import tasks
    from tests.runners import personas

    settings.RUNNER_SHARD_CYCLES_PER_SECOND, settings.RUNNER_PERSONA_SHARDS = 1000.0, 4
    fleet = personas(4, cycle_interval=2.0)
    assert tasks.pass_defer(0, 4)  # a chain of an earlier, bigger fleet: its next pass waits
    assert tasks.shards_unscheduled() == (1, [])  # the old pass still waits: nothing new yet
    context = mock.Mock(additional_context={"runner": "test-runner"}, worker_name="w", job=None)
    ProcrastinateJob.objects.filter(lock=tasks.pass_lock(0, 4)).delete()  # type: ignore[misc]  # it runs now:
    assert "this chain ends" in tasks.personas_pass_job(context, shard=0, shards=4)
    assert cycle_jobs("personas:") == []  # no next pass of the old chain
    assert not Experience.objects.filter(agent__in=fleet).exists()  # and it took no persona
    assert tasks.shards_unscheduled() == (1, [0])
    assert "cycles" in tasks.personas_pass_job(context, shard=0, shards=1)  # the new chain passes
    assert cycle_jobs("personas:") == [("personas:0/1", "todo")]


async def test_the_workers_engine_queries_run_in_autocommit() -> None:
    """Each of the engine's queries is one statement calling one of its functions: on the worker's own
    connections it runs without a BEGIN and a COMMIT around it (a third of two idle runners' statements), and
    the engine works on them: a job deferred there is fetched and finished."""
    from procrastinate.contrib.django import app

    from runtime.worker import worker_connector

    connector = worker_connector()
    worker_app = app.with_connector(connector)
    async with worker_app.open_async():
        async with connector.pool.connection() as connection:
            assert connection.autocommit
            await connection.execute("SELECT 1")
            assert connection.info.transaction_status.name == "IDLE"  # no transaction left open
        job_id = await worker_app.configure_task("runtime:agents.schedule", queue="control").defer_async(timestamp=0)
        await worker_app.run_worker_async(queues=["control"], wait=False, install_signal_handlers=False,
                                          delete_jobs="never")
        job = await worker_app.job_manager.get_job_status_async(job_id)
    assert job.value == "succeeded"


def test_planning_a_start_pass_began_is_failed_only_once_no_start_pass_of_its_shard_runs() -> None:
    """A start pass plans for as long as its models take: the sweep leaves its "validating" plans alone while it
    runs, and fails them as any dead cycle's once its worker died (the engine then retries the pass: no longer
    under way)."""
    from datetime import timedelta

    from django.db import connection
    from django.utils import timezone

    from planning.models import Plan
    from runtime.cycles import plans_orphaned_fail
    from runtime.tasks import agents_starting, start_lock, start_shard
    from tests.factories import AgentFactory, PlanFactory

    agent = AgentFactory(kind="tool")  # its shard's start pass deferred on commit
    plan = PlanFactory(agent=agent, status=Plan.Status.VALIDATING)
    Plan.objects.filter(pk=plan.pk).update(updated_at=timezone.now() - timedelta(hours=1))  # long at it

    def pass_status(status: str) -> None:
        with connection.cursor() as cursor:
            cursor.execute("UPDATE procrastinate_jobs SET status = %s WHERE lock = %s",
                           [status, start_lock(*start_shard(agent.pk))])

    pass_status("doing")  # the pass under way
    assert agents_starting() == {agent.pk}
    assert plans_orphaned_fail(runner="sweep", busy=agents_starting()) == 0
    plan.refresh_from_db()
    assert plan.status == Plan.Status.VALIDATING

    pass_status("todo")  # its worker died, and the engine retried the pass
    assert agents_starting() == set()
    assert plans_orphaned_fail(runner="sweep", busy=agents_starting()) == 1
    plan.refresh_from_db()
    assert plan.status == Plan.Status.FAILED and "planning interrupted" in plan.failure_reason


def test_a_goal_given_to_an_idle_tool_agent_is_planned_by_its_start_pass() -> None:
    """An operator gives a running, idle tool agent a goal: its waiting cycle is replaced by its shard's start
    pass (which plans it with the other agents given goals meanwhile) and the chain goes on from there; an agent
    with an open plan gets its own cycle at once, as before."""
    from django.contrib.auth.models import User
    from django.utils import timezone
    from procrastinate.contrib.django.models import ProcrastinateJob

    from planning.models import Plan
    from planning.services import agent_give_goal
    from runtime.tasks import cycle_defer, start_lock, start_shard, tools_start_pass
    from tests.factories import AgentFactory

    agent = AgentFactory(kind="tool", cycle_interval=60)
    ProcrastinateJob.objects.all().delete()  # type: ignore[misc]  # its start pass ran: its chain waits a minute
    assert cycle_defer(agent.pk, after=60, kind=Agent.Kind.TOOL)
    operator = User.objects.create_user("giver")

    agent_give_goal(agent=agent, user=operator, description="Read notes.txt and write a short summary to summary.txt")
    assert cycle_jobs() == []
    assert cycle_jobs("starts:") == [(start_lock(*start_shard(agent.pk)), "todo")]
    assert tools_start_pass(*start_shard(agent.pk), runner="test") == (1, 0, False)
    plan = Plan.objects.get(agent=agent)
    assert plan.status in (Plan.Status.AWAITING_APPROVAL, Plan.Status.CLARIFYING)  # the offline planner answered
    assert cycle_jobs() == [(f"agent:{agent.pk}", "todo")]  # chained again, at the time the pass's cycle set

    # With that plan open, a second goal brings the agent's own cycle forward, as any decision does.
    ProcrastinateJob.objects.all().delete()  # type: ignore[misc]
    assert cycle_defer(agent.pk, after=60, kind=Agent.Kind.TOOL)
    agent_give_goal(agent=agent, user=operator, description="List the workspace")
    jobs = ProcrastinateJob.objects.filter(lock=f"agent:{agent.pk}")  # type: ignore[misc]
    assert [(job.status, job.scheduled_at is None or job.scheduled_at <= timezone.now()) for job in jobs] == [
        ("todo", True)]
    assert cycle_jobs("starts:") == []
