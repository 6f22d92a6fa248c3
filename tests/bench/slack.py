"""Deciding from Slack: a signed click on Approve posted to the interactivity endpoint (verified, decided through
the planning services, the message updated through a local stand-in of Slack's Web API) until its answer, p50 and
p95, beside the same decision made with the web page's button; and the endpoint's answer time with 200 items
waiting. Slack waits 3 s for an answer: the goal.

slack_click_to_next_step_p50, _p95: a signed click on Approve of a running tool agent's step that waits for an
operator -> that step started ("Step started" in its plan's events), through the stack's own runtime in this process
(a worker of the job engine on PostgreSQL + Redis, the embedded scheduler on SQLite, as tests/bench/decision.py
runs it): the decision wakes the agent (agents/signals.py operator_acted), whose next cycle starts the step. Beside
it the web page's Approve button, same agents, same runtime. Goal < 0.5 s (decision_to_step's)."""

from __future__ import annotations

import hashlib
import hmac
import json
import random
import statistics
import threading
import time
from typing import Any
from urllib.parse import urlencode

from django.test import Client, override_settings

from tests.bench.common import figure

SAMPLES = 20
WAITING = 200
GOAL_SECONDS = 3.0
SECRET = "bench-signing-secret"
NEXT_STEP_AGENTS = 12  # clicks (and web approvals) of the next-step figure, a fresh agent each
NEXT_STEP_GOAL_SECONDS = 0.5
SETTLE_SECONDS = 3.0  # the runtime has claimed the agents' chains: each one cycling on its own beat


def p95(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(0.95 * (len(ordered) - 1))))]


def steps_of_running_agents(channel: Any, prefix: str, start: int) -> list[Any]:
    """NEXT_STEP_AGENTS running tool agents at the default interval, each with an active plan whose first step
    (`file.list`) waits for an operator's approval and has its Slack message."""
    from agents.models import Agent
    from notifications.models import SlackMessage
    from planning.models import Plan, PlanStep

    steps = []
    for i in range(NEXT_STEP_AGENTS):
        agent = Agent.objects.create(name=f"{prefix}-{i}", kind=Agent.Kind.TOOL, status=Agent.Status.RUNNING,
                                     waiting_reason="step 1 awaits approval")
        plan = Plan.objects.create(agent=agent, goal_text="List the workspace", status=Plan.Status.ACTIVE,
                                   approval_mode=Plan.ApprovalMode.STEP)
        step = PlanStep.objects.create(plan=plan, key="1", position=1, description="List the files", tool="file.list",
                                       tool_input={"path": "."}, status=PlanStep.Status.AWAITING_APPROVAL)
        PlanStep.objects.create(plan=plan, key="2", position=2, description="List them again", tool="file.list",
                                tool_input={"path": "."})
        SlackMessage.objects.create(channel=channel, plan=plan, step=step, kind="step", slack_channel="C0BENCH",
                                    ts=f"1765090000.{start + i:06d}")
        steps.append(step)
    return steps


def started_after(steps: list[Any], clicked: dict[int, float]) -> list[float]:
    """Seconds from each step's click (wall clock) to its "Step started" event, waiting up to 60 s for all."""
    from planning.models import PlanEvent

    events = PlanEvent.objects.filter(step__in=steps, kind=PlanEvent.Kind.STEP_STARTED)
    deadline = time.monotonic() + 60
    while events.count() < len(steps):
        if time.monotonic() > deadline:
            raise RuntimeError(f"only {events.count()} of {len(steps)} approved steps started within 60 s")
        time.sleep(0.02)
    return [e.created_at.timestamp() - clicked[e.step_id] for e in events]


def next_step_figures(channel: Any, user: Any) -> list[dict[str, Any]]:
    """Click (or web Approve) -> the agent's step started, through the runtime's own cycle."""
    from tests.bench.notify import runtime_thread

    slack_steps = steps_of_running_agents(channel, "bench-slack-next", 5000)
    web_steps = steps_of_running_agents(channel, "bench-web-next", 6000)
    slack_client, web = Client(), Client()
    web.force_login(user)
    rng = random.Random(7)
    clicked: dict[int, float] = {}
    stop = threading.Event()
    thread = runtime_thread(stop)
    try:
        time.sleep(SETTLE_SECONDS)
        for n, step in enumerate(slack_steps):  # at a random moment of the agent's beat, as an operator would
            time.sleep(rng.uniform(0.0, 0.4))
            clicked[step.pk] = time.time()
            click(slack_client, f"1765090000.{5000 + n:06d}")
        slack = started_after(slack_steps, clicked)
        for step in web_steps:
            time.sleep(rng.uniform(0.0, 0.4))
            clicked[step.pk] = time.time()
            if web.post(f"/steps/{step.pk}/approve/").status_code not in (200, 302):
                raise RuntimeError("the web approval was refused")
        webs = started_after(web_steps, clicked)
    finally:
        stop.set()
        thread.join(timeout=60)
    from django.conf import settings

    runtime = "a worker of the job engine (PostgreSQL + Redis)" if settings.SCALE_OUT else "the embedded scheduler"
    note = (f"{NEXT_STEP_AGENTS} running tool agents a side at the default 2 s interval, each step approved at a random "
            f"moment of its agent's beat, through {runtime} in this process; ms, Slack: "
            + ", ".join(f"{x * 1000:.0f}" for x in sorted(slack)) + "; web: "
            + ", ".join(f"{x * 1000:.0f}" for x in sorted(webs)))
    return [
        figure("slack_click_to_next_step_p50", statistics.median(slack), "s", baseline=statistics.median(webs),
               baseline_name="the web page's Approve -> the step started", goal=f"< {NEXT_STEP_GOAL_SECONDS} s",
               passed=statistics.median(slack) < NEXT_STEP_GOAL_SECONDS, note=note),
        figure("slack_click_to_next_step_p95", p95(slack), "s", baseline=p95(webs),
               baseline_name="the web page's Approve, p95", goal=f"< {NEXT_STEP_GOAL_SECONDS} s",
               passed=p95(slack) < NEXT_STEP_GOAL_SECONDS),
    ]


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
            next_step = next_step_figures(channel, user)
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
        *next_step,
    ]
