"""Fencing against a stale runner, simulated deterministically on this run's PostgreSQL test database: runner B
took a job, was cut off long enough for the engine to retry the job on runner A, and comes back. Its commits are
refused and rolled back (agents/fencing.py), and its late finish ends nothing A holds (tasks.job_finish_held).
The real thing, with a network cut, is tests/faults/test_partition.py."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator

import psycopg
import pytest
from django.conf import settings
from django.db import connection, transaction

from agents.fencing import Fence, FenceLost, fence_hold, fenced
from agents.models import Agent
from agents.services import agents_cycle_count
from planning import services
from planning.models import Plan, PlanStep
from tests.factories import AgentFactory, GoalFactory

pytestmark = [
    pytest.mark.skipif("postgresql" not in settings.DATABASES["default"]["ENGINE"],
                       reason="fencing checks the job engine's table: needs PostgreSQL (the scale-out pass)"),
    pytest.mark.scaleout,
    pytest.mark.django_db(transaction=True),
]


def sql(query: str, *params: object) -> list[tuple[object, ...]]:
    with connection.cursor() as cursor:
        cursor.execute(query, params)
        return list(cursor.fetchall()) if cursor.description else []


def worker_new() -> int:
    return int(sql("INSERT INTO procrastinate_workers DEFAULT VALUES RETURNING id")[0][0])  # type: ignore[call-overload]


@pytest.fixture
def job_taken_over() -> Iterator[tuple[int, int, int]]:
    """A cycle job taken by worker B, then retried after a stall and taken by worker A: (job, B, A)."""
    b, a = worker_new(), worker_new()
    job = int(sql("INSERT INTO procrastinate_jobs (queue_name, task_name, lock, args, status, worker_id) "  # type: ignore[call-overload]
                  "VALUES ('cycles', 'agents.cycle', 'agent:test', '{}', 'doing', %s) RETURNING id", b)[0][0])
    yield job, b, a


def take_over(job: int, by: int) -> None:
    sql("UPDATE procrastinate_jobs SET worker_id = %s, attempts = attempts + 1 WHERE id = %s", by, job)


def fence(job: int, worker: int) -> Fence:
    return Fence(job_id=job, worker_id=worker, lease_valid=lambda: True)


def test_a_stale_runners_commit_is_refused_and_rolled_back(job_taken_over: tuple[int, int, int]) -> None:
    job, b, a = job_taken_over
    agent = AgentFactory(kind=Agent.Kind.TOOL)
    goal = GoalFactory(agent=agent, description="Write the log", source_needs=[])
    plan = Plan.objects.create(agent=agent, goal=goal, goal_text=goal.description, status=Plan.Status.ACTIVE)
    step = PlanStep.objects.create(plan=plan, key="1", position=1, description="Append", tool="file.append",
                                   tool_input={"path": "log.txt", "content": "x\n"})
    with fenced(fence(job, b)):
        agents_cycle_count(agents=[agent])  # B holds the job: its cycle counts
    assert Agent.objects.get(pk=agent.pk).cycle_count == 1

    take_over(job, by=a)
    with fenced(fence(job, b)):
        with pytest.raises(FenceLost, match="no longer held"):
            agents_cycle_count(agents=[agent])
        with pytest.raises(FenceLost):
            services.step_start(step=step, runner="runner B")
    assert Agent.objects.get(pk=agent.pk).cycle_count == 1  # nothing of B's written
    assert PlanStep.objects.get(pk=step.pk).status == PlanStep.Status.PENDING
    with fenced(fence(job, a)):  # the holder writes
        assert services.step_start(step=step, runner="runner A") is not None
        agents_cycle_count(agents=[agent])
    assert Agent.objects.get(pk=agent.pk).cycle_count == 2


def test_a_takeover_waits_for_the_fenced_transaction_under_way(job_taken_over: tuple[int, int, int]) -> None:
    """B's recording transaction holds its job's row: the engine's retry waits for it to end (no commit of B's
    can land after A took the job), and A never waits longer than B's transaction."""
    job, b, _a = job_taken_over
    holding, release = threading.Event(), threading.Event()

    def runner_b() -> None:
        try:
            with fenced(fence(job, b)), transaction.atomic():
                fence_hold()
                holding.set()
                release.wait(10)
        finally:
            connection.close()

    thread = threading.Thread(target=runner_b)
    thread.start()
    assert holding.wait(10)
    db = connection.settings_dict
    with psycopg.connect(host=db["HOST"], port=db["PORT"] or 5432, user=db["USER"], dbname=db["NAME"],
                         autocommit=True) as other:
        other.execute("SET lock_timeout = '300ms'")
        with pytest.raises(psycopg.errors.LockNotAvailable):
            other.execute("UPDATE procrastinate_jobs SET status = 'todo', worker_id = NULL WHERE id = %s", [job])
        release.set()
        thread.join(10)
        other.execute("UPDATE procrastinate_jobs SET status = 'todo', worker_id = NULL WHERE id = %s", [job])


def test_a_late_finish_ends_nothing_another_worker_holds(job_taken_over: tuple[int, int, int],
                                                        caplog: pytest.LogCaptureFixture) -> None:
    from procrastinate.contrib.django import app
    from procrastinate.jobs import Status

    from runtime.tasks import job_finish_held
    from runtime.worker import fenced_job_manager, worker_connector

    job, b, a = job_taken_over
    take_over(job, by=a)

    async def finishes() -> tuple[bool, bool]:
        worker_app = app.with_connector(worker_connector())
        worker_app.job_manager = fenced_job_manager(worker_app)
        async with worker_app.open_async():
            stale = await job_finish_held(worker_app, job_id=job, worker_id=b, status=Status.SUCCEEDED,
                                          delete_job=True)
            held_by_a = await worker_app.connector.execute_query_all_async(
                query="SELECT status, worker_id FROM procrastinate_jobs WHERE id = %(id)s", id=job)
            assert held_by_a == [{"status": "doing", "worker_id": a}]  # B's finish freed nothing: A's lock stands
            holder = await job_finish_held(worker_app, job_id=job, worker_id=a, status=Status.SUCCEEDED,
                                           delete_job=True)
            return stale, holder

    with caplog.at_level("INFO", logger="planner.runner"):
        assert asyncio.run(finishes()) == (False, True)
    assert sql("SELECT id FROM procrastinate_jobs WHERE id = %s", job) == []
    lines = [r for r in caplog.records if "no longer held" in r.getMessage()]
    assert len(lines) == 1 and lines[0].levelname == "INFO" and lines[0].exc_info is None


def test_the_settling_round_finishes_no_job_another_worker_took_over(job_taken_over: tuple[int, int, int]) -> None:
    """B's task returned but its finish was cut off; after the heal the job is A's: B's settling leaves it be."""
    import time
    from unittest import mock

    from asgiref.sync import sync_to_async
    from procrastinate import exceptions
    from procrastinate.contrib.django import app
    from procrastinate.jobs import Status

    from runtime import tasks
    from runtime.worker import fenced_job_manager, worker_connector

    job, b, a = job_taken_over

    async def cut_finish_then_settle() -> int:
        worker_app = app.with_connector(worker_connector())
        worker_app.job_manager = fenced_job_manager(worker_app)
        async with worker_app.open_async():
            job_row = type("Job", (), {"id": job, "worker_id": b})()
            cut = exceptions.ConnectorException("Database error.")
            with mock.patch.object(worker_app.connector, "execute_query_all_async", side_effect=cut):
                await worker_app.job_manager.finish_job(job_row, Status.SUCCEEDED, True)  # one line, no raise
            assert tasks._returned[job][1] == b
            tasks._returned[job] = (time.monotonic() - 10, b)
            await sync_to_async(take_over)(job, by=a)
            return await tasks.jobs_unfinished_settle(worker_app)

    assert asyncio.run(cut_finish_then_settle()) == 0
    assert sql("SELECT status, worker_id FROM procrastinate_jobs WHERE id = %s", job) == [("doing", a)]
    assert job not in tasks._returned


def test_a_silent_worker_is_recovered_the_moment_it_is_stalled_not_a_sweep_later() -> None:
    """A worker that stopped beating gets a recovery deferred for the moment its heartbeat is
    RUNNER_STALLED_SECONDS old (one at most); none while every worker beats."""
    from procrastinate.contrib.django import app

    from runtime.tasks import RECOVER_SOON, recover_when_stalled
    from runtime.worker import worker_connector

    worker_new()  # beating now
    silent = worker_new()

    async def deferred() -> list[bool]:
        worker_app = app.with_connector(worker_connector())
        async with worker_app.open_async():
            beating = await recover_when_stalled(worker_app)
            await worker_app.connector.execute_query_async(  # its last heartbeat, a second short of stalled
                query="UPDATE procrastinate_workers SET last_heartbeat = now() - make_interval(secs => %(age)s) "
                      "WHERE id = %(id)s", age=settings.RUNNER_STALLED_SECONDS - 1, id=silent)
            return [beating, await recover_when_stalled(worker_app), await recover_when_stalled(worker_app)]

    assert asyncio.run(deferred()) == [False, True, False]
    (task, wait), = sql("SELECT task_name, EXTRACT(EPOCH FROM scheduled_at - now()) FROM procrastinate_jobs "
                        "WHERE queueing_lock = %s AND status = 'todo'", RECOVER_SOON)
    assert str(task).endswith("agents.recover") and 0.8 < float(wait) < 1.6  # type: ignore[arg-type]
