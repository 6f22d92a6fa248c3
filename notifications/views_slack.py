"""Slack's interactivity endpoint (a click on Approve / Decline… / Answer…, a modal's submission) and the
settings page's Slack parts (add a Slack app channel, make a code to connect one's Slack account).

The endpoint has no login and no CSRF token: Slack signs every request, and nothing is read or done before the
signature and its timestamp are verified with slack_sdk's SignatureVerifier and the signing secret of the channel
that posted the message. It answers at once (Slack waits 3 s); a decision goes through the planning services."""

from __future__ import annotations

import json
import logging
from typing import Any

from django.contrib import messages
from django.contrib.auth.decorators import login_not_required
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import redirect
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_POST
from slack_sdk.errors import SlackApiError, SlackClientError
from slack_sdk.signature import SignatureVerifier

from notifications import slack_app
from notifications.forms_slack import SlackAppChannelForm
from notifications.models import SlackMessage
from notifications.services import SettingsError, slack_app_channel_add
from notifications.views import VIEWER_REFUSED, owner
from planner_site.roles import user_can_decide

logger = logging.getLogger("planner.notifications")

MODAL_TITLES = {"decline": "Decline", "answer": "Answer", "connect": "Connect your account"}


def refused() -> HttpResponse:
    return HttpResponse("Not a request from Slack for this site.", status=401, content_type="text/plain")


def message_named(payload: dict[str, Any]) -> SlackMessage | None:
    """The message a request is about: the clicked message (block_actions), or the one a modal was opened from."""
    if payload.get("type") == "view_submission":
        try:
            pk = int(json.loads(payload["view"]["private_metadata"])["m"])
        except (KeyError, TypeError, ValueError):
            return None
        return SlackMessage.objects.select_related("channel").filter(pk=pk).first()
    container = payload.get("container") or {}
    channel_id = container.get("channel_id") or (payload.get("channel") or {}).get("id")
    ts = container.get("message_ts") or (payload.get("message") or {}).get("ts")
    if not channel_id or not ts:
        return None
    return SlackMessage.objects.select_related("channel").filter(slack_channel=str(channel_id), ts=str(ts)).first()


def ephemeral(message: SlackMessage, slack_user: str, text: str) -> None:
    try:
        slack_app.client(message.channel).chat_postEphemeral(channel=message.slack_channel, user=slack_user,
                                                             text=text, thread_ts=message.ts)
    except (SlackApiError, SlackClientError, OSError) as exc:
        logger.warning("Slack reply to %s not posted: %s", slack_user, exc)


CHANGED = ("It changed since this message was posted; the message now shows it as it is: look again before "
           "deciding. Nothing was changed.")


def changed(message: SlackMessage, slack_user: str) -> HttpResponse:
    """The reader decided on what the message showed, but the item was edited since: refused, message redrawn."""
    ephemeral(message, slack_user, CHANGED)
    SlackMessage.objects.filter(pk=message.pk).update(refresh_due=True)
    slack_app.messages_refresh(ids=[message.pk])
    return HttpResponse(status=200)


def modal_open(message: SlackMessage, trigger_id: str, purpose: str, seen: str = "") -> None:
    label = {"decline": "Why decline? The agent replans with your feedback.",
             "answer": "Your answer to the planner's question",
             "connect": "The code from your notification settings page"}[purpose]
    view = {
        "type": "modal", "callback_id": purpose, "private_metadata": json.dumps({"m": message.pk, "a": purpose, "f": seen}),
        "title": {"type": "plain_text", "text": MODAL_TITLES[purpose]},
        "submit": {"type": "plain_text", "text": "Connect" if purpose == "connect" else MODAL_TITLES[purpose]},
        "close": {"type": "plain_text", "text": "Cancel"},
        "blocks": [{"type": "input", "block_id": "text", "label": {"type": "plain_text", "text": label},
                    "element": {"type": "plain_text_input", "action_id": "text", "multiline": purpose != "connect"}}],
    }
    try:
        slack_app.client(message.channel).views_open(trigger_id=trigger_id, view=view)
    except (SlackApiError, SlackClientError, OSError) as exc:
        logger.warning("Slack modal not opened: %s", exc)


def refresh(message: SlackMessage) -> None:
    """The item was decided (here or elsewhere): its messages say who decided, now."""
    ids = slack_app.item_close(message)
    slack_app.messages_refresh(ids=ids)


@csrf_exempt
@login_not_required
@require_POST
def interactions(request: HttpRequest) -> HttpResponse:
    try:
        payload = json.loads(request.POST["payload"])
        if not isinstance(payload, dict):
            raise ValueError
    except (KeyError, ValueError):
        return refused()  # nothing signed to verify: not Slack
    message = message_named(payload)
    if message is None or not message.channel.signing_secret or not message.channel.active:
        return refused()
    if not SignatureVerifier(message.channel.signing_secret).is_valid_request(request.body, dict(request.headers)):
        return refused()
    slack_user = str((payload.get("user") or {}).get("id") or "")
    team = str((payload.get("team") or {}).get("id") or (payload.get("user") or {}).get("team_id") or "")
    user = slack_app.account_user(team, slack_user)
    if payload.get("type") == "view_submission":
        return submission(payload, message, slack_user, team, user)
    if payload.get("type") != "block_actions" or not payload.get("actions"):
        return HttpResponse(status=200)
    action = str(payload["actions"][0].get("action_id") or "")
    if action not in ("approve", "decline", "answer"):
        return HttpResponse(status=200)  # Open is a link: nothing to do here
    if user is None:
        ephemeral(message, slack_user, "Your Slack account is not connected to an account of the dashboard, so it "
                                       "cannot decide. Make a code in your notification settings and type it in "
                                       "the window that opened. Nothing was changed.")
        modal_open(message, str(payload.get("trigger_id") or ""), "connect")
        return HttpResponse(status=200)
    if not user_can_decide(user):
        ephemeral(message, slack_user, f"Your account {user.get_username()} may only view; it cannot decide. "
                                       "Nothing was changed.")
        return HttpResponse(status=200)
    outcome = slack_app.outcome_of(message)
    if outcome:
        ephemeral(message, slack_user, f"Already decided: {outcome} Nothing was changed.")
        refresh(message)
        return HttpResponse(status=200)
    seen = str(payload["actions"][0].get("value") or "").rpartition(":")[2]
    if not slack_app.message_current(message, seen):
        return changed(message, slack_user)
    if action in ("decline", "answer"):
        modal_open(message, str(payload.get("trigger_id") or ""), action, seen)
        return HttpResponse(status=200)
    answer = slack_app.decide(message, user, "approve")
    if not answer.decided:
        ephemeral(message, slack_user, answer.note)
    refresh(message)
    return HttpResponse(status=200)


def submission(payload: dict[str, Any], message: SlackMessage, slack_user: str, team: str, user: Any) -> HttpResponse:
    view = payload.get("view") or {}
    purpose = view.get("callback_id")
    try:
        text = str(view["state"]["values"]["text"]["text"]["value"] or "").strip()
    except (KeyError, TypeError):
        text = ""

    def modal_error(note: str) -> JsonResponse:
        return JsonResponse({"response_action": "errors", "errors": {"text": note}})

    if purpose == "connect":
        try:
            account = slack_app.connect(team_id=team, slack_user_id=slack_user, code=text)
        except slack_app.ConnectRefused as exc:
            return modal_error(str(exc))
        ephemeral(message, slack_user, f"Connected: your clicks decide as {account.user.get_username()}.")
        return JsonResponse({"response_action": "clear"})
    if purpose not in ("decline", "answer"):
        return HttpResponse(status=200)
    if user is None:
        return modal_error("Your Slack account is not connected to an account of the dashboard. Nothing was changed.")
    if not text:
        return modal_error("Feedback is required to decline. Nothing was changed." if purpose == "decline"
                           else "Write an answer to the planner's question. Nothing was changed.")
    try:
        seen = str(json.loads(view.get("private_metadata") or "{}").get("f") or "")
    except ValueError:
        seen = ""
    outcome = slack_app.outcome_of(message)
    if outcome:  # decided meanwhile (while the window was open): who won
        refresh(message)
        return modal_error(f"Already decided: {outcome} Nothing was changed.")
    if not slack_app.message_current(message, seen):
        SlackMessage.objects.filter(pk=message.pk).update(refresh_due=True)
        slack_app.messages_refresh(ids=[message.pk])
        return modal_error(CHANGED)
    answer = slack_app.decide(message, user, purpose, text)
    if not answer.decided:
        refresh(message)
        return modal_error(answer.note)
    refresh(message)
    return JsonResponse({"response_action": "clear"})


# --- the settings page's Slack parts ----------------------------------------------------------------------------

@require_POST
def slack_channel_add(request: HttpRequest) -> HttpResponse:
    if not user_can_decide(owner(request)):
        return HttpResponse(VIEWER_REFUSED, status=403)
    form = SlackAppChannelForm(request.POST, prefix="slack")
    if not form.is_valid():
        errors = " ".join(str(e) for errs in form.errors.values() for e in errs)
        messages.error(request, f"{errors} Nothing was changed.")
        return redirect("notify-settings")
    try:
        channel = slack_app_channel_add(user=owner(request), **form.cleaned_data)
    except SettingsError as exc:
        messages.error(request, str(exc))
        return redirect("notify-settings")
    messages.success(request, f"Added {channel}. Its bot token and signing secret are kept and never shown again.")
    return redirect("notify-settings")


@require_POST
def slack_connect_code(request: HttpRequest) -> HttpResponse:
    code = slack_app.connect_code_make(user=owner(request))
    messages.success(request, f"Your code to connect Slack: {code}. Click a button on a message of this site in "
                              "Slack and type it in the window that opens. It works once, for "
                              f"{slack_app.code_minutes()} minutes.")
    return redirect("notify-settings")
