"""Reminders and escalation. An item sent to an operator and still waiting for a person after their
subscription's `remind_after_minutes` is sent to them again (once); after `escalate_after_minutes` it goes to the
subscription's `escalate_to` (another operator's subscription, or a team account's), and the first Slack app
message says it was escalated. Run by the notifier beside the dispatch (every NOTIFY_SWEEP_SECONDS); each
reminder and escalation is a notification with a key of its own, so it is made once however often this runs."""

from __future__ import annotations

import logging
from datetime import UTC, datetime, timedelta
from typing import Any

from django.db import IntegrityError, transaction
from django.db.models import Q
from django.utils import timezone

from notifications.deciding import item_waiting
from notifications.models import Channel, Delivery, Notification, SlackMessage, Subscription, Trigger

logger = logging.getLogger("planner.notifications")

WAITING_KINDS = (Trigger.WAITING, Trigger.URGENT, Trigger.ESCALATED, Trigger.QUESTION)
LOOKBACK = timedelta(days=7)  # older items are not reminded of (they are in the inbox)
FOLLOW_UP_PREFIXES = ("remind:", "escalate:")


def notification_waits(n: Notification) -> bool:
    if n.plan is None:
        return False
    kind = "question" if n.kind == Trigger.QUESTION else ("step" if n.step_id else "plan")
    return item_waiting(kind, n.plan, n.step)


def follow_up(original: Notification, *, user_id: int, key: str, title: str, extra: dict[str, Any],
              now: datetime) -> list[int]:
    """A notification made from `original` for `user_id`, with a delivery on each of their active channels."""
    channels = list(Channel.objects.filter(user_id=user_id, active=True, user__is_active=True))
    try:
        with transaction.atomic():
            made = Notification.objects.create(
                user_id=user_id, key=key, kind=original.kind, agent_id=original.agent_id, plan_id=original.plan_id,
                step_id=original.step_id, event_id=original.event_id, title=title[:300],
                payload={**original.payload, "title": title[:300], **extra})
            Delivery.objects.bulk_create([Delivery(notification=made, channel=c, next_attempt_at=now)
                                          for c in channels])
    except IntegrityError:  # made meanwhile by another notifier
        return []
    return list(Delivery.objects.filter(notification=made).values_list("pk", flat=True))


def reminders_dispatch(*, now: datetime | None = None) -> list[int]:
    """Reminders and escalations now due; returns the new deliveries' ids (to send now)."""
    now = now or timezone.now()
    subscriptions = list(
        Subscription.objects.filter(active=True, user__is_active=True)
        .filter(Q(remind_after_minutes__isnull=False) | Q(escalate_after_minutes__isnull=False,
                                                          escalate_to__isnull=False))
        .select_related("user", "escalate_to", "escalate_to__user").prefetch_related("agents"))
    created: list[int] = []
    for sub in subscriptions:
        kinds = [k for k in sub.kinds if k in WAITING_KINDS]
        timers = [m for m in (sub.remind_after_minutes, sub.escalate_after_minutes) if m is not None]
        if not kinds or not timers:
            continue
        originals = list(
            Notification.objects.filter(user_id=sub.user_id, kind__in=kinds, created_at__gte=now - LOOKBACK,
                                        created_at__lte=now - timedelta(minutes=min(timers)))
            .exclude(key__startswith=FOLLOW_UP_PREFIXES[0]).exclude(key__startswith=FOLLOW_UP_PREFIXES[1])
            .select_related("plan", "step", "user"))
        if not originals:
            continue
        done = set(Notification.objects.filter(
            key__in=[f"{p}{n.pk}" for n in originals for p in FOLLOW_UP_PREFIXES]).values_list("key", flat=True))
        agent_ids = {a.pk for a in sub.agents.all()}
        for n in originals:
            if agent_ids and n.agent_id not in agent_ids:
                continue
            age = now - n.created_at
            remind = sub.remind_after_minutes is not None and age >= timedelta(minutes=sub.remind_after_minutes) \
                and f"remind:{n.pk}" not in done
            target = sub.escalate_to
            escalate = target is not None and sub.escalate_after_minutes is not None \
                and age >= timedelta(minutes=sub.escalate_after_minutes) and f"escalate:{n.pk}" not in done \
                and target.active and target.user.is_active and target.user_id != n.user_id
            if not (remind or escalate) or not notification_waits(n):
                continue
            minutes = int(age.total_seconds() // 60)
            if remind:
                created += follow_up(n, user_id=n.user_id, key=f"remind:{n.pk}", now=now,
                                     title=f"Reminder ({minutes} min unanswered): {n.title}",
                                     extra={"reminder_of": n.pk})
            if escalate and target is not None:
                ids = follow_up(n, user_id=target.user_id, key=f"escalate:{n.pk}", now=now,
                                title=f"Escalated from {n.user.get_username()} after {minutes} min: {n.title}",
                                extra={"escalated_from": {"notification": n.pk, "user": n.user.get_username()}})
                if ids:
                    at = now.astimezone(UTC).strftime("%H:%M UTC")
                    SlackMessage.objects.filter(delivery__notification=n, outcome="").update(
                        escalated=f"Escalated to {target.user.get_username()} at {at}: unanswered for {minutes} min.",
                        refresh_due=True)
                created += ids
    if created:
        logger.debug("%d reminder and escalation deliveries", len(created))
    return created
