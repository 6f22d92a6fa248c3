"""Slack app channels: an item waiting for a person (a step, a plan, a planner's question) posted as a Block Kit
message with buttons that decide, through the same services as the web page (events, audit, pushes, policies,
budgets apply alike); the message is updated to say who decided and when, wherever the decision was made.

Slack's Web API is called through the official `slack_sdk` WebClient at SLACK_API_BASE_URL (never an address a
user typed). A click reaches `notifications.views_slack`, which verifies Slack's signature and calls `click` or
`submission` here."""

from __future__ import annotations

import hashlib
import json
import logging
import secrets
import time
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.contrib.auth.models import User
from django.db import transaction
from django.utils import timezone
from slack_sdk import WebClient
from slack_sdk.errors import SlackApiError, SlackClientError

from notifications.deciding import STEP_OUTCOMES, item_decide, item_fingerprint, item_outcome
from notifications.links import link_make
from notifications.models import Channel, Delivery, SlackAccount, SlackConnectCode, SlackMessage, Trigger
from notifications.senders import EXCERPT_CHARS, SendResult, slack_escape
from planning import services as planning
from planning.models import Plan, PlanEvent, PlanStep

logger = logging.getLogger("planner.notifications")

DECIDABLE = (Trigger.WAITING, Trigger.URGENT, Trigger.ESCALATED, Trigger.QUESTION)
STEPS_SHOWN = 20
INPUT_CHARS = 1500


def client(channel: Channel) -> WebClient:
    return WebClient(token=channel.bot_token, base_url=settings.SLACK_API_BASE_URL,
                     timeout=settings.SLACK_TIMEOUT_SECONDS)


# --- the message ---------------------------------------------------------------------------------------------

def step_lines(step: PlanStep) -> str:
    tool_input = json.dumps(step.tool_input, ensure_ascii=False, indent=1, sort_keys=True)
    if len(tool_input) > INPUT_CHARS:
        tool_input = tool_input[:INPUT_CHARS] + "… (cut: open it for the whole input)"
    flags = [f"risk: {step.get_risk_display().lower()}"] + (["needs permission"] if step.requires_permission else [])
    return (f"*Step {slack_escape(step.key)}*: {slack_escape(step.description)}\n"
            f"Tool: `{slack_escape(step.tool or '(none)')}` · {', '.join(flags)}\n"
            f"Input:\n```{slack_escape(tool_input)}```")


def message_kind(notification_kind: str, step: PlanStep | None) -> str:
    if notification_kind == Trigger.QUESTION:
        return "question"
    return "step" if step is not None else "plan"


def message_blocks(*, kind: str, plan: Plan, step: PlanStep | None, title: str, outcome: str = "",
                   escalated: str = "") -> list[dict[str, Any]]:
    """The plan, the step(s) with tool and exact input, risk, who asks; Approve / Decline… / Open, or who decided."""
    agent = plan.agent
    blocks: list[dict[str, Any]] = [
        {"type": "section", "text": {"type": "mrkdwn", "text": f"*{slack_escape(title)}*"}},
        {"type": "context", "elements": [{"type": "mrkdwn", "text": slack_escape(
            f"Asked by {agent.name} ({agent.get_kind_display().lower()}) · plan “{plan.goal_text}” v{plan.version}")}]},
    ]
    if kind == "question":
        blocks.append({"type": "section", "text": {"type": "mrkdwn", "text": "Question: " + slack_escape(
            plan.clarification_question or "(no question text)")}})
    elif step is not None:
        blocks.append({"type": "section", "text": {"type": "mrkdwn", "text": step_lines(step)[:2900]}})
    else:
        if plan.what:
            blocks.append({"type": "section", "text": {"type": "mrkdwn", "text": slack_escape(plan.what)[:2900]}})
        steps = list(plan.steps.all())
        for s in steps[:STEPS_SHOWN]:
            blocks.append({"type": "section", "text": {"type": "mrkdwn", "text": step_lines(s)[:2900]}})
        if len(steps) > STEPS_SHOWN:
            blocks.append({"type": "context", "elements": [{"type": "mrkdwn", "text":
                           f"and {len(steps) - STEPS_SHOWN} more steps: open the plan to see them all"}]})
    if escalated:
        blocks.append({"type": "context", "elements": [{"type": "mrkdwn", "text": slack_escape(escalated)}]})
    open_url = link_make(plan_id=plan.pk, step_id=step.pk if step else None)
    if outcome:
        blocks.append({"type": "section", "text": {"type": "mrkdwn", "text": f":white_check_mark: {slack_escape(outcome)}"}})
        blocks.append({"type": "actions", "elements": [
            {"type": "button", "action_id": "open", "text": {"type": "plain_text", "text": "Open"}, "url": open_url}]})
        return blocks
    ref = f"{kind}:{step.pk if step else plan.pk}:{item_fingerprint(plan, step)}"  # what the reader saw
    buttons: list[dict[str, Any]]
    if kind == "question":
        buttons = [{"type": "button", "style": "primary", "action_id": "answer", "value": ref,
                    "text": {"type": "plain_text", "text": "Answer…"}}]
    else:
        buttons = [
            {"type": "button", "style": "primary", "action_id": "approve", "value": ref,
             "text": {"type": "plain_text", "text": "Approve"}},
            {"type": "button", "style": "danger", "action_id": "decline", "value": ref,
             "text": {"type": "plain_text", "text": "Decline…"}},
        ]
    buttons.append({"type": "button", "action_id": "open", "text": {"type": "plain_text", "text": "Open"},
                    "url": open_url})
    blocks.append({"type": "actions", "block_id": "decide", "elements": buttons})
    return blocks


def outcome_of(message: SlackMessage) -> str:
    """Who decided the message's item and when ("Approved by nadia at 07:02 UTC, 7 Dec 2026"), or "" while it waits."""
    return item_outcome(message.kind, message.plan_id, message.step_id)


# --- posting (the notifier sends a delivery on a Slack app channel) -------------------------------------------

def message_post(delivery: Delivery) -> SendResult:
    """Post one notification to the channel's Slack channel. An item that waits for a person gets buttons and a
    SlackMessage row (the one write here: where the message is, for clicks and updates)."""
    notification, channel = delivery.notification, delivery.channel
    plan = Plan.objects.select_related("agent").filter(pk=notification.plan_id).first() \
        if notification.plan_id else None
    step = PlanStep.objects.filter(pk=notification.step_id).first() if notification.step_id else None
    title = notification.payload.get("title", notification.title)
    decidable = plan is not None and notification.kind in DECIDABLE
    started = time.monotonic()
    if decidable and plan is not None:
        kind = message_kind(notification.kind, step)
        blocks = message_blocks(kind=kind, plan=plan, step=step, title=title)
    else:
        kind = ""
        blocks = [{"type": "section", "text": {"type": "mrkdwn", "text": f"*{slack_escape(title)}*"}},
                  {"type": "context", "elements": [{"type": "mrkdwn", "text": slack_escape(
                      notification.payload.get("text", "")) or " "}]},
                  {"type": "actions", "elements": [{"type": "button", "action_id": "open", "text": {
                      "type": "plain_text", "text": "Open"}, "url": notification.payload.get("link", "")}]}]
    try:
        response = client(channel).chat_postMessage(channel=channel.target, text=title, blocks=blocks)
    except (SlackApiError, SlackClientError, OSError) as exc:
        return SendResult(ok=False, error=f"{type(exc).__name__}: {exc}"[:EXCERPT_CHARS],
                          duration_ms=int((time.monotonic() - started) * 1000))
    duration = int((time.monotonic() - started) * 1000)
    if decidable and plan is not None:
        message = SlackMessage.objects.create(channel=channel, delivery=delivery, plan=plan, step=step, kind=kind,
                                              slack_channel=str(response.get("channel") or channel.target),
                                              ts=str(response.get("ts") or ""))
        # Decided between the post and this row: the decision's hook found no row to update; do it now.
        outcome = outcome_of(message)
        if outcome:
            SlackMessage.objects.filter(pk=message.pk).update(outcome=outcome, refresh_due=True)
    return SendResult(ok=True, status_code=response.status_code,
                      excerpt=json.dumps({"ok": True, "channel": response.get("channel"), "ts": response.get("ts")}),
                      duration_ms=duration)


def test_post(channel: Channel, *, title: str, text: str) -> SendResult:
    """The settings page's "Send a test" on a Slack app channel: one plain message, at once."""
    started = time.monotonic()
    try:
        response = client(channel).chat_postMessage(channel=channel.target, text=f"{title}. {text}")
    except (SlackApiError, SlackClientError, OSError) as exc:
        return SendResult(ok=False, error=f"Slack refused the test ({type(exc).__name__})",
                          duration_ms=int((time.monotonic() - started) * 1000))
    return SendResult(ok=True, status_code=response.status_code,
                      duration_ms=int((time.monotonic() - started) * 1000))


# --- updates: a decision made anywhere closes its messages ----------------------------------------------------

def messages_for_event(event: PlanEvent) -> Any:
    messages = SlackMessage.objects.filter(plan_id=event.plan_id or 0, outcome="")
    if event.kind in STEP_OUTCOMES:
        return messages.filter(step_id=event.step_id)
    if event.kind in (PlanEvent.Kind.PLAN_CANCELLED, PlanEvent.Kind.REPLAN_REQUESTED, PlanEvent.Kind.PLAN_EDITED):
        return messages
    return messages.filter(step__isnull=True)


def outcomes_mark(event_id: int) -> int:
    """After a decision commits: its open messages are marked with who decided, to be updated in Slack."""
    event = PlanEvent.objects.select_related("actor").filter(pk=event_id).first()
    if event is None or event.plan_id is None:
        return 0
    marked = 0
    for message in messages_for_event(event):
        outcome = outcome_of(message)
        if outcome:
            marked += SlackMessage.objects.filter(pk=message.pk, outcome="").update(outcome=outcome, refresh_due=True)
        elif event.kind in (PlanEvent.Kind.STEP_EDITED, PlanEvent.Kind.PLAN_EDITED):  # still waiting, edited:
            marked += SlackMessage.objects.filter(pk=message.pk).update(refresh_due=True)  # shown as it is now
    return marked


def message_current(message: SlackMessage, seen: str) -> bool:
    """Whether the item is still as the clicked message showed it (`seen`: its fingerprint in the button)."""
    plan = Plan.objects.get(pk=message.plan_id)
    step = PlanStep.objects.filter(pk=message.step_id).first() if message.step_id else None
    return seen == item_fingerprint(plan, step)


def item_close(message: SlackMessage) -> list[int]:
    """Mark every open message of this message's item with who decided it (none while it still waits); returns
    the messages to update (this one included when its update is still due)."""
    outcome = outcome_of(message)
    if outcome:
        same = SlackMessage.objects.filter(plan_id=message.plan_id, step_id=message.step_id, kind=message.kind)
        same.filter(outcome="").update(outcome=outcome, refresh_due=True)
        return list(same.filter(refresh_due=True).values_list("pk", flat=True))
    return []


def messages_refresh(*, ids: list[int] | None = None) -> int:
    """chat.update every message marked to refresh (or these): it then says who decided and when."""
    due = SlackMessage.objects.filter(refresh_due=True).select_related("channel", "plan", "plan__agent", "step")
    if ids is not None:
        due = due.filter(pk__in=ids)
    done = 0
    for message in list(due[:100]):
        delivery_title = ""
        if message.delivery_id:
            delivery_title = Delivery.objects.filter(pk=message.delivery_id).values_list(
                "notification__title", flat=True).first() or ""
        blocks = message_blocks(kind=message.kind, plan=message.plan, step=message.step,
                                title=delivery_title or "An item that waited for a person", outcome=message.outcome,
                                escalated=message.escalated)
        try:
            client(message.channel).chat_update(channel=message.slack_channel, ts=message.ts,
                                                text=message.outcome or message.escalated or delivery_title,
                                                blocks=blocks)
        except (SlackApiError, SlackClientError, OSError) as exc:
            logger.warning("Slack message %s not updated: %s", message.pk, exc)
            continue
        done += SlackMessage.objects.filter(pk=message.pk, outcome=message.outcome,
                                            escalated=message.escalated).update(refresh_due=False)
    return done


# --- who clicks -------------------------------------------------------------------------------------------------

def code_minutes() -> int:
    return max(1, settings.SLACK_CONNECT_CODE_MAX_AGE_SECONDS // 60)


def code_hash(code: str) -> str:
    return hashlib.sha256("".join(c for c in code.upper() if c.isalnum()).encode()).hexdigest()


@transaction.atomic
def connect_code_make(*, user: User) -> str:
    """A one-time code for `user` to type in Slack (shown once; only its hash is kept)."""
    alphabet = "ABCDEFGHJKLMNPQRSTUVWXYZ23456789"
    code = "".join(secrets.choice(alphabet) for _ in range(10))
    SlackConnectCode.objects.create(user=user, code_hash=code_hash(code),
                                    expires_at=timezone.now() + timedelta(seconds=settings.SLACK_CONNECT_CODE_MAX_AGE_SECONDS))
    return f"{code[:5]}-{code[5:]}"


class ConnectRefused(Exception):
    pass


@transaction.atomic
def connect(*, team_id: str, slack_user_id: str, code: str) -> SlackAccount:
    """Connect a Slack user (as Slack's signed request names them) to the account whose code they typed."""
    now = timezone.now()
    row = SlackConnectCode.objects.select_for_update().filter(code_hash=code_hash(code)).first()
    if row is None or row.used_at is not None or row.expires_at < now:
        raise ConnectRefused("This code is unknown, used or expired: make a new one in your notification settings. "
                             "Nothing was changed.")
    row.used_at = now
    row.save(update_fields=["used_at"])
    account, _ = SlackAccount.objects.update_or_create(team_id=team_id, slack_user_id=slack_user_id,
                                                       defaults={"user": row.user})
    return account


def account_user(team_id: str, slack_user_id: str) -> User | None:
    account = SlackAccount.objects.select_related("user").filter(team_id=team_id, slack_user_id=slack_user_id).first()
    return account.user if account and account.user.is_active else None


# --- deciding ---------------------------------------------------------------------------------------------------

@dataclass
class Answer:
    """What the clicker is told (ephemeral), and which messages to update now."""

    note: str
    decided: bool = False


def decide(message: SlackMessage, user: User, action: str, text: str = "") -> Answer:
    """Apply one decision through the planning services, as the web does; a refusal says who decided first."""
    plan = Plan.objects.select_related("agent").get(pk=message.plan_id)
    step = PlanStep.objects.select_related("plan").filter(pk=message.step_id).first() if message.step_id else None
    try:
        item_decide(kind=message.kind, plan=plan, step=step, user=user, action=action, text=text, via="slack")
    except planning.DecisionError as exc:
        outcome = outcome_of(message)
        if outcome:
            return Answer(f"Already decided: {outcome} Nothing was changed.")
        return Answer(str(exc))
    return Answer("", decided=True)
