"""Writes of the notifications app: the dispatcher (events → notifications → deliveries), one delivery attempt,
and an operator's own channels and subscriptions.

Exactly once after a success: a delivery is sent only by whoever moves it from pending to sending (one
conditional UPDATE, so two workers never both win); a delivered one is never claimed again. A sender that dies
mid-send loses its claim after NOTIFY_TIMEOUT_SECONDS + CLAIM_MARGIN_SECONDS, and the delivery is tried again
(its receiver may then see it twice: the `X-Planner-Delivery` header is the same, to let it notice)."""

from __future__ import annotations

import logging
import secrets
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.conf import settings
from django.contrib.auth.models import User
from django.db import transaction
from django.db.models import F, Max, Q
from django.utils import timezone

from agents.models import Agent
from notifications import selectors
from notifications.models import (
    Channel,
    Delivery,
    DeliveryAttempt,
    DispatchCursor,
    Notification,
    SettingsChange,
    Subscription,
    Trigger,
    channel_target_problem,
)
from notifications.senders import SendResult
from notifications.sending import channel_test_send, delivery_send
from planner_site import outbound
from planner_site.roles import user_can_decide
from planning.models import PlanEvent

logger = logging.getLogger("planner.notifications")

CLAIM_MARGIN_SECONDS = 30


class SettingsError(Exception):
    """A refused change of an operator's notification settings (the message says why; nothing was changed)."""


def retry_wait_seconds(attempts: int) -> int:
    """How long after its `attempts`-th failure a delivery is tried again: doubled each time."""
    return int(settings.NOTIFY_RETRY_FIRST_SECONDS * 2 ** max(0, attempts - 1))


# --- dispatch --------------------------------------------------------------------------------------------------

def cursor_position() -> int:
    """Where the dispatcher reads from; a new installation starts at the newest event (no history is sent)."""
    cursor = DispatchCursor.objects.filter(pk=1).values_list("last_event_id", flat=True).first()
    if cursor is not None:
        return cursor
    newest = PlanEvent.objects.aggregate(m=Max("pk"))["m"] or 0
    DispatchCursor.objects.get_or_create(pk=1, defaults={"last_event_id": newest})
    return int(DispatchCursor.objects.values_list("last_event_id", flat=True).get(pk=1))


def notifications_dispatch(*, now: datetime | None = None) -> list[int]:
    """Read the events since the cursor (and the last minute's again), and the items that became urgent; make a
    notification for every operator subscribed to each, and a delivery on each of their active channels.
    Returns the new deliveries' ids (to send now). Safe to run twice at once: nothing is made twice."""
    now = now or timezone.now()
    after = cursor_position()
    subscriptions = selectors.subscriptions_active()
    wanted = selectors.wanted_kinds(subscriptions)
    if not wanted:  # nobody listens: nothing to read, the cursor moves past what nobody will be told of
        newest = PlanEvent.objects.aggregate(newest=Max("pk"))["newest"] or after
        if newest > after:
            DispatchCursor.objects.filter(pk=1, last_event_id__lt=newest).update(last_event_id=newest, updated_at=now)
        return []
    events = selectors.events_to_read(after_id=after, now=now, wanted=set(wanted))
    candidates: list[selectors.Candidate] = []
    if wanted:
        risky_plans = selectors.plans_risky({e.plan_id for e in events if e.plan_id is not None and e.step_id is None})
        for event in events:
            if selectors.EVENT_TRIGGERS[event.kind] in wanted:
                candidate = selectors.event_candidate(event, risky_plans)
                if candidate is not None:
                    candidates.append(candidate)
        if Trigger.URGENT in wanted:
            candidates += selectors.urgent_candidates(now=now)
    created = notifications_create(candidates, subscriptions, now=now) if candidates else []
    newest = max((e.pk for e in events), default=after)
    if newest > after:
        DispatchCursor.objects.filter(pk=1, last_event_id__lt=newest).update(last_event_id=newest, updated_at=now)
    return created


def notifications_create(candidates: Iterable[selectors.Candidate], subscriptions: list[Subscription], *,
                         now: datetime) -> list[int]:
    candidates = list(candidates)
    done = set(Notification.objects.filter(key__in=[c.key for c in candidates]).values_list("user_id", "key"))
    rows: list[Notification] = []
    channels: dict[tuple[int, str], list[Channel]] = {}
    for c in candidates:
        payload = None
        for recipient in selectors.recipients(subscriptions, c):
            if (recipient.user_id, c.key) in done:
                continue
            payload = payload or c.payload()
            rows.append(Notification(user_id=recipient.user_id, key=c.key, kind=c.kind, agent=c.agent, plan=c.plan,
                                     step=c.step, event=c.event, title=payload["title"], payload=payload))
            channels[(recipient.user_id, c.key)] = recipient.channels
            done.add((recipient.user_id, c.key))
    if not rows:
        return []
    with transaction.atomic():
        Notification.objects.bulk_create(rows, ignore_conflicts=True)
        made = Notification.objects.filter(key__in={r.key for r in rows}, user_id__in={r.user_id for r in rows},
                                           deliveries__isnull=True).values_list("pk", "user_id", "key")
        deliveries = [Delivery(notification_id=pk, channel=channel, next_attempt_at=now)
                      for pk, user_id, key in made for channel in channels.get((user_id, key), [])]
        Delivery.objects.bulk_create(deliveries, ignore_conflicts=True)
        ids = list(Delivery.objects.filter(notification_id__in=[pk for pk, _, _ in made], attempts=0,
                                           status=Delivery.Status.PENDING).values_list("pk", flat=True))
    logger.debug("%d notifications, %d deliveries", len(rows), len(ids))
    return ids


# --- delivery --------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class AttemptOutcome:
    status: str  # delivered, retry, failed, skipped
    wait_seconds: int = 0


def delivery_claim(delivery_id: int, *, now: datetime) -> bool:
    """Take a delivery to send it: only one worker can (a conditional UPDATE is the row's lock)."""
    claimable = Q(status=Delivery.Status.PENDING) | Q(status=Delivery.Status.SENDING, claimed_until__lt=now)
    until = now + timedelta(seconds=settings.NOTIFY_TIMEOUT_SECONDS + CLAIM_MARGIN_SECONDS)
    return bool(Delivery.objects.filter(claimable, pk=delivery_id).update(
        status=Delivery.Status.SENDING, claimed_until=until, attempts=F("attempts") + 1))


def delivery_attempt(*, delivery_id: int, runner: str = "") -> AttemptOutcome:
    """Try one delivery once, if it is still to be sent; record the attempt and what the receiver answered."""
    if not delivery_claim(delivery_id, now=timezone.now()):
        return AttemptOutcome("skipped")  # delivered, given up, or being sent by someone else
    delivery = Delivery.objects.select_related("notification", "channel").get(pk=delivery_id)
    if not delivery.channel.active:  # turned off since it was made: not sent, and said so
        Delivery.objects.filter(pk=delivery_id, status=Delivery.Status.SENDING).update(
            status=Delivery.Status.FAILED, attempts=F("attempts") - 1, claimed_until=None,
            last_error="Not sent: the channel was turned off.")
        return AttemptOutcome("failed")
    result = delivery_send(delivery, attempt=delivery.attempts)
    if result.error_class == outbound.RATE_LIMITED:  # not sent: tried again next minute, not counted
        wait = 60
        Delivery.objects.filter(pk=delivery_id, status=Delivery.Status.SENDING).update(
            status=Delivery.Status.PENDING, attempts=F("attempts") - 1, claimed_until=None, last_error=result.error,
            next_attempt_at=timezone.now() + timedelta(seconds=wait))
        return AttemptOutcome("retry", wait)
    return delivery_record(delivery, result, runner=runner)


@transaction.atomic
def delivery_record(delivery: Delivery, result: SendResult, *, runner: str) -> AttemptOutcome:
    now = timezone.now()
    DeliveryAttempt.objects.create(delivery=delivery, number=delivery.attempts, ok=result.ok,
                                   status_code=result.status_code, response_excerpt=result.excerpt,
                                   error=result.error, duration_ms=result.duration_ms, runner=runner[:150])
    mine = Delivery.objects.filter(pk=delivery.pk, status=Delivery.Status.SENDING)
    if result.ok:
        mine.update(status=Delivery.Status.DELIVERED, delivered_at=now, claimed_until=None, last_error="")
        return AttemptOutcome("delivered")
    error = result.error or f"HTTP {result.status_code}"  # the owner sees it: never the receiver's body
    if delivery.attempts >= settings.NOTIFY_MAX_ATTEMPTS:
        mine.update(status=Delivery.Status.FAILED, claimed_until=None, last_error=error)
        logger.warning("delivery %s given up after %d attempts: %s", delivery.pk, delivery.attempts, error)
        return AttemptOutcome("failed")
    wait = retry_wait_seconds(delivery.attempts)
    mine.update(status=Delivery.Status.PENDING, claimed_until=None, last_error=error,
                next_attempt_at=now + timedelta(seconds=wait))
    return AttemptOutcome("retry", wait)


def deliveries_send_due(*, runner: str = "", now: datetime | None = None) -> int:
    """Send every delivery that is due (the embedded runtime's way; the job engine sends one per job)."""
    sent = 0
    for delivery_id in selectors.deliveries_due(now=now or timezone.now()):
        sent += delivery_attempt(delivery_id=delivery_id, runner=runner).status == "delivered"
    return sent


# --- an operator's settings ------------------------------------------------------------------------------------

def settings_record(user: User, action: str, **detail: object) -> None:
    SettingsChange.objects.create(user=user, user_label=user.get_username(), action=action, detail=detail)


class SettingsForbidden(SettingsError):
    """A change the user's role does not allow (a viewer's webhook or Slack channel): answered with a 403."""


def channel_change_allowed(user: User, *, kind: str, target: str, action: str) -> bool:
    """Operators add and change any channel of their own. A viewer may only be told by e-mail at their own
    account's address, and may turn off or remove any channel of theirs (which only stops sending)."""
    if user_can_decide(user):
        return True
    if action in ("off", "remove"):
        return True
    return kind == Channel.Kind.EMAIL and bool(user.email) and target.strip().lower() == user.email.strip().lower()


@transaction.atomic
def channel_add(*, user: User, kind: str, target: str) -> Channel:
    """Add a channel of one's own (checked by the outbound guard, within the cap per user); a webhook gets a new
    secret to verify signatures with."""
    if not channel_change_allowed(user, kind=kind, target=target, action="add"):
        raise SettingsForbidden("Only operators add webhook and Slack channels; a viewer may add e-mail to their "
                                "own account's address. Nothing was changed.")
    if problem := channel_target_problem(kind, target):
        raise SettingsError(f"{problem} Nothing was changed.")
    User.objects.select_for_update().filter(pk=user.pk).first()  # one add at a time per user: the cap holds
    if Channel.objects.filter(user=user).count() >= settings.NOTIFY_MAX_CHANNELS_PER_USER:
        raise SettingsError(f"You have {settings.NOTIFY_MAX_CHANNELS_PER_USER} channels, the most allowed: remove "
                            "one first. Nothing was changed.")
    if Channel.objects.filter(user=user, kind=kind, target=target).exists():
        raise SettingsError("You already have this channel. Nothing was changed.")
    secret = secrets.token_urlsafe(32) if kind == Channel.Kind.WEBHOOK else ""
    channel = Channel.objects.create(user=user, kind=kind, target=target, secret=secret)
    settings_record(user, "channel_added", channel=channel.pk, kind=kind, target=target)
    return channel


@transaction.atomic
def slack_app_channel_add(*, user: User, target: str, bot_token: str, signing_secret: str) -> Channel:
    """Add a Slack app channel of one's own: the Slack channel to post in, the app's bot token and signing
    secret (recorded in the settings audit without them)."""
    if Channel.objects.filter(user=user, kind=Channel.Kind.SLACK_APP, target=target).exists():
        raise SettingsError("You already have this channel. Nothing was changed.")
    channel = Channel.objects.create(user=user, kind=Channel.Kind.SLACK_APP, target=target, bot_token=bot_token,
                                     signing_secret=signing_secret)
    settings_record(user, "channel_added", channel=channel.pk, kind=channel.kind, target=target)
    return channel


def channel_own(user: User, channel_id: int, action: str, **filters: object) -> Channel:
    """One of the user's own channels, locked, that their role allows `action` on."""
    channel = Channel.objects.select_for_update().filter(user=user, pk=channel_id, **filters).first()
    if channel is None:
        raise SettingsError("No such channel of yours. Nothing was changed.")
    if not channel_change_allowed(user, kind=channel.kind, target=channel.target, action=action):
        raise SettingsForbidden("Only operators change webhook and Slack channels. Nothing was changed.")
    return channel


@transaction.atomic
def channel_set_active(*, user: User, channel_id: int, active: bool) -> Channel:
    channel = channel_own(user, channel_id, "on" if active else "off")
    if active and (problem := channel_target_problem(channel.kind, channel.target)):
        raise SettingsError(f"{problem} Nothing was changed.")
    channel.active = active
    channel.save(update_fields=["active", "updated_at"])
    settings_record(user, "channel_turned_on" if active else "channel_turned_off", channel=channel.pk)
    return channel


@transaction.atomic
def channel_remove(*, user: User, channel_id: int) -> None:
    channel = channel_own(user, channel_id, "remove")
    settings_record(user, "channel_removed", channel=channel.pk, kind=channel.kind, target=channel.target)
    channel.delete()


@transaction.atomic
def channel_secret_rotate(*, user: User, channel_id: int) -> Channel:
    channel = channel_own(user, channel_id, "rotate", kind=Channel.Kind.WEBHOOK)
    channel.secret = secrets.token_urlsafe(32)
    channel.save(update_fields=["secret", "updated_at"])
    settings_record(user, "channel_secret_renewed", channel=channel.pk)
    return channel


def channel_test(*, user: User, channel_id: int) -> SendResult:
    """Send a test message on one of one's own channels now, through the outbound guard; recorded."""
    with transaction.atomic():
        channel = channel_own(user, channel_id, "test")
    result = channel_test_send(channel)
    settings_record(user, "channel_tested", channel=channel.pk, ok=result.ok, status=result.status_code,
                    error=result.error_class or result.error)
    return result


@transaction.atomic
def subscription_save(*, user: User, kinds: list[str], agents: Iterable[Agent], min_risk: str,
                      subscription_id: int | None = None, remind_after_minutes: int | None = None,
                      escalate_after_minutes: int | None = None, escalate_to: Subscription | None = None
                      ) -> Subscription:
    """Create or change one of one's own subscriptions."""
    bad = [k for k in kinds if k not in Trigger.values]
    if not kinds or bad:
        raise SettingsError("Choose at least one known kind of notification. Nothing was changed.")
    if min_risk not in Subscription.MinRisk.values:
        raise SettingsError("Unknown minimum risk. Nothing was changed.")
    if subscription_id is None:
        subscription = Subscription(user=user)
    else:
        found = Subscription.objects.select_for_update().filter(user=user, pk=subscription_id).first()
        if found is None:
            raise SettingsError("No such subscription of yours. Nothing was changed.")
        subscription = found
    if escalate_to is not None and escalate_to.user_id == user.pk:
        raise SettingsError("Escalate to another operator's subscription (or a team account's). Nothing was changed.")
    subscription.kinds = [k for k in Trigger.values if k in kinds]
    subscription.min_risk = min_risk
    subscription.remind_after_minutes = remind_after_minutes
    subscription.escalate_after_minutes = escalate_after_minutes if escalate_to is not None else None
    subscription.escalate_to = escalate_to
    subscription.save()
    agents = list(agents)
    subscription.agents.set(agents)
    settings_record(user, "subscription_saved", subscription=subscription.pk, kinds=subscription.kinds,
                    agents=[a.pk for a in agents], min_risk=min_risk, remind_after_minutes=remind_after_minutes,
                    escalate_after_minutes=subscription.escalate_after_minutes,
                    escalate_to=escalate_to.pk if escalate_to else None)
    return subscription


@transaction.atomic
def subscription_remove(*, user: User, subscription_id: int) -> None:
    deleted, _ = Subscription.objects.filter(user=user, pk=subscription_id).delete()
    if not deleted:
        raise SettingsError("No such subscription of yours. Nothing was changed.")
    settings_record(user, "subscription_removed", subscription=subscription_id)
