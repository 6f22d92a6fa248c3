"""Fencing: a runner writes an agent's or a shard's rows only while it holds the job that covers them.

The scale-out runtime (runtime/tasks.py) runs each cycle or pass inside `fenced(...)`: the job's id, the
engine's worker that took it, and the runner's lease (runtime/worker.py: still within
RUNNER_LEASE_SECONDS of its last heartbeat the database took). The services that record a cycle, a pass, a
step's start or its end call `fence_hold()` first, inside their own transaction: it refuses (FenceLost) once the
lease ran out (the runner may be cut off: another may take its jobs soon) and, on PostgreSQL, unless the job's
row still says this worker is doing it, and it keeps a share lock on that row until the transaction ends. The
engine's retry of a stalled job (an UPDATE of that row) therefore waits for a transaction under way, and a
transaction that begins after the retry finds the row changed and is rolled back: a stale runner's commit is
refused whatever the engine's finish does. Outside a runner's job (the embedded runtime, pages, tests) there
is no fence and `fence_hold()` does nothing.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from django.db import connection


class FenceLost(Exception):
    """This runner no longer holds the job covering these rows (its lease ran out, or the job was taken over
    after a stall): nothing of it is written. `lease_ran_out`: the former (the database unreachable)."""

    def __init__(self, message: str, *, lease_ran_out: bool = False) -> None:
        super().__init__(message)
        self.lease_ran_out = lease_ran_out


@dataclass(frozen=True)
class Fence:
    job_id: int
    worker_id: int | None
    lease_valid: Callable[[], bool]


_local = threading.local()


@contextlib.contextmanager
def fenced(fence: Fence | None) -> Iterator[None]:
    """The thread's work in this block is covered by `fence` (None: no fence)."""
    previous = getattr(_local, "fence", None)
    _local.fence = fence
    try:
        yield
    finally:
        _local.fence = previous


def fence_current() -> Fence | None:
    return getattr(_local, "fence", None)


def fence_lease_check() -> None:
    """FenceLost once the runner's lease ran out: nothing with effects outside the database may start (a tool
    call), since another runner may take this job over soon."""
    fence = fence_current()
    if fence is not None and not fence.lease_valid():
        raise FenceLost(f"job {fence.job_id}: this runner's lease ran out (the database unreachable)",
                        lease_ran_out=True)


def fence_hold() -> None:
    """Inside a transaction that records a cycle, a pass or a step: refuse it (FenceLost) unless this runner
    still holds its job, and keep that job from being taken over until the transaction ends."""
    fence = fence_current()
    if fence is None:
        return
    fence_lease_check()
    if connection.vendor != "postgresql" or fence.worker_id is None:
        return
    if not connection.in_atomic_block:
        raise RuntimeError("fence_hold() belongs inside the transaction it guards")
    with connection.cursor() as cursor:
        # The engine's own table: FOR SHARE makes the stalled-job retry (an UPDATE of this row) wait for us.
        cursor.execute("SELECT 1 FROM procrastinate_jobs WHERE id = %s AND worker_id = %s AND status = 'doing' "
                       "FOR SHARE", [fence.job_id, fence.worker_id])
        held = cursor.fetchone() is not None
    if not held:
        raise FenceLost(f"job {fence.job_id} is no longer held by worker {fence.worker_id} (taken over after a "
                        "stall): its writes were refused and rolled back")
