"""Agent cycles as Procrastinate jobs (the scale-out runtime; PostgreSQL).

Every driven agent has one chain of `agents.cycle` jobs: each cycle, when it ends, defers the next one
`cycle_interval` seconds later. Every cycle job carries the agent's lock (`agent:<id>`), so the engine never
starts a cycle of an agent while another runs, on any worker; and its queueing lock (the same string), so an
agent never has two cycles waiting. A chain breaks when a cycle's worker dies (the engine retries the job
once the worker's heartbeats stop: `jobs_stalled_retry`) or when an agent is created or resumed; the
`agents_schedule` sweep, every two seconds, starts a chain for each driven agent that has none.

A retried or newly started cycle first fails the planning a dead cycle left "validating" (it knows, thanks
to the lock, that no other cycle of this agent runs).
"""

from __future__ import annotations

import logging
from datetime import timedelta

from django.conf import settings
from django.utils import timezone
from procrastinate import Blueprint, JobContext, exceptions

from agents.connections import CONNECTION_ERRORS
from agents.retention import retention_prune
from agents.runtime.cycles import agents_driven, cycle_run, error_brief, plans_orphaned_fail

logger = logging.getLogger("planner.runner")

CYCLES_QUEUE = "cycles"
CONTROL_QUEUE = "control"  # the sweep, the stalled-job retry and pruning: never behind a backlog of cycles
LOCK_PREFIX = "agent:"
PRUNE_BUDGET_SECONDS = 5.0  # one pruning round; a bigger backlog goes on in the next round

blueprint = Blueprint()


def agent_lock(agent_id: int) -> str:
    return f"{LOCK_PREFIX}{agent_id}"


def runner_name(context: JobContext) -> str:
    """The name this worker process goes by in timelines (`runagents --runner-id`)."""
    return str(context.additional_context.get("runner") or f"worker {context.worker_id}")


def cycle_defer(agent_id: int, *, after: float = 0.0, recover: bool = False) -> bool:
    """Defer the agent's next cycle `after` seconds from now; False when one is already waiting."""
    try:
        agent_cycle_job.configure(lock=agent_lock(agent_id), queueing_lock=agent_lock(agent_id),
                                  schedule_in={"seconds": max(after, 0.0)}).defer(agent_id=agent_id, recover=recover)
    except exceptions.AlreadyEnqueued:
        return False
    return True


@blueprint.task(name="agents.cycle", queue=CYCLES_QUEUE, pass_context=True)
def agent_cycle_job(context: JobContext, agent_id: int, recover: bool = False) -> str:
    """One cycle of one agent, then the next one deferred after its interval (while it is driven)."""
    job = context.job
    assert job is not None
    try:
        return cycle_run(agent_id, runner_name(context), recover=recover or job.attempts > 0)
    except CONNECTION_ERRORS as exc:
        logger.warning("cycle of agent %s cut off by the database (%s)", agent_id, error_brief(exc))
        raise
    except Exception:  # one agent's broken cycle must not end its chain: it is logged and the next one comes
        logger.exception("cycle of agent %s failed", agent_id)
        return "failed"
    finally:
        interval = agents_driven().filter(pk=agent_id).values_list("cycle_interval", flat=True).first()
        if interval is not None:
            cycle_defer(agent_id, after=interval)


def agents_unscheduled() -> list[int]:
    """Driven agents with no cycle waiting or under way, overdue by more than a sweep (a chain between two
    jobs is not one of them), never-run agents first."""
    from procrastinate.contrib.django.models import ProcrastinateJob

    held = {int(lock.removeprefix(LOCK_PREFIX)) for lock in ProcrastinateJob.objects.filter(
        status__in=("todo", "doing"), lock__startswith=LOCK_PREFIX).values_list("lock", flat=True)}
    overdue = timezone.now() - timedelta(seconds=settings.RUNNER_SWEEP_SECONDS)
    due = agents_driven().filter(next_cycle_at__isnull=True) | agents_driven().filter(next_cycle_at__lt=overdue)
    return [pk for pk in due.values_list("pk", flat=True) if pk not in held]


def agents_busy() -> set[int]:
    from procrastinate.contrib.django.models import ProcrastinateJob

    return {int(lock.removeprefix(LOCK_PREFIX)) for lock in ProcrastinateJob.objects.filter(
        status="doing", lock__startswith=LOCK_PREFIX).values_list("lock", flat=True)}


@blueprint.periodic(cron=f"* * * * * */{settings.RUNNER_SWEEP_SECONDS}")
@blueprint.task(name="agents.schedule", queue=CONTROL_QUEUE, pass_context=True)
def agents_schedule(context: JobContext, timestamp: int) -> int:
    """Start a chain of cycles for every driven agent without one; fail planning left by dead cycles of
    agents no cycle drives any more (a paused agent's)."""
    started = sum(cycle_defer(pk, recover=True) for pk in agents_unscheduled())
    plans_orphaned_fail(runner=runner_name(context), busy=agents_busy())
    return started


@blueprint.periodic(cron=f"* * * * * */{settings.RUNNER_SWEEP_SECONDS}")
@blueprint.task(name="agents.recover", queue=CONTROL_QUEUE, pass_context=True)
async def jobs_stalled_retry(context: JobContext, timestamp: int) -> int:
    """Retry the jobs of workers whose heartbeats stopped (killed, frozen, cut off): their agents' cycles run
    again elsewhere, as retries (attempts > 0), which recover what the dead cycle left."""
    manager = context.app.job_manager
    stalled = list(await manager.get_stalled_jobs(seconds_since_heartbeat=settings.RUNNER_STALLED_SECONDS))
    for job in stalled:
        await manager.retry_job(job)
    if stalled:
        logger.warning("retried %d jobs of workers whose heartbeat stopped", len(stalled))
    return len(stalled)


if settings.RETENTION_PRUNE_SECONDS > 0:
    @blueprint.periodic(cron="* * * * *")
    @blueprint.task(name="agents.prune", queue=CONTROL_QUEUE, queueing_lock="agents.prune")
    def rows_prune(timestamp: int) -> int:
        """Rows written at machine speed, kept as long as the RETAIN_* settings say (agents/retention.py)."""
        report = retention_prune(budget_seconds=PRUNE_BUDGET_SECONDS)
        return sum(report.counts.values())


def on_app_ready(app: object) -> None:
    """PROCRASTINATE_ON_APP_READY: the contrib app's App gets these tasks."""
    app.add_tasks_from(blueprint, namespace="runtime")  # type: ignore[attr-defined]

