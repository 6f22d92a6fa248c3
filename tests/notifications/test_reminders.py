"""Reminders and escalation: an item still waiting after the subscription's remind_after is sent again, once;
after escalate_after it goes to the escalation subscription's operator, and the first Slack message says so;
an item decided meanwhile is neither reminded of nor escalated."""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

import pytest
from django.core import mail
from django.utils import timezone

from notifications import slack_app
from notifications.models import Channel, Notification, SlackMessage, Subscription, Trigger
from notifications.reminders import reminders_dispatch
from notifications.services import deliveries_send_due, notifications_dispatch
from planning import services as planning_services
from tests.factories import UserFactory
from tests.notifications.slack_standin import SlackStandin, slack
from tests.notifications.test_confirm import step_waiting

pytestmark = pytest.mark.django_db
__all__ = ["slack"]


def operators(*, remind: int | None = 10, escalate: int | None = 30) -> tuple[Any, Any]:
    nadia = UserFactory(username="nadia", role="operators")
    olga = UserFactory(username="olga", role="operators")
    Channel.objects.create(user=nadia, kind=Channel.Kind.EMAIL, target="nadia@example.com")
    Channel.objects.create(user=olga, kind=Channel.Kind.EMAIL, target="olga@example.com")
    team = Subscription.objects.create(user=olga, kinds=[Trigger.FAILED])  # olga's own: only failures
    Subscription.objects.create(user=nadia, kinds=list(Trigger.values), remind_after_minutes=remind,
                                escalate_after_minutes=escalate, escalate_to=team)
    return nadia, olga


def sent_to(address: str) -> list[str]:
    return [m.subject for m in mail.outbox if m.to == [address]]


def test_an_unanswered_step_is_reminded_once_then_escalated() -> None:
    nadia, olga = operators()
    step_waiting()
    notifications_dispatch()
    deliveries_send_due()
    now = timezone.now()
    assert reminders_dispatch(now=now + timedelta(minutes=9)) == []  # not yet
    assert len(reminders_dispatch(now=now + timedelta(minutes=11))) == 1
    assert reminders_dispatch(now=now + timedelta(minutes=12)) == []  # once
    deliveries_send_due(now=now + timedelta(minutes=12))
    reminders = [s for s in sent_to("nadia@example.com") if s.startswith("Reminder")]
    assert len(reminders) == 1 and "step s1 waits for your approval" in reminders[0]
    assert sent_to("olga@example.com") == []
    assert len(reminders_dispatch(now=now + timedelta(minutes=31))) == 1
    deliveries_send_due(now=now + timedelta(minutes=31))
    [escalated] = sent_to("olga@example.com")
    assert escalated.startswith("Escalated from nadia after 31 min")
    assert Notification.objects.filter(user=olga, key__startswith="escalate:").count() == 1
    assert reminders_dispatch(now=now + timedelta(minutes=60)) == []


def test_an_item_decided_meanwhile_is_neither_reminded_nor_escalated() -> None:
    nadia, _ = operators()
    step = step_waiting()
    notifications_dispatch()
    planning_services.step_approve(step=step, user=nadia)
    assert reminders_dispatch(now=timezone.now() + timedelta(hours=2)) == []


def test_without_timers_nothing_is_sent_again() -> None:
    operators(remind=None, escalate=None)
    step_waiting()
    notifications_dispatch()
    assert reminders_dispatch(now=timezone.now() + timedelta(hours=2)) == []


def test_the_first_slack_message_says_it_was_escalated(slack: SlackStandin) -> None:
    nadia, olga = operators(remind=None, escalate=5)
    Channel.objects.create(user=nadia, kind=Channel.Kind.SLACK_APP, target="C0PLANNER", bot_token="xoxb-t",
                           signing_secret="s")
    step_waiting()
    notifications_dispatch()
    deliveries_send_due()
    first = SlackMessage.objects.get()
    reminders_dispatch(now=timezone.now() + timedelta(minutes=6))
    first.refresh_from_db()
    assert first.escalated.startswith("Escalated to olga at") and first.refresh_due
    slack_app.messages_refresh()
    [update] = slack.of("chat.update")
    assert update.args["ts"] == first.ts
    blocks = json.dumps(update.args["blocks"])
    assert "Escalated to olga at" in blocks and "unanswered for 6 min" in blocks
    assert '"Approve"' in blocks  # still waiting: the buttons stay
