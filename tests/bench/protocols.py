"""Agents of every protocol connected at scale (issue 57), on PostgreSQL + Redis and `serve --workers 2`.

connected_N_*: N external agents wait at once for an operator, a mix of long polls (`GET /api/v1/plans/<id>/next
?wait=20`, asked again when it answers `wait`), API websockets (`/ws/api/plans/<id>/`) and MCP tasks (the official
`mcp` client on 2026-07-28 with the tasks extension: `wait_for_decision` answers with a task; the agent listens for
its `notifications/tasks` (`subscriptions/listen` with its task id), following `tasks/get` at the task's
`pollIntervalMs` only if the stream is refused, ends or is cut, each agent's HTTP connections held open), from a load generator in its own process
(`python -m tests.bench.protocols gen`). With all N connected, this process measures:

- the decision: an operator approves one waiting plan at a time (`plan_approve`, the web's service, in a helper
  process, one for the whole run as a web server's process serves many decisions: `python -m tests.bench.protocols
  decide`; its cold first decisions are the warm fleet's, not counted), from the call -> its agent has the answer
  `run` (the generator's clock; one machine, one clock). Long polls and websockets together, MCP tasks apart (told
  by notification, or by their poll if it comes first: the generator says which).
- the dashboard's p90, one request at a time (as tests/bench/load.py probes);
- memory per connected agent: (the RSS of the `serve` processes with N connected - the same just before) / N.

Each beside the same measure with 20 agents (PROTO_AGENTS_SMALL), in the same run and the same database (holding
both fleets). A first small fleet warms the server (first imports and caches) and is not counted.

a2a_input_required_to_inbox_p95: remote A2A agents (an a2a-sdk server agent on loopback, in this process) each given
a goal; each works a random 0.5-2.5 s, then enters `input-required` with a question; the time from that moment (the
agent's clock) to the question in the inbox (the plan's "Clarification asked" event), through the stack's own
runtime in this process (a worker of the job engine). The agents' card offers streaming, as a2a-sdk agents' usually
does: the runtime subscribes to the task (SubscribeToTask). a2a_polled_input_required_to_inbox_p95: the same with a
card that offers neither streaming nor push, the task read every A2A_FOLLOW_SECONDS while it is worked on. Baseline of
both: a card without streaming, the task read at the agent's 2 s interval (A2A_FOLLOW_SECONDS=0).

SKIPPED without PostgreSQL and Redis on 127.0.0.1 (the scale-out stack; `serve --workers 2` needs it).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
import resource
import ssl
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any

from tests.bench.common import figure
from tests.bench.live import PG_URL, REDIS_URL, ROOT, Stack, reachable, stack
from tests.bench.load import probe_ms

AGENTS = int(os.environ.get("PROTO_AGENTS", "2000"))
AGENTS_SMALL = int(os.environ.get("PROTO_AGENTS_SMALL", "20"))
MIX = {"long_poll": 0.45, "websocket": 0.45, "mcp_task": 0.10}  # shares of each fleet
DECISIONS = int(os.environ.get("PROTO_DECISIONS", "20"))  # decisions a transport in each fleet (at most its size)
WORKERS = int(os.environ.get("LOAD_WORKERS", "2"))
A2A_AGENTS = int(os.environ.get("PROTO_A2A_AGENTS", "20"))
DECISION_GOAL_MS = 100.0
DASHBOARD_GOAL_MS = 300.0
MEMORY_GOAL_KB = 200.0
A2A_GOAL_SECONDS = 1.0
CONNECT_TIMEOUT_SECONDS = 300.0
CONNECT_GAP_SECONDS = 0.01  # 100 agents connecting a second
# The fleet over this many generator processes: one event loop for 2,000 agents lags behind what it measures.
GEN_PROCESSES = int(os.environ.get("PROTO_GEN_PROCESSES", "4"))
# The generators stand in for agents on other machines: on this one they yield the CPU to the server they load
# (its database and Redis included). A generator that falls behind shows in its printed loop lag, and an answer it
# sees late counts against the server.
GEN_NICE = int(os.environ.get("PROTO_GEN_NICE", "10"))
TASKS = "io.modelcontextprotocol/tasks"

AGENTS_SETUP = r"""
import json
from agents.models import Agent, AgentToken
from planning.services import reported
tools = [{"name": "search", "input_schema": {"type": "object", "properties": {"q": {"type": "string"}}}}]
out = []
for i in range(COUNT):
    agent = Agent.objects.create(name=f"PREFIX {i:04d}", kind=Agent.Kind.EXTERNAL, declared_tools=tools,
                                 approval_policy="plan")
    raw = AgentToken.issue(agent=agent)[1]
    plan = reported.plan_submit(agent=agent, data={"goal": f"Look up {i}", "steps": [
        {"id": "1", "tool": "search", "intent": "look it up", "input": {"q": str(i)}, "requiresPermission": False}]})
    out.append({"token": raw, "plan": plan.pk})
print(json.dumps(out))
"""


def p90(values: list[float]) -> float:
    return statistics.quantiles(values, n=10)[-1] if len(values) >= 2 else (values[0] if values else float("nan"))


def p95(values: list[float]) -> float:
    return statistics.quantiles(values, n=20)[-1] if len(values) >= 2 else (values[0] if values else float("nan"))


def fleet(st: Stack, prefix: str, count: int) -> list[dict[str, Any]]:
    """`count` external agents, each with a plan awaiting approval, their transports dealt by MIX."""
    script = AGENTS_SETUP.replace("COUNT", str(count)).replace("PREFIX", prefix)
    agents: list[dict[str, Any]] = json.loads(st.manage("shell", "-c", script).strip().splitlines()[-1])
    kinds = [kind for kind, share in MIX.items() for _ in range(round(share * count))]
    kinds += ["long_poll"] * (count - len(kinds))
    for agent, kind in zip(agents, kinds, strict=False):
        agent["kind"] = kind
    return agents


# --- memory of the serve processes ---------------------------------------------------------------------------------


def descendants(pid: int) -> list[int]:
    out, todo = [], [pid]
    while todo:
        current = todo.pop()
        out.append(current)
        with contextlib.suppress(OSError):
            for task in Path(f"/proc/{current}/task").iterdir():
                todo += [int(c) for c in (task / "children").read_text().split()]
    return out


def rss_kb(pid: int) -> int:
    with contextlib.suppress(OSError):
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def serve_rss_kb(st: Stack) -> int:
    """The RSS of the `serve` process and its workers, in KB."""
    return sum(rss_kb(pid) for pid in descendants(st.processes[0].pid))


# --- the load generator (its own process) ----------------------------------------------------------------------------


def seen(plan: int, via: str = "") -> None:
    print(f"seen {plan} {time.time():.6f} {via}".rstrip(), flush=True)


RETRY_SECONDS = 1.0  # an agent refused or cut off tries again after this, as a client with a retry would


async def retried(connect: Any, agent: dict[str, Any], connected: asyncio.Event) -> None:
    """An agent's connection, made again after an error (a refusal while the fleet connects, a cut)."""
    while True:
        try:
            await connect(agent, connected)
            return
        except Exception as exc:  # an agent retries whatever went wrong; counted for the note
            ERRORS.append(type(exc).__name__)
            await asyncio.sleep(RETRY_SECONDS)


ERRORS: list[str] = []


async def long_poll(url: str, tls: Any, agent: dict[str, Any], connected: asyncio.Event) -> None:
    """An agent with its own HTTP client (one connection), as each real agent has. One client shared by the whole
    fleet is not a fleet: its pool looks through all of its connections for each request and each response
    (httpcore), which at 2,000 connections kept the generator's loop busy for seconds at a time."""
    import httpx

    headers = {"Authorization": f"Bearer {agent['token']}"}
    async with httpx.AsyncClient(base_url=url, verify=tls, limits=httpx.Limits(max_connections=1)) as http:
        while True:
            request = http.get(f"/api/v1/plans/{agent['plan']}/next", params={"wait": 20}, headers=headers,
                               timeout=60)
            connected.set()
            response = await request
            response.raise_for_status()
            if response.json().get("action") != "wait":
                seen(agent["plan"])
                return


async def websocket(url: str, agent: dict[str, Any], connected: asyncio.Event) -> None:
    from websockets.asyncio.client import connect

    ws_url = url.replace("http://", "ws://") + f"/ws/api/plans/{agent['plan']}/"
    async with connect(ws_url, additional_headers={"Authorization": f"Bearer {agent['token']}"}, open_timeout=120,
                       ping_interval=None) as ws:
        async for message in ws:
            if json.loads(message).get("action") != "wait":
                seen(agent["plan"])
                return
            connected.set()
    raise ConnectionError(f"the socket closed: {ws.close_code}")


async def mcp_task(url: str, agent: dict[str, Any], connected: asyncio.Event) -> None:
    """A 2026-07-28 MCP client with the tasks extension (docs/mcp-tasks.md): `wait_for_decision` answers with a
    task; the agent listens for its notifications (`subscriptions/listen` with the task's id: connected once the
    server acknowledged it) and follows `tasks/get` at the task's pollIntervalMs only when the server did not agree to
    notify it, or once the stream ends or is cut (the spec: a client that listens need not poll). `seen` at the first state that is not "working", from either (`notice` or `poll`).
    Its HTTP client holds the connections open (the listen's stream, the polls)."""
    import httpx2
    from mcp import ClientSession
    from mcp.client.extension import NotificationBinding, ResultClaim
    from mcp.client.streamable_http import streamable_http_client
    from mcp_types import (
        GetTaskRequest,
        GetTaskRequestParams,
        SubscriptionFilter,
        SubscriptionsAcknowledgedNotification,
        SubscriptionsListenRequest,
        SubscriptionsListenRequestParams,
        SubscriptionsListenResult,
    )

    from tests.mcp.test_task_notifications import TaskNotice
    from tests.mcp.test_tasks import TaskHandle, TaskState, follow

    acknowledged, noticed = asyncio.Event(), asyncio.Event()
    honoured: set[str] = set()  # the task ids the server agreed to notify

    async def message(message: Any) -> None:
        if isinstance(message, SubscriptionsAcknowledgedNotification):
            honoured.update((message.params.notifications.model_extra or {}).get("taskIds") or ())
            acknowledged.set()

    async def notice(state: TaskNotice) -> None:
        if state.status != "working":
            noticed.set()

    claims = {TASKS: [ResultClaim(result_type="task", model=TaskHandle, resolve=follow)]}
    binding = NotificationBinding(method="notifications/tasks", params_type=TaskNotice, handler=notice)
    async with (httpx2.AsyncClient(base_url=url, headers={"Authorization": f"Bearer {agent['token']}"},
                                   timeout=120) as http,
                streamable_http_client(f"{url}/mcp", http_client=http) as (read, write),
                ClientSession(read, write, extensions={TASKS: {}}, result_claims=claims, message_handler=message,
                              notification_bindings=[binding]) as session):
        await session.discover()
        handle = await session.call_tool("wait_for_decision", {"plan_id": agent["plan"]}, allow_claimed=True)
        if not isinstance(handle, TaskHandle):
            raise RuntimeError(f"wait_for_decision answered without a task: {handle}")
        listen = SubscriptionsListenRequest(params=SubscriptionsListenRequestParams(
            notifications=SubscriptionFilter.model_validate({"taskIds": [handle.task_id]})))
        listening = asyncio.create_task(session.send_request(listen, SubscriptionsListenResult))

        async def polled() -> None:
            if handle.task_id in honoured:  # told by notification: polled only once the stream ends or is cut
                await asyncio.wait([listening])
            interval = handle.poll_interval_ms or 1000
            while True:
                print(f"poll {interval}", flush=True)  # as the server suggests it, as a real client follows it
                await asyncio.sleep(interval / 1000)
                state = await session.send_request(
                    GetTaskRequest(params=GetTaskRequestParams(task_id=handle.task_id)), TaskState)
                if state.status != "working":
                    return
                interval = state.poll_interval_ms or 1000

        acked, told = asyncio.create_task(acknowledged.wait()), asyncio.create_task(noticed.wait())
        polling: asyncio.Task[None] | None = None
        try:
            await asyncio.wait([acked, listening], return_when=asyncio.FIRST_COMPLETED)
            if not acknowledged.is_set():
                listening.result()  # the listen was refused: its error, for the retry
            polling = asyncio.create_task(polled())
            connected.set()
            done, _ = await asyncio.wait([polling, told], return_when=asyncio.FIRST_COMPLETED)
            seen(agent["plan"], "notice" if told in done else "poll")
            if polling in done:
                polling.result()  # a failed poll is the agent's error, as before
        finally:
            tasks = tuple(t for t in (listening, polling, acked, told) if t is not None)
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)  # the stream's end or cut: the poll stood in


async def lag_report() -> None:
    """Each second, the worst lag of this loop (a sleep's overshoot): an answer seen late by a busy generator would
    count as the server's."""
    loop = asyncio.get_running_loop()
    while True:
        worst, second = 0.0, loop.time() + 1
        while loop.time() < second:
            started = loop.time()
            await asyncio.sleep(0.02)
            worst = max(worst, loop.time() - started - 0.02)
        print(f"lag {worst * 1000:.1f}", flush=True)


async def generate(url: str, agents: list[dict[str, Any]], gap: float) -> None:
    lags = asyncio.create_task(lag_report())
    events = [asyncio.Event() for _ in agents]
    tls = ssl.create_default_context()  # one for all: each client would load the CA bundle again (plain http here)
    connects = {"long_poll": partial(long_poll, url, tls), "websocket": partial(websocket, url),
                "mcp_task": partial(mcp_task, url)}
    tasks = []
    for agent, connected in zip(agents, events, strict=True):
        tasks.append(asyncio.create_task(retried(connects[agent["kind"]], agent, connected)))
        await asyncio.sleep(gap)  # a fleet connecting over seconds, not in one burst
    for connected in events:
        await connected.wait()
    print(f"ready {len(ERRORS)}", flush=True)
    await asyncio.gather(*tasks)
    lags.cancel()


def generator_main(url: str, gap: float) -> None:
    import django

    django.setup()  # the MCP client's task models are tests/mcp/'s, modules of the test suite
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    os.nice(GEN_NICE)
    asyncio.run(generate(url, json.loads(sys.stdin.readline()), gap))


# --- the decider (its own process): an operator's approval through the web's service -----------------------------


def decider_main(user_id: int) -> None:
    import django

    django.setup()
    from django.contrib.auth.models import User

    from planning import services
    from planning.models import Plan

    user = User.objects.get(pk=user_id)
    print("ready", flush=True)
    for line in sys.stdin:
        plan = Plan.objects.get(pk=int(line))
        decided = time.time()  # the operator decides: the service's own time counts
        services.plan_approve(plan=plan, user=user, mode=Plan.ApprovalMode.ALL)
        print(f"{decided:.6f}", flush=True)
    from planner_site.events import publisher

    publisher.drain()


# --- one fleet connected: the probe (this process) ----------------------------------------------------------------


class Generator:
    """The fleet's agents dealt over GEN_PROCESSES load generator processes (each its own event loop), their lines
    read here: `ready`, `seen` and each second the loop's worst lag (how late it ran what was due)."""

    def __init__(self, st: Stack, agents: list[dict[str, Any]]) -> None:
        url = f"http://127.0.0.1:{st.port}"
        shares = [agents[n::GEN_PROCESSES] for n in range(GEN_PROCESSES)]
        self.procs = [st.spawn([sys.executable, "-m", "tests.bench.protocols", "gen", url,
                                str(CONNECT_GAP_SECONDS * len(shares))], stdin=subprocess.PIPE,
                               stdout=subprocess.PIPE, text=True, bufsize=1) for share in shares if share]
        for proc, share in zip(self.procs, shares, strict=False):
            assert proc.stdin is not None
            proc.stdin.write(json.dumps(share) + "\n")
            proc.stdin.flush()
        self.readied: list[int] = []  # each process's errors while its agents connected (each agent tried again)
        self.ready = threading.Event()
        self.seen: dict[int, float] = {}
        self.seen_by: dict[int, str] = {}  # an MCP task's agent: told by "notice" or by its "poll"
        self.polls: list[int] = []  # each pollInterval (ms) an MCP task's agent followed
        self.lags: list[tuple[float, float]] = []  # (when, the worst lag in ms of one process over a second)
        self.readers = [threading.Thread(target=self.read, args=(proc,), daemon=True) for proc in self.procs]
        for reader in self.readers:
            reader.start()

    @property
    def refused(self) -> int:
        return sum(self.readied)

    def read(self, proc: subprocess.Popen[str]) -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            parts = line.split()
            if parts[:1] == ["ready"]:
                self.readied.append(int(parts[1]))
                if len(self.readied) == len(self.procs):
                    self.ready.set()
            elif parts[:1] == ["seen"]:
                self.seen[int(parts[1])] = float(parts[2])
                if len(parts) > 3:
                    self.seen_by[int(parts[1])] = parts[3]
            elif parts[:1] == ["poll"]:
                self.polls.append(int(parts[1]))
            elif parts[:1] == ["lag"]:
                self.lags.append((time.time(), float(parts[1])))

    def lag_max(self, since: float) -> float:
        """The generators' worst loop lag since `since` (time.time()), in ms: how late an answer may have been seen."""
        return max((lag for when, lag in list(self.lags) if when >= since), default=0.0)

    def close(self) -> None:
        from tests.browser.conftest import stop

        for proc in self.procs:
            stop(proc)


def decider_spawn(st: Stack) -> subprocess.Popen[str]:
    """The operator's process, one for the whole run (as a web server's process decides many times): its first
    decision, which pays for the process's first imports and connection, is the warm fleet's, not counted."""
    decider = st.spawn([sys.executable, "-m", "tests.bench.protocols", "decide", str(st.data["user"])],
                       stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, bufsize=1)
    assert decider.stdout is not None
    assert decider.stdout.readline().strip() == "ready"
    return decider


def fleet_measure(st: Stack, agents: list[dict[str, Any]], *, rng: random.Random,
                  decider: subprocess.Popen[str]) -> dict[str, Any]:
    """Connect the fleet, then measure: memory, the dashboard, and decisions by transport."""
    url = f"http://127.0.0.1:{st.port}"
    idle_kb = serve_rss_kb(st)
    generator = Generator(st, agents)
    assert decider.stdin is not None and decider.stdout is not None
    try:
        connect_started = time.monotonic()
        if not generator.ready.wait(CONNECT_TIMEOUT_SECONDS):
            raise RuntimeError(f"the {len(agents)} agents did not connect within {CONNECT_TIMEOUT_SECONDS:.0f} s; "
                               f"logs in {st.tmp}")
        connect_seconds = time.monotonic() - connect_started
        time.sleep(3.0)  # settled: every long poll in flight, every task polled once
        connected_kb = serve_rss_kb(st)
        dashboard = probe_ms(url, "/", st.data["session"])
        load = os.getloadavg()[0]
        by_kind: dict[str, list[float]] = {kind: [] for kind in MIX}
        chosen = []
        for kind in MIX:
            of_kind = [a for a in agents if a["kind"] == kind]
            chosen += rng.sample(of_kind, min(DECISIONS, len(of_kind)))
        rng.shuffle(chosen)
        committed: dict[int, float] = {}
        decisions_started = time.time()
        for agent in chosen:
            time.sleep(rng.uniform(0.05, 0.25))
            decider.stdin.write(f"{agent['plan']}\n")
            decider.stdin.flush()
            committed[agent["plan"]] = float(decider.stdout.readline())
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and any(a["plan"] not in generator.seen for a in chosen):
            time.sleep(0.05)
        lag = generator.lag_max(decisions_started)
        loads = (load, os.getloadavg()[0])
        lost = 0
        for agent in chosen:
            if agent["plan"] in generator.seen:
                by_kind[agent["kind"]].append((generator.seen[agent["plan"]] - committed[agent["plan"]]) * 1000)
            else:
                lost += 1
    finally:
        generator.close()
    return {"n": len(agents), "memory_kb": (connected_kb - idle_kb) / len(agents), "idle_kb": idle_kb,
            "connected_kb": connected_kb, "dashboard": dashboard, "by_kind": by_kind, "lost": lost,
            "loads": loads, "lag": lag, "polls": list(generator.polls), "connect_seconds": connect_seconds,
            "refused": generator.refused,
            "noticed": sum(1 for a in chosen if generator.seen_by.get(a["plan"]) == "notice"),
            "tasks_seen": sum(1 for a in chosen if a["plan"] in generator.seen_by)}


def scale_figures() -> list[dict[str, Any]]:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)  # the server's sockets: one an agent
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    rng = random.Random(57)
    with stack(("--workers", str(WORKERS))) as st:
        warm, small, big = (fleet(st, "Warm", AGENTS_SMALL), fleet(st, "Small", AGENTS_SMALL),
                            fleet(st, "Agent", AGENTS))
        decider = decider_spawn(st)
        try:
            fleet_measure(st, warm, rng=rng, decider=decider)  # first imports and caches of every path: not counted
            few = fleet_measure(st, small, rng=rng, decider=decider)
            many = fleet_measure(st, big, rng=rng, decider=decider)
        finally:
            assert decider.stdin is not None
            decider.stdin.close()
            with contextlib.suppress(subprocess.TimeoutExpired):
                decider.wait(30)
        where = f"{st.stack_name}, serve --workers {WORKERS}"
    counts = {kind: sum(1 for a in big if a["kind"] == kind) for kind in MIX}
    mix = ", ".join(f"{n} {kind.replace('_', ' ')}s" for kind, n in counts.items())
    n = AGENTS

    def pushed(m: dict[str, Any]) -> list[float]:
        return m["by_kind"]["long_poll"] + m["by_kind"]["websocket"]

    def kinds_note(m: dict[str, Any]) -> str:
        return "; ".join(f"{kind.replace('_', ' ')} p95 {p95(v):.0f} ms, median {statistics.median(v or [0]):.0f} ms "
                         f"({len(v)})" for kind, v in m["by_kind"].items())

    def polls(m: dict[str, Any]) -> str:
        low, high = min(m["polls"], default=0), max(m["polls"], default=0)
        every = f"every {low} ms" if low == high else f"every {low}-{high} ms"
        return f"{len(m['polls'])} polls {every}" if m["polls"] else "no poll"

    poll_note = f"{polls(many)} with {n}, {polls(few)} with {AGENTS_SMALL}"

    def conditions(m: dict[str, Any]) -> str:
        return (f"load average {m['loads'][0]:.1f}-{m['loads'][1]:.1f} on {os.cpu_count()} cores, the generators' "
                f"loop lag at most {m['lag']:.0f} ms")

    out = [
        figure(f"connected_{n}_decision_p95", p95(pushed(many)), "ms", baseline=p95(pushed(few)),
               baseline_name=f"the same with {AGENTS_SMALL} agents connected", goal=f"< {DECISION_GOAL_MS:.0f} ms",
               passed=p95(pushed(many)) < DECISION_GOAL_MS and many["lost"] == 0,
               note=f"{mix} waiting at once ({where}; {GEN_PROCESSES} generator processes; connected in "
                    f"{many['connect_seconds']:.0f} s, {many['refused']} connection errors retried); an operator's "
                    f"approval (the service called) -> the agent has `run`; long polls and websockets: "
                    f"{kinds_note(many)}; lost {many['lost']}; {conditions(many)}; with {AGENTS_SMALL}: "
                    f"{kinds_note(few)}, {conditions(few)}"),
        figure(f"connected_{n}_mcp_task_decision_p95", p95(many["by_kind"]["mcp_task"]), "ms",
               baseline=p95(few["by_kind"]["mcp_task"]), baseline_name=f"the same with {AGENTS_SMALL} agents",
               goal=f"< {DECISION_GOAL_MS:.0f} ms", passed=p95(many["by_kind"]["mcp_task"]) < DECISION_GOAL_MS,
               note=f"the MCP client listens for its task's notifications, polling tasks/get at the task's "
                    f"pollInterval only if the stream is refused or ends ({poll_note}): {many['noticed']} of {many['tasks_seen']} told first by "
                    f"notification ({few['noticed']} of {few['tasks_seen']} with {AGENTS_SMALL}); median "
                    f"{statistics.median(many['by_kind']['mcp_task'] or [float('nan')]):.0f} ms"),
        figure(f"connected_{n}_dashboard_p90", p90(many["dashboard"]), "ms", baseline=p90(few["dashboard"]),
               baseline_name=f"the same with {AGENTS_SMALL} agents connected", goal=f"< {DASHBOARD_GOAL_MS:.0f} ms",
               passed=p90(many["dashboard"]) < DASHBOARD_GOAL_MS,
               note=f"one request at a time, {len(many['dashboard'])} loads; median "
                    f"{statistics.median(many['dashboard']):.0f} ms"),
        figure(f"connected_{n}_memory_per_agent", many["memory_kb"], "KB", baseline=few["memory_kb"],
               baseline_name=f"the same with {AGENTS_SMALL} agents connected", goal=f"< {MEMORY_GOAL_KB:.0f} KB",
               passed=many["memory_kb"] < MEMORY_GOAL_KB,
               note=f"RSS of the serve processes: {many['idle_kb'] / 1024:.0f} MB before, "
                    f"{many['connected_kb'] / 1024:.0f} MB with {n} connected ({few['connected_kb'] / 1024:.0f} MB "
                    f"with {AGENTS_SMALL})"),
    ]
    return out


# --- a remote A2A agent's question in the inbox ------------------------------------------------------------------

ENTERED: dict[str, float] = {}  # task id -> when the bench agent entered input-required (its clock)


def a2a_app(base: str, *, streaming: bool = False) -> Any:
    from a2a.helpers.proto_helpers import new_task
    from a2a.server.agent_execution import AgentExecutor, RequestContext
    from a2a.server.events import EventQueue
    from a2a.server.request_handlers import DefaultRequestHandlerV2
    from a2a.server.routes import create_agent_card_routes, create_jsonrpc_routes
    from a2a.server.tasks import InMemoryTaskStore, TaskUpdater
    from a2a.types import AgentCapabilities, AgentCard, AgentInterface, AgentSkill, Part, TaskState
    from starlette.applications import Starlette

    rng = random.Random(7)

    class AskingAgent(AgentExecutor):
        """Works a while on a new task, then asks a question (input-required)."""

        async def execute(self, context: RequestContext, event_queue: EventQueue) -> None:
            task_id, context_id = context.task_id or "", context.context_id or ""
            updater = TaskUpdater(event_queue, task_id, context_id)
            assert context.message is not None
            await event_queue.enqueue_event(new_task(task_id, context_id, TaskState.TASK_STATE_SUBMITTED,
                                                     history=[context.message]))
            await updater.start_work(updater.new_agent_message([Part(text="Reading the notes")]))
            await asyncio.sleep(rng.uniform(0.5, 2.5))
            ENTERED[task_id] = time.time()
            await updater.requires_input(updater.new_agent_message([Part(text="Markdown or plain text?")]))

        async def cancel(self, context: RequestContext, event_queue: EventQueue) -> None:
            await TaskUpdater(event_queue, context.task_id or "", context.context_id or "").cancel()

    card = AgentCard(name="Bench asker, streaming" if streaming else "Bench asker", description="Asks a question after a while", version="1.0",
                     supported_interfaces=[AgentInterface(url=f"{base}/a2a", protocol_binding="JSONRPC",
                                                          protocol_version="1.0")],
                     capabilities=AgentCapabilities(streaming=streaming), default_input_modes=["text/plain"],
                     default_output_modes=["text/plain"],
                     skills=[AgentSkill(id="ask", name="Ask", description="Asks", tags=["bench"])])
    handler = DefaultRequestHandlerV2(agent_executor=AskingAgent(), task_store=InMemoryTaskStore(), agent_card=card)
    return Starlette(routes=[*create_agent_card_routes(card), *create_jsonrpc_routes(handler, "/a2a")])


def a2a_asked(first: Any, user: Any, prefix: str) -> list[float]:
    """A2A_AGENTS remote agents like `first` (the same card), each given a goal through the product's service; the
    seconds from each agent entering input-required to its question in the inbox, through the runtime."""
    from agents.models import Agent
    from planning.models import A2ATask, PlanEvent
    from planning.services.agents import agent_give_goal
    from tests.bench.notify import runtime_thread

    agents = [Agent.objects.create(name=f"{prefix} {i:02d}", kind=Agent.Kind.A2A, a2a_url=first.a2a_url,
                                   a2a_card=first.a2a_card) for i in range(A2A_AGENTS)]
    stop = threading.Event()
    thread = runtime_thread(stop)
    try:
        for agent in agents:  # as the agent's page gives it: the runtime sends it at the agent's next cycle
            agent_give_goal(agent=agent, user=user, description="Summarise the notes")
        asked = PlanEvent.objects.filter(plan__agent__in=agents, kind=PlanEvent.Kind.CLARIFICATION_ASKED)
        deadline = time.monotonic() + 60
        while asked.count() < len(agents) and time.monotonic() < deadline:
            time.sleep(0.1)
    finally:
        stop.set()
        thread.join(timeout=60)
    Agent.objects.filter(pk__in=[a.pk for a in agents]).update(status=Agent.Status.PAUSED)
    tasks = {t.plan_id: t.task_id for t in A2ATask.objects.filter(plan__agent__in=agents)}
    latencies = [e.created_at.timestamp() - ENTERED[tasks[e.plan_id]] for e in asked
                 if tasks.get(e.plan_id) in ENTERED]
    if len(latencies) < len(agents):
        raise RuntimeError(f"only {len(latencies)} of {len(agents)} A2A agents' questions reached the inbox")
    return latencies


def a2a_figures() -> list[dict[str, Any]]:
    from django.conf import settings
    from django.contrib.auth.models import Group, User
    from django.test import override_settings

    from agents.models import Agent
    from planning.services.a2a import agent_a2a_add
    from tests.a2a.a2a_agent import served

    user = User.objects.create_user("bench-a2a")
    user.groups.add(Group.objects.get(name="operators"))
    with override_settings(OUTBOUND_ALLOWED_NETWORKS=["127.0.0.0/8"]):
        with served(a2a_app) as base:  # a card without streaming: the task is read (GetTask)
            first = agent_a2a_add(user=user, url=base)
            Agent.objects.filter(pk=first.pk).update(status=Agent.Status.PAUSED)  # the card's: the fleets copy it
            with override_settings(A2A_FOLLOW_SECONDS=0):  # as before: the task read at the agent's interval
                before = a2a_asked(first, user, "Asker at its interval")
            polled = a2a_asked(first, user, "Asker followed")
        with served(partial(a2a_app, streaming=True)) as base:  # the card offers streaming (SubscribeToTask)
            first = agent_a2a_add(user=user, url=base)
            Agent.objects.filter(pk=first.pk).update(status=Agent.Status.PAUSED)
            streamed = a2a_asked(first, user, "Asker streaming")
    runtime = "a worker of the job engine" if settings.SCALE_OUT else "the embedded scheduler"
    read_at_interval = "agents without streaming read at their 2 s interval (A2A_FOLLOW_SECONDS=0)"

    def note(latencies: list[float], how: str) -> str:
        return (f"{len(latencies)} remote A2A agents (a2a-sdk server on loopback) {how}, entering input-required "
                f"0.5-2.5 s into their task, through {runtime}; median {statistics.median(latencies):.2f} s (read at "
                f"their interval {statistics.median(before):.2f} s); ms: "
                + ", ".join(f"{x * 1000:.0f}" for x in sorted(latencies)))

    return [figure("a2a_input_required_to_inbox_p95", p95(streamed), "s", baseline=p95(before), baseline_name=read_at_interval,
                   goal=f"< {A2A_GOAL_SECONDS:.0f} s", passed=p95(streamed) < A2A_GOAL_SECONDS,
                   note=note(streamed, "whose cards offer streaming, as a2a-sdk agents' usually do: the task is "
                                       "subscribed to")),
            figure("a2a_polled_input_required_to_inbox_p95", p95(polled), "s", baseline=p95(before), baseline_name=read_at_interval,
                   goal=f"< {A2A_GOAL_SECONDS:.0f} s", passed=p95(polled) < A2A_GOAL_SECONDS,
                   note=note(polled, f"whose cards offer neither streaming nor push: the task is read every "
                                     f"{settings.A2A_FOLLOW_SECONDS:g} s (A2A_FOLLOW_SECONDS) while it is worked on"))]


def figures() -> Iterator[dict[str, Any]]:
    """The A2A figure, then the fleets' (each printed as soon as it is measured)."""
    if not (reachable(PG_URL) and reachable(REDIS_URL)):
        print("  protocols: SKIPPED, they need PostgreSQL and Redis on 127.0.0.1 (the scale-out stack): "
              "`serve --workers 2` runs on it only", flush=True)
        return
    parts = set(os.environ.get("BENCH_PROTOCOLS_PARTS", "a2a,scale").split(","))
    if "a2a" in parts:
        yield from a2a_figures()
    if "scale" in parts:
        yield from scale_figures()


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    if sys.argv[1] == "gen":
        generator_main(sys.argv[2], float(sys.argv[3]))
    elif sys.argv[1] == "decide":
        decider_main(int(sys.argv[2]))
    else:
        raise SystemExit(f"unknown role {sys.argv[1]}")
