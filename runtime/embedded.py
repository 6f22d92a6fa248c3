"""The embedded runtime: one process (`make run`, SQLite) drives every agent as it falls due.

The simplest in-process scheduler: nothing is leased or claimed, because no other process drives agents on
the embedded stack (several processes mean the scale-out stack, runtime/tasks.py). An agent runs at
most one cycle at a time; up to RUNNER_CONCURRENCY cycles run at once, each in a thread of its own whose
model calls are awaited on this loop (the thread's database connection is given back meanwhile). The personas
due together run as one pass, as on the scale-out stack (runtime/cycle.py persona_cycles); those whose cycle
may wait on a model server then run their own. The loop
asks the database for due agents on its tick, when an agent it drives falls due again, or at once while
agents wait for a free slot. Database errors are logged and waited out with a growing backoff.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime
from typing import Any, NamedTuple

from asgiref.sync import sync_to_async
from django.conf import settings
from django.db.models import F, Min
from django.utils import timezone

from agents.connections import CONNECTION_ERRORS, connection_scope, error_brief
from agents.models import Agent
from agents.services import agent_cycle_soon
from agents.signals import operator_acted
from runtime.cycles import (
    agents_driven,
    cycle_run,
    personas_run,
    plans_orphaned_fail,
    runner_id_new,
)
from runtime.retention import retention_prune

logger = logging.getLogger("planner.runner")

RETRY_FIRST_SECONDS = 0.25  # the first wait after a database error; doubled up to RUNNER_DB_RETRY_MAX_SECONDS
PRUNE_BUDGET_SECONDS = 5.0

# The running scheduler of this process, if any: /healthz counts it.
current: Scheduler | None = None


class Due(NamedTuple):
    pk: int
    interval: float
    kind: str


def agents_due(*, exclude: set[int], limit: int) -> tuple[list[Due], datetime | None]:
    """Up to `limit` due agents (never-run ones first, then the longest overdue) with their intervals and kinds,
    and when the earliest of the others falls due."""
    now = timezone.now()
    driven = agents_driven().exclude(pk__in=exclude)
    due = [Due(*row) for row in driven.filter(next_cycle_at__isnull=True)
           .values_list("pk", "cycle_interval", "kind")[:limit]]
    if len(due) < limit:
        due += [Due(*row) for row in driven.filter(next_cycle_at__lte=now).order_by(F("next_cycle_at").asc(), "pk")
                .values_list("pk", "cycle_interval", "kind")[:limit - len(due)]]
    later = driven.exclude(pk__in=[d.pk for d in due]).aggregate(at=Min("next_cycle_at"))["at"]
    return due, later


def agents_remaining(*, finished: set[int]) -> bool:
    """Whether some driven agent still owes this scheduler cycles (for --cycles)."""
    return agents_driven().exclude(pk__in=finished).exists()


def db_call(fn: Callable[..., Any], /, **kwargs: Any) -> Any:
    """Run one of the loop's database operations in its thread, then hand the connection back."""
    with connection_scope():
        return fn(**kwargs)


class Scheduler:
    """Drive agents until stopped, or until each has had `cycles` cycles."""

    def __init__(self, *, runner_id: str | None = None, cycles: int | None = None, concurrency: int | None = None,
                 tick: float | None = None, prune_seconds: float | None = None, notify: bool = True) -> None:
        self.id = runner_id or runner_id_new()
        self.notify = notify  # also dispatch and deliver notifications (runtime/notify.py)
        self.cycles = cycles
        self.concurrency = concurrency or settings.RUNNER_CONCURRENCY
        self.tick = settings.RUNNER_TICK_SECONDS if tick is None else tick
        self.prune_seconds = settings.RETENTION_PRUNE_SECONDS if prune_seconds is None else prune_seconds
        self.done: Counter[int] = Counter()
        self.inflight: dict[int, asyncio.Task[None]] = {}
        self.stopping = asyncio.Event()
        self.wake = asyncio.Event()  # a cycle ended, or a stop: look again now, not on the next tick
        self.backlog = True  # the last look filled every free slot: agents may be waiting for one
        self.next_due: float | None = None  # time.monotonic() when the next known agent falls due
        self.ticked = True  # the last wait ended on the tick (or there was none yet), not on a wake
        self.failures = 0
        self.outage_since: float | None = None
        self.woken: set[int] = set()  # agents an operator acted on since their cycle started (operator_acted)
        self.loop: asyncio.AbstractEventLoop | None = None
        # Cycles get threads of their own: the loop's default executor stays free for the work the async LLM
        # client and DNS lookups hand to it, which the cycles' model calls wait for.
        self.cycle_threads = ThreadPoolExecutor(max_workers=self.concurrency, thread_name_prefix="cycle")
        self.db_thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="scheduler-db")

    def stop(self) -> None:
        self.stopping.set()
        self.wake.set()

    def operator_acted(self, sender: object, agent_id: int, **kwargs: Any) -> None:
        """agents/signals.py, in the thread whose write committed (a page's, the API's, the admin's), after the
        receiver that made the agent due in the database (agents/apps.py): the loop looks at once. The agent is
        marked: a cycle of it under way may have read the state before the write, and ends by setting its next
        cycle at its interval; marked, it is due again when it ends (woken_due). A cycle that starts later reads
        the write, and clears the mark (`look`). (set.add and discard are atomic under the GIL.)"""
        self.woken.add(agent_id)
        if self.loop is not None and not self.loop.is_closed():
            with contextlib.suppress(RuntimeError):  # the loop closed meanwhile: the scheduler stopped
                self.loop.call_soon_threadsafe(self.look_now)

    def look_now(self) -> None:
        """On the loop: look for due agents at once."""
        self.due_again(0.0)
        self.wake.set()

    async def woken_due(self, agent_ids: list[int]) -> None:
        """Of these agents, whose cycles just ended, those an operator acted on during the cycle are due now
        again (their cycle set their next one at the end of their interval)."""
        for agent_id in [a for a in agent_ids if a in self.woken]:
            self.woken.discard(agent_id)
            with contextlib.suppress(*CONNECTION_ERRORS):  # the database is away: the interval stands
                await self.db(agent_cycle_soon, agent_id=agent_id)
                self.due_again(0.0)

    @property
    def finished(self) -> set[int]:
        return {a for a, n in self.done.items() if self.cycles is not None and n >= self.cycles}

    async def db(self, fn: Callable[..., Any], /, **kwargs: Any) -> Any:
        return await self.db_calls(fn, **kwargs)

    def owes(self, agent_id: int) -> bool:
        """Whether the agent is still to have a cycle of this scheduler (always, without --cycles)."""
        return self.cycles is None or self.done[agent_id] < self.cycles

    def due_again(self, interval: float) -> None:
        """An agent falls due again `interval` seconds from now: the loop looks for it then."""
        at = time.monotonic() + interval
        self.next_due = at if self.next_due is None else min(self.next_due, at)

    def ended(self, intervals: list[float]) -> None:
        """Cycles ended, of agents due again after these intervals (none for those that had their --cycles,
        which fall due no more here). Once the last cycle under way ended, the loop looks at once: whether any
        agent still owes a cycle, or the run is over."""
        if intervals:
            self.due_again(min(intervals))
        elif not self.inflight:
            self.due_again(0.0)

    async def drive(self, agent_id: int, interval: float, kind: str = "") -> None:
        try:
            what = await self.cycle(agent_id, self.id, kind)
            logger.debug("agent %s: %s", agent_id, what)
            self.done[agent_id] += 1
            await self.woken_due([agent_id])
        except CONNECTION_ERRORS as exc:  # not a cycle that happened: it runs once the database is back
            logger.warning("%s: cycle of agent %s cut off by the database (%s)", self.id, agent_id, error_brief(exc))
        except Exception:  # one agent's broken cycle must never stop the others
            logger.exception("cycle of agent %s failed", agent_id)
            self.done[agent_id] += 1
        finally:
            self.inflight.pop(agent_id, None)
            self.ended([interval] if self.owes(agent_id) else [])
            self.wake.set()

    async def drive_pass(self, due: list[Due]) -> None:
        """One pass of the due personas; then each whose cycle may wait on a model server runs its own."""
        apart: list[int] = []
        try:
            done, apart = await self.personas([d.pk for d in due], self.id)
            for agent_id in done:
                self.done[agent_id] += 1
            await self.woken_due(list(done))
        except CONNECTION_ERRORS as exc:  # not cycles that happened: they run once the database is back
            logger.warning("%s: a pass of %d personas cut off by the database (%s)", self.id, len(due),
                           error_brief(exc))
        except Exception:  # a broken pass must never stop the others
            logger.exception("a pass of %d personas failed", len(due))
        finally:
            for d in due:
                if d.pk not in apart:
                    self.inflight.pop(d.pk, None)
            self.ended([d.interval for d in due if d.pk not in apart and self.owes(d.pk)])
            self.wake.set()
        for d in due:
            if d.pk in apart:
                self.inflight[d.pk] = asyncio.create_task(self.drive(d.pk, d.interval, d.kind))

    async def look(self) -> bool:
        """Start the due agents' cycles; False when --cycles is reached for every agent."""
        limit = self.concurrency - len(self.inflight)
        if limit <= 0:
            return True
        due, later = await self.db(agents_due, exclude=set(self.inflight) | self.finished, limit=limit)
        self.backlog = len(due) >= limit
        wait = None if later is None else (later - timezone.now()).total_seconds()
        self.next_due = time.monotonic() + wait if wait is not None and wait > 0 else None
        self.woken.difference_update(d.pk for d in due)  # these cycles read what the operators wrote until now
        personas = [d for d in due if d.kind == Agent.Kind.PERSONA]
        if personas:
            task = asyncio.create_task(self.drive_pass(personas))
            for d in personas:
                self.inflight[d.pk] = task
        for d in due:
            if d.kind != Agent.Kind.PERSONA:
                self.inflight[d.pk] = asyncio.create_task(self.drive(d.pk, d.interval, d.kind))
        if self.cycles is not None and not due and not self.inflight:
            return bool(await self.db(agents_remaining, finished=self.finished))
        return True

    def look_due(self) -> bool:
        """Whether to ask the database now: on the tick, while agents may wait for a slot, or once an agent
        this process knows of falls due. A cycle's end otherwise waits for one of those."""
        due = self.next_due is not None and time.monotonic() >= self.next_due
        return self.ticked or self.backlog or due

    def wait_seconds(self) -> float:
        if self.next_due is None:
            return self.tick
        return max(0.0, min(self.tick, self.next_due - time.monotonic()))

    async def db_trouble(self, exc: BaseException) -> None:
        """Log a database error and wait before the next try, longer each time, at most the setting."""
        self.failures += 1
        if self.outage_since is None:
            self.outage_since = time.monotonic()
        delay = min(settings.RUNNER_DB_RETRY_MAX_SECONDS, RETRY_FIRST_SECONDS * 2 ** (self.failures - 1))
        logger.warning("%s: database unreachable (%s); try %d, next in %.2f s", self.id, error_brief(exc),
                       self.failures, delay)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.stopping.wait(), timeout=delay)

    async def prune_forever(self) -> None:
        while not self.stopping.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.stopping.wait(), timeout=self.prune_seconds)
            if self.stopping.is_set():
                return
            try:
                await self.db(retention_prune, budget_seconds=PRUNE_BUDGET_SECONDS)
            except CONNECTION_ERRORS as exc:
                logger.warning("%s: pruning failed (%s); next round later", self.id, error_brief(exc))
            except Exception:
                logger.exception("%s: pruning failed", self.id)

    async def run(self) -> None:
        global current
        current = self
        self.loop = asyncio.get_running_loop()
        operator_acted.connect(self.operator_acted, dispatch_uid=f"embedded.operator_acted.{id(self)}")
        # The threads' entry points, wrapped once for the run rather than once a cycle.
        self.cycle = sync_to_async(cycle_run, thread_sensitive=False, executor=self.cycle_threads)
        self.personas = sync_to_async(personas_run, thread_sensitive=False, executor=self.cycle_threads)
        self.db_calls = sync_to_async(db_call, thread_sensitive=False, executor=self.db_thread)
        logger.info("%s started (up to %d agents at once)", self.id, self.concurrency)
        background = [asyncio.create_task(self.prune_forever())] if self.prune_seconds > 0 else []
        if self.notify:
            from runtime.notify import notifier_forever

            background.append(asyncio.create_task(notifier_forever(self.stopping, runner=self.id)))
        try:
            # This process drives every agent: planning left "validating" was cut off when it last stopped.
            with contextlib.suppress(*CONNECTION_ERRORS):
                await self.db(plans_orphaned_fail, runner=self.id, stale_seconds=0)
            while not self.stopping.is_set():
                self.wake.clear()
                if self.look_due():
                    try:
                        if not await self.look():
                            break
                    except CONNECTION_ERRORS as exc:
                        await self.db_trouble(exc)
                        self.ticked = True  # look again after the wait, whatever wakes the loop meanwhile
                        continue
                    if self.outage_since is not None:
                        logger.warning("%s: the database answers again after %.1f s; carrying on", self.id,
                                       time.monotonic() - self.outage_since)
                    self.failures, self.outage_since = 0, None
                try:
                    await asyncio.wait_for(self.wake.wait(), timeout=self.wait_seconds())
                    self.ticked = False
                except TimeoutError:
                    self.ticked = True
        finally:
            operator_acted.disconnect(dispatch_uid=f"embedded.operator_acted.{id(self)}")
            self.stopping.set()
            await self.shutdown(background)
            if current is self:
                current = None

    async def shutdown(self, background: list[asyncio.Task[None]]) -> None:
        """Let the cycles under way finish (within the grace), then stop."""
        if self.inflight:
            await asyncio.wait(list(self.inflight.values()), timeout=settings.RUNNER_SHUTDOWN_GRACE_SECONDS)
        if self.inflight:
            logger.warning("%s: %d cycles still under way after %.0f s", self.id, len(self.inflight),
                           settings.RUNNER_SHUTDOWN_GRACE_SECONDS)
        for task in background:
            task.cancel()
        await asyncio.gather(*background, return_exceptions=True)
        for executor in (self.db_thread, self.cycle_threads):
            executor.shutdown(wait=False, cancel_futures=True)
        logger.info("%s stopped", self.id)
