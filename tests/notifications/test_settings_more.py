"""The settings page's new parts: a test notification on each channel (sent at once, the receiver's answer
shown), and a subscription's reminder and escalation timers."""

from __future__ import annotations

from typing import Any

import pytest
from django.test import Client

from notifications.models import Channel, Subscription, Trigger
from tests.factories import UserFactory
from tests.notifications.slack_standin import SlackStandin, slack

pytestmark = pytest.mark.django_db
__all__ = ["slack"]


def signed_in(username: str = "nadia") -> tuple[Any, Client]:
    user = UserFactory(username=username, role="operators")
    client = Client()
    client.force_login(user)
    return user, client


def test_a_test_notification_by_the_slack_app_goes_through_slacks_web_api(slack: SlackStandin) -> None:
    """The one "Send a test" button (tests/notifications/test_outbound.py tests it for webhooks) also serves a Slack
    app channel: a message posted with the channel's bot token."""
    user, client = signed_in()
    app = Channel.objects.create(user=user, kind=Channel.Kind.SLACK_APP, target="C0PLANNER", bot_token="xoxb-t",
                                 signing_secret="s")
    client.post(f"/notifications/channels/{app.pk}/test/")
    [posted] = slack.of("chat.postMessage")
    assert posted.args["channel"] == "C0PLANNER" and "this channel works" in posted.args["text"]


def test_a_viewer_cannot_add_a_slack_app_channel() -> None:
    viewer = UserFactory(username="vera", role="viewers")
    client = Client()
    client.force_login(viewer)
    response = client.post("/notifications/slack/channels/", {"slack-target": "C0PLANNER", "slack-bot_token": "xoxb-t",
                                                               "slack-signing_secret": "s"})
    assert response.status_code == 403
    assert not Channel.objects.exists()


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
