"""`make bench`: the figures that matter to an operator, each printed with the floor it compares to.

Runs on a throwaway SQLite database (or DATABASE_URL if set). Orders of magnitude only: this is a
noisy shared machine. Floors come from ../shared/STACK.md's measured baselines or from the product's
own promises (a live page must update well within a second).
"""

from __future__ import annotations

import asyncio
import os
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


def bench_cycles(n: int) -> None:
    from agents.models import Agent
    from agents.runner import Runner

    Agent.objects.update(next_cycle_at=None)
    runner = Runner(runner_id="bench", cycles=3, tick=0.01)
    started = time.perf_counter()
    asyncio.run(runner.run())
    elapsed = time.perf_counter() - started
    report(f"runner: persona cycles, {n} agents x 3", sum(runner.done.values()) / elapsed, "cycles/s",
           "20/s (1 agent every 2 s x 40 agents)")


def figures() -> list[dict]:
    FIGURES.clear()
    n = int(os.environ.get("BENCH_AGENTS", "200"))
    seed(n)
    print(f"  {n} agents on {django.db.connection.vendor}")
    bench_parse_validate()  # the dashboard and push figures are in tests/bench/live.py, beside baselines
    seed_small = 40
    from agents.models import Agent

    Agent.objects.exclude(pk__in=list(Agent.objects.values_list("pk", flat=True)[:seed_small])).update(status="paused")
    bench_cycles(seed_small)
    return FIGURES
