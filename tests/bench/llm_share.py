"""A model server shared fairly (issue 52): with the demo's personas running, an operator's goal is planned within 2x
the time it takes with the personas paused.

The demo (seed_demo) runs under the embedded runner (runtime/embedded.py Scheduler, as `manage.py serve` runs
it). The Reporter (rules planner off: its plan is the model's) is given its goal once a persona's call is under way,
and the time from then to its plan awaiting approval is measured; the baseline is the same with the personas paused,
in the same run. Two servers:

- always: the slow one-at-a-time stand-in (tests/llm_server.py, `slots=1`), whose persona answers take
  PERSONA_SECONDS and the plan's answer PLAN_SECONDS, streamed as llama-cpp-python streams;
- with OPENAI_BASE_URL set (and LLM_MODEL, e.g. SmolLM2-135M-Instruct served by llama-cpp-python): that server, the
  same way (minutes on a busy CPU; BENCH_SHARE_RUNS runs each, default 1). Skipped, and said so, without it.
"""

from __future__ import annotations

import asyncio
import json
import os
import statistics
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from tests.bench.common import figure

MAX_RATIO = 2.0
PERSONA_SECONDS = 3.0  # a persona's answer on the stand-in (a goals list from a small model on a busy CPU)
PLAN_SECONDS = 0.6  # the Reporter's plan on the stand-in
STANDIN_RUNS = 3
WARM_SECONDS = 15.0  # on a real server, the personas run this long before the operator's goal
GOAL = "Write a report from the notes"


def plan_answer() -> str:
    """The Reporter's plan as a model would write it: one report of the demo's notes."""
    step = {"id": "1", "tool": "report.write", "intent": "Write the report of the notes",
            "input": {"paths": ["notes/monday.txt", "notes/tuesday.txt"], "output": "report.md"},
            "requiresPermission": True}
    return json.dumps({"goal": GOAL, "thinking_summary": "One report of both notes.", "steps": [step]})


def demo_seed(*, personas: bool) -> int:
    """A fresh demo: only the Reporter (its goal not given yet, its rules planner off) and, when `personas`, the
    personas run. The Reporter's id."""
    from django.core.management import call_command

    from agents.models import Agent
    from goals.models import Goal
    from planning.models import Plan

    Agent.objects.all().delete()
    with open(os.devnull, "w") as quiet:
        call_command("seed_demo", no_users=True, interval=1, stdout=quiet)
    reporter = Agent.objects.get(name="Reporter")
    Plan.objects.filter(agent=reporter).delete()
    Goal.objects.filter(agent=reporter).delete()
    Agent.objects.filter(kind=Agent.Kind.TOOL).update(status=Agent.Status.PAUSED)
    Agent.objects.filter(pk=reporter.pk).update(rules_planner=False)
    if not personas:
        Agent.objects.filter(kind=Agent.Kind.PERSONA).update(status=Agent.Status.PAUSED)
    return reporter.pk


def goal_give(reporter_id: int) -> None:
    """What an operator does: the Reporter gets its goal and runs."""
    from django.utils import timezone

    from agents.models import Agent
    from goals.models import Goal

    agent = Agent.objects.get(pk=reporter_id)
    Goal.objects.create(agent=agent, description=GOAL, source_needs=[])
    Agent.objects.filter(pk=reporter_id).update(status=Agent.Status.RUNNING, next_cycle_at=timezone.now())


def planned(reporter_id: int) -> str | None:
    """The Reporter's first plan's status once planning ended (None while it is planned)."""
    from planning.models import Plan

    plan = Plan.objects.filter(agent_id=reporter_id).order_by("pk").first()
    if plan is None or plan.status == Plan.Status.VALIDATING:
        return None
    return str(plan.status)


def timed_plan(*, personas: bool, persona_busy: Callable[[], bool], limit: float, warm: float = 0.0
               ) -> tuple[float, str]:
    """Seconds from the goal given (once a persona's call is under way, when personas run: `persona_busy`, after
    `warm` seconds) to its plan leaving planning, and the plan's status; run by the embedded runner."""
    from asgiref.sync import sync_to_async

    from runtime.embedded import Scheduler

    reporter_id = demo_seed(personas=personas)

    async def run() -> tuple[float, str]:
        scheduler = Scheduler(runner_id="bench-share", tick=0.05, prune_seconds=0)
        running = asyncio.ensure_future(scheduler.run())
        try:
            if personas:
                await asyncio.sleep(warm)
                waited = time.monotonic()
                while not persona_busy() and time.monotonic() - waited < limit:
                    await asyncio.sleep(0.05)
                await asyncio.sleep(0.2)
            await sync_to_async(goal_give)(reporter_id)
            started = time.monotonic()
            while time.monotonic() - started < limit:
                status = await sync_to_async(planned)(reporter_id)
                if status is not None:
                    return time.monotonic() - started, status
                await asyncio.sleep(0.05)
            return time.monotonic() - started, "still planning"
        finally:
            scheduler.stop()
            await running

    return asyncio.run(run())


@contextmanager
def model_settings(**values: Any) -> Iterator[None]:
    from django.test.utils import override_settings

    with override_settings(**values):
        yield


def standin_figures() -> list[dict[str, Any]]:
    from tests.llm_server import LLMTestServer, Reply, answer

    class StandIn(LLMTestServer):
        """llama-cpp-python as it answers (a 500 for json_schema, one request at a time): the Reporter's plan when the
        prompt is its goal's, a persona's answer else."""

        def take(self, model: str, body: dict[str, Any], headers: dict[str, str]) -> Reply:
            refused = super().take(model, body, headers)  # recorded; the json_schema refusal, else "nothing scripted"
            if refused.status == 500:
                return refused
            prompt = json.dumps(body.get("messages", []))
            if GOAL in prompt:
                return answer(plan_answer(), delay=PLAN_SECONDS)
            return answer('{"goals": []}', delay=PERSONA_SECONDS)

    ratios: list[float] = []
    busy_times: list[float] = []
    idle_times: list[float] = []
    statuses: set[str] = set()
    for _ in range(STANDIN_RUNS):
        with StandIn(slots=1, refuse_json_schema=True) as server, model_settings(
                OPENAI_BASE_URL=server.base_url, OPENAI_API_KEY="none", LLM_MODEL_SETTINGS={},
                LLM_MODELS={"planner": ["SmolLM2-135M-Instruct"], "fast": ["SmolLM2-135M-Instruct"]},
                LLM_PURPOSE_MODELS={}, LLM_LOCAL_CONCURRENCY=1, LLM_TIMEOUT_SECONDS=60, LLM_MAX_RETRIES=0):
            from agents.llm.structured import formats_forget

            formats_forget()
            idle, idle_status = timed_plan(personas=False, persona_busy=lambda: True, limit=60)
            formats_forget()

            def persona_busy() -> bool:
                return any(GOAL not in json.dumps(r.messages) for r in server.requests[-3:])

            busy, busy_status = timed_plan(personas=True, persona_busy=persona_busy, limit=60)
        idle_times.append(idle)
        busy_times.append(busy)
        statuses |= {idle_status, busy_status}
        ratios.append(busy / idle)
    ratio = statistics.median(ratios)
    value = statistics.median(busy_times)
    baseline = statistics.median(idle_times)
    return [figure(
        "operator plan, personas running", value, "s", baseline=baseline, baseline_name="personas paused",
        goal=f"<= {MAX_RATIO:g}x the time with the personas paused", passed=ratio <= MAX_RATIO
        and statuses == {"awaiting_approval"},
        note=(f"stand-in one-slot server: persona answers {PERSONA_SECONDS:g} s, the plan's {PLAN_SECONDS:g} s; "
              f"median of {STANDIN_RUNS} runs, ratios {', '.join(f'{r:.2f}' for r in ratios)}; "
              f"plans ended {', '.join(sorted(statuses))}"))]


def real_figures() -> list[dict[str, Any]]:
    base_url = os.environ.get("OPENAI_BASE_URL", "")
    if not base_url:
        print("  llm_share: no OPENAI_BASE_URL: the real-server figure is skipped", flush=True)
        return []
    model = os.environ.get("LLM_MODEL", "SmolLM2-135M-Instruct")
    runs = int(os.environ.get("BENCH_SHARE_RUNS", "1"))
    limit = float(os.environ.get("BENCH_SHARE_LIMIT", "600"))
    busy_times: list[float] = []
    idle_times: list[float] = []
    statuses: list[str] = []
    with model_settings(OPENAI_BASE_URL=base_url, LLM_MODELS={"planner": [model], "fast": [model]},
                        LLM_PURPOSE_MODELS={}, PLAN_DEADLINE_SECONDS=limit):
        for _ in range(runs):
            idle, idle_status = timed_plan(personas=False, persona_busy=lambda: True, limit=limit)
            # The personas' calls cannot be seen under way on a real server: they get WARM_SECONDS to start them.
            busy, busy_status = timed_plan(personas=True, persona_busy=lambda: True, warm=WARM_SECONDS, limit=limit)
            idle_times.append(idle)
            busy_times.append(busy)
            statuses += [idle_status, busy_status]
    ratio = statistics.median(b / i for b, i in zip(busy_times, idle_times, strict=True))
    return [figure(
        "operator plan, personas running (real)", statistics.median(busy_times), "s",
        baseline=statistics.median(idle_times), baseline_name="personas paused",
        goal=f"<= {MAX_RATIO:g}x the time with the personas paused",
        passed=ratio <= MAX_RATIO and set(statuses) == {"awaiting_approval"},
        note=f"{model} at {base_url}; {runs} run(s) each; plans ended {', '.join(statuses)}")]


def figures() -> list[dict[str, Any]]:
    return standin_figures() + real_figures()
