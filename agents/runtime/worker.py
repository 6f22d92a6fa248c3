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
from concurrent.futures import ThreadPoolExecutor

from asgiref.sync import sync_to_async
from django.conf import settings

from agents.runtime.cycles import agents_driven
from agents.runtime.tasks import CONTROL_QUEUE, CYCLES_QUEUE

logger = logging.getLogger("planner.runner")

EXECUTOR_SPARE_THREADS = 8  # the loop's own users of its default executor (DNS lookups, the SDK's setup)


def driven_cycle_counts() -> dict[int, int]:
    return dict(agents_driven().values_list("pk", "cycle_count"))


async def cycles_reached(cycles: int, poll: float = 0.2) -> None:
    """Return once every driven agent has had `cycles` more cycles than when this began (by any worker)."""
    start = await sync_to_async(driven_cycle_counts)()
    while True:
        await asyncio.sleep(poll)
        now = await sync_to_async(driven_cycle_counts)()
        if all(count >= start.get(pk, 0) + cycles for pk, count in now.items()):
            return


async def worker_run(*, runner_id: str, stop: asyncio.Event, cycles: int | None = None,
                     concurrency: int | None = None) -> None:
    """Run the engine's worker until `stop` is set (or --cycles is reached), then stop it gracefully: no job
    is taken any more, and the cycles under way finish (within RUNNER_SHUTDOWN_GRACE_SECONDS)."""
    from procrastinate.contrib.django import app

    concurrency = concurrency or settings.RUNNER_CONCURRENCY
    asyncio.get_running_loop().set_default_executor(
        ThreadPoolExecutor(max_workers=concurrency + EXECUTOR_SPARE_THREADS, thread_name_prefix="cycle"))
    worker_app = app.with_connector(app.connector.get_worker_connector())  # the Django connector cannot LISTEN
    async with worker_app.open_async():
        worker = asyncio.create_task(worker_app.run_worker_async(
            name=runner_id, queues=[CONTROL_QUEUE, CYCLES_QUEUE], concurrency=concurrency,
            additional_context={"runner": runner_id}, install_signal_handlers=False, delete_jobs="successful",
            update_heartbeat_interval=settings.RUNNER_HEARTBEAT_SECONDS,
            stalled_worker_timeout=settings.RUNNER_STALLED_SECONDS,
            shutdown_graceful_timeout=settings.RUNNER_SHUTDOWN_GRACE_SECONDS,
            fetch_job_polling_interval=settings.RUNNER_TICK_SECONDS,
        ))
        waits = [asyncio.create_task(stop.wait())]
        if cycles is not None:
            waits.append(asyncio.create_task(cycles_reached(cycles)))
        try:
            await asyncio.wait([worker, *waits], return_when=asyncio.FIRST_COMPLETED)
        finally:
            for wait in waits:
                wait.cancel()
            if not worker.done():
                worker.cancel()  # the engine's graceful stop: the cycles under way end first
            with contextlib.suppress(asyncio.CancelledError):
                await worker
