"""An operator's decision taking effect, and what agents waiting for one cost.

decision_to_step: a plan approved → its first step done, through the stack's own runtime in this process (the
embedded scheduler, or a worker of the job engine on PostgreSQL), tool agents at the default 2 s interval. The
time is read from the plan's events: "Plan approved" to "Step completed" (a `file.list` step). The baseline is
the same approvals as before `operator_acted` existed (agents/signals.py): the decision not sent to the runtime,
and the waiting agents cycling at their interval (RUNNER_WAITING_SECONDS=0), measured in the same run: the step
then waits for the agent's next cycle.

waiting_100_cpu (scale-out stack): the CPU a second of two `runagents` processes and PostgreSQL while 100 tool
agents at the default 2 s interval wait for approval, beside the same runners with no agent at all (the floor).
The note adds the same fleet with RUNNER_WAITING_SECONDS=0 (each agent cycling at its interval while it waits,
as before)."""

from __future__ import annotations

import os
import random
import statistics
import threading
import time
from contextlib import nullcontext
from typing import Any
from unittest import mock

from tests.bench.common import figure
from tests.bench.notify import runtime_thread

AGENTS = 12  # approvals a phase, a fresh agent each
WAITING_AGENTS = 100
WAITING_SETTLE_SECONDS = 6.0  # the runners start and every agent has had its first cycle
WAITING_SECONDS = 15.0
SETTLE_SECONDS = 3.0  # the agents' chains are under way, each cycling on its own beat
GOAL_SECONDS = 0.5


def agents_waiting(prefix: str, n: int = AGENTS) -> list[Any]:
    """`n` running tool agents at the default interval, each with a plan of one step awaiting approval."""
    from agents.models import Agent
    from planning.models import Plan, PlanStep

    plans = []
    for i in range(n):
        agent = Agent.objects.create(name=f"{prefix}-{i}", kind=Agent.Kind.TOOL, status=Agent.Status.RUNNING,
                                     waiting_reason="plan v1 awaits approval")
        plan = Plan.objects.create(agent=agent, goal_text="List the workspace", status=Plan.Status.AWAITING_APPROVAL)
        PlanStep.objects.create(plan=plan, key="1", position=1, description="List the files", tool="file.list",
                                tool_input={"path": "."})
        plans.append(plan)
    return plans


def approvals(plans: list[Any], user: Any, *, sent: bool) -> list[float]:
    """Approve each plan at a random moment of its agent's beat; the seconds from each approval to its step done."""
    from planning import services as planning
    from planning.models import Plan, PlanEvent

    quiet = nullcontext() if sent else mock.patch("planning.services.events.operator_acted_on_commit")
    rng = random.Random(7)
    with quiet:
        for plan in plans:
            time.sleep(rng.uniform(0.0, 0.4))
            planning.plan_approve(plan=plan, user=user, mode=Plan.ApprovalMode.ALL)
    events = PlanEvent.objects.filter(plan__in=plans)
    deadline = time.monotonic() + 60
    while events.filter(kind=PlanEvent.Kind.STEP_COMPLETED).count() < len(plans):
        if time.monotonic() > deadline:
            raise RuntimeError("approved steps did not run within 60 s")
        time.sleep(0.05)
    at = {(e.plan_id, e.kind): e.created_at for e in events.filter(
        kind__in=[PlanEvent.Kind.PLAN_APPROVED, PlanEvent.Kind.STEP_COMPLETED])}
    return [(at[(p.pk, PlanEvent.Kind.STEP_COMPLETED)] - at[(p.pk, PlanEvent.Kind.PLAN_APPROVED)]).total_seconds()
            for p in plans]


def fleet_cpu(agents: int, **env: str) -> float:
    """Runner + PostgreSQL CPU milliseconds a second over WAITING_SECONDS, with `agents` tool agents waiting for
    approval, two `runagents` processes started afresh with `env`."""
    from agents.models import Agent
    from tests.bench.runner import runner_processes
    from tests.bench.scale import cpu_seconds, postgres_cpu_seconds

    class NoModel:  # these agents call no model
        base_url = "http://127.0.0.1:9/v1"

    Agent.objects.all().delete()
    if agents:
        agents_waiting("bench-waiting", agents)
    saved = dict(os.environ)
    os.environ.update(env)
    try:
        with runner_processes(NoModel()) as runners:
            time.sleep(WAITING_SETTLE_SECONDS)
            cpu, pg, started = sum(cpu_seconds(r.pid) for r in runners), postgres_cpu_seconds(), time.monotonic()
            time.sleep(WAITING_SECONDS)
            cpu = sum(cpu_seconds(r.pid) for r in runners) - cpu + postgres_cpu_seconds() - pg
            return 1000 * cpu / (time.monotonic() - started)
    finally:
        os.environ.clear()
        os.environ.update(saved)
        Agent.objects.all().delete()


def waiting_figures() -> list[dict[str, Any]]:
    from django.conf import settings

    if not settings.SCALE_OUT:
        print("  decision: waiting_100_cpu SKIPPED, it runs `runagents` processes on the scale-out stack", flush=True)
        return []
    idle = fleet_cpu(0)
    waiting = fleet_cpu(WAITING_AGENTS)
    cycling = fleet_cpu(WAITING_AGENTS, RUNNER_WAITING_SECONDS="0")
    return [figure(
        "waiting_100_cpu", waiting, "ms/s", baseline=idle, baseline_name="the same two runners with no agent",
        goal="<= 2x the runners with no agent", passed=waiting <= 2 * idle,
        note=f"runners + PostgreSQL, {WAITING_SECONDS:.0f} s; the same {WAITING_AGENTS} agents cycling every 2 s while "
             f"they wait (RUNNER_WAITING_SECONDS=0, as before): {cycling:.0f} ms/s")]


def figures() -> list[dict[str, Any]]:
    from django.contrib.auth.models import User
    from django.test import override_settings

    user = User.objects.create_user("bench-decision")
    before, after = agents_waiting("bench-unsent"), agents_waiting("bench-sent")
    stop = threading.Event()
    thread = runtime_thread(stop)
    try:
        # As before `operator_acted` existed: a waiting agent cycled at its interval, and a decision waited for it.
        with override_settings(RUNNER_WAITING_SECONDS=0):
            time.sleep(SETTLE_SECONDS)
            unsent = approvals(before, user, sent=False)
        sent = approvals(after, user, sent=True)
    finally:
        stop.set()
        thread.join(timeout=60)
    p50, base = statistics.median(sent), statistics.median(unsent)
    p90 = statistics.quantiles(sent, n=10)[-1]
    note = (f"{AGENTS} approvals a phase, tool agents at the default 2 s interval; sent, ms: "
            + ", ".join(f"{x * 1000:.0f}" for x in sorted(sent)) + "; not sent, ms: "
            + ", ".join(f"{x * 1000:.0f}" for x in sorted(unsent)))
    return [*waiting_figures(),
        figure("decision_to_step_p50", p50, "s", baseline=base, goal=f"< {GOAL_SECONDS} s",
               baseline_name="the same approvals not sent, the agents cycling at their interval (as before)",
               passed=p50 < GOAL_SECONDS, note=note),
        figure("decision_to_step_p90", p90, "s", baseline=statistics.quantiles(unsent, n=10)[-1],
               goal=f"< {GOAL_SECONDS} s", baseline_name="the same, not sent", passed=p90 < GOAL_SECONDS),
    ]
