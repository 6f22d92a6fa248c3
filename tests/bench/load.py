"""Pages under load: `/healthz` and the dashboard's p95 while agents long-poll, plans execute and operators
decide, beside the same figures on the idle server (the ratio is what carries over between machines).

The server is the real one (`manage.py serve --no-runner`, PostgreSQL + Redis when reachable, as in
tests/bench/live.py), with `--workers LOAD_WORKERS` (2: one per core of this machine) on PostgreSQL + Redis. The load comes from a generator in its own process (`python -m tests.bench.load gen`):
LOAD_POLLERS external agents long-polling plans that wait for an operator, LOAD_EXECUTORS agents starting and
finishing steps of plans that run at once (each step's tool taking LOAD_STEP_SECONDS), and LOAD_OPERATORS
operators reloading the dashboard. This process
only probes: one request at a time, so the figure is what one more user would see.
"""

from __future__ import annotations

import asyncio
import json
import os
import statistics
import subprocess
import sys
import time
from typing import Any

from tests.bench.common import figure
from tests.bench.live import PG_URL, REDIS_URL, ROOT, Stack, p95, reachable, stack

POLLERS = int(os.environ.get("LOAD_POLLERS", "200"))
EXECUTORS = int(os.environ.get("LOAD_EXECUTORS", "20"))
OPERATORS = int(os.environ.get("LOAD_OPERATORS", "2"))
STEP_SECONDS = float(os.environ.get("LOAD_STEP_SECONDS", "1.0"))  # an agent's tool runs between start and result
PROBES = int(os.environ.get("LOAD_PROBES", "60"))
WORKERS = int(os.environ.get("LOAD_WORKERS", "2"))  # `serve --workers` on the scale-out stack (one per core)
WARMUP_SECONDS = 5.0
GOAL_MS = 300.0

AGENTS = r"""
import json
from agents.models import Agent, AgentToken
from planning.services import reported
tools = [{"name": "search", "input_schema": {"type": "object", "properties": {"q": {"type": "string"}}}}]
def make(name, policy, steps):
    agent = Agent.objects.create(name=name, kind=Agent.Kind.EXTERNAL, declared_tools=tools, approval_policy=policy)
    raw = AgentToken.issue(agent=agent)[1]
    plan = reported.plan_submit(agent=agent, data={"goal": name, "steps": [
        {"id": str(n), "tool": "search", "intent": f"look up {n}", "input": {"q": str(n)}, "requiresPermission": False}
        for n in range(1, steps + 1)]})
    return {"token": raw, "plan": plan.pk}
pollers = [make(f"Poller {i:03d}", "plan", 1) for i in range(POLLERS)]
executors = [make(f"Executor {i:02d}", "permission", 20) for i in range(EXECUTORS)]
print(json.dumps({"pollers": pollers, "executors": executors}))
"""


# --- the load generator (its own process) ------------------------------------------------------------------------


async def poller(http: Any, agent: dict[str, Any]) -> None:
    headers = {"Authorization": f"Bearer {agent['token']}"}
    while True:
        await http.get(f"/api/v1/plans/{agent['plan']}/next", params={"wait": 20}, headers=headers, timeout=60)


async def executor(http: Any, agent: dict[str, Any]) -> None:
    headers = {"Authorization": f"Bearer {agent['token']}"}
    plan, n = agent["plan"], 0
    while True:
        answer = (await http.get(f"/api/v1/plans/{plan}/next", params={"wait": 5}, headers=headers, timeout=60)).json()
        if answer.get("action") != "run":
            body = {"goal": f"again {n}", "steps": [{"id": "1", "tool": "search", "intent": "look up", "input": {"q": "x"},
                                                     "requiresPermission": False}]}
            created = await http.post("/api/v1/plans", json=body, headers=headers, timeout=60)
            plan = created.json().get("id", plan)
            continue
        step = answer["step"]["id"]
        n += 1
        await http.post(f"/api/v1/steps/{step}/start", json={"request_id": f"s{step}"}, headers=headers, timeout=60)
        await asyncio.sleep(STEP_SECONDS)
        await http.post(f"/api/v1/steps/{step}/result", json={"request_id": f"r{step}", "succeeded": True,
                                                             "output": "found"}, headers=headers, timeout=60)


async def operator(http: Any, session: str) -> None:
    while True:
        await http.get("/", cookies={"sessionid": session}, timeout=60)
        await asyncio.sleep(0.5)  # a person reads before reloading


async def generate(url: str, data: dict[str, Any]) -> None:
    import httpx

    limits = httpx.Limits(max_connections=POLLERS + EXECUTORS + OPERATORS + 10)
    async with httpx.AsyncClient(base_url=url, limits=limits) as http:
        tasks = [poller(http, a) for a in data["pollers"]] + [executor(http, a) for a in data["executors"]]
        tasks += [operator(http, data["session"]) for _ in range(OPERATORS)]
        results = await asyncio.gather(*tasks, return_exceptions=True)
        print(results[:3], file=sys.stderr)


# --- the probe (this process) ------------------------------------------------------------------------------------


def probe_ms(url: str, path: str, session: str) -> list[float]:
    import httpx

    times = []
    with httpx.Client(base_url=url, cookies={"sessionid": session}, timeout=60) as http:
        for _ in range(PROBES):
            started = time.perf_counter()
            response = http.get(path)
            times.append((time.perf_counter() - started) * 1000)
            assert response.status_code == 200, (path, response.status_code)
            time.sleep(0.05)
    return times


def load_figures(st: Stack) -> list[dict[str, Any]]:
    url = f"http://127.0.0.1:{st.port}"
    session = st.data["session"]
    agents = json.loads(st.manage("shell", "-c", AGENTS.replace("POLLERS", str(POLLERS))
                                  .replace("EXECUTORS", str(EXECUTORS))).strip().splitlines()[-1])
    idle = {path: probe_ms(url, path, session) for path in ("/healthz", "/")}
    generator = st.spawn([sys.executable, "-m", "tests.bench.load", "gen", url],
                         stdin=subprocess.PIPE, text=True)
    assert generator.stdin is not None
    generator.stdin.write(json.dumps(agents | {"session": session}) + "\n")
    generator.stdin.flush()
    try:
        time.sleep(WARMUP_SECONDS)
        loaded = {path: probe_ms(url, path, session) for path in ("/healthz", "/")}
        machine_load = os.getloadavg()[0]  # the machine is shared: how busy it was while the probes ran
    finally:
        generator.terminate()
    what = (f"{POLLERS} long polls, {EXECUTORS} plans executing, {OPERATORS} operators ({st.stack_name}, "
            f"serve {' '.join(st.serve_args) or 'in one process'}); load average {machine_load:.1f} on "
            f"{os.cpu_count()} cores")
    results = []
    for path, name in (("/healthz", "health check under load p95"), ("/", "dashboard under load p95")):
        value, base = p95(loaded[path]), p95(idle[path])
        results.append(figure(name, value, "ms", baseline=base, baseline_name="the same page on the idle server",
                              goal=f"< {GOAL_MS:.0f} ms", passed=value < GOAL_MS,
                              note=f"{what}; median {statistics.median(loaded[path]):.0f} ms"))
    return results


def figures() -> list[dict[str, Any]]:
    scaleout = reachable(PG_URL) and reachable(REDIS_URL)  # as Stack decides; SQLite serves in one process
    with stack(("--workers", str(WORKERS)) if scaleout else ()) as st:
        return load_figures(st)


if __name__ == "__main__" and sys.argv[1:2] == ["gen"]:
    sys.path.insert(0, str(ROOT))
    asyncio.run(generate(sys.argv[2], json.loads(sys.stdin.readline())))
