"""The channels: how one delivery goes out. A webhook gets the notification as JSON, signed; Slack gets an
incoming-webhook message with blocks and Approve/Decline buttons (links); e-mail goes by Django's mail.

Webhook signature: `X-Planner-Signature: sha256=<hex HMAC-SHA256 of the raw body with the channel's secret>`.
The body carries `sent_at` (also in `X-Planner-Timestamp`), so a receiver that checks the signature and the age
of `sent_at` refuses both forgeries and replays. `X-Planner-Delivery` names the delivery (the same on retries)."""

from __future__ import annotations

import hashlib
import hmac
import json
import threading
import time
from dataclasses import dataclass
from typing import Any

import httpx
from django.conf import settings
from django.core.mail import EmailMessage

from notifications.models import Channel, Delivery

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


_client: httpx.Client | None = None
_client_lock = threading.Lock()


def http_client() -> httpx.Client:
    """One client per process (thread-safe): making one loads the TLS certificates, ~0.2 s each time."""
    global _client
    with _client_lock:
        if _client is None:
            _client = httpx.Client(timeout=settings.NOTIFY_TIMEOUT_SECONDS, follow_redirects=False)
        return _client


def http_post(url: str, body: bytes, headers: dict[str, str]) -> SendResult:
    started = time.monotonic()
    try:
        response = http_client().post(url, content=body, headers={"Content-Type": "application/json", **headers})
    except httpx.HTTPError as exc:
        return SendResult(ok=False, error=f"{type(exc).__name__}: {exc}"[:EXCERPT_CHARS],
                          duration_ms=int((time.monotonic() - started) * 1000))
    return SendResult(ok=response.is_success, status_code=response.status_code,
                      excerpt=response.text[:EXCERPT_CHARS], duration_ms=int((time.monotonic() - started) * 1000))


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


def delivery_send(delivery: Delivery, *, attempt: int) -> SendResult:
    """Send one delivery on its channel (no database writes here)."""
    channel = delivery.channel
    if channel.kind == Channel.Kind.EMAIL:
        return mail_send(delivery)
    if channel.kind == Channel.Kind.SLACK_APP:
        from notifications.slack_app import message_post

        return message_post(delivery)
    if channel.kind == Channel.Kind.SLACK:
        body = json.dumps(slack_body(delivery.notification.payload)).encode()
        return http_post(channel.target, body, {})
    sent_at = int(time.time())
    body = json.dumps(webhook_body(delivery, attempt=attempt, sent_at=sent_at), separators=(",", ":")).encode()
    return http_post(channel.target, body, {SIGNATURE_HEADER: body_sign(channel.secret, body),
                                            TIMESTAMP_HEADER: str(sent_at), DELIVERY_HEADER: str(delivery.pk)})
