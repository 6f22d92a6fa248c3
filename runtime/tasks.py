"""Agent cycles as Procrastinate jobs (the scale-out runtime; PostgreSQL).

Persona agents are driven in passes: the driven personas are split into shards (by id), as many as their cycles
need (one per RUNNER_SHARD_CYCLES_PER_SECOND of them, at most RUNNER_PERSONA_SHARDS, none without personas:
shards_wanted), and each shard has one chain of `agents.personas` jobs. A pass runs one cycle of each of the
shard's due personas at once (runtime/cycle.py, persona_cycles: one read, one transaction), then defers the
shard's next pass to when its next persona falls due. Its lock (`personas:<shard>/<shards>`) keeps one pass of a
shard under way at a time. When the fleet wants another number of shards, the old chains end at their next pass
and the sweep starts the new ones once none of the old is waiting or under way: two passes never take the same
persona. A persona whose cycle needs more than the common path (a model call, a plan to make)
gets a cycle job of its own, below; passes leave it alone while that job waits or runs.

Every other driven agent (tool agents) has one chain of `agents.cycle` jobs: each cycle, when it ends, defers
the next one `cycle_interval` seconds later. A chain starts with a start pass (`agents.start`) of the agent's
shard (its id modulo RUNNER_START_SHARDS): the pass takes the shard's driven tool agents that are due and have no
cycle waiting or under way, plans together the first goals of those whose cycle would only plan one (runtime/cycle.py
tools_start: a hundred agents given goals wait for their models side by side, in one pass, not in a hundred
jobs), and defers each agent's cycle (the planned ones' next, at the time their cycle set; the others' first, at
once). Its lock (`starts:<shard>/<shards>`) keeps one start pass of a shard under way at a time, and its queueing
lock one waiting: an agent made driven while its shard's pass runs is taken by the next one. Every cycle job carries the agent's lock (`agent:<id>`), so the engine never
starts a cycle of an agent while another runs, on any worker; and its queueing lock (the same string), so an
agent never has two cycles waiting. A chain breaks when a cycle's worker dies (the engine retries the job
once the worker's heartbeats stop: `jobs_stalled_retry`). A tool agent created or resumed gets its chain when
the write commits (`chain_start_on_save`: a start pass of its shard); the `agents_schedule` sweep, every two
seconds, defers a start pass for each shard with a driven agent that still has no chain. Planning a start pass
began and a dead worker cut off is failed like a dead cycle's: by the agent's next cycle, or by the sweep once no
start pass of its shard runs.

Every cycle first fails the planning a dead cycle left "validating" (runtime/cycles.py): thanks to
the lock, no other cycle of this agent runs meanwhile. A cycle job carries the agent's kind when its deferrer
read it (its chain, its start): a tool agent's cycle then reads its row alone, and finds such planning in the
read of its open plans (runtime/cycle.py, tool_open_plan).
"""

from __future__ import annotations

import logging
import math
import threading
import time
from datetime import timedelta
from typing import Any

from asgiref.sync import sync_to_async
from django.conf import settings
from django.db import transaction
from django.db.models import Exists, F, FloatField, Min, OuterRef, Q, QuerySet, Sum, Value
from django.db.models.functions import Greatest, Mod
from django.db.models.signals import post_save
from django.utils import timezone
from procrastinate import Blueprint, JobContext, exceptions
from procrastinate.jobs import Status

from agents.connections import (
    CONNECTION_ERRORS,
    connection_recover,
    connection_release,
    connection_scope,
    error_brief,
)
from agents.fencing import Fence, FenceLost, fenced
from agents.models import Agent
from agents.signals import operator_acted
from planning.models import Plan
from runtime.cycles import (
    agents_driven,
    cycle_run,
    personas_run,
    plans_orphaned_fail,
    tools_start_run,
)
from runtime.outage import OUTAGE, OUTAGE_LINE, REFUSED_LINE, STRAGGLER_LINE
from runtime.retention import retention_prune

logger = logging.getLogger("planner.runner")

CYCLES_QUEUE = "cycles"
CONTROL_QUEUE = "control"  # the sweep, the stalled-job retry and pruning: never behind a backlog of cycles
LOCK_PREFIX = "agent:"
PASS_PREFIX = "personas:"
START_PREFIX = "starts:"
TOOLS_PER_START = 400  # a bigger backlog goes on in the next start pass, deferred at once
PERSONAS_PER_PASS = 400  # a bigger backlog goes on in the next pass, deferred at once
PRUNE_BUDGET_SECONDS = 5.0  # one pruning round; a bigger backlog goes on in the next round

blueprint = Blueprint()

# Jobs whose task returned in this process, with when (time.monotonic()). The engine marks a job finished just
# after its task returns; a job still "doing" a while later lost that write to a cut connection, and would hold
# its agent's lock for as long as this worker lives (its heartbeat is fine, so it is never found stalled).
# `jobs_unfinished_settle` finishes such jobs.
RETURNED_GRACE_SECONDS = 2.0
_returned: dict[int, tuple[float, int | None]] = {}  # job id -> (when, the worker that took it)
_returned_lock = threading.Lock()


class Lease:
    """This runner's lease (agents/fencing.py): valid while its worker's last heartbeat (or registration) that the
    database took was sent less than RUNNER_LEASE_SECONDS ago. The engine retries a worker's jobs elsewhere only
    once its heartbeat is RUNNER_STALLED_SECONDS old, so a runner cut off stops recording and starting tools
    before anyone may take its jobs. Valid in a process whose worker never beat (a job run by hand, a test)."""

    def __init__(self) -> None:
        self.renewed_at: float | None = None
        self._lock = threading.Lock()

    def renew(self, sent_at: float) -> None:
        with self._lock:
            self.renewed_at = sent_at if self.renewed_at is None else max(self.renewed_at, sent_at)
        OUTAGE.answered(sent_at)  # the database answers: an outage under way is over, said in one line

    def valid(self) -> bool:
        renewed = self.renewed_at
        return renewed is None or time.monotonic() - renewed < settings.RUNNER_LEASE_SECONDS


LEASE = Lease()


def job_fence(context: JobContext) -> Fence | None:
    """The fence of the job this context runs: its id, the engine's worker that took it, this runner's lease."""
    job = context.job
    if job is None or job.id is None:
        return None
    return Fence(job_id=job.id, worker_id=job.worker_id, lease_valid=LEASE.valid)


def fence_line(exc: FenceLost) -> dict[str, object]:
    """The log line's `extra` for a refusal (runtime/outage.py): during an outage (the lease ran out), or
    a straggler of one (taken over meanwhile)."""
    return REFUSED_LINE if exc.lease_ran_out else STRAGGLER_LINE


def job_returned(context: JobContext) -> None:
    """The job's task returned here (see `_returned`)."""
    if context.job is not None and context.job.id is not None:
        job_finish_later(context.job.id, context.job.worker_id)


def job_finish_later(job_id: int, worker_id: int | None) -> None:
    """Have the settling round finish this job if it is found still under way (and this worker's) a while later."""
    with _returned_lock:
        _returned[job_id] = (time.monotonic(), worker_id)


def agent_lock(agent_id: int) -> str:
    return f"{LOCK_PREFIX}{agent_id}"


def runner_name(context: JobContext) -> str:
    """The name this worker process goes by in timelines (`runagents --runner-id`)."""
    return str(context.additional_context.get("runner") or context.worker_name or "a worker")


def cycle_defer(agent_id: int, *, after: float = 0.0, kind: str = "") -> bool:
    """Defer the agent's next cycle `after` seconds from now; False when one is already waiting. `kind`: the
    agent's kind when the caller has just read it (a tool agent's cycle then reads only its row, cycle_run)."""
    try:
        with transaction.atomic():  # a refused insert leaves a caller's transaction usable
            agent_cycle_job.configure(lock=agent_lock(agent_id), queueing_lock=agent_lock(agent_id),
                                      schedule_at=timezone.now() + timedelta(seconds=max(after, 0.0))
                                      ).defer(agent_id=agent_id, **({"kind": kind} if kind else {}))
    except exceptions.AlreadyEnqueued:
        return False
    return True


@blueprint.task(name="agents.cycle", queue=CYCLES_QUEUE, pass_context=True)
def agent_cycle_job(context: JobContext, agent_id: int, kind: str = "") -> str:
    """One cycle of one agent, then the next one deferred after its interval (while it is driven). `kind`: the
    agent's kind as the job's deferrer read it (none from the sweep and for a persona's own cycle)."""
    try:
        with fenced(job_fence(context)):
            return agent_cycle_run(context, agent_id, kind)
    finally:
        job_returned(context)


def agent_cycle_run(context: JobContext, agent_id: int, kind: str = "") -> str:
    """The cycle, then its successor deferred on the same connection (one pool checkout, and its check, fewer a
    cycle; a connection the cycle found cut was dropped, and the next is checked out afresh), then given back.
    A runner that no longer holds the job (agents/fencing.py) records nothing and chains nothing: the runner
    that took the job over does. One whose lease ran out records nothing but chains as after any cycle that
    failed: a runner whose heartbeats were only late (a busy host) keeps the agent going, and the successor's
    queueing lock keeps it at one, whoever takes the job over."""
    chained = True
    try:
        return cycle_run(agent_id, runner_name(context), kind, release=False)
    except FenceLost as exc:
        chained = exc.lease_ran_out
        logger.warning("cycle of agent %s not recorded: %s", agent_id, exc, extra=fence_line(exc))
        return "fenced off"
    except Agent.DoesNotExist:
        return "agent deleted"  # its chain ends here: it is driven no more
    except CONNECTION_ERRORS as exc:  # not a cycle that happened: the next one comes all the same
        logger.warning("cycle of agent %s cut off by the database (%s)", agent_id, error_brief(exc),
                       extra=OUTAGE_LINE)
        return "cut off by the database"
    except Exception:  # one agent's broken cycle must not end its chain: it is logged and the next one comes
        logger.exception("cycle of agent %s failed", agent_id)
        return "failed"
    finally:
        try:
            if chained:
                chain_next(agent_id)
        finally:
            connection_release()


def agents_chained() -> QuerySet[Agent]:
    """The driven agents that have chains of their own: all but personas, which passes drive."""
    return agents_driven().exclude(kind=Agent.Kind.PERSONA)


def shard_personas(shard: int, shards: int) -> QuerySet[Agent]:
    return agents_driven().filter(kind=Agent.Kind.PERSONA).annotate(shard=Mod(F("pk"), shards)).filter(shard=shard)


def shards_wanted() -> int:
    """How many shards the driven personas make: one per RUNNER_SHARD_CYCLES_PER_SECOND of their cycles (a persona
    cycles at most once a pass: 1 / max(its interval, RUNNER_PASS_GAP_SECONDS) a second), at most
    RUNNER_PERSONA_SHARDS; none without personas. Each shard's passes cost their job and their fixed statements
    whatever their size, so a small fleet makes fewer, larger passes, while a large one needs every shard to
    spread over the runners."""
    gap = max(settings.RUNNER_PASS_GAP_SECONDS, 0.001)
    rate = agents_driven().filter(kind=Agent.Kind.PERSONA).aggregate(rate=Sum(
        Value(1.0) / Greatest(F("cycle_interval"), Value(gap)), output_field=FloatField()))["rate"]
    if not rate:
        return 0
    return max(1, min(settings.RUNNER_PERSONA_SHARDS, math.ceil(rate / settings.RUNNER_SHARD_CYCLES_PER_SECOND)))


def pass_lock(shard: int, shards: int) -> str:
    return f"{PASS_PREFIX}{shard}/{shards}"


def pass_defer(shard: int, shards: int, *, after: float = 0.0) -> bool:
    """Defer a pass of the shard `after` seconds from now; False when one is already waiting."""
    try:
        with transaction.atomic():  # a refused insert leaves a caller's transaction usable
            personas_pass_job.configure(lock=pass_lock(shard, shards), queueing_lock=pass_lock(shard, shards),
                                        schedule_at=timezone.now() + timedelta(seconds=max(after, 0.0))
                                        ).defer(shard=shard, shards=shards)
    except exceptions.AlreadyEnqueued:
        return False
    return True


def personas_due(shard: int, shards: int, *, limit: int) -> list[int]:
    """The shard's due personas (never-run ones first, then the longest overdue), without those whose own cycle
    job waits or runs."""
    return due_without_cycles(shard_personas(shard, shards), limit=limit)


def due_without_cycles(agents: QuerySet[Agent], *, limit: int) -> list[int]:
    """Up to `limit` of these agents that are due (never-run ones first, then the longest overdue), without those
    whose cycle job waits or runs."""
    due = agents.filter(Q(next_cycle_at__isnull=True) | Q(next_cycle_at__lte=timezone.now()))
    ids = list(due.order_by(F("next_cycle_at").asc(nulls_first=True), "pk").values_list("pk", flat=True)[:limit])
    if not ids:
        return []
    chained = agents_with_cycles("todo", "doing")
    return [pk for pk in ids if pk not in chained]


def personas_pass(shard: int, shards: int, runner: str) -> tuple[int, int, bool]:
    """One pass of a shard: one cycle of each of its due personas, and a cycle job for each that needs its
    own. Returns the cycles recorded here, the personas sent to their own cycle, and whether more were due
    than a pass takes."""
    ids = personas_due(shard, shards, limit=PERSONAS_PER_PASS)
    if not ids:
        return 0, 0, False
    done, alone = personas_run(ids, runner)
    for agent_id in alone:
        cycle_defer(agent_id)
    return len(done), len(alone), len(ids) >= PERSONAS_PER_PASS


@blueprint.task(name="agents.personas", queue=CYCLES_QUEUE, pass_context=True)
def personas_pass_job(context: JobContext, shard: int, shards: int) -> str:
    """A pass of one shard of personas, then the shard's next pass deferred to when its next persona is due."""
    backlog, started, chained = False, time.monotonic(), True
    try:
        if (wanted := shards_wanted()) != shards:  # the fleet grew or shrank: the sweep starts the new shards
            chained = False
            return f"the personas now make {wanted} shards: this chain ends"
        with fenced(job_fence(context)):
            done, alone, backlog = personas_pass(shard, shards, runner_name(context))
        return f"{done} cycles, {alone} on their own"
    except FenceLost as exc:
        # Taken over: the shard's holder goes on with it. This runner's lease ran out: the next pass comes as
        # after any failed pass (a busy host's late heartbeats must not stop the shard until the sweep); should
        # the job be taken over meanwhile, the successor's queueing lock keeps one, and its lock one pass at once.
        chained = exc.lease_ran_out
        logger.warning("pass of personas %s not recorded: %s", pass_lock(shard, shards), exc, extra=fence_line(exc))
        return "fenced off"
    except CONNECTION_ERRORS as exc:  # not cycles that happened: the next pass tries again
        logger.warning("pass of personas %s cut off by the database (%s)", pass_lock(shard, shards), error_brief(exc),
                       extra=OUTAGE_LINE)
        return "cut off by the database"
    except Exception:  # a broken pass must not end the shard's chain: it is logged and the next one comes
        logger.exception("pass of personas %s failed", pass_lock(shard, shards))
        return "failed"
    finally:
        try:
            if chained:
                pass_next(shard, shards, backlog=backlog, elapsed=time.monotonic() - started)
        finally:
            connection_release()
            job_returned(context)


def pass_next(shard: int, shards: int, *, backlog: bool, elapsed: float = 0.0) -> None:
    """Defer the shard's next pass to when its next persona falls due (within a sweep), and no sooner than
    RUNNER_PASS_GAP_SECONDS after this pass started (`elapsed` ago): a pass as long as the gap is followed at
    once, so a shard's passes never fall further apart than their own length. With a backlog, at the gap.
    (Should the fleet want another number of shards meanwhile, that next pass ends the chain.)"""
    gap = max(settings.RUNNER_PASS_GAP_SECONDS - elapsed, 0.0)
    for attempt in (1, 2):
        try:
            after = gap
            if not backlog:
                at = shard_personas(shard, shards).aggregate(at=Min("next_cycle_at"))["at"]
                wait = settings.RUNNER_SWEEP_SECONDS if at is None else (at - timezone.now()).total_seconds()
                after = min(max(wait, gap), settings.RUNNER_SWEEP_SECONDS)
            pass_defer(shard, shards, after=after)
            return
        except CHAIN_ERRORS as exc:
            connection_recover()
            if attempt == 2:
                logger.warning("next pass of personas %s not deferred (%s); the sweep starts it again",
                               pass_lock(shard, shards), error_brief(exc), extra=OUTAGE_LINE)


# A lost connection as Django raises it (the driven read) or as the engine wraps it (the defer).
CHAIN_ERRORS: tuple[type[Exception], ...] = (*CONNECTION_ERRORS, exceptions.ConnectorException)


def chain_next(agent_id: int) -> None:
    """Defer the agent's next cycle at the time its cycle set (its interval, longer while it waits for a person:
    agents/services.py agent_cycle_count), while it is driven by a chain (a persona's own cycle
    is one cycle: passes drive it again). A connection cut just now (after the cycle's last statement, or
    after the pool's check of a connection checked out afresh) is recovered and tried once more; failing
    again, it is logged and the sweep starts the chain again."""
    for attempt in (1, 2):
        try:
            row = agents_chained().filter(pk=agent_id).values_list("next_cycle_at", "cycle_interval", "kind").first()
            if row is not None:
                next_at, interval, kind = row
                cycle_defer(agent_id, after=cycle_after(next_at, interval), kind=kind)
            return
        except CHAIN_ERRORS as exc:
            connection_recover()
            if attempt == 2:
                logger.warning("next cycle of agent %s not deferred (%s); the sweep starts its chain again",
                               agent_id, error_brief(exc), extra=OUTAGE_LINE)


def cycle_after(next_at: Any, interval: float) -> float:
    """Seconds until an agent's next cycle: the time its cycle set (agent_cycle_count); the interval after a cycle
    that failed before setting it."""
    now = timezone.now()
    return interval if next_at is None or next_at <= now else (next_at - now).total_seconds()


# --- start passes: where tool agents' chains begin ---------------------------------------------------------


def start_shard(agent_id: int) -> tuple[int, int]:
    shards = settings.RUNNER_START_SHARDS
    return agent_id % shards, shards


def start_lock(shard: int, shards: int) -> str:
    return f"{START_PREFIX}{shard}/{shards}"


def start_defer(shard: int, shards: int) -> bool:
    """Defer a start pass of the shard now; False when one is already waiting (it takes every agent due then)."""
    try:
        with transaction.atomic():  # a refused insert leaves a caller's transaction usable
            tools_start_job.configure(lock=start_lock(shard, shards), queueing_lock=start_lock(shard, shards)
                                      ).defer(shard=shard, shards=shards)
    except exceptions.AlreadyEnqueued:
        return False
    return True


def tools_unchained(shard: int, shards: int, *, limit: int) -> list[int]:
    """The shard's driven tool agents that are due (never run, or overdue) and have no cycle waiting or under way,
    never-run ones first."""
    shard_tools = agents_chained().filter(kind=Agent.Kind.TOOL).annotate(shard=Mod(F("pk"), shards)).filter(shard=shard)
    return due_without_cycles(shard_tools, limit=limit)


def tools_start_pass(shard: int, shards: int, runner: str) -> tuple[int, int, bool]:
    """One start pass of a shard: the first goals of its agents that only plan one planned together, then every
    agent's chain deferred (tools_start). Returns the agents planned here, those sent to their own first cycle,
    and whether more were due than a pass takes."""
    ids = tools_unchained(shard, shards, limit=TOOLS_PER_START)
    if not ids:
        return 0, 0, False
    planned, alone = tools_start_run(ids, runner)
    rows = agents_chained().filter(pk__in=planned).values_list("pk", "next_cycle_at", "cycle_interval")
    for agent_id, next_at, interval in rows:
        cycle_defer(agent_id, after=cycle_after(next_at, interval), kind=Agent.Kind.TOOL)
    for agent_id in alone:
        cycle_defer(agent_id, kind=Agent.Kind.TOOL)
    return len(planned), len(alone), len(ids) >= TOOLS_PER_START


@blueprint.task(name="agents.start", queue=CYCLES_QUEUE, pass_context=True)
def tools_start_job(context: JobContext, shard: int, shards: int) -> str:
    """A start pass of one shard of tool agents (tools_start_pass); with a backlog, the next one deferred at once.
    An agent it read but did not chain (the pass broke off) is found by the sweep."""
    backlog = False
    try:
        with fenced(job_fence(context)):
            planned, alone, backlog = tools_start_pass(shard, shards, runner_name(context))
        return f"{planned} planned, {alone} on their own"
    except FenceLost as exc:  # taken over: the sweep starts the chains it left
        logger.warning("start pass %s not recorded: %s", start_lock(shard, shards), exc, extra=fence_line(exc))
        return "fenced off"
    except CONNECTION_ERRORS as exc:  # not cycles that happened: the sweep starts the chains again
        logger.warning("start pass %s cut off by the database (%s)", start_lock(shard, shards), error_brief(exc),
                       extra=OUTAGE_LINE)
        return "cut off by the database"
    except Exception:  # logged; the sweep defers the shard's next start pass for the agents left without a chain
        logger.exception("start pass %s failed", start_lock(shard, shards))
        return "failed"
    finally:
        try:
            if backlog:
                start_defer(shard, shards)
        except CHAIN_ERRORS as exc:
            logger.warning("next start pass %s not deferred (%s); the sweep defers it", start_lock(shard, shards),
                           error_brief(exc), extra=OUTAGE_LINE)
        finally:
            connection_release()
            job_returned(context)


def agents_starting() -> set[int]:
    """Tool agents with planning "validating" in a shard whose start pass is under way: that pass may still be
    planning it (a dead worker's pass is retried by jobs_stalled_retry, and is then no longer under way)."""
    doing = jobs_locked(START_PREFIX, "doing")
    shards = settings.RUNNER_START_SHARDS
    under_way = [int(lock.removeprefix(START_PREFIX).partition("/")[0]) for lock in doing
                 if lock.rpartition("/")[2] == str(shards)]
    if not under_way:
        return set()
    return set(Plan.objects.filter(status=Plan.Status.VALIDATING, agent__kind=Agent.Kind.TOOL)
               .annotate(shard=Mod(F("agent_id"), shards)).filter(shard__in=under_way)
               .values_list("agent_id", flat=True))


async def jobs_unfinished_settle(app: Any) -> int:
    """Finish the cycle jobs whose task returned here a while ago but which the engine could not mark finished
    (see `_returned`); the agent's next cycle was deferred by the task, or the sweep starts one. A job is
    forgotten only once it is found ended, or is finished here: a round cut off by the database (the read or
    the finish) leaves it for the next round, or it would hold its lock for as long as this worker lives."""
    now = time.monotonic()
    with _returned_lock:
        due = {job_id: worker for job_id, (at, worker) in _returned.items() if now - at >= RETURNED_GRACE_SECONDS}
    if not due:
        return 0
    stuck = await sync_to_async(jobs_doing_among)(list(due))
    settled = set(due) - set(stuck)  # ended as they should have
    finished = 0
    for job_id in stuck:
        try:
            held = await job_finish_held(app, job_id=job_id, worker_id=due[job_id], status=Status.SUCCEEDED,
                                         delete_job=True)
        except exceptions.ConnectorException as exc:  # the database is away: the next round
            logger.info("unfinished job %s not settled (%s)", job_id, error_brief(exc))
        else:
            settled.add(job_id)  # finished here, or another worker holds it now (taken over): not ours to end
            finished += held
    with _returned_lock:
        for job_id in settled:
            _returned.pop(job_id, None)
    if finished:
        logger.warning("finished %d cycle jobs whose end was lost to the database", finished,
                       extra={"outage": "straggler"})
    return finished


FINISH_HELD = """
WITH held AS (
    SELECT id FROM procrastinate_jobs
    WHERE id = %(job_id)s AND worker_id = %(worker_id)s AND status = 'doing' FOR UPDATE
)
SELECT procrastinate_finish_job_v1(id, %(status)s, %(delete_job)s) AS finished, id FROM held
"""


async def job_finish_held(app: Any, *, job_id: int, worker_id: int | None, status: Status, delete_job: bool) -> bool:
    """Finish a job only while `worker_id` still holds it (status "doing", taken by that worker), in one statement;
    False, and one line in the log, when it does not: after a stall the engine retried it and another worker may
    be running it now, whose lock a late finish would free (two passes of one shard at once). The engine's own
    finish does not check (procrastinate_finish_job_v1 takes a job id alone)."""
    if worker_id is None:  # a job this worker did not fetch itself: the engine's finish, as it is
        await app.job_manager.finish_job_by_id_async(job_id=job_id, status=status, delete_job=delete_job)
        return True
    rows = await app.connector.execute_query_all_async(
        query=FINISH_HELD, job_id=job_id, worker_id=worker_id, status=status.value, delete_job=delete_job)
    if not rows:
        logger.info("job %s is no longer held by worker %s (taken over after a stall, or ended): its finish is "
                    "left to its holder", job_id, worker_id)
        return False
    return True


def jobs_doing_among(ids: list[int]) -> list[int]:
    """Which of these jobs are still under way, in a connection scope (the settling thread runs no cycles that
    would give its connection back, or drop it once cut: the next round connects afresh)."""
    from procrastinate.contrib.django.models import ProcrastinateJob

    jobs = ProcrastinateJob.objects  # type: ignore[misc]  # the engine's read-only manager, typed loosely
    with connection_scope():
        return list(jobs.filter(id__in=ids, status="doing").values_list("id", flat=True))


def jobs_locked(prefix: str, *statuses: str) -> list[str]:
    """The locks starting with `prefix` of jobs in one of these states (the engine's jobs table, through its
    Django model)."""
    from procrastinate.contrib.django.models import ProcrastinateJob

    jobs = ProcrastinateJob.objects  # type: ignore[misc]  # the engine's read-only manager, typed loosely
    return list(jobs.filter(status__in=statuses, lock__startswith=prefix).values_list("lock", flat=True))


def agents_with_cycles(*statuses: str) -> set[int]:
    """Agents with a cycle job in one of these states."""
    return {int(lock.removeprefix(LOCK_PREFIX)) for lock in jobs_locked(LOCK_PREFIX, *statuses)}


def chains_start() -> int:
    """Start the chain of every chain-driven agent without one: a start pass of its shard for a tool agent (it
    plans the first goals of the agents starting together), a remote A2A agent's next cycle itself (no start pass
    takes one: it plans nothing here). Returns how many were deferred."""
    unscheduled = agents_unscheduled()
    remote = set(Agent.objects.filter(pk__in=unscheduled, kind=Agent.Kind.A2A).values_list("pk", flat=True))
    started = sum(cycle_defer(pk, kind=Agent.Kind.A2A) for pk in sorted(remote))
    return started + sum(start_defer(*shard) for shard in sorted({start_shard(pk) for pk in unscheduled
                                                                  if pk not in remote}))


def agents_unscheduled() -> list[int]:
    """Chain-driven agents with no cycle waiting or under way, overdue by more than a sweep (a chain between two
    jobs is not one of them)."""
    held = agents_with_cycles("todo", "doing")
    overdue = timezone.now() - timedelta(seconds=settings.RUNNER_SWEEP_SECONDS)
    due = agents_chained().filter(Q(next_cycle_at__isnull=True) | Q(next_cycle_at__lt=overdue))
    return [pk for pk in due.values_list("pk", flat=True) if pk not in held]


def shards_unscheduled() -> tuple[int, list[int]]:
    """How many shards the personas make now (shards_wanted), and those of them with no pass waiting or under
    way; none while a pass of another number of shards waits or runs (that chain ends at its next pass), so
    that no persona is in two passes at once."""
    shards = shards_wanted()
    held = set(jobs_locked(PASS_PREFIX, "todo", "doing"))
    if any(lock.rpartition("/")[2] != str(shards) for lock in held):
        return shards, []
    return shards, [shard for shard in range(shards) if pass_lock(shard, shards) not in held]


@blueprint.periodic(cron=f"* * * * * */{settings.RUNNER_SWEEP_SECONDS}")
@blueprint.task(name="agents.schedule", queue=CONTROL_QUEUE, pass_context=True)
def agents_schedule(context: JobContext, timestamp: int) -> int:
    """Start the chain of cycles of every chain-driven agent without one (a start pass of its shard), and of passes
    for every persona shard without one; fail planning left by dead cycles (or start passes) of agents nothing
    drives any more (a paused agent's, or a persona's whose own cycle died)."""
    try:
        started = chains_start()
        shards, unscheduled = shards_unscheduled()
        started += sum(pass_defer(shard, shards) for shard in unscheduled)
        plans_orphaned_fail(runner=runner_name(context), busy=agents_with_cycles("doing") | agents_starting())
        return started
    except CHAIN_ERRORS as exc:  # the next sweep does it all again
        logger.warning("sweep cut off by the database (%s)", error_brief(exc), extra=OUTAGE_LINE)
        connection_recover()
        return 0
    finally:
        connection_release()


RECOVER_SOON = "recover:soon"  # the queueing lock of a recovery deferred for when a silent worker is stalled


@blueprint.periodic(cron=f"* * * * * */{settings.RUNNER_SWEEP_SECONDS}")
# No lock: a worker killed while holding it would keep every later recovery waiting on the recovery of
# its own job. Two overlapping runs may find the same stalled job; the second is told it ended meanwhile.
@blueprint.task(name="agents.recover", queue=CONTROL_QUEUE, pass_context=True)
async def jobs_stalled_retry(context: JobContext, timestamp: int) -> int:
    """Retry the jobs of workers whose heartbeats stopped (killed, frozen, cut off), so their agents' locks are
    free again and their cycles run elsewhere (and recover what the dead cycle left). A dead cycle that had
    already deferred its successor is ended instead: that next cycle is waiting, and does the same. A worker
    silent but not stalled yet gets a recovery of its own at the moment it will be (recover_when_stalled)."""
    manager = context.app.job_manager
    stalled = list(await manager.get_stalled_jobs(seconds_since_heartbeat=settings.RUNNER_STALLED_SECONDS))
    recovered = 0
    for job in stalled:
        try:
            try:
                await manager.retry_job(job)
            except exceptions.UniqueViolation:
                await manager.finish_job(job, status=Status.ABORTED, delete_job=True)
            recovered += 1
        except exceptions.ConnectorException as exc:  # it ended meanwhile (its worker was only slow, or another
            logger.info("stalled job %s ended meanwhile (%s)", job.id, error_brief(exc))  # recovery took it)
    if recovered:
        logger.warning("recovered %d jobs of workers whose heartbeat stopped", recovered)
    await recover_when_stalled(context.app)
    return recovered


# Seconds until the first worker that has missed heartbeats (silent for more than two) but is not stalled yet will
# be: NULL when none is.
SILENT_WORKERS = """
SELECT EXTRACT(EPOCH FROM min(last_heartbeat) + make_interval(secs => %(stalled)s) - now())::float AS wait
FROM procrastinate_workers
WHERE last_heartbeat < now() - make_interval(secs => %(silent)s)
  AND last_heartbeat >= now() - make_interval(secs => %(stalled)s)
"""
RECOVER_MARGIN_SECONDS = 0.2  # after the threshold: the engine's own test is "older than", strictly


async def recover_when_stalled(app: Any) -> bool:
    """A worker that went silent is found stalled the moment its heartbeat is RUNNER_STALLED_SECONDS old, not up
    to a sweep later: when one will be before the next periodic recovery, a recovery is deferred for that moment
    (one waiting at most, by its queueing lock). Nothing is deferred while every worker beats. Returns whether
    one was deferred."""
    row = await app.connector.execute_query_one_async(
        query=SILENT_WORKERS, stalled=settings.RUNNER_STALLED_SECONDS, silent=2 * settings.RUNNER_HEARTBEAT_SECONDS)
    wait = row["wait"] if row else None
    if wait is None or wait >= settings.RUNNER_SWEEP_SECONDS:
        return False  # nobody silent, or the periodic recovery comes first
    at = timezone.now() + timedelta(seconds=max(wait, 0.0) + RECOVER_MARGIN_SECONDS)
    try:
        await jobs_stalled_retry.configure(schedule_at=at, queueing_lock=RECOVER_SOON).defer_async(
            timestamp=int(at.timestamp()))
    except exceptions.AlreadyEnqueued:
        return False
    return True


if settings.RETENTION_PRUNE_SECONDS > 0:
    @blueprint.periodic(cron="* * * * *")
    @blueprint.task(name="agents.prune", queue=CONTROL_QUEUE)
    def rows_prune(timestamp: int) -> int:
        """Rows written at machine speed, kept as long as the RETAIN_* settings say (runtime/retention.py)."""
        try:
            report = retention_prune(budget_seconds=PRUNE_BUDGET_SECONDS)
            return sum(report.counts.values())
        finally:
            connection_release()


def chain_start_on_save(sender: type[Agent], instance: Agent, created: bool = False,
                        update_fields: frozenset[str] | None = None, raw: bool = False, **kwargs: Any) -> None:
    """A tool agent (a remote A2A agent: its first cycle deferred at once) created running, or saved with its
    status running (resumed: `agent_set_status`, the
    admin's edits, which save the fields changed), has its chain of cycles started once the write commits, so
    its first cycle need not wait for the next sweep (up to RUNNER_SWEEP_SECONDS). Its queueing lock keeps it
    at one waiting cycle; should the defer fail, the sweep starts the chain as before. Personas are driven by
    their shard's passes, external agents by no runner."""
    if raw or not (created or (update_fields is not None and "status" in update_fields)):
        return  # a save that did not create the agent nor set its status (the sweep starts any chain it needs)
    if instance.status != Agent.Status.RUNNING or instance.kind in (Agent.Kind.PERSONA, Agent.Kind.EXTERNAL):
        return
    agent_id = instance.pk
    if instance.kind == Agent.Kind.A2A:  # a remote agent's chain is its cycles: no start pass plans it
        transaction.on_commit(lambda: chain_resume(agent_id, Agent.Kind.A2A), robust=True)
        return
    transaction.on_commit(lambda: chain_start(agent_id), robust=True)


def chain_resume(agent_id: int, kind: str) -> None:
    """An agent whose chain no start pass begins (a remote A2A agent) has its next cycle deferred now."""
    try:
        cycle_defer(agent_id, kind=kind)
    except CHAIN_ERRORS as exc:
        logger.info("first cycle of agent %s not deferred (%s); the sweep starts its chain", agent_id,
                    error_brief(exc))


def chain_soon_on_decision(sender: object, agent_id: int, **kwargs: Any) -> None:
    """An operator acted on the agent (agents/signals.py, after the commit): its next cycle is due now. A persona's
    next pass takes it (agents/services.py cycle_soon_on_decision made it due: unless the pass under way had read
    it already); a tool agent's cycle waiting for its time is replaced by one due now (the engine moves no waiting
    job's time: it is cancelled and deferred again). A cycle under way keeps its lock: the new one runs when it
    ends. A tool agent with no open plan and no other cycle (a goal given to an idle agent) goes to its shard's
    start pass instead, which plans it with the other agents given goals meanwhile, or defers its cycle at once.
    Failing, the agent cycles at the time its last cycle set, as before."""
    from procrastinate.contrib.django.models import ProcrastinateJob

    try:
        planning = ~Exists(Plan.objects.filter(agent_id=OuterRef("pk")).open())
        row = agents_chained().filter(pk=agent_id).values_list("kind", planning).first()
        if row is None:
            return
        kind, unplanned = row
        jobs = ProcrastinateJob.objects  # type: ignore[misc]  # the engine's read-only manager, typed loosely
        now, later, others = timezone.now(), [], 0
        for job_id, status, at in jobs.filter(lock=agent_lock(agent_id), status__in=["todo", "doing"]).values_list(
                "id", "status", "scheduled_at"):
            if status == "todo" and at is not None and at > now:
                later.append(job_id)
            else:
                others += 1
        for job_id in later:
            app_of_jobs().job_manager.cancel_job_by_id(job_id, delete_job=True)
        if kind == Agent.Kind.TOOL and unplanned and not others:
            start_defer(*start_shard(agent_id))
        else:
            cycle_defer(agent_id, kind=kind)
    except CHAIN_ERRORS as exc:
        logger.info("cycle of agent %s not brought forward (%s); it comes at its interval", agent_id,
                    error_brief(exc))


def app_of_jobs() -> Any:
    """The contrib app's engine App (its job manager), as every process of the scale-out stack has it."""
    from procrastinate.contrib.django import app

    return app


def chain_start(agent_id: int) -> None:
    """A tool agent's chain starts: a start pass of its shard, now (one waiting takes it as well)."""
    try:
        start_defer(*start_shard(agent_id))
    except CHAIN_ERRORS as exc:
        logger.info("first cycle of agent %s not deferred (%s); the sweep starts its chain", agent_id,
                    error_brief(exc))


def on_app_ready(app: object) -> None:
    """PROCRASTINATE_ON_APP_READY: the contrib app's App gets these tasks, and every process of the scale-out
    stack (pages, API, admin, runners) starts the chain of a tool agent it saves running, and brings an agent's
    next cycle forward when an operator acts on it."""
    app.add_tasks_from(blueprint, namespace="runtime")  # type: ignore[attr-defined]
    post_save.connect(chain_start_on_save, sender=Agent, dispatch_uid="runtime.chain_start_on_save")
    operator_acted.connect(chain_soon_on_decision, dispatch_uid="runtime.chain_soon_on_decision")
    from runtime.notify_tasks import on_app_ready as notifications_ready

    notifications_ready(app)

