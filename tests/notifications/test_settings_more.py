"""The settings page's new parts: a test notification on each channel (sent at once, the receiver's answer
shown), and a subscription's reminder and escalation timers."""

from __future__ import annotations

from typing import Any

import pytest
from django.core import mail
from django.test import Client

from notifications.models import Channel, Delivery, Subscription, Trigger
from tests.factories import UserFactory
from tests.notifications.conftest import Receiver
from tests.notifications.slack_standin import SlackStandin, slack

pytestmark = pytest.mark.django_db
__all__ = ["slack"]


def signed_in(username: str = "nadia") -> tuple[Any, Client]:
    user = UserFactory(username=username, role="operators")
    client = Client()
    client.force_login(user)
    return user, client


def test_a_test_notification_reaches_a_webhook_and_the_page_says_so(receiver: Receiver) -> None:
    user, client = signed_in()
    channel = Channel.objects.create(user=user, kind=Channel.Kind.WEBHOOK, target=receiver.url, secret="s")
    page = client.post(f"/notifications/channels/{channel.pk}/test/", follow=True)
    assert "delivered" in page.content.decode()
    [got] = receiver.wait_for(1)
    assert got.json()["title"] == "Test notification from Agent planner"


def test_a_failing_channel_says_what_it_met_and_is_not_retried(receiver: Receiver) -> None:
    user, client = signed_in()
    receiver.script = [503]
    channel = Channel.objects.create(user=user, kind=Channel.Kind.WEBHOOK, target=receiver.url, secret="s")
    page = client.post(f"/notifications/channels/{channel.pk}/test/", follow=True)
    assert "failed: HTTP 503" in page.content.decode()
    assert Delivery.objects.get().status == Delivery.Status.FAILED


def test_a_test_notification_by_email_and_by_the_slack_app(slack: SlackStandin) -> None:
    user, client = signed_in()
    email = Channel.objects.create(user=user, kind=Channel.Kind.EMAIL, target="nadia@example.com")
    app = Channel.objects.create(user=user, kind=Channel.Kind.SLACK_APP, target="C0PLANNER", bot_token="xoxb-t",
                                 signing_secret="s")
    client.post(f"/notifications/channels/{email.pk}/test/")
    client.post(f"/notifications/channels/{app.pk}/test/")
    assert [m.subject for m in mail.outbox] == ["Test notification from Agent planner"]
    [posted] = slack.of("chat.postMessage")
    assert posted.args["channel"] == "C0PLANNER" and "Test notification" in posted.args["text"]


def test_nobody_tests_someone_elses_channel() -> None:
    other = UserFactory(username="olga", role="operators")
    channel = Channel.objects.create(user=other, kind=Channel.Kind.EMAIL, target="olga@example.com")
    _, client = signed_in()
    response = client.post(f"/notifications/channels/{channel.pk}/test/", follow=True)
    assert "No such channel of yours. Nothing was changed." in response.content.decode()
    assert not mail.outbox and not Delivery.objects.exists()


def test_a_subscription_saves_its_reminder_and_escalation() -> None:
    olga = UserFactory(username="olga", role="operators")
    team = Subscription.objects.create(user=olga, kinds=[Trigger.WAITING])
    user, client = signed_in()
    data = {"new-kinds": [Trigger.WAITING], "new-min_risk": "safe", "new-remind_after_minutes": "15",
            "new-escalate_after_minutes": "45"}
    refused = client.post("/notifications/subscriptions/", data, follow=True)
    assert "Choose whom to escalate to." in refused.content.decode()
    assert not Subscription.objects.filter(user=user).exists()
    client.post("/notifications/subscriptions/", data | {"new-escalate_to": str(team.pk)})
    sub = Subscription.objects.get(user=user)
    assert (sub.remind_after_minutes, sub.escalate_after_minutes, sub.escalate_to) == (15, 45, team)
    page = client.get("/notifications/settings/").content.decode()
    assert "olga: subscription" in page and 'value="15"' in page
