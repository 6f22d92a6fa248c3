"""The runner: claims agents with leases and drives their cycles concurrently on one asyncio loop.

Leases make scale-out safe: any number of runners share the database; a claim is
`SELECT ... FOR UPDATE SKIP LOCKED` on PostgreSQL (SQLite serialises writers instead), so no agent is
driven by two runners at once, and a killed runner's lease expires and another runner takes over.
Cycles run in worker threads (database work off the loop); LLM HTTP waits return to the loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import uuid
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta

from asgiref.sync import sync_to_async
from django.conf import settings
from django.db import close_old_connections, connection, transaction
from django.db.models import Q
from django.utils import timezone

from agents.cycle import agent_cycle
from agents.models import Agent
from planning.planner import plans_interrupted_fail

logger = logging.getLogger("planner.runner")


def runner_id_new() -> str:
    """A name operators can read in leases and timelines: which machine, which process."""
    return f"runner {socket.gethostname()}/{os.getpid()}-{uuid.uuid4().hex[:4]}"


def agents_claim(*, runner: str, limit: int, exclude: set[int]) -> list[int]:
    """Lease up to `limit` due, running agents that no live runner holds; returns their ids."""
    if limit <= 0:
        return []
    now = timezone.now()
    with transaction.atomic():
        free = Q(lease_owner="") | Q(lease_expires_at__lt=now) | Q(lease_owner=runner)
        due = Q(next_cycle_at__isnull=True) | Q(next_cycle_at__lte=now)
        ids = list(
            Agent.objects.select_for_update(skip_locked=True)
            .filter(free & due, status=Agent.Status.RUNNING)
            .exclude(kind=Agent.Kind.EXTERNAL)  # external agents drive themselves over the API
            .exclude(pk__in=exclude)
            .order_by("next_cycle_at", "pk")
            .values_list("pk", flat=True)[:limit]
        )
        if ids:
            Agent.objects.filter(pk__in=ids).update(
                lease_owner=runner, lease_expires_at=now + timedelta(seconds=settings.RUNNER_LEASE_SECONDS)
            )
            plans_interrupted_fail(agent_ids=ids, runner=runner)  # planning cut off by a runner that died
    return ids


def agents_renew(*, runner: str, ids: set[int]) -> None:
    """Extend the leases of agents whose cycle is still under way (a slow LLM call must not lose its agent)."""
    if ids:
        Agent.objects.filter(pk__in=ids, lease_owner=runner).update(
            lease_expires_at=timezone.now() + timedelta(seconds=settings.RUNNER_LEASE_SECONDS)
        )


def agents_release(*, runner: str, ids: set[int] | None = None) -> None:
    qs = Agent.objects.filter(lease_owner=runner)
    if ids is not None:
        qs = qs.filter(pk__in=ids)
    qs.update(lease_owner="", lease_expires_at=None)


def agents_remaining(*, finished: set[int]) -> bool:
    """Whether some running agent still owes this runner cycles (for --cycles). Agents another runner
    holds count too: their lease is released or expires, and then this runner drives them."""
    return Agent.objects.filter(status=Agent.Status.RUNNING).exclude(kind=Agent.Kind.EXTERNAL).exclude(
        pk__in=finished).exists()


def cycle_run(agent_id: int, runner: str) -> str:
    close_old_connections()
    try:
        return agent_cycle(agent_id=agent_id, runner=runner)
    finally:
        # Cycle threads come and go with the runner; a connection left in one would outlive it.
        connection.close()


class Runner:
    """Drive agents until stopped, or until each has had `cycles` cycles from this runner."""

    def __init__(self, *, runner_id: str | None = None, cycles: int | None = None,
                 concurrency: int | None = None, tick: float | None = None) -> None:
        self.id = runner_id or runner_id_new()
        self.cycles = cycles
        self.concurrency = concurrency or settings.RUNNER_CONCURRENCY
        self.tick = settings.RUNNER_TICK_SECONDS if tick is None else tick
        self.done: Counter[int] = Counter()
        self.inflight: dict[int, asyncio.Task[None]] = {}
        self.stopping = asyncio.Event()
        # Cycles get their own threads: the loop's default executor must stay free for the work the
        # async LLM client and DNS lookups hand to it, or agents waiting on the loop could starve it.
        self.executor = ThreadPoolExecutor(max_workers=self.concurrency, thread_name_prefix="runner-cycle")

    def stop(self) -> None:
        self.stopping.set()

    @property
    def finished(self) -> set[int]:
        return {a for a, n in self.done.items() if self.cycles is not None and n >= self.cycles}

    async def drive(self, agent_id: int) -> None:
        try:
            what = await sync_to_async(cycle_run, thread_sensitive=False, executor=self.executor)(agent_id, self.id)
            logger.debug("agent %s: %s", agent_id, what)
        except Exception:  # one agent's broken cycle must never stop the others
            logger.exception("cycle of agent %s failed", agent_id)
        finally:
            self.done[agent_id] += 1
            self.inflight.pop(agent_id, None)
            if agent_id in self.finished:
                await sync_to_async(agents_release, thread_sensitive=False)(runner=self.id, ids={agent_id})

    async def run(self) -> None:
        logger.info("runner %s started", self.id)
        try:
            while not self.stopping.is_set():
                await sync_to_async(agents_renew, thread_sensitive=False)(runner=self.id, ids=set(self.inflight))
                claimed = await sync_to_async(agents_claim, thread_sensitive=False)(
                    runner=self.id, limit=self.concurrency - len(self.inflight),
                    exclude=set(self.inflight) | self.finished,
                )
                for agent_id in claimed:
                    self.inflight[agent_id] = asyncio.create_task(self.drive(agent_id))
                if self.cycles is not None and not claimed and not self.inflight:
                    remaining = await sync_to_async(agents_remaining, thread_sensitive=False)(finished=self.finished)
                    if not remaining:
                        break
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self.stopping.wait(), timeout=self.tick)
        finally:
            if self.inflight:
                await asyncio.gather(*self.inflight.values(), return_exceptions=True)
            await sync_to_async(agents_release, thread_sensitive=False)(runner=self.id)
            self.executor.shutdown(wait=False)
            logger.info("runner %s stopped", self.id)
