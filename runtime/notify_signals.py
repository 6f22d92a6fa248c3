"""The after-commit nudge: an event that may notify someone, saved one by one, wakes the dispatcher at once.
Events written in bulk (a cycle's) are found by the dispatcher's sweep a moment later."""

from __future__ import annotations

from typing import Any

from django.db import transaction
from django.db.models.signals import post_save
from django.dispatch import receiver

from agents.signals import events_may_notify
from planning.models import PlanEvent

NUDGING_KINDS = frozenset({
    PlanEvent.Kind.STEP_AWAITING, PlanEvent.Kind.VALIDATED, PlanEvent.Kind.CLARIFICATION_ASKED,
    PlanEvent.Kind.PLAN_FAILED, PlanEvent.Kind.ESCALATED, PlanEvent.Kind.BUDGET_REACHED,
})


@receiver(post_save, sender=PlanEvent, dispatch_uid="notifications.event_nudge")
def event_nudge(sender: type[PlanEvent], instance: PlanEvent, created: bool, **kwargs: Any) -> None:
    if created and instance.kind in NUDGING_KINDS:
        from runtime.notify import nudge

        transaction.on_commit(nudge)


@receiver(post_save, sender=PlanEvent, dispatch_uid="notifications.slack_close")
def decision_closes_slack_messages(sender: type[PlanEvent], instance: PlanEvent, created: bool, **kwargs: Any) -> None:
    """A decision, made anywhere (the web, the API, a policy, Slack): once it commits, its Slack messages are
    marked with who decided, and the notifier updates them in Slack."""
    from notifications.deciding import CLOSING_KINDS

    if created and instance.kind in CLOSING_KINDS and instance.plan_id is not None:
        event_id = instance.pk

        def close() -> None:
            from notifications.slack_app import outcomes_mark
            from runtime.notify import nudge

            if outcomes_mark(event_id):
                nudge(always=True)

        transaction.on_commit(close)


@receiver(events_may_notify, dispatch_uid="notifications.bulk_nudge")
def bulk_nudge(sender: object, **kwargs: Any) -> None:
    """Events written in bulk (first versions awaiting approval) committed: dispatch now."""
    from runtime.notify import nudge

    nudge()
