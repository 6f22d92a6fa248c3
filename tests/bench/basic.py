"""`make bench`: the figures that matter to an operator, each printed with the floor it compares to.

Runs on a throwaway SQLite database (or DATABASE_URL if set). Orders of magnitude only: this is a
noisy shared machine. Floors come from ../shared/STACK.md's measured baselines or from the product's
own promises (a live page must update well within a second).
"""

from __future__ import annotations

import asyncio
import os
import statistics
import time
from pathlib import Path

import django

from tests.bench.common import figure

FIGURES: list[dict] = []


def report(name: str, value: float, unit: str, floor: str) -> None:
    """The figures of the first release, against fixed floors (no same-run baseline yet)."""
    FIGURES.append(figure(name, value, unit, baseline=None, goal=floor, passed=True, note="floor, not a ratio"))


def seed(n_agents: int) -> None:
    from agents.models import Agent, Need
    from goals.models import Goal
    from planning.models import Plan, PlanStep

    for i in range(n_agents):
        agent = Agent.objects.create(name=f"bench-{i}", kind=Agent.Kind.PERSONA, cycle_interval=0)
        Need.objects.bulk_create([Need(agent=agent, name=n, satisfaction=0.6) for n in ("hunger", "energy", "money")])
        goal = Goal.objects.create(agent=agent, description=f"goal {i}", source_needs=["hunger"])
        plan = Plan.objects.create(agent=agent, goal=goal, goal_text=goal.description, status=Plan.Status.ACTIVE)
        PlanStep.objects.bulk_create([
            PlanStep(plan=plan, key=str(k), position=k, description=f"step {k}", action_hint="work",
                     status="completed" if k == 1 else "pending") for k in range(1, 5)
        ])


def bench_dashboard(n: int) -> None:
    from django.db import connection
    from django.template.loader import render_to_string
    from django.test.utils import CaptureQueriesContext

    from planning.selectors import dashboard_counts, dashboard_rows

    times = []
    for _ in range(5):
        started = time.perf_counter()
        with CaptureQueriesContext(connection) as queries:
            rows = dashboard_rows()
            render_to_string("planning/dashboard_live.html", {"rows": rows, "counts": dashboard_counts(), "full": True})
        times.append((time.perf_counter() - started) * 1000)
    report(f"dashboard, {n} agents: render", statistics.median(times), "ms", "1,000 rows in 140 ms (STACK.md)")
    report(f"dashboard, {n} agents: queries", len(queries), "queries", "constant (no N+1): 5")


def bench_parse_validate() -> None:
    import json

    from planning.engine.parse import PlanParseError, plan_parse
    from planning.engine.validate import plan_validate

    cases = json.loads((Path(__file__).parents[1] / "planning" / "corpus" / "cases.json").read_text())
    cases = cases["cases"] if isinstance(cases, dict) else cases
    started = time.perf_counter()
    rounds = 20
    for _ in range(rounds):
        for case in cases:
            try:
                parsed = plan_parse(case["output"])
            except PlanParseError:
                continue
            plan_validate(parsed.data, kind=case.get("kind", "tool"))
    per_second = rounds * len(cases) / (time.perf_counter() - started)
    report("planner: parse + validate model outputs", per_second, "outputs/s", "100/s (a model answers ~1/s)")


def bench_push() -> None:
    from channels.db import database_sync_to_async
    from channels.testing import WebsocketCommunicator
    from django.contrib.auth.models import User

    from planning import services
    from planning.consumers import PlanConsumer
    from planning.models import PlanStep

    async def run() -> list[float]:
        user = await database_sync_to_async(lambda: User.objects.create_superuser("bench", "", "x"))()
        step = await PlanStep.objects.select_related("plan").filter(status="pending").afirst()
        assert step is not None
        comm = WebsocketCommunicator(PlanConsumer.as_asgi(), f"/ws/plans/{step.plan_id}/")
        comm.scope["user"] = user
        comm.scope["url_route"] = {"kwargs": {"plan_id": step.plan_id}}
        await comm.connect()
        await comm.receive_from(timeout=10)
        latencies = []
        for i in range(20):
            started = time.perf_counter()
            await database_sync_to_async(services.event_record)(plan=step.plan, kind="step_edited", actor_label="bench",
                                                                  reason=f"ping {i}")
            await comm.receive_from(timeout=10)
            latencies.append((time.perf_counter() - started) * 1000)
        await comm.disconnect()
        return latencies

    latencies = asyncio.run(run())
    report("live push: change -> rendered page update, p50", statistics.median(latencies), "ms",
           "under 250 ms (incl. 50 ms coalescing); STACK.md: 3-9 ms transport")


def figures() -> list[dict]:
    FIGURES.clear()
    n = int(os.environ.get("BENCH_AGENTS", "200"))
    seed(n)
    print(f"  {n} agents on {django.db.connection.vendor}")
    bench_dashboard(n)
    bench_parse_validate()
    bench_push()
    return FIGURES  # the runner's figures: tests/bench/runner.py
