"""An operator's decision taking effect: a plan approved → its first step done, through the stack's own runtime in
this process (the embedded scheduler, or a worker of the job engine on PostgreSQL), tool agents at the default
2 s interval. The time is read from the plan's events: "Plan approved" to "Step completed" (a `file.list` step).

The baseline is the same approvals with the decision not sent to the runtime (`operator_acted`,
agents/signals.py: as before it existed), measured in the same run: the step then waits for the agent's next
cycle, on average half its interval."""

from __future__ import annotations

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
SETTLE_SECONDS = 3.0  # the agents' chains are under way, each cycling on its own beat
GOAL_SECONDS = 0.5


def agents_waiting(prefix: str) -> list[Any]:
    """AGENTS running tool agents at the default interval, each with a plan of one step awaiting approval."""
    from agents.models import Agent
    from planning.models import Plan, PlanStep

    plans = []
    for i in range(AGENTS):
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


def figures() -> list[dict[str, Any]]:
    from django.contrib.auth.models import User

    user = User.objects.create_user("bench-decision")
    before, after = agents_waiting("bench-unsent"), agents_waiting("bench-sent")
    stop = threading.Event()
    thread = runtime_thread(stop)
    time.sleep(SETTLE_SECONDS)
    try:
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
    return [
        figure("decision_to_step_p50", p50, "s", baseline=base, goal=f"< {GOAL_SECONDS} s",
               baseline_name="the same approvals not sent to the runtime (the agent's next cycle)",
               passed=p50 < GOAL_SECONDS, note=note),
        figure("decision_to_step_p90", p90, "s", baseline=statistics.quantiles(unsent, n=10)[-1],
               goal=f"< {GOAL_SECONDS} s", baseline_name="the same, not sent", passed=p90 < GOAL_SECONDS),
    ]
