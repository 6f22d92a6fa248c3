"""Planning figures: a plan never outlives its deadline, a replan does not repeat the restatement call,
one long-winded model cannot fill the call log. Each beside its baseline from the same run."""

from __future__ import annotations

import time
from typing import Any

from tests.bench.common import figure

DEADLINE_SECONDS = 2.0


def tool_agent(name: str) -> Any:
    from agents.models import Agent

    agent = Agent.objects.create(name=name, kind=Agent.Kind.TOOL, cycle_interval=0)
    agent.workspace.mkdir(parents=True, exist_ok=True)
    (agent.workspace / "data.csv").write_text("a,b\n1,2\n")
    return agent


def deadline_held() -> dict[str, Any]:
    """A planner that would answer after 30 s, each call allowed 60 s: the plan ends at its deadline."""
    from django.conf import settings

    from planning.planner import plan_generate
    from tests.llm_server import LLMTestServer, answer

    with LLMTestServer() as server:
        saved = (settings.OPENAI_BASE_URL, settings.OPENAI_API_KEY, settings.LLM_TIMEOUT_SECONDS,
                 settings.LLM_MODELS, settings.PLAN_DEADLINE_SECONDS)
        settings.OPENAI_BASE_URL, settings.OPENAI_API_KEY = server.base_url, "bench"
        settings.LLM_TIMEOUT_SECONDS, settings.PLAN_DEADLINE_SECONDS = 60, DEADLINE_SECONDS
        settings.LLM_MODELS = {"planner": ["slow-a", "slow-b"], "fast": ["fast"]}
        server.script("fast", answer('<json>{"who": "a", "what": "b", "when": "c", "where": "d", "why": "e"}</json>'))
        server.script("slow-a", answer("late", delay=30))
        server.script("slow-b", answer("late", delay=30))
        try:
            started = time.perf_counter()
            plan = plan_generate(agent=tool_agent("bench-deadline"), goal_text="List the workspace")
            elapsed = time.perf_counter() - started
        finally:
            (settings.OPENAI_BASE_URL, settings.OPENAI_API_KEY, settings.LLM_TIMEOUT_SECONDS,
             settings.LLM_MODELS, settings.PLAN_DEADLINE_SECONDS) = saved
    held = plan.failure_reason.startswith(f"no model answered within {DEADLINE_SECONDS:g} s")
    return figure("plan_deadline_held", elapsed, "s", baseline=DEADLINE_SECONDS, baseline_name="PLAN_DEADLINE_SECONDS",
                  goal="<= 1.1x the deadline, failed with 'no model answered within N s'",
                  passed=held and elapsed <= DEADLINE_SECONDS * 1.1,
                  note="two models that would each answer after 30 s, 60 s allowed per call")


def replan_calls() -> dict[str, Any]:
    """LLM calls of a replan against those of the first plan (offline model: calls, not latency)."""
    from agents.models import LLMCall
    from planning.planner import plan_generate

    agent = tool_agent("bench-replan")
    first = plan_generate(agent=agent, goal_text="Convert data.csv to JSON")
    second = plan_generate(agent=agent, goal_text=first.goal_text, previous=first, reason="bench: replan")
    plan_calls = LLMCall.objects.filter(plan=first).count()
    replan_calls = LLMCall.objects.filter(plan=second).count()
    return figure("replan_model_calls", replan_calls, "calls", baseline=plan_calls, baseline_name="first plan's calls",
                  goal="a replan reuses the restatement: one call fewer than a first plan",
                  passed=replan_calls == plan_calls - 1)


def stored_answer() -> dict[str, Any]:
    """Bytes kept of a 1 MB answer, against the answer itself."""
    from agents.llm.gateway import response_stored

    text = "x" * 1_000_000
    kept = len(response_stored(text).encode())
    return figure("llm_answer_stored_bytes", kept, "bytes", baseline=len(text), baseline_name="a 1 MB answer",
                  goal="<= 64 KB kept per answer", passed=kept <= 64 * 1024 + 100)


def figures() -> list[dict[str, Any]]:
    return [deadline_held(), replan_calls(), stored_answer()]
