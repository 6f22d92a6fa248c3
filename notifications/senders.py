"""The plain channels: how one delivery goes out. A webhook gets the notification as JSON, signed; Slack gets an
incoming-webhook message with blocks and Approve/Decline buttons (links); e-mail goes by Django's mail. The Slack
app (slack_app.py) builds on this module; sending.py sends by the channel's kind, through one or the other.

Webhook signature: `X-Planner-Signature: sha256=<hex HMAC-SHA256 of the raw body with the channel's secret>`.
The body carries `sent_at` (also in `X-Planner-Timestamp`), so a receiver that checks the signature and the age
of `sent_at` refuses both forgeries and replays. `X-Planner-Delivery` names the delivery (the same on retries)."""

from __future__ import annotations

import hashlib
import hmac
import time
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.core.mail import EmailMessage

from notifications.models import Channel, Delivery
from planner_site import outbound

EXCERPT_CHARS = 500
SIGNATURE_HEADER = "X-Planner-Signature"
TIMESTAMP_HEADER = "X-Planner-Timestamp"
DELIVERY_HEADER = "X-Planner-Delivery"


@dataclass(frozen=True)
class SendResult:
    ok: bool
    status_code: int | None = None
    excerpt: str = ""
    error: str = ""
    duration_ms: int = 0
    error_class: str = ""


def body_sign(secret: str, body: bytes) -> str:
    return "sha256=" + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()


def webhook_body(delivery: Delivery, *, attempt: int, sent_at: int) -> dict[str, Any]:
    return {**delivery.notification.payload, "delivery": delivery.pk, "attempt": attempt, "sent_at": sent_at}


def slack_body(payload: dict[str, Any]) -> dict[str, Any]:
    """An incoming-webhook message: the title, a line of context, and buttons that are plain links."""
    buttons = [{"type": "button", "text": {"type": "plain_text", "text": "Open"}, "url": payload["link"]}]
    if payload.get("approve_link"):
        buttons = [
            {"type": "button", "style": "primary", "text": {"type": "plain_text", "text": "Approve"},
             "url": payload["approve_link"]},
            {"type": "button", "style": "danger", "text": {"type": "plain_text", "text": "Decline"},
             "url": payload["decline_link"]},
            *buttons,
        ]
    return {
        "text": payload["title"],
        "blocks": [
            {"type": "section", "text": {"type": "mrkdwn", "text": slack_escape(payload["title"])}},
            {"type": "context", "elements": [{"type": "mrkdwn", "text": slack_escape(payload.get("text", ""))
                                              or " "}]},
            {"type": "actions", "elements": buttons},
        ],
    }


def slack_escape(text: str) -> str:
    """Slack's three control characters in text, escaped as its docs ask (no mention or link is injected)."""
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def http_post(url: str, body: bytes, headers: dict[str, str], *, hosts: list[str] | None = None) -> SendResult:
    """POST through the outbound guard (planner_site/outbound.py): the owner's error says a status and a class,
    never the receiver's body; the attempt row keeps a short excerpt of it for administrators."""
    answer = outbound.post(url, body, headers, hosts=hosts)
    return SendResult(ok=answer.ok, status_code=answer.status_code, excerpt=answer.excerpt,
                      error="" if answer.ok else answer.summary, duration_ms=answer.duration_ms,
                      error_class=answer.error_class)


def channel_post(channel: Channel, body: bytes, headers: dict[str, str]) -> SendResult:
    hosts = settings.SLACK_WEBHOOK_HOSTS if channel.kind == Channel.Kind.SLACK else None
    return http_post(channel.target, body, headers, hosts=hosts)


def mail_send(delivery: Delivery) -> SendResult:
    payload = delivery.notification.payload
    lines = [payload["title"], "", payload.get("text", ""), "", f"Open: {payload['link']}"]
    if payload.get("approve_link"):
        lines += [f"Approve: {payload.get('confirm_approve_link') or payload['approve_link']}",
                  f"Decline: {payload.get('confirm_decline_link') or payload['decline_link']}"]
    lines += ["", "You get this because of your notification settings: " + payload.get("settings_link", "")]
    message = EmailMessage(subject=payload["title"][:150], body="\n".join(lines), to=[delivery.channel.target])
    started = time.monotonic()
    try:
        sent = message.send(using="notifications")
    except Exception as exc:  # any mailer's failure (SMTP, DNS, refused address) is a failed attempt, retried
        return SendResult(ok=False, error=f"{type(exc).__name__}: {exc}"[:EXCERPT_CHARS],
                          duration_ms=int((time.monotonic() - started) * 1000))
    return SendResult(ok=bool(sent), excerpt="accepted by the mailer" if sent else "",
                      error="" if sent else "the mailer sent nothing", duration_ms=int((time.monotonic() - started) * 1000))
