"""The runner: claims agents with leases and drives their cycles concurrently on one asyncio loop.

Leases make scale-out safe: any number of runners share the database; a claim is
`SELECT ... FOR UPDATE SKIP LOCKED` on PostgreSQL (SQLite serialises writers instead), so no agent is
driven by two runners at once. Each runner holds the leases of its fair share of the running agents
(their number divided among the live runners, from the heartbeats), renews them with its heartbeat and
drives them as they fall due, the longest-waiting first; when runners join it gives the excess back, and
it takes free agents only while below its share. A killed runner's leases expire and its heartbeat goes
stale, so the others' shares grow and they continue its agents; a runner stopped with SIGTERM/SIGINT
frees every agent it is not driving at once, and the others as their cycles end.

The database may go away under a runner (a terminated connection, a restart, a failover): the loop
logs it, waits with a growing backoff and carries on when the database answers again. Cycles run on a few
worker threads (database work off the loop), each cycle in a greenlet: a model's answer is awaited on the
loop while the cycle is parked, holding neither its thread (agents/parking.py) nor a database connection
(agents/connections.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import os
import socket
import time
import uuid
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timedelta
from typing import Any

from asgiref.sync import sync_to_async
from django.conf import settings
from django.db import transaction
from django.db.models import F, Min, Q
from django.utils import timezone

from agents.connections import CONNECTION_ERRORS, connection_recover, connection_release
from agents.cycle import agent_cycle
from agents.models import Agent, RunnerHeartbeat
from agents.parking import CyclePool
from agents.retention import retention_prune
from planning.models import Plan
from planning.planner import plans_interrupted_fail

logger = logging.getLogger("planner.runner")

RETRY_FIRST_SECONDS = 0.25  # the first wait after a database error; doubled up to RUNNER_DB_RETRY_MAX_SECONDS
PRUNE_BUDGET_SECONDS = 5.0  # one background pruning round; a bigger backlog goes on in the next round
HEARTBEAT_MAX_SECONDS = 2.5
# The agents runners drive: running ones, but not external agents, which drive themselves over the API.
DRIVEN = Q(status=Agent.Status.RUNNING) & ~Q(kind=Agent.Kind.EXTERNAL)
HEARTBEAT_FORGOTTEN = timedelta(hours=1)  # rows of runners gone without a word (killed) are deleted after this


def runner_id_new() -> str:
    """A name operators can read in leases and timelines: which machine, which process."""
    return f"runner {socket.gethostname()}/{os.getpid()}-{uuid.uuid4().hex[:4]}"


def lease_end(now: datetime) -> datetime:
    return now + timedelta(seconds=settings.RUNNER_LEASE_SECONDS)


def agents_claim(*, runner: str, limit: int, exclude: set[int], release: set[int] | None = None,
                 share: int | None = None) -> list[int]:
    """Lease up to `limit` due, running agents, the longest-waiting first, in one transaction: this runner's
    own agents first, then agents no live runner holds, as long as it holds fewer than its `share` (None:
    no bound). The leases of `release` (agents it is done with) go back first. Returns the claimed ids."""
    now = timezone.now()
    with transaction.atomic():
        if release:
            agents_release(runner=runner, ids=release)
        if limit <= 0:
            return []
        due = (Q(next_cycle_at__isnull=True) | Q(next_cycle_at__lte=now)) & DRIVEN
        # Never-run agents first (PostgreSQL sorts NULL last unless told), then the longest overdue.
        order = (F("next_cycle_at").asc(nulls_first=True), "pk")
        ids = list(Agent.objects.select_for_update(skip_locked=True).filter(due, lease_owner=runner)
                   .exclude(pk__in=exclude).order_by(*order).values_list("pk", flat=True)[:limit])
        room = limit - len(ids)
        if share is not None:
            room = min(room, share - Agent.objects.filter(lease_owner=runner).count())
        if room > 0:
            free = Q(lease_owner="") | Q(lease_expires_at__lt=now)
            ids += Agent.objects.select_for_update(skip_locked=True).filter(due & free).exclude(pk__in=exclude) \
                .order_by(*order).values_list("pk", flat=True)[:room]
        if ids:
            Agent.objects.filter(pk__in=ids).update(lease_owner=runner, lease_expires_at=lease_end(now))
            plans_interrupted_fail(agent_ids=ids, runner=runner)  # planning cut off by a runner that died
    return ids


def agents_next_due(*, runner: str, exclude: set[int]) -> datetime | None:
    """When the earliest running agent this runner could claim (its own or a free one, not under way here)
    falls due; None when none is waiting for a time."""
    now = timezone.now()
    mine_or_free = Q(lease_owner=runner) | Q(lease_owner="") | Q(lease_expires_at__lt=now)
    due: datetime | None = Agent.objects.filter(DRIVEN & mine_or_free).exclude(pk__in=exclude).aggregate(
        due=Min("next_cycle_at"))["due"]
    return due


def agents_claim_next(*, runner: str, limit: int, exclude: set[int], release: set[int],
                      share: int | None) -> tuple[list[int], dict[int, tuple[float, str]], datetime | None]:
    """A claim (agents_claim); the cycle interval and kind of each agent claimed (when its cycle ends, it is
    due again after that; its kind tells the cycle what to read); and, when the claim left slots free, when
    the next agent falls due: until then a freed slot has nothing to take, and the runner need not ask."""
    claimed = agents_claim(runner=runner, limit=limit, exclude=exclude, release=release, share=share)
    facts = {pk: (interval, kind) for pk, interval, kind in Agent.objects.filter(pk__in=claimed).values_list(
        "pk", "cycle_interval", "kind")} if claimed else {}
    if len(claimed) >= limit:
        return claimed, facts, None
    return claimed, facts, agents_next_due(runner=runner, exclude=exclude | set(claimed))


def plans_orphaned_fail(*, runner: str) -> int:
    """Plans left "validating" by a runner that died, of agents no runner holds any more (a paused agent is
    never claimed again): failed with their reason once the lease has expired, so none waits for good.
    External agents are left alone: their planning runs in the web process that took the request."""
    now = timezone.now()
    stale = now - timedelta(seconds=settings.RUNNER_LEASE_SECONDS)
    with transaction.atomic():
        ids = list(Agent.objects.select_for_update(skip_locked=True)
                   .filter(Q(lease_owner="") | Q(lease_expires_at__lt=now))
                   .exclude(kind=Agent.Kind.EXTERNAL)
                   .filter(pk__in=Plan.objects.filter(status=Plan.Status.VALIDATING, updated_at__lt=stale)
                           .values("agent_id"))
                   .values_list("pk", flat=True))
        return plans_interrupted_fail(agent_ids=ids, runner=runner) if ids else 0


def agents_release(*, runner: str, ids: set[int] | None = None, keep: set[int] | None = None) -> None:
    """Give back this runner's leases (of `ids` only, when given), except those of `keep`."""
    qs = Agent.objects.filter(lease_owner=runner)
    if ids is not None:
        qs = qs.filter(pk__in=ids)
    if keep:
        qs = qs.exclude(pk__in=keep)
    qs.update(lease_owner="", lease_expires_at=None)


def agents_remaining(*, finished: set[int]) -> bool:
    """Whether some running agent still owes this runner cycles (for --cycles). Agents another runner
    holds count too: their lease is released or expires, and then this runner drives them."""
    return Agent.objects.filter(DRIVEN).exclude(pk__in=finished).exists()


def runner_heartbeat(*, runner: str, in_flight: set[int], cycles: int, create: bool = True) -> tuple[set[int], int]:
    """Say this runner is alive, work out its fair share and keep its leases to that; one transaction.

    The share is the running agents divided among the live runners: a runner keeps (and renews) the
    leases of its agents up to its share, those under way always, and gives back the rest (the latest
    due first) for the others, so a runner that joins gets its part within a heartbeat and no runner
    takes them all while others idle. Returns the in-flight agents whose lease it still holds (one it
    lost, e.g. after a database outage longer than a lease, is logged by the caller) and the share.
    A stopping runner passes `create=False`: a beat that lands after its clean stop deleted the row must
    not bring it back (the runner would count as live for a lease after it exited)."""
    now = timezone.now()
    with transaction.atomic():
        if not RunnerHeartbeat.objects.filter(name=runner).update(seen_at=now, in_flight=len(in_flight), cycles=cycles):
            if not create:
                return set(), 1
            RunnerHeartbeat.objects.filter(seen_at__lt=now - HEARTBEAT_FORGOTTEN).delete()
            RunnerHeartbeat.objects.create(name=runner, host=socket.gethostname()[:255], pid=os.getpid(), seen_at=now,
                                           in_flight=len(in_flight), cycles=cycles)
        live = RunnerHeartbeat.objects.live().count()
        running = Agent.objects.filter(DRIVEN).count()
        share = max(1, math.ceil(running / max(1, live)))
        held = list(Agent.objects.filter(lease_owner=runner)
                    .order_by(F("next_cycle_at").asc(nulls_first=True), "pk").values_list("pk", "status"))
        kept = {pk for pk, _status in held if pk in in_flight}
        for pk, status in held:
            if pk not in kept and status == Agent.Status.RUNNING and len(kept) < share:
                kept.add(pk)
        if len(kept) < len(held):
            agents_release(runner=runner, keep=kept)
        if kept:
            Agent.objects.filter(pk__in=kept, lease_owner=runner).update(lease_expires_at=lease_end(now))
    return kept & in_flight, share


def runner_gone(*, runner: str, keep: set[int]) -> None:
    """A clean stop: free every agent but those still in a cycle (`keep`), and leave the live runners."""
    with transaction.atomic():
        agents_release(runner=runner, keep=keep)
        RunnerHeartbeat.objects.filter(name=runner).delete()


POOL_KEPT_FOR_LOOP = 2  # connections of the pool left to the loop's own database thread and the pruning thread


def threads_fitting_pool() -> int:
    """How many cycle threads the process's connection pool serves without making one wait: each holds at
    most one connection at a time (none while its cycles wait for models). No bound without a pool."""
    pool = settings.DATABASES["default"].get("OPTIONS", {}).get("pool")
    if not isinstance(pool, dict) or "max_size" not in pool:
        return 1_000_000
    return max(1, int(pool["max_size"]) - POOL_KEPT_FOR_LOOP)


def db_call(fn: Callable[..., Any], /, **kwargs: Any) -> Any:
    """Run one of the loop's database operations in its thread, then hand the connection back."""
    try:
        return fn(**kwargs)
    except CONNECTION_ERRORS:
        connection_recover()
        raise
    finally:
        connection_release()


def cycle_run(agent_id: int, runner: str, kind: str = "") -> str:
    try:
        return agent_cycle(agent_id=agent_id, runner=runner, kind=kind)
    except CONNECTION_ERRORS:
        connection_recover()
        raise
    finally:
        connection_release()


def error_brief(exc: BaseException) -> str:
    """One line for the log: the driver's first line, without the SQL or the traceback."""
    return f"{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''}"[:300]


class Runner:
    """Drive agents until stopped, or until each has had `cycles` cycles from this runner."""

    def __init__(self, *, runner_id: str | None = None, cycles: int | None = None,
                 concurrency: int | None = None, tick: float | None = None, prune_seconds: float | None = None,
                 threads: int | None = None) -> None:
        self.id = runner_id or runner_id_new()
        self.cycles = cycles
        self.concurrency = concurrency or settings.RUNNER_CONCURRENCY
        self.tick = settings.RUNNER_TICK_SECONDS if tick is None else tick
        # Four beats a lease (one lost beat loses nothing), and often enough that a runner that leaves or
        # dies is noticed by the others within seconds.
        self.beat_seconds = min(settings.RUNNER_LEASE_SECONDS / 4, HEARTBEAT_MAX_SECONDS)
        self.prune_seconds = settings.RETENTION_PRUNE_SECONDS if prune_seconds is None else prune_seconds
        self.share = self.concurrency  # until the first heartbeat tells how many runners share the agents
        self.done: Counter[int] = Counter()
        self.cycles_total = 0
        self.inflight: dict[int, asyncio.Task[None]] = {}
        self.ended: set[int] = set()  # agents done with (--cycles reached); their leases go back with the next claim
        self.stopping = asyncio.Event()
        self.wake = asyncio.Event()  # a slot freed, or a stop: claim or leave now, not on the next tick
        # Whether the last claim filled every free slot (agents were waiting, so a freed slot is refilled at
        # once), and if not, when the next agent it could take falls due (time.monotonic()): a slot freed
        # before then has nothing to take, and asking would cost a write transaction each time.
        self.backlog = True
        self.next_due: float | None = None
        self.ticked = True  # the last wait ended on the tick (or there was none yet), not on a wake
        self.agent_facts: dict[int, tuple[float, str]] = {}  # each agent claimed: its cycle interval (s), its kind
        self.leases = asyncio.Lock()  # a claim and a heartbeat never interleave (see beat)
        self.failures = 0
        self.outage_since: float | None = None
        # Cycles get their own threads (started with the loop, see run): the loop's default executor must stay
        # free for the work the async LLM client and DNS lookups hand to it. A few threads carry all the
        # cycles, since a cycle waiting for a model is parked, not a thread. The loop's own database work
        # (claims, heartbeats) runs on one more thread, pruning on another.
        self.threads = max(1, min(self.concurrency, threads or settings.RUNNER_THREADS, threads_fitting_pool()))
        self.cycles_pool: CyclePool | None = None
        self.db_executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="runner-db")
        self.prune_executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="runner-prune")

    def stop(self) -> None:
        self.stopping.set()
        self.wake.set()

    @property
    def finished(self) -> set[int]:
        return {a for a, n in self.done.items() if self.cycles is not None and n >= self.cycles}

    async def db(self, fn: Callable[..., Any], /, **kwargs: Any) -> Any:
        return await sync_to_async(db_call, thread_sensitive=False, executor=self.db_executor)(fn, **kwargs)

    def db_back(self) -> None:
        if self.outage_since is not None:
            logger.warning("runner %s: the database answers again after %.1f s; carrying on", self.id,
                           time.monotonic() - self.outage_since)
        self.failures = 0
        self.outage_since = None

    async def db_trouble(self, exc: BaseException) -> None:
        """Log a database error and wait before the next try, longer each time, at most the setting."""
        self.failures += 1
        if self.outage_since is None:
            self.outage_since = time.monotonic()
        delay = min(settings.RUNNER_DB_RETRY_MAX_SECONDS, RETRY_FIRST_SECONDS * 2 ** (self.failures - 1))
        logger.warning("runner %s: database unreachable (%s); try %d, next in %.2f s", self.id, error_brief(exc),
                       self.failures, delay)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.stopping.wait(), timeout=delay)

    async def drive(self, agent_id: int) -> None:
        counted = True
        try:
            assert self.cycles_pool is not None
            _interval, kind = self.agent_facts.get(agent_id, (0.0, ""))
            what = await self.cycles_pool.submit(cycle_run, agent_id, self.id, kind)
            logger.debug("agent %s: %s", agent_id, what)
        except CONNECTION_ERRORS as exc:
            # Not a cycle that happened: the agent is due again and runs once the database is back.
            counted = False
            logger.warning("runner %s: cycle of agent %s cut off by the database (%s)", self.id, agent_id,
                           error_brief(exc))
        except Exception:  # one agent's broken cycle must never stop the others
            logger.exception("cycle of agent %s failed", agent_id)
        finally:
            if counted:
                self.done[agent_id] += 1
                self.cycles_total += 1
                if agent_id not in self.finished:  # (--cycles) an agent done with is never due again here
                    self.due_after(self.agent_facts.get(agent_id, (0.0, ""))[0])
            self.inflight.pop(agent_id, None)
            if agent_id in self.finished:
                self.ended.add(agent_id)
            self.wake.set()

    def claim_due(self) -> bool:
        """Whether to ask the database for agents now: on the tick, when the last claim left agents waiting,
        once the next one falls due (an agent whose cycle ended is due again after its interval), or when
        the last cycle under way ended with agents done (--cycles: give them back, or stop). A freed slot
        otherwise waits for one of those."""
        due = self.next_due is not None and time.monotonic() >= self.next_due
        return self.ticked or self.backlog or due or bool(self.ended and not self.inflight)

    def due_after(self, seconds: float) -> None:
        """An agent this runner knows of falls due in `seconds`."""
        at = time.monotonic() + seconds
        self.next_due = at if self.next_due is None else min(self.next_due, at)

    def wait_seconds(self) -> float:
        if self.next_due is None:
            return self.tick
        return max(0.0, min(self.tick, self.next_due - time.monotonic()))

    async def claim(self) -> list[int]:
        async with self.leases:
            release, self.ended = self.ended, set()
            limit = self.concurrency - len(self.inflight)
            try:
                claimed, facts, next_due = await self.db(
                    agents_claim_next, runner=self.id, limit=limit, exclude=set(self.inflight) | self.finished,
                    release=release, share=self.share,
                )
            except BaseException:
                self.ended |= release
                raise
            self.backlog = limit > 0 and len(claimed) >= limit
            # An agent already due that this claim did not take (over this runner's share, or being claimed
            # by another runner) is no reason to ask again before the tick.
            wait = None if next_due is None else (next_due - timezone.now()).total_seconds()
            self.next_due = time.monotonic() + wait if wait is not None and wait > 0 else None
            self.agent_facts.update(facts)
            for agent_id in claimed:
                self.inflight[agent_id] = asyncio.create_task(self.drive(agent_id))
        return claimed

    async def beat(self) -> None:
        # Under the leases lock: the heartbeat keeps the leases of the agents under way, so it must see
        # every agent a claim has just taken.
        async with self.leases:
            in_flight = set(self.inflight)
            try:
                held, self.share = await self.db(runner_heartbeat, runner=self.id, in_flight=in_flight,
                                                 cycles=self.cycles_total, create=not self.stopping.is_set())
            except CONNECTION_ERRORS as exc:
                logger.warning("runner %s: heartbeat failed (%s)", self.id, error_brief(exc))
                return
        lost = (in_flight - held) & set(self.inflight)
        if lost:
            logger.error("runner %s lost the lease of agents %s while their cycles ran (no renewal for "
                         "RUNNER_LEASE_SECONDS)", self.id, sorted(lost))

    async def beat_forever(self) -> None:
        # Beats go on while a stopping runner finishes its cycles (their leases must not lapse meanwhile);
        # the shutdown cancels this task last.
        while True:
            await asyncio.sleep(self.beat_seconds)
            await self.beat()
            try:
                await self.db(plans_orphaned_fail, runner=self.id)
            except CONNECTION_ERRORS as exc:
                logger.warning("runner %s: looking for interrupted planning failed (%s)", self.id, error_brief(exc))
            except Exception:
                logger.exception("runner %s: looking for interrupted planning failed", self.id)

    async def prune_forever(self) -> None:
        while not self.stopping.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.stopping.wait(), timeout=self.prune_seconds)
            if self.stopping.is_set():
                return
            try:
                await asyncio.get_running_loop().run_in_executor(
                    self.prune_executor, lambda: db_call(retention_prune, budget_seconds=PRUNE_BUDGET_SECONDS))
            except CONNECTION_ERRORS as exc:
                logger.warning("runner %s: pruning failed (%s); next round later", self.id, error_brief(exc))
            except Exception:
                logger.exception("runner %s: pruning failed", self.id)

    async def run(self) -> None:
        logger.info("runner %s started (up to %d agents at once on %d threads)", self.id, self.concurrency,
                    self.threads)
        self.cycles_pool = CyclePool(threads=self.threads, loop=asyncio.get_running_loop())
        await self.beat()  # the first claim already knows this runner's fair share
        background = [asyncio.create_task(self.beat_forever())]
        if self.prune_seconds > 0:
            background.append(asyncio.create_task(self.prune_forever()))
        try:
            while not self.stopping.is_set():
                self.wake.clear()
                if self.claim_due():
                    try:
                        claimed = await self.claim()
                        idle = self.cycles is not None and not claimed and not self.inflight
                        if idle and not await self.db(agents_remaining, finished=self.finished):
                            break
                    except CONNECTION_ERRORS as exc:
                        self.ticked = True  # try again after the wait, whatever wakes the loop meanwhile
                        await self.db_trouble(exc)
                        continue
                    self.db_back()
                try:
                    await asyncio.wait_for(self.wake.wait(), timeout=self.wait_seconds())
                    self.ticked = False
                except TimeoutError:
                    self.ticked = True
        finally:
            self.stopping.set()
            await self.shutdown(background)

    async def shutdown(self, background: list[asyncio.Task[None]]) -> None:
        """Free the agents not in a cycle at once, the others as their cycles end (within the grace)."""
        deadline = time.monotonic() + settings.RUNNER_SHUTDOWN_GRACE_SECONDS
        with contextlib.suppress(*CONNECTION_ERRORS):
            await self.db(agents_release, runner=self.id, keep=set(self.inflight))
        while self.inflight and time.monotonic() < deadline:
            await asyncio.wait(list(self.inflight.values()), timeout=deadline - time.monotonic(),
                               return_when=asyncio.FIRST_COMPLETED)
            with contextlib.suppress(*CONNECTION_ERRORS):
                await self.db(agents_release, runner=self.id, keep=set(self.inflight))
        if self.inflight:
            logger.warning("runner %s: %d cycles still under way after %.0f s; their agents go on elsewhere once "
                           "their leases expire", self.id, len(self.inflight), settings.RUNNER_SHUTDOWN_GRACE_SECONDS)
        for attempt in range(3):
            try:
                await self.db(runner_gone, runner=self.id, keep=set(self.inflight))
                break
            except CONNECTION_ERRORS as exc:
                logger.warning("runner %s: could not free its leases (%s)%s", self.id, error_brief(exc),
                               "; they expire on their own" if attempt == 2 else "")
                await asyncio.sleep(0.5 * (attempt + 1))
        for task in background:
            task.cancel()
        await asyncio.gather(*background, return_exceptions=True)
        for executor in (self.db_executor, self.prune_executor):
            executor.shutdown(wait=False, cancel_futures=True)
        if self.cycles_pool is not None:
            self.cycles_pool.shutdown()
        logger.info("runner %s stopped", self.id)
