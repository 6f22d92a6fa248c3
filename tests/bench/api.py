"""The external agents' API: what the HTTP layer adds to a step, and how soon a long poll hears a decision.

- step start + result over /api/v1 (auth, rate limit, idempotency record, JSON) against the same two
  transitions through the services directly: the API's overhead per step.
- a long poll woken by the push of an operator's approval against the same poll with no channel layer,
  re-reading the database every second: what the push saves an agent waiting for an operator.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import statistics
import time
from collections.abc import AsyncIterator
from typing import Any

from tests.bench.common import figure

STEPS = 20  # PLAN_MAX_STEPS
POLLS = 5


def setup(name: str, steps: int) -> tuple[Any, str, Any, Any]:
    from django.contrib.auth.models import User

    from agents.models import Agent, AgentToken
    from planning import services
    from planning.models import Plan
    from planning.services import reported

    tools = [{"name": "search", "input_schema": {"type": "object", "properties": {"q": {"type": "string"}}}}]
    agent = Agent.objects.create(name=name, kind=Agent.Kind.EXTERNAL, declared_tools=tools)
    raw = AgentToken.issue(agent=agent)[1]
    plan = reported.plan_submit(agent=agent, data={"goal": name, "steps": [
        {"id": str(n), "tool": "search", "intent": f"look up {n}", "input": {"q": str(n)}, "requiresPermission": False}
        for n in range(1, steps + 1)]})
    user = User.objects.get_or_create(username=f"bench-operator-{name}")[0]
    services.plan_approve(plan=plan, user=user, mode=Plan.ApprovalMode.ALL)
    return agent, raw, plan, user


def per_step_ms(run: Any, steps: list[Any]) -> float:
    started = time.perf_counter()
    for step in steps:
        run(step)
    return (time.perf_counter() - started) * 1000 / len(steps)


def bench_steps() -> list[dict[str, Any]]:
    from django.core.cache import cache
    from django.test import Client, override_settings

    from planning.services import reported

    agent, raw, plan, _ = setup("bench api steps", STEPS)
    client = Client(headers={"Authorization": f"Bearer {raw}"})

    def over_http(step: Any) -> None:
        for path, body in ((f"/api/v1/steps/{step.pk}/start", {"request_id": f"s{step.pk}"}),
                           (f"/api/v1/steps/{step.pk}/result", {"request_id": f"r{step.pk}", "succeeded": True})):
            assert client.post(path, json.dumps(body), content_type="application/json").status_code == 200

    cache.clear()
    with override_settings(API_RATE_LIMIT="100000/m"):
        api_ms = per_step_ms(over_http, list(plan.steps.all()))
    base_agent, _, base_plan, _ = setup("bench service steps", STEPS)

    def direct(step: Any) -> None:
        reported.step_start(agent=base_agent, step_id=step.pk, request_id=f"s{step.pk}")
        reported.step_result(agent=base_agent, step_id=step.pk, request_id=f"r{step.pk}", succeeded=True)

    service_ms = per_step_ms(direct, list(base_plan.steps.all()))
    return [figure("API: step start + result over HTTP", api_ms, "ms/step", baseline=service_ms,
                   baseline_name="the same through the services", goal="HTTP adds well under the work itself (ratio < 3)",
                   passed=api_ms < 3 * service_ms)]


@contextlib.asynccontextmanager
async def no_pushes(**_: Any) -> AsyncIterator[None]:
    """A watch that never hears a change: the poll re-reads on its own."""
    yield None


async def wake_ms(*, pushed: bool) -> float:
    from asgiref.sync import sync_to_async

    from planning import api as api_module
    from planning import services
    from planning.models import Plan

    times = []
    for n in range(POLLS):
        agent, _, plan, user = await sync_to_async(setup)(f"bench wake {pushed} {n}", 1)
        await sync_to_async(Plan.objects.filter(pk=plan.pk).update)(status=Plan.Status.AWAITING_APPROVAL)
        watched = api_module.changes_watched
        api_module.POLL_SECONDS = 1.0
        if not pushed:
            api_module.changes_watched = no_pushes  # type: ignore[assignment]
        try:
            poll = asyncio.create_task(api_module.plan_next_wait(agent=agent, plan_id=plan.pk, wait=10))
            await asyncio.sleep(0.2)
            fresh = await Plan.objects.aget(pk=plan.pk)
            started = time.perf_counter()
            await sync_to_async(services.plan_approve, thread_sensitive=False)(plan=fresh, user=user, mode="all")
            answer = await poll
            times.append((time.perf_counter() - started) * 1000)
            assert answer["action"] == "run", answer
        finally:
            api_module.changes_watched = watched
    return statistics.median(times)


def figures() -> list[dict[str, Any]]:
    results = bench_steps()
    pushed = asyncio.run(wake_ms(pushed=True))
    polled = asyncio.run(wake_ms(pushed=False))
    results.append(figure("API: long poll hears an approval", pushed, "ms", baseline=polled,
                          baseline_name="re-reading every second without pushes",
                          goal="well under a second, far below polling", passed=pushed < 500 and pushed < polled))
    return results
