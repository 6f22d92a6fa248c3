"""Retention: what the runner stores at machine speed is kept only as long as the RETAIN_* settings say.

Every query here is set-based and bounded (RETENTION_BATCH_ROWS rows a statement), never one per goal
or agent, so pruning a big backlog neither locks a table for long nor holds a cycle back. Rows are
taken oldest first in primary-key order, which follows creation time, so a pass stops at its first
batch; the tables it scans are themselves bounded by these very limits.

Kept always: the events operators made (the audit of what people decided) and every event of a plan
that is still open (its page shows the whole story), the undo copies of an open plan's steps, and a notification
while any of its deliveries is still to be sent. The curves on the agent page are drawn from the
newest experiences, so they need nothing kept apart.
"""

from __future__ import annotations

import logging
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path

from django.conf import settings
from django.db.models import Q, QuerySet
from django.utils import timezone

from agents.models import Experience, LLMCall
from agents.tools import UNDO_FOLDER
from notifications.models import Delivery, Notification
from planning.models import Plan, PlanEvent, PlanStep

logger = logging.getLogger("planner.retention")


@dataclass
class PruneReport:
    """Rows deleted (or, for model calls' bodies, cleared) per kind, and whether a backlog remains."""

    counts: dict[str, int] = field(default_factory=dict)
    more: bool = False  # a time budget ran out before every backlog was cleared

    @property
    def total(self) -> int:
        return sum(self.counts.values())


def cutoff(hours: float, now: datetime) -> datetime | None:
    """The moment before which rows go, or None when the setting keeps them forever (0)."""
    return now - timedelta(hours=hours) if hours > 0 else None


def batch_delete(qs: QuerySet, batch: int) -> int:
    """Delete up to `batch` rows of `qs`, oldest (lowest primary key) first; returns how many went."""
    ids = list(qs.order_by("pk").values_list("pk", flat=True)[:batch])
    if not ids:
        return 0
    qs.model._default_manager.filter(pk__in=ids).delete()
    return len(ids)


def aged_out(setting: str, old: Callable[[datetime], QuerySet]) -> Callable[..., int]:
    """A pruner deleting the rows `old(moment)` finds, where the moment is `setting` hours ago (0: never)."""
    def prune(*, now: datetime, batch: int) -> int:
        moment = cutoff(getattr(settings, setting), now)
        return 0 if moment is None else batch_delete(old(moment), batch)

    return prune


def llm_bodies_prune(*, now: datetime, batch: int) -> int:
    """Clear the prompt and response of old calls; the row (model, tokens, latency, cost) stays for usage."""
    moment = cutoff(settings.RETAIN_LLM_BODIES_HOURS, now)
    if moment is None:
        return 0
    # Served by llmcall_body_kept_idx: only rows that still hold a body are looked at.
    ids = list(LLMCall.objects.filter(body_pruned=False, created_at__lt=moment)
               .order_by("created_at").values_list("pk", flat=True)[:batch])
    if ids:
        LLMCall.objects.filter(pk__in=ids).update(prompt=[], response="", body_pruned=True)
    return len(ids)


UNDO_IDS_PER_QUERY = 500  # step ids asked about in one query (well within every database's parameter limit)


def undo_copies_prune(*, now: datetime, batch: int) -> int:
    """The undo copies of steps (files kept so an operator can roll a step back, agents/tools.py) whose plan
    closed RETAIN_UNDO_HOURS ago or more, or whose step is gone: up to `batch` steps' folders a call. An
    open plan's steps, and a plan closed since, keep theirs."""
    moment = cutoff(settings.RETAIN_UNDO_HOURS, now)
    root = Path(settings.AGENT_WORKSPACES) / UNDO_FOLDER
    if moment is None or not root.is_dir():
        return 0
    folders = {int(step.name): step for agent in root.iterdir() if agent.is_dir()
               for step in agent.iterdir() if step.is_dir() and step.name.isdigit()}
    ids = sorted(folders)
    kept: set[int] = set()
    for start in range(0, len(ids), UNDO_IDS_PER_QUERY):
        kept.update(PlanStep.objects.filter(pk__in=ids[start:start + UNDO_IDS_PER_QUERY]).filter(
            Q(plan__status__in=Plan.OPEN_STATUSES) | Q(plan__updated_at__gte=moment)).values_list("pk", flat=True))
    gone = [folders[pk] for pk in ids if pk not in kept][:batch]
    for folder in gone:
        shutil.rmtree(folder, ignore_errors=True)
    return len(gone)


PRUNERS: dict[str, Callable[..., int]] = {
    "experiences": aged_out("RETAIN_EXPERIENCES_HOURS", lambda m: Experience.objects.filter(created_at__lt=m)),
    "model-call bodies": llm_bodies_prune,
    "model calls": aged_out("RETAIN_LLM_CALLS_HOURS", lambda m: LLMCall.objects.filter(created_at__lt=m)),
    # The runner's events of closed plans; operators' events and open plans' events stay.
    "events": aged_out("RETAIN_EVENTS_HOURS", lambda m: PlanEvent.objects.filter(
        created_at__lt=m, actor__isnull=True).exclude(plan__status__in=Plan.OPEN_STATUSES)),
    "undo copies": undo_copies_prune,
    # Notifications with their deliveries and attempts (deleted with them), once every delivery is over
    # (delivered or failed): one still pending or being sent keeps its notification, however old.
    "notifications": aged_out("RETAIN_NOTIFICATIONS_HOURS", lambda m: Notification.objects.filter(
        created_at__lt=m).exclude(deliveries__status__in=[Delivery.Status.PENDING, Delivery.Status.SENDING])),
}


def retention_prune(*, now: datetime | None = None, batch: int | None = None,
                    budget_seconds: float | None = None) -> PruneReport:
    """Prune every kind, batch after batch, until nothing is left or `budget_seconds` runs out."""
    now = now or timezone.now()
    batch = batch or settings.RETENTION_BATCH_ROWS
    started = time.monotonic()
    report = PruneReport(counts=dict.fromkeys(PRUNERS, 0))
    busy = set(PRUNERS)
    while busy:
        for name in sorted(busy):
            done = PRUNERS[name](now=now, batch=batch)
            report.counts[name] += done
            if done < batch:
                busy.discard(name)
        if busy and budget_seconds is not None and time.monotonic() - started > budget_seconds:
            report.more = True
            break
    if report.total:
        logger.info("retention pruned %s", ", ".join(f"{n} {k}" for k, n in report.counts.items() if n))
    return report
