"""Notifications as jobs of the job engine (scale-out, Procrastinate): a dispatch every NOTIFY_SWEEP_SECONDS (and
one deferred after each commit of an event that may notify someone), and one job per delivery, retried with a
growing wait (the delivery row says how long) until it is delivered or NOTIFY_MAX_ATTEMPTS are spent."""

from __future__ import annotations

import logging
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.db import transaction
from django.utils import timezone
from procrastinate import Blueprint, JobContext, exceptions
from procrastinate.retry import BaseRetryStrategy, RetryDecision

from agents.connections import CONNECTION_ERRORS, connection_release, error_brief

logger = logging.getLogger("planner.notifications")

QUEUE = "notifications"
DISPATCH_LOCK = "notifications:dispatch"
OVERDUE_SECONDS = 10  # a due delivery without a job this long (a lost deferral): the dispatch defers one

blueprint = Blueprint()


class DeliveryRetry(Exception):
    """The receiver failed; the job is run again after `wait_seconds`."""

    def __init__(self, delivery_id: int, wait_seconds: int) -> None:
        super().__init__(f"delivery {delivery_id} failed; again in {wait_seconds} s")
        self.wait_seconds = wait_seconds


class DeliveryRetryStrategy(BaseRetryStrategy):
    """The wait the delivery row chose; anything unexpected (the database away) is tried again soon too."""

    def get_retry_decision(self, *, exception: BaseException, job: Any) -> RetryDecision | None:
        if isinstance(exception, DeliveryRetry):
            return RetryDecision(retry_in={"seconds": exception.wait_seconds})
        if job.attempts >= settings.NOTIFY_MAX_ATTEMPTS:
            return None
        return RetryDecision(retry_in={"seconds": settings.NOTIFY_RETRY_FIRST_SECONDS * 2 ** job.attempts})


def delivery_lock(delivery_id: int) -> str:
    return f"delivery:{delivery_id}"


def delivery_defer(delivery_id: int) -> bool:
    try:
        with transaction.atomic():  # a refused insert leaves a caller's transaction usable
            delivery_job.configure(queueing_lock=delivery_lock(delivery_id)).defer(delivery_id=delivery_id)
    except exceptions.AlreadyEnqueued:
        return False
    return True


def dispatch_defer() -> None:
    """Ask for a dispatch now (one waits at most: the queueing lock)."""
    try:
        with transaction.atomic():  # a refused insert leaves a caller's transaction usable
            dispatch_job.configure(queueing_lock=DISPATCH_LOCK).defer(timestamp=0)
    except exceptions.AlreadyEnqueued:
        pass
    except Exception as exc:  # a nudge is only a head start: the periodic dispatch comes anyway
        logger.info("notifications nudge not deferred (%s)", exc)


@blueprint.task(name="notifications.deliver", queue=QUEUE, pass_context=True, retry=DeliveryRetryStrategy())
def delivery_job(context: JobContext, delivery_id: int) -> str:
    from notifications.services import delivery_attempt

    try:
        outcome = delivery_attempt(delivery_id=delivery_id,
                                   runner=str(context.additional_context.get("runner") or context.worker_name or ""))
    finally:
        connection_release()
    if outcome.status == "retry":
        raise DeliveryRetry(delivery_id, outcome.wait_seconds)
    return outcome.status


@blueprint.periodic(cron=f"* * * * * */{settings.NOTIFY_SWEEP_SECONDS}")
@blueprint.task(name="notifications.dispatch", queue=QUEUE, lock=DISPATCH_LOCK)
def dispatch_job(timestamp: int) -> int:
    """New events → notifications → one delivery job each; and a job again for due deliveries that lost theirs."""
    from notifications.reminders import reminders_dispatch
    from notifications.selectors import deliveries_due
    from notifications.services import notifications_dispatch
    from notifications.slack_app import messages_refresh

    try:
        messages_refresh()
        created = notifications_dispatch() + reminders_dispatch()
        for delivery_id in created:
            delivery_defer(delivery_id)
        overdue = deliveries_due(now=timezone.now() - timedelta(seconds=OVERDUE_SECONDS))
        for delivery_id in overdue:
            delivery_defer(delivery_id)
        return len(created)
    except CONNECTION_ERRORS as exc:  # the next dispatch (a second later) reads the same events again
        logger.warning("notifications dispatch cut off by the database (%s)", error_brief(exc),
                       extra={"outage": True})  # a runner's outage says it (runtime/outage.py)
        return 0
    finally:
        connection_release()


def on_app_ready(app: Any) -> None:
    app.add_tasks_from(blueprint, namespace="notifications")
