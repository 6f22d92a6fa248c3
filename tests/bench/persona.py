"""Persona agents following their plans (issue 6): model calls per cycle, share of plan-following actions,
and what one cycle costs, from a run of the demo personas with the offline model.

An operator approves every step that waits for one (as a watching operator would), so plans that spend
money go on. Calls and plan-following are counted over the second half of the run (steady state), all
purposes together. A cycle's time is compared with a one-row UPDATE transaction measured in the same run.
"""

from __future__ import annotations

import os
import statistics
import time

from tests.bench.common import figure

CYCLES = int(os.environ.get("BENCH_PERSONA_CYCLES", "800"))
MAX_CALLS_PER_CYCLE = 0.2
MIN_FOLLOWING = 0.7
MAX_CYCLE_RATIO = 5.0
MAX_QUERIES = 8
QUERY_SAMPLE_EVERY = 7  # coprime with the goal re-evaluation interval (5), so the sample is not biased
TRANSACTION_CONTROL = ("BEGIN", "SAVEPOINT", "RELEASE", "COMMIT", "ROLLBACK")


def update_baseline_ms(agent_id: int, rounds: int = 200) -> float:
    from django.db import transaction
    from django.db.models import F

    from agents.models import Agent

    times = []
    for _ in range(rounds):
        started = time.perf_counter()
        with transaction.atomic():
            Agent.objects.filter(pk=agent_id).update(cycle_interval=F("cycle_interval"))
        times.append((time.perf_counter() - started) * 1000)
    return statistics.median(times)


def figures() -> list[dict]:
    from django.contrib.auth.models import User
    from django.core.management import call_command
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from agents.cycle import agent_cycle
    from agents.models import Agent, Experience, LLMCall
    from planning import services
    from planning.models import PlanStep

    with open(os.devnull, "w") as quiet:
        call_command("seed_demo", no_users=True, interval=0, stdout=quiet)
    operator = User.objects.create_superuser("bench-operator", "", "x")
    personas = list(Agent.objects.filter(kind=Agent.Kind.PERSONA).order_by("name"))
    steady = CYCLES // 2
    times: list[float] = []
    queries: list[int] = []
    calls_at_steady = 0
    for n in range(1, CYCLES + 1):
        if n == steady + 1:
            calls_at_steady = LLMCall.objects.filter(agent__in=personas).count()
        for agent in personas:
            if n > steady and n % QUERY_SAMPLE_EVERY == 0:  # counted, not timed: capturing costs time itself
                with CaptureQueriesContext(connection) as captured:
                    agent_cycle(agent_id=agent.pk, runner="bench")
                queries.append(sum(1 for q in captured.captured_queries
                                   if not q["sql"].lstrip().upper().startswith(TRANSACTION_CONTROL)))
            else:
                started = time.perf_counter()
                agent_cycle(agent_id=agent.pk, runner="bench")
                if n > steady:
                    times.append((time.perf_counter() - started) * 1000)
            for step in PlanStep.objects.filter(plan__agent=agent, status=PlanStep.Status.AWAITING_APPROVAL):
                services.step_approve(step=step, user=operator)
    cycles = steady * len(personas)
    calls = LLMCall.objects.filter(agent__in=personas).count() - calls_at_steady
    late = Experience.objects.filter(agent__in=personas, cycle__gt=steady)
    following = late.filter(followed_plan=True).count() / max(late.count(), 1)
    baseline = update_baseline_ms(personas[0].pk)
    cycle_ms = statistics.median(times)
    median_queries = statistics.median(queries)
    note = f"{len(personas)} demo personas x {CYCLES} cycles, second half counted"
    return [
        figure("persona_model_calls_per_cycle", calls / cycles, "calls", baseline=None,
               goal=f"<= {MAX_CALLS_PER_CYCLE}", passed=calls / cycles <= MAX_CALLS_PER_CYCLE, note=note),
        figure("persona_plan_following", following * 100, "%", baseline=None, goal=f">= {MIN_FOLLOWING:.0%}",
               passed=following >= MIN_FOLLOWING, note=note),
        figure("persona_cycle", cycle_ms, "ms", baseline=baseline, baseline_name="one-row UPDATE transaction",
               goal=f"<= {MAX_CYCLE_RATIO:g}x baseline", passed=cycle_ms <= MAX_CYCLE_RATIO * baseline,
               note=f"median; p90 {statistics.quantiles(times, n=10)[-1]:.1f} ms"),
        figure("persona_cycle_queries", median_queries, "queries", baseline=None, goal=f"<= {MAX_QUERIES}",
               passed=median_queries <= MAX_QUERIES, note=f"median, transaction control not counted; max {max(queries)}"),
    ]
