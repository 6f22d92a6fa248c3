"""The settings page's "Send a test notification": one notification sent at once on one channel of one's own,
with what the receiver answered (a test is tried once, never retried later)."""

from __future__ import annotations

import secrets

from django.contrib.auth.models import User
from django.http import HttpRequest, HttpResponse
from django.utils import timezone
from django.views.decorators.http import require_POST

from notifications.models import Channel, Delivery, Notification
from notifications.selectors import link_settings
from notifications.services import SettingsError, delivery_attempt, settings_record
from notifications.views import owner, settings_answer

TEST_KIND = "test"


def channel_test_send(*, user: User, channel_id: int) -> tuple[bool, str]:
    """Send a test on one's own channel now: (delivered, what happened)."""
    channel = Channel.objects.filter(user=user, pk=channel_id).first()
    if channel is None:
        raise SettingsError("No such channel of yours. Nothing was changed.")
    title = "Test notification from Agent planner"
    notification = Notification.objects.create(
        user=user, key=f"test:{channel.pk}:{secrets.token_hex(8)}", kind=TEST_KIND, title=title,
        payload={"kind": TEST_KIND, "title": title, "text": f"Sent by {user.get_username()} from the settings page: "
                 "this channel works.", "link": link_settings(), "settings_link": link_settings(),
                 "created_at": timezone.now().isoformat()})
    delivery = Delivery.objects.create(notification=notification, channel=channel, next_attempt_at=timezone.now())
    settings_record(user, "channel_tested", channel=channel.pk)
    outcome = delivery_attempt(delivery_id=delivery.pk, runner="test button")
    delivery.refresh_from_db()
    if outcome.status == "delivered":
        return True, f"Test sent on {channel}: delivered."
    Delivery.objects.filter(pk=delivery.pk).exclude(status=Delivery.Status.DELIVERED).update(
        status=Delivery.Status.FAILED, claimed_until=None)  # a test is not retried later
    return False, f"Test on {channel} failed: {delivery.last_error or 'not sent'}"


@require_POST
def channel_test_view(request: HttpRequest, pk: int) -> HttpResponse:
    try:
        ok, note = channel_test_send(user=owner(request), channel_id=pk)
    except SettingsError as exc:
        return settings_answer(request, str(exc), ok=False, status=404)
    return settings_answer(request, note, ok=ok)  # the test ran: what it met is the answer
