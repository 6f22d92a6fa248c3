"""Notification latency: a step starts waiting for a person → the signed webhook arrives at a local receiver,
through the stack's own runtime in this process (the embedded scheduler, or a worker of the job engine on
PostgreSQL), one step at a time. The issue's goal: an operator away from the screen learns within 5 s. The
baseline is one delivery sent directly (no dispatcher, no runtime), measured in the same run."""

from __future__ import annotations

import asyncio
import statistics
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from django.conf import settings

from tests.bench.common import figure

SAMPLES = 10
GOAL_SECONDS = 5.0


class Receiver:
    def __init__(self) -> None:
        self.arrivals: list[float] = []
        self.cond = threading.Condition()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                self.rfile.read(int(self.headers.get("Content-Length", "0")))
                self.send_response(200)
                self.end_headers()
                with outer.cond:
                    outer.arrivals.append(time.monotonic())
                    outer.cond.notify_all()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def wait(self, count: int, deadline: float = 30.0) -> float:
        end = time.monotonic() + deadline
        with self.cond:
            while len(self.arrivals) < count and time.monotonic() < end:
                self.cond.wait(timeout=max(0.0, end - time.monotonic()))
            if len(self.arrivals) < count:
                raise RuntimeError("no delivery within the deadline")
            return self.arrivals[count - 1]


def step_waits(agent: Any, n: int) -> float:
    from planning.models import Plan, PlanEvent, PlanStep

    plan = Plan.objects.create(agent=agent, goal_text=f"Bench {n}", status=Plan.Status.ACTIVE,
                               approval_mode=Plan.ApprovalMode.STEP)
    step = PlanStep.objects.create(plan=plan, key="1", position=1, description="Wait",
                                   status=PlanStep.Status.AWAITING_APPROVAL)
    PlanEvent.objects.create(plan=plan, step=step, kind=PlanEvent.Kind.STEP_AWAITING, actor_label="bench")
    return time.monotonic()


def runtime_thread(stop: threading.Event) -> threading.Thread:
    async def run() -> None:
        stopped = asyncio.Event()
        if settings.SCALE_OUT:
            from runtime.worker import worker_run

            task = asyncio.create_task(worker_run(runner_id="bench-notify", stop=stopped))
        else:
            from runtime.embedded import Scheduler

            scheduler = Scheduler(runner_id="bench-notify", prune_seconds=0)
            task = asyncio.create_task(scheduler.run())
            stopped_wait = asyncio.create_task(stopped.wait())
            stopped_wait.add_done_callback(lambda _t: scheduler.stop())
        while not stop.is_set():
            await asyncio.sleep(0.05)
        stopped.set()
        await task

    thread = threading.Thread(target=lambda: asyncio.run(run()), daemon=True)
    thread.start()
    return thread


def figures() -> list[dict[str, Any]]:
    from django.contrib.auth.models import User

    from agents.models import Agent
    from notifications.models import Channel, Subscription, Trigger
    from notifications.services import delivery_attempt, notifications_dispatch

    receiver = Receiver()
    settings.OUTBOUND_ALLOWED_NETWORKS = ["127.0.0.0/8"]  # the local receiver, allowed as a deployer would
    user = User.objects.create_user("bench-notify")
    Channel.objects.create(user=user, kind=Channel.Kind.WEBHOOK, target=receiver.url, secret="bench")
    Subscription.objects.create(user=user, kinds=[Trigger.WAITING])
    agent = Agent.objects.create(name="bench-notify", kind=Agent.Kind.TOOL, status=Agent.Status.PAUSED)

    # Baseline: one delivery made and sent directly, no runtime (the second: the first pays for the HTTP client).
    for n in (-1, 0):
        step_waits(agent, n)
        [delivery_id] = notifications_dispatch()
        started = time.monotonic()
        delivery_attempt(delivery_id=delivery_id)
        baseline = time.monotonic() - started
    receiver.wait(2)

    stop = threading.Event()
    thread = runtime_thread(stop)
    time.sleep(2.0)  # the runtime starts
    latencies = []
    try:
        for n in range(1, SAMPLES + 1):
            committed = step_waits(agent, n)
            latencies.append(receiver.wait(n + 2) - committed)
    finally:
        stop.set()
        thread.join(timeout=60)
    p50, worst = statistics.median(latencies), max(latencies)
    note = f"{SAMPLES} steps one after another; all: " + ", ".join(f"{x * 1000:.0f}" for x in latencies) + " ms"
    return [
        figure("notify_webhook_p50", p50, "s", baseline=baseline, baseline_name="one delivery sent directly",
               goal=f"< {GOAL_SECONDS:.0f} s", passed=p50 < GOAL_SECONDS, note=note),
        figure("notify_webhook_max", worst, "s", baseline=baseline, baseline_name="one delivery sent directly",
               goal=f"< {GOAL_SECONDS:.0f} s", passed=worst < GOAL_SECONDS),
    ]
