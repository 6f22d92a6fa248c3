"""A Procrastinate worker driving agents' cycles (scale-out), as `runagents` and `serve` start it.

The engine's own worker, configured for agents: the cycles queue and the control queue, RUNNER_CONCURRENCY
jobs at once, heartbeats every RUNNER_HEARTBEAT_SECONDS (a worker silent for RUNNER_STALLED_SECONDS is dead
and its jobs are retried elsewhere), finished jobs deleted (the jobs table holds what is waiting or under
way, not history). Cycles are synchronous Django code: the engine runs them on the loop's default executor,
which is sized here so that cycles waiting for their models never starve the loop's own use of it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from asgiref.sync import sync_to_async
from django.conf import settings

from agents.connections import CONNECTION_ERRORS, connection_scope, error_brief
from agents.llm.limits import model_calls_resume, model_calls_stop
from runtime.cycles import agents_driven
from runtime.notify_tasks import QUEUE as NOTIFICATIONS_QUEUE
from runtime.outage import OUTAGE, OUTAGE_LINE
from runtime.tasks import (
    CONTROL_QUEUE,
    CYCLES_QUEUE,
    LEASE,
    job_finish_held,
    job_finish_later,
    jobs_unfinished_settle,
)

logger = logging.getLogger("planner.runner")

RETRY_FIRST_SECONDS = 0.25  # the first wait after a database error; doubled up to RUNNER_DB_RETRY_MAX_SECONDS
EXECUTOR_SPARE_THREADS = 8  # the loop's own users of its default executor (DNS lookups, the SDK's setup)


class WorkerStopped(Exception):
    """The engine's worker ended while nobody asked it to."""


def driven_cycle_counts() -> dict[int, int] | None:
    """Each driven agent's cycle count; None while the database is away (the connection recovered, given back)."""
    try:
        with connection_scope():
            return dict(agents_driven().values_list("pk", "cycle_count"))
    except CONNECTION_ERRORS:
        return None


def worker_connector() -> Any:
    """The worker's own connector: what `DjangoConnector.get_worker_connector()` builds (a psycopg pool on the
    same database, Procrastinate's `connector_params`), its connections in autocommit. Each of the engine's
    queries (fetch a job, finish it, beat, defer a periodic job) is one statement calling one of its
    functions, its own transaction either way; out of autocommit each also cost a BEGIN and a COMMIT, which
    were a third of what two idle runners sent (scale_200_cpu_per_cycle: a runner's fixed cost)."""
    from procrastinate import PsycopgConnector
    from procrastinate.contrib.django.utils import connector_params

    async def autocommit(connection: Any) -> None:  # the pool's `configure`, run once for each new connection
        await connection.set_autocommit(True)

    alias = getattr(settings, "PROCRASTINATE_DATABASE_ALIAS", "default")
    # Its pool gives up a failed reconnection after DB_POOL_RECONNECT_SECONDS, as the Django pool does
    # (settings.py): after a long outage the next try comes at once, not up to minutes later.
    return PsycopgConnector(kwargs=connector_params(alias), configure=autocommit,
                            reconnect_timeout=settings.DB_POOL_RECONNECT_SECONDS)


def fenced_job_manager(worker_app: Any) -> Any:
    """The engine's job manager for this runner's worker, with two guards (docs/runtime-guarantees.md): a job is
    finished only while this worker still holds it (tasks.job_finish_held: a late finish after a stall must not
    end the job, and free the lock, of the worker that took it over), and each heartbeat or registration the
    database took renews this runner's lease (tasks.LEASE, sent-at time)."""
    from procrastinate import exceptions, manager

    class FencedJobManager(manager.JobManager):
        async def finish_job(self, job: Any, status: Any, delete_job: bool) -> None:
            try:
                await job_finish_held(worker_app, job_id=job.id, worker_id=job.worker_id, status=status,
                                      delete_job=delete_job)
            except exceptions.ConnectorException as exc:
                # Cut off: the job stays "doing" under this worker. The settling round finishes it once the
                # database answers, if this worker still holds it (tasks.jobs_unfinished_settle); else its new
                # holder does. One line, not the engine's "Task exception was never retrieved" traceback.
                logger.warning("job %s: its finish was cut off by the database (%s); settled when it answers, "
                               "if this worker still holds it", job.id, error_brief(exc), extra=OUTAGE_LINE)
                job_finish_later(job.id, job.worker_id)

        async def update_heartbeat(self, worker_id: int) -> None:
            sent = time.monotonic()
            try:
                await super().update_heartbeat(worker_id)
            except Exception:  # the engine stops the worker; worker_run waits the outage out
                OUTAGE.lost(heartbeat=True, what="the heartbeat failed")
                raise
            LEASE.renew(sent)

        async def register_worker(self) -> int:
            sent = time.monotonic()
            try:
                worker_id = await super().register_worker()
            except Exception:
                OUTAGE.lost(heartbeat=True, what="the worker's registration failed")
                raise
            LEASE.renew(sent)
            return worker_id

    return FencedJobManager(worker_app.connector)


async def cycles_reached(cycles: int, poll: float = 0.2) -> None:
    """Return once every driven agent has had `cycles` more cycles than when this began (by any worker)."""
    while (start := await sync_to_async(driven_cycle_counts)()) is None:  # an outage as the runner starts
        await asyncio.sleep(poll)
    while True:
        await asyncio.sleep(poll)
        now = await sync_to_async(driven_cycle_counts)()
        if now is not None and all(count >= start.get(pk, 0) + cycles for pk, count in now.items()):
            return


async def worker_run(*, runner_id: str, stop: asyncio.Event, cycles: int | None = None,
                     concurrency: int | None = None) -> None:
    """Run the engine's worker until `stop` is set (or --cycles is reached), then stop it gracefully: no job
    is taken any more, and the cycles under way finish (within RUNNER_SHUTDOWN_GRACE_SECONDS).

    A worker outlives its database: when the engine's worker ends on a database error (a terminated
    connection under its listener, a restart, an outage), it is logged, waited out with a growing backoff
    (at most RUNNER_DB_RETRY_MAX_SECONDS), and the worker starts again once the database answers; the cycles
    it had under way are retried as any dead worker's are."""
    import psycopg
    from procrastinate import exceptions
    from procrastinate.contrib.django import app

    concurrency = concurrency or settings.RUNNER_CONCURRENCY
    OUTAGE.watch(runner_id)  # its outages of the database: one line each (runtime/outage.py)
    asyncio.get_running_loop().set_default_executor(
        ThreadPoolExecutor(max_workers=concurrency + EXECUTOR_SPARE_THREADS, thread_name_prefix="cycle"))
    worker_app = app.with_connector(worker_connector())  # the Django connector cannot LISTEN
    worker_app.job_manager = fenced_job_manager(worker_app)
    # The driver's own errors too: opening the worker's pool raises psycopg_pool's PoolTimeout (a psycopg
    # OperationalError, not Django's) when the database stays away longer than the pool's 30 s; it must not end
    # the runner.
    database_errors: tuple[type[Exception], ...] = (
        exceptions.ConnectorException, *CONNECTION_ERRORS, psycopg.OperationalError, OSError, WorkerStopped)
    reached = asyncio.create_task(cycles_reached(cycles)) if cycles is not None else None
    stopped = asyncio.create_task(stop.wait())
    loop = asyncio.get_running_loop()
    model_calls_resume(loop)
    # A stop ends the model calls of the cycles under way at once (they finish within the grace, not on a busy model).
    stopped.add_done_callback(lambda task: None if task.cancelled() else model_calls_stop(loop))
    failures, outage_since = 0, 0.0
    try:
        while not stopped.done() and not (reached and reached.done()):
            try:
                async with worker_app.open_async():
                    if failures:
                        await worker_app.check_connection_async()
                        logger.info("%s: the database answers again after %.1f s of retries; carrying on",
                                    runner_id, time.monotonic() - outage_since)
                        failures = 0
                    await worker_until(worker_app, runner_id, concurrency, [t for t in (stopped, reached) if t])
                if not stopped.done() and not (reached and reached.done()):
                    # The engine stops its worker when one of its side tasks (the listener, the heartbeat)
                    # loses the database: that is an outage too.
                    raise WorkerStopped("the worker stopped on its own")
            except database_errors as exc:
                failures += 1
                outage_since = outage_since if failures > 1 else time.monotonic()
                delay = min(settings.RUNNER_DB_RETRY_MAX_SECONDS, RETRY_FIRST_SECONDS * 2 ** (failures - 1))
                logger.warning("%s: database unreachable (%s); try %d, next in %.2f s", runner_id,
                               error_brief(exc), failures, delay, extra=OUTAGE_LINE)
                await asyncio.wait([stopped], timeout=delay)
    finally:
        for task in (stopped, reached):
            if task is not None:
                task.cancel()


async def jobs_settle_forever(worker_app: Any) -> None:
    while True:
        await asyncio.sleep(settings.RUNNER_SWEEP_SECONDS)
        try:
            await jobs_unfinished_settle(worker_app)
        except Exception as exc:  # the database is away: the next round tries again, with the same jobs
            logger.warning("settling unfinished jobs failed (%s); the next round tries again", error_brief(exc),
                           extra=OUTAGE_LINE)


async def worker_until(worker_app: Any, runner_id: str, concurrency: int, until: list[asyncio.Task[Any]]) -> None:
    """Run the engine's worker until one of `until` is done (then stop it gracefully), or it ends by itself."""
    worker = asyncio.create_task(worker_app.run_worker_async(
        name=runner_id, queues=[CONTROL_QUEUE, CYCLES_QUEUE, NOTIFICATIONS_QUEUE], concurrency=concurrency,
        additional_context={"runner": runner_id}, install_signal_handlers=False, delete_jobs="successful",
        update_heartbeat_interval=settings.RUNNER_HEARTBEAT_SECONDS,
        stalled_worker_timeout=settings.RUNNER_STALLED_SECONDS,
        shutdown_graceful_timeout=settings.RUNNER_SHUTDOWN_GRACE_SECONDS,
        fetch_job_polling_interval=settings.RUNNER_TICK_SECONDS,
    ))
    settling = asyncio.create_task(jobs_settle_forever(worker_app))
    try:
        await asyncio.wait([worker, *until], return_when=asyncio.FIRST_COMPLETED)
    finally:
        settling.cancel()
        if not worker.done():
            worker.cancel()  # the engine's graceful stop: the cycles under way end first
        with contextlib.suppress(asyncio.CancelledError):
            await worker
