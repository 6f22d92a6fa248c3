"""Deciding from Slack: a waiting item is posted by a Slack app channel (to a local stand-in of Slack's Web API)
with its tool and exact input; a click signed as Slack signs it decides through the planning services, and the
message then says who decided; forged, replayed, unmapped and viewers' clicks change nothing; of Slack and the
web at once, one wins and the other is told who."""

from __future__ import annotations

import json
import threading
import time
from typing import Any

import pytest
from django.db import close_old_connections
from django.test import Client

from notifications import slack_app
from notifications.models import Channel, SlackAccount, SlackMessage, Subscription, Trigger
from notifications.services import deliveries_send_due, notifications_dispatch
from planning.models import Plan, PlanEvent, PlanStep
from tests.factories import AgentFactory, PlanEventFactory, PlanFactory, PlanStepFactory, UserFactory
from tests.notifications.slack_standin import SlackStandin, click, slack, slack_post, submit

pytestmark = pytest.mark.django_db
__all__ = ["slack"]  # the fixture, used by name

SECRET = "8f742231b10e8888abcd99yyyzzz85a5"
CHANNEL = "C0PLANNER"


def operator_with_slack(*, username: str = "nadia", slack_user: str | None = "U1", role: str = "operators") -> Any:
    user = UserFactory(username=username, role=role)
    Channel.objects.create(user=user, kind=Channel.Kind.SLACK_APP, target=CHANNEL, bot_token="xoxb-test-token",
                           signing_secret=SECRET)
    Subscription.objects.create(user=user, kinds=list(Trigger.values))
    if slack_user:
        SlackAccount.objects.create(team_id="T1", slack_user_id=slack_user, user=user)
    return user


def step_waiting() -> PlanStep:
    plan = PlanFactory(agent=AgentFactory(kind="tool", name="Ada"), approval_mode=Plan.ApprovalMode.STEP,
                       goal_text="Tidy the log bucket")
    step = PlanStepFactory(plan=plan, key="s1", description="Delete the old logs", risk=PlanStep.Risk.RISKY,
                           tool="shell", tool_input={"command": "rm -rf /var/log/old"},
                           status=PlanStep.Status.AWAITING_APPROVAL)
    PlanEventFactory(plan=plan, step=step, kind=PlanEvent.Kind.STEP_AWAITING)
    return step


def posted(slack: SlackStandin) -> tuple[dict[str, Any], str]:
    """Dispatch and send: the one message posted, and its ts."""
    notifications_dispatch()
    deliveries_send_due()
    [call] = slack.of("chat.postMessage")
    message = SlackMessage.objects.get()
    assert message.ts and message.slack_channel == CHANNEL
    return call.args, message.ts


def blocks_text(blocks: list[dict[str, Any]]) -> str:
    return json.dumps(blocks, ensure_ascii=False)


def slack_client() -> Client:
    return Client(enforce_csrf_checks=True)  # Slack sends no CSRF token: the endpoint trusts only the signature


def test_a_waiting_step_is_posted_with_its_tool_input_risk_and_buttons(slack: SlackStandin) -> None:
    operator_with_slack()
    step_waiting()
    args, _ = posted(slack)
    text = blocks_text(args["blocks"])
    assert args["channel"] == CHANNEL
    assert slack.of("chat.postMessage")[0].token == "xoxb-test-token"
    assert "step s1 waits for your approval" in args["text"]
    assert "`shell`" in text and "rm -rf /var/log/old" in text and "risk: risky" in text
    assert "Asked by Ada" in text and "Tidy the log bucket" in text
    [actions] = [b for b in args["blocks"] if b["type"] == "actions"]
    assert [e["text"]["text"] for e in actions["elements"]] == ["Approve", "Decline…", "Open"]
    assert actions["elements"][2]["url"].startswith("http://127.0.0.1:8000/notifications/link/")


def test_a_signed_click_approves_the_step_and_the_message_says_who(slack: SlackStandin) -> None:
    user = operator_with_slack()
    step = step_waiting()
    _, ts = posted(slack)
    response = slack_post(slack_client(), click("approve", channel=CHANNEL, ts=ts, value=slack.value(ts, "approve")), secret=SECRET)
    assert response.status_code == 200
    step.refresh_from_db()
    assert step.status == PlanStep.Status.PENDING and step.approved_by == user  # the runner runs it next cycle
    event = PlanEvent.objects.get(step=step, kind=PlanEvent.Kind.STEP_APPROVED)
    assert event.actor == user and event.detail["via"] == "slack"
    [update] = slack.of("chat.update")
    assert update.args["ts"] == ts and update.args["channel"] == CHANNEL
    text = blocks_text(update.args["blocks"])
    assert "Approved by nadia in Slack at" in text
    assert '"Approve"' not in text  # the buttons are gone: nothing to decide twice


def test_decline_opens_a_modal_and_its_feedback_reaches_the_replan(slack: SlackStandin) -> None:
    operator_with_slack()
    step = step_waiting()
    _, ts = posted(slack)
    client = slack_client()
    assert slack_post(client, click("decline", channel=CHANNEL, ts=ts, value=slack.value(ts, "decline")), secret=SECRET).status_code == 200
    [opened] = slack.of("views.open")
    view = opened.args["view"]
    assert view["callback_id"] == "decline" and opened.args["trigger_id"]
    step.refresh_from_db()
    assert step.status == PlanStep.Status.AWAITING_APPROVAL  # the click alone decides nothing

    empty = slack_post(client, submit(view, "   "), secret=SECRET)
    assert empty.json()["response_action"] == "errors" and "Feedback is required" in empty.json()["errors"]["text"]
    step.refresh_from_db()
    assert step.status == PlanStep.Status.AWAITING_APPROVAL

    answer = slack_post(client, submit(view, "Don't delete, archive them to the cold bucket instead"), secret=SECRET)
    assert answer.json() == {"response_action": "clear"}
    step.refresh_from_db()
    assert step.status == PlanStep.Status.DECLINED
    assert "archive them to the cold bucket" in step.plan.replan_reason
    [update] = slack.of("chat.update")
    assert "Declined by nadia in Slack" in blocks_text(update.args["blocks"])


@pytest.mark.parametrize("how", ["forged", "replayed", "other_secret", "unsigned"])
def test_forged_and_replayed_clicks_are_refused_and_change_nothing(slack: SlackStandin, how: str) -> None:
    operator_with_slack()
    step = step_waiting()
    _, ts = posted(slack)
    payload = click("approve", channel=CHANNEL, ts=ts, value=slack.value(ts, "approve"))
    client = slack_client()
    if how == "forged":
        response = slack_post(client, payload, secret=SECRET, signature="v0=" + "0" * 64)
    elif how == "replayed":  # a genuine signature, six minutes old
        response = slack_post(client, payload, secret=SECRET, timestamp=int(time.time()) - 360)
    elif how == "other_secret":
        response = slack_post(client, payload, secret="not-the-apps-secret")
    else:
        response = client.post("/notifications/slack/interactions/", {"payload": json.dumps(payload)})
    assert response.status_code == 401
    step.refresh_from_db()
    assert step.status == PlanStep.Status.AWAITING_APPROVAL
    assert not PlanEvent.objects.filter(kind=PlanEvent.Kind.STEP_APPROVED).exists()
    assert not slack.of("chat.update") and not slack.of("chat.postEphemeral")


def test_an_unmapped_slack_user_is_refused_and_can_connect_with_a_code(slack: SlackStandin) -> None:
    user = operator_with_slack(slack_user=None)
    step = step_waiting()
    _, ts = posted(slack)
    client = slack_client()
    assert slack_post(client, click("approve", channel=CHANNEL, ts=ts, value=slack.value(ts, "approve"), user="U7"), secret=SECRET).status_code == 200
    step.refresh_from_db()
    assert step.status == PlanStep.Status.AWAITING_APPROVAL
    [reply] = slack.of("chat.postEphemeral")
    assert reply.args["user"] == "U7" and "not connected" in reply.args["text"]
    assert reply.args["text"].endswith("Nothing was changed.")
    [opened] = slack.of("views.open")
    assert opened.args["view"]["callback_id"] == "connect"

    # The operator makes a code in the settings page, and types it in the window Slack opened.
    web = Client()
    web.force_login(user)
    page = web.post("/notifications/slack/connect/", follow=True)
    [note] = [str(m) for m in page.context["messages"]]
    code = note.split("Your code to connect Slack: ")[1].split(".")[0]
    wrong = slack_post(client, submit(opened.args["view"], "AAAAA-BBBBB", user="U7"), secret=SECRET)
    assert wrong.json()["response_action"] == "errors" and not SlackAccount.objects.exists()
    done = slack_post(client, submit(opened.args["view"], code.lower(), user="U7"), secret=SECRET)
    assert done.json() == {"response_action": "clear"}
    assert SlackAccount.objects.get().user == user
    again = slack_post(client, submit(opened.args["view"], code, user="U8"), secret=SECRET)
    assert "unknown, used or expired" in again.json()["errors"]["text"]  # single use
    assert SlackAccount.objects.count() == 1

    slack_post(client, click("approve", channel=CHANNEL, ts=ts, value=slack.value(ts, "approve"), user="U7"), secret=SECRET)
    step.refresh_from_db()
    assert step.status == PlanStep.Status.PENDING and step.approved_by == user


def test_a_viewer_is_refused_in_the_thread_and_nothing_changes(slack: SlackStandin) -> None:
    operator_with_slack()
    UserFactory(username="vic", role="viewers")
    SlackAccount.objects.create(team_id="T1", slack_user_id="U2", user=UserFactory(username="vera", role="viewers"))
    step = step_waiting()
    _, ts = posted(slack)
    client = slack_client()
    slack_post(client, click("approve", channel=CHANNEL, ts=ts, value=slack.value(ts, "approve"), user="U2"), secret=SECRET)
    slack_post(client, click("decline", channel=CHANNEL, ts=ts, value=slack.value(ts, "decline"), user="U2"), secret=SECRET)
    step.refresh_from_db()
    assert step.status == PlanStep.Status.AWAITING_APPROVAL
    replies = slack.of("chat.postEphemeral")
    assert len(replies) == 2 and all("vera may only view" in r.args["text"] for r in replies)
    assert replies[0].args["thread_ts"] == ts
    assert not slack.of("views.open") and not slack.of("chat.update")


def test_web_first_then_slack_the_click_is_told_who_won(slack: SlackStandin,
                                                          django_capture_on_commit_callbacks: Any) -> None:
    operator_with_slack()
    olga = UserFactory(username="olga", role="operators")
    step = step_waiting()
    _, ts = posted(slack)
    web = Client()
    web.force_login(olga)
    with django_capture_on_commit_callbacks(execute=True):
        assert web.post(f"/steps/{step.pk}/approve/").status_code in (200, 302)
    message = SlackMessage.objects.get()
    assert message.refresh_due and message.outcome.startswith("Approved by olga at")
    assert slack_app.messages_refresh() == 1  # the notifier's round: the message decided elsewhere is updated
    [update] = slack.of("chat.update")
    assert "Approved by olga at" in blocks_text(update.args["blocks"])

    slack_post(slack_client(), click("approve", channel=CHANNEL, ts=ts, value=slack.value(ts, "approve")), secret=SECRET)
    [reply] = slack.of("chat.postEphemeral")
    assert reply.args["text"].startswith("Already decided: Approved by olga at")
    assert reply.args["text"].endswith("Nothing was changed.")
    assert PlanEvent.objects.filter(step=step, kind=PlanEvent.Kind.STEP_APPROVED).count() == 1


def test_slack_first_then_the_web_is_refused_and_nothing_is_decided_twice(slack: SlackStandin) -> None:
    operator_with_slack()
    olga = UserFactory(username="olga", role="operators")
    step = step_waiting()
    _, ts = posted(slack)
    slack_post(slack_client(), click("approve", channel=CHANNEL, ts=ts, value=slack.value(ts, "approve")), secret=SECRET)
    web = Client()
    web.force_login(olga)
    response = web.post(f"/steps/{step.pk}/decline/", {"feedback": "no"}, follow=True)
    assert "nadia approved it at" in response.content.decode().lower()
    step.refresh_from_db()
    assert step.status == PlanStep.Status.PENDING
    assert PlanEvent.objects.filter(step=step, kind__in=[PlanEvent.Kind.STEP_APPROVED,
                                                         PlanEvent.Kind.STEP_DECLINED]).count() == 1


def test_a_plan_awaiting_approval_lists_its_steps_and_is_approved_from_slack(slack: SlackStandin) -> None:
    user = operator_with_slack()
    plan = PlanFactory(agent=AgentFactory(kind="tool", name="Bo"), status=Plan.Status.AWAITING_APPROVAL,
                       goal_text="Ship the report")
    PlanStepFactory(plan=plan, key="fetch", tool="http_get", tool_input={"url": "https://example.com/data"})
    PlanStepFactory(plan=plan, key="mail", tool="send_mail", tool_input={"to": "boss@example.com"})
    PlanEventFactory(plan=plan, kind=PlanEvent.Kind.VALIDATED)
    args, ts = posted(slack)
    text = blocks_text(args["blocks"])
    assert "https://example.com/data" in text and "boss@example.com" in text and "`send_mail`" in text
    slack_post(slack_client(), click("approve", channel=CHANNEL, ts=ts, value=slack.value(ts, "approve")), secret=SECRET)
    plan.refresh_from_db()
    assert plan.status == Plan.Status.ACTIVE
    assert set(plan.steps.values_list("approved_by", flat=True)) == {user.pk}
    assert "Approved by nadia in Slack" in blocks_text(slack.of("chat.update")[0].args["blocks"])


def test_a_planners_question_is_answered_from_a_modal(slack: SlackStandin) -> None:
    operator_with_slack()
    plan = PlanFactory(agent=AgentFactory(kind="tool", name="Cy"), status=Plan.Status.CLARIFYING,
                       clarification_question="Which region should the bucket live in?")
    PlanEventFactory(plan=plan, kind=PlanEvent.Kind.CLARIFICATION_ASKED)
    args, ts = posted(slack)
    assert "Which region" in blocks_text(args["blocks"])
    client = slack_client()
    slack_post(client, click("answer", channel=CHANNEL, ts=ts, value=slack.value(ts, "answer")), secret=SECRET)
    [opened] = slack.of("views.open")
    assert slack_post(client, submit(opened.args["view"], "eu-west-1, please"), secret=SECRET).json() == {
        "response_action": "clear"}
    plan.refresh_from_db()
    assert plan.status == Plan.Status.ACTIVE and plan.clarification_answer == "eu-west-1, please"


def test_a_slack_api_failure_is_a_failed_attempt_retried_later(slack: SlackStandin) -> None:
    operator_with_slack()
    step_waiting()
    slack.fail_next = ["channel_not_found"]
    notifications_dispatch()
    assert deliveries_send_due() == 0
    assert not SlackMessage.objects.exists()
    from notifications.models import Delivery

    delivery = Delivery.objects.get()
    assert delivery.status == Delivery.Status.PENDING and "channel_not_found" in delivery.last_error


def test_the_settings_page_adds_a_slack_app_and_never_shows_its_secrets() -> None:
    user = UserFactory(username="nadia", role="operators")
    web = Client()
    web.force_login(user)
    bad = web.post("/notifications/slack/channels/", {"slack-target": "general", "slack-bot_token": "xoxb-1",
                                                      "slack-signing_secret": "s"}, follow=True)
    assert "Enter a Slack channel ID" in bad.content.decode() and not Channel.objects.exists()
    page = web.post("/notifications/slack/channels/", {"slack-target": "c0planner",
                                                       "slack-bot_token": "xoxb-secret-token-123",
                                                       "slack-signing_secret": "sign-me-please"}, follow=True)
    channel = Channel.objects.get()
    assert channel.kind == Channel.Kind.SLACK_APP and channel.target == "C0PLANNER"
    assert channel.bot_token == "xoxb-secret-token-123" and channel.signing_secret == "sign-me-please"
    html = page.content.decode()
    assert "C0PLANNER" in html and "/notifications/slack/interactions/" in html
    assert "xoxb-secret-token-123" not in html and "sign-me-please" not in html


def test_step_services_still_decide_once_when_two_slack_users_click(slack: SlackStandin) -> None:
    operator_with_slack()
    olga = UserFactory(username="olga", role="operators")
    SlackAccount.objects.create(team_id="T1", slack_user_id="U3", user=olga)
    step = step_waiting()
    _, ts = posted(slack)
    client = slack_client()
    slack_post(client, click("approve", channel=CHANNEL, ts=ts, value=slack.value(ts, "approve"), user="U3"), secret=SECRET)
    slack_post(client, click("approve", channel=CHANNEL, ts=ts, value=slack.value(ts, "approve"), user="U1"), secret=SECRET)
    assert PlanEvent.objects.filter(step=step, kind=PlanEvent.Kind.STEP_APPROVED).count() == 1
    [reply] = slack.of("chat.postEphemeral")
    assert reply.args["user"] == "U1" and "Approved by olga in Slack" in reply.args["text"]


@pytest.mark.django_db(transaction=True)  # two requests in two threads: each sees what the other committed
def test_slack_and_web_at_the_same_moment_one_wins_the_other_is_told_who(slack: SlackStandin) -> None:
    operator_with_slack()
    olga = UserFactory(username="olga", role="operators")
    step = step_waiting()
    _, ts = posted(slack)
    web = Client()
    web.force_login(olga)
    answers: dict[str, str] = {}
    started = time.monotonic()

    def from_slack() -> None:
        try:
            slack_post(slack_client(), click("approve", channel=CHANNEL, ts=ts, value=slack.value(ts, "approve")), secret=SECRET)
        finally:
            close_old_connections()

    def from_web() -> None:
        try:
            answers["web"] = web.post(f"/steps/{step.pk}/decline/", {"feedback": "not now"},
                                      HTTP_HX_REQUEST="true").content.decode()
        finally:
            close_old_connections()

    threads = [threading.Thread(target=from_slack), threading.Thread(target=from_web)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert time.monotonic() - started < 3  # Slack waits 3 s for the answer
    decisions = list(PlanEvent.objects.filter(step=step, kind__in=[PlanEvent.Kind.STEP_APPROVED,
                                                                   PlanEvent.Kind.STEP_DECLINED]))
    assert len(decisions) == 1, (answers, slack.calls)
    [winner] = decisions
    if winner.kind == PlanEvent.Kind.STEP_APPROVED:  # Slack won: the web is told who
        assert "nadia approved it at" in answers["web"]
    else:  # the web won: the Slack click is told who, in the thread
        [reply] = slack.of("chat.postEphemeral")
        assert reply.args["text"].startswith("Already decided: Declined by olga at")
    [update] = slack.of("chat.update")  # either way the message says who decided
    assert ("Approved by nadia in Slack" if winner.kind == PlanEvent.Kind.STEP_APPROVED
            else "Declined by olga") in blocks_text(update.args["blocks"])


def test_a_step_edited_after_the_post_is_not_approved_from_the_old_message(slack: SlackStandin) -> None:
    user = operator_with_slack()
    step = step_waiting()
    args, ts = posted(slack)
    [actions] = [b for b in args["blocks"] if b["type"] == "actions"]
    old_value = actions["elements"][0]["value"]
    PlanStep.objects.filter(pk=step.pk).update(tool_input={"command": "rm -rf /"})  # edited meanwhile
    payload = click("approve", channel=CHANNEL, ts=ts, value=slack.value(ts, "approve"))
    payload["actions"][0]["value"] = old_value
    slack_post(slack_client(), payload, secret=SECRET)
    step.refresh_from_db()
    assert step.status == PlanStep.Status.AWAITING_APPROVAL
    [reply] = slack.of("chat.postEphemeral")
    assert reply.args["text"].startswith("It changed since this message was posted")
    assert reply.args["text"].endswith("Nothing was changed.")
    [update] = slack.of("chat.update")  # redrawn as it is now, buttons and all
    assert '"rm -rf /"' in blocks_text(update.args["blocks"]).replace("\\", "")
    [new_actions] = [b for b in update.args["blocks"] if b["type"] == "actions"]
    payload["actions"][0]["value"] = new_actions["elements"][0]["value"]
    slack_post(slack_client(), payload, secret=SECRET)  # a click on what it shows now decides
    step.refresh_from_db()
    assert step.status == PlanStep.Status.PENDING and step.approved_by == user


def test_a_plan_approved_in_slack_then_approved_on_the_web_is_refused_with_who(slack: SlackStandin) -> None:
    operator_with_slack()
    olga = UserFactory(username="olga", role="operators")
    plan = PlanFactory(agent=AgentFactory(kind="tool", name="Bo"), status=Plan.Status.AWAITING_APPROVAL)
    PlanStepFactory(plan=plan, key="fetch", tool="http_get", tool_input={"url": "https://example.com/data"})
    PlanEventFactory(plan=plan, kind=PlanEvent.Kind.VALIDATED)
    _, ts = posted(slack)
    slack_post(slack_client(), click("approve", channel=CHANNEL, ts=ts, value=slack.value(ts, "approve")),
               secret=SECRET)
    web = Client()
    web.force_login(olga)
    answer = web.post(f"/plans/{plan.pk}/approve/", {"mode": "all"}, HTTP_HX_REQUEST="true").content.decode()
    assert "no longer awaiting approval (it is active): nadia approved it at" in answer
    assert PlanEvent.objects.filter(plan=plan, kind=PlanEvent.Kind.PLAN_APPROVED).count() == 1
