"""Deciding from Slack: a signed click on Approve posted to the interactivity endpoint (verified, decided through
the planning services, the message updated through a local stand-in of Slack's Web API) until its answer, p50 and
p95, beside the same decision made with the web page's button; and the endpoint's answer time with 200 items
waiting. Slack waits 3 s for an answer: the goal."""

from __future__ import annotations

import hashlib
import hmac
import json
import statistics
import time
from typing import Any
from urllib.parse import urlencode

from django.test import Client, override_settings

from tests.bench.common import figure

SAMPLES = 20
WAITING = 200
GOAL_SECONDS = 3.0
SECRET = "bench-signing-secret"


def p95(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(0.95 * (len(ordered) - 1))))]


def waiting_steps(agent: Any, channel: Any, count: int, start: int) -> list[Any]:
    from notifications.models import SlackMessage
    from planning.models import Plan, PlanStep

    steps = []
    for n in range(start, start + count):
        plan = Plan.objects.create(agent=agent, goal_text=f"Bench {n}", status=Plan.Status.ACTIVE,
                                   approval_mode=Plan.ApprovalMode.STEP)
        step = PlanStep.objects.create(plan=plan, key="1", position=1, description="Wait", tool="shell",
                                       tool_input={"command": f"echo {n}"}, status=PlanStep.Status.AWAITING_APPROVAL)
        SlackMessage.objects.create(channel=channel, plan=plan, step=step, kind="step", slack_channel="C0BENCH",
                                    ts=f"1765090000.{n:06d}")
        steps.append(step)
    return steps


def click(client: Client, ts: str) -> float:
    from notifications.deciding import item_fingerprint
    from notifications.models import SlackMessage

    message = SlackMessage.objects.select_related("plan", "step").get(slack_channel="C0BENCH", ts=ts)
    value = f"step:{message.step_id}:{item_fingerprint(message.plan, message.step)}"  # the button's, as posted
    payload = {"type": "block_actions", "user": {"id": "U1"}, "team": {"id": "T1"}, "trigger_id": "t",
               "container": {"type": "message", "channel_id": "C0BENCH", "message_ts": ts},
               "actions": [{"action_id": "approve", "value": value}]}
    body = urlencode({"payload": json.dumps(payload)})
    stamp = str(int(time.time()))
    signature = "v0=" + hmac.new(SECRET.encode(), f"v0:{stamp}:{body}".encode(), hashlib.sha256).hexdigest()
    started = time.monotonic()
    response = client.post("/notifications/slack/interactions/", data=body,
                           content_type="application/x-www-form-urlencoded",
                           HTTP_X_SLACK_SIGNATURE=signature, HTTP_X_SLACK_REQUEST_TIMESTAMP=stamp)
    took = time.monotonic() - started
    if response.status_code != 200:
        raise RuntimeError(f"the click was refused: {response.status_code}")
    return took


def figures() -> list[dict[str, Any]]:
    from django.contrib.auth.models import Group, User

    from agents.models import Agent
    from notifications.models import Channel, SlackAccount
    from planning.models import PlanStep
    from tests.notifications.slack_standin import standin_start

    standin, server = standin_start()
    try:
        with override_settings(SLACK_API_BASE_URL=standin.base_url):
            user = User.objects.create_user("bench-slack")
            user.groups.add(Group.objects.get(name="operators"))
            channel = Channel.objects.create(user=user, kind=Channel.Kind.SLACK_APP, target="C0BENCH",
                                             bot_token="xoxb-bench", signing_secret=SECRET)
            SlackAccount.objects.create(team_id="T1", slack_user_id="U1", user=user)
            agent = Agent.objects.create(name="bench-slack", kind=Agent.Kind.TOOL, status=Agent.Status.PAUSED)
            slack_client, web = Client(), Client()
            web.force_login(user)

            steps = waiting_steps(agent, channel, SAMPLES + 1, 0)
            click(slack_client, "1765090000.000000")  # warm: the first request pays for imports
            clicks = [click(slack_client, f"1765090000.{n:06d}") for n in range(1, SAMPLES + 1)]
            web_steps = waiting_steps(agent, channel, SAMPLES, 1000)
            webs = []
            for step in web_steps:
                started = time.monotonic()
                web.post(f"/steps/{step.pk}/approve/")
                webs.append(time.monotonic() - started)
            approved = PlanStep.objects.filter(pk__in=[s.pk for s in steps + web_steps],
                                               status=PlanStep.Status.PENDING).count()
            if approved != len(steps) + len(web_steps):
                raise RuntimeError(f"only {approved} of {len(steps) + len(web_steps)} steps were approved")

            waiting_steps(agent, channel, WAITING, 2000)
            loaded = [click(slack_client, f"1765090000.{n:06d}") for n in range(2000, 2000 + SAMPLES)]
    finally:
        server.shutdown()
        server.server_close()
    web_p50 = statistics.median(webs)
    note = (f"{SAMPLES} clicks one after another, each verified, decided and its message updated (chat.update to a "
            "local stand-in of Slack's Web API); baseline: the web page's Approve button, same steps")
    return [
        figure("slack_click_answer_p50", statistics.median(clicks), "s", baseline=web_p50,
               baseline_name="the web page's Approve", goal=f"< {GOAL_SECONDS:.0f} s (Slack's wait)",
               passed=statistics.median(clicks) < GOAL_SECONDS, note=note),
        figure("slack_click_answer_p95", p95(clicks), "s", baseline=p95(webs),
               baseline_name="the web page's Approve, p95", goal=f"< {GOAL_SECONDS:.0f} s",
               passed=p95(clicks) < GOAL_SECONDS),
        figure("slack_click_answer_200_waiting_p95", p95(loaded), "s", baseline=p95(clicks),
               baseline_name="the same with 20 waiting", goal=f"< {GOAL_SECONDS:.0f} s",
               passed=p95(loaded) < GOAL_SECONDS,
               note=f"{WAITING} steps waiting, each with its Slack message; {SAMPLES} of them approved by clicks"),
    ]
