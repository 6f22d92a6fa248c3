"""One delivery, or a channel's test, sent the way its channel's kind asks: by the plain senders (senders.py: a
webhook, a Slack incoming webhook, e-mail) or by the Slack app (slack_app.py), which builds on them. No database
writes here: notifications/services.py records what the channel answered."""

from __future__ import annotations

import json
import time

from django.conf import settings
from django.core.mail import EmailMessage

from notifications.models import Channel, Delivery
from notifications.senders import (
    DELIVERY_HEADER,
    SIGNATURE_HEADER,
    TIMESTAMP_HEADER,
    SendResult,
    body_sign,
    channel_post,
    mail_send,
    slack_body,
    webhook_body,
)
from notifications.slack_app import message_post, test_post


def delivery_send(delivery: Delivery, *, attempt: int) -> SendResult:
    """Send one delivery on its channel (no database writes here)."""
    channel = delivery.channel
    if channel.kind == Channel.Kind.EMAIL:
        return mail_send(delivery)
    if channel.kind == Channel.Kind.SLACK_APP:
        return message_post(delivery)
    if channel.kind == Channel.Kind.SLACK:
        body = json.dumps(slack_body(delivery.notification.payload)).encode()
        return channel_post(channel, body, {})
    sent_at = int(time.time())
    body = json.dumps(webhook_body(delivery, attempt=attempt, sent_at=sent_at), separators=(",", ":")).encode()
    return channel_post(channel, body, {SIGNATURE_HEADER: body_sign(channel.secret, body),
                                        TIMESTAMP_HEADER: str(sent_at), DELIVERY_HEADER: str(delivery.pk)})


def channel_test_send(channel: Channel) -> SendResult:
    """The settings page's "Send a test": one message now, through the same guard as every delivery."""
    payload = {"kind": "test", "title": "Test from the agent planner: this channel works",
               "text": "Sent because you asked for a test on your notification settings.",
               "link": f"{settings.PLANNER_BASE_URL}/notifications/settings/"}
    if channel.kind == Channel.Kind.EMAIL:
        message = EmailMessage(subject=payload["title"], body=f"{payload['text']}\n\n{payload['link']}",
                               to=[channel.target])
        try:
            sent = message.send(using="notifications")
        except Exception as exc:  # any mailer's failure is said, by its class only
            return SendResult(ok=False, error=f"the mailer failed ({type(exc).__name__})")
        return SendResult(ok=bool(sent), error="" if sent else "the mailer sent nothing")
    if channel.kind == Channel.Kind.SLACK:
        return channel_post(channel, json.dumps({"text": payload["title"]}).encode(), {})
    if channel.kind == Channel.Kind.SLACK_APP:
        return test_post(channel, title=payload["title"], text=payload["text"])
    sent_at = int(time.time())
    body = json.dumps({**payload, "sent_at": sent_at}, separators=(",", ":")).encode()
    return channel_post(channel, body, {SIGNATURE_HEADER: body_sign(channel.secret, body),
                                        TIMESTAMP_HEADER: str(sent_at)})
