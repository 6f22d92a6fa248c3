"""Live pages: push latency, fan-out, and the cost of big pages, each beside a bare baseline of the same run.

- push_plan_p95, push_dashboard_p95: a change committed in another process (a service call in a
  `committer` subprocess) -> the updated fragment at a websocket client of the real server
  (`manage.py serve --no-runner`); goal < 25 ms, every change delivered. Baseline: a bare send from another
  process -> a minimal consumer (served the same way) -> the client. PostgreSQL + Redis only: the embedded stack (SQLite) is one
  process and pushes only its own changes (another process's show when a page is reloaded), so the
  push figures print SKIPPED when PostgreSQL or Redis is not reachable.
- fanout_200_p95: delivery p95 with 200 open dashboards at 20 changes/s, none lost; goal < 25 ms (issue 17's
  "push p95 < 25 ms with 200 open pages"); baseline: the bare path with 200 clients at the same rate.
- plan_page_1000: the plan page with 1,000 steps (the view, as an operator) against a bare template
  of the same rows fed by one query; queries must not grow with steps.
- dashboard_1000: the dashboard with 1,000 agents (its first page of 50) against a bare template of
  the same 50 rows.

`python -m tests.bench.live bare|committer ...` are the helper processes.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import json
import os
import re
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from tests.bench.common import figure

ROOT = Path(__file__).resolve().parents[2]
PUSH_SAMPLES = int(os.environ.get("BENCH_PUSH_SAMPLES", "60"))
FANOUT_CLIENTS = int(os.environ.get("BENCH_FANOUT_CLIENTS", "200"))
FANOUT_RATE = 20.0
FANOUT_SECONDS = 5.0
PG_URL = os.environ.get("BENCH_PG_URL", "postgres://postgres@127.0.0.1:5432/postgres")
REDIS_URL = os.environ.get("BENCH_REDIS_URL", "redis://127.0.0.1:6379/0")
MARK = re.compile(r"ping (\d+)\b")


def p95(values: list[float]) -> float:
    return statistics.quantiles(values, n=20)[-1] if len(values) >= 2 else (values[0] if values else float("nan"))


def reachable(url: str) -> bool:
    parts = urlsplit(url)
    try:
        with socket.create_connection((parts.hostname or "127.0.0.1", parts.port or 0), timeout=2):
            return True
    except OSError:
        return False


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# --- the stack under test: its own database, server, and helper processes --------------------------------------

SETUP = r"""
import json
from django.contrib.auth.models import Group, User
from django.test import Client
from agents.models import Agent
from goals.models import Goal
from planning.models import Plan, PlanStep
user = User.objects.create_user("bench", "", "bench-not-secret-1")
user.groups.add(Group.objects.get(name="operators"))
client = Client()
client.force_login(user)
agent = Agent.objects.create(name="Bench", kind=Agent.Kind.PERSONA, status=Agent.Status.PAUSED)
goal = Goal.objects.create(agent=agent, description="Earn money", source_needs=["money"])
plan = Plan.objects.create(agent=agent, goal=goal, goal_text="Earn money", status=Plan.Status.ACTIVE,
                           approval_mode=Plan.ApprovalMode.ALL)
step = PlanStep.objects.create(plan=plan, key="1", position=1, description="start", action_hint="work")
for k in range(2, 6):
    PlanStep.objects.create(plan=plan, key=str(k), position=k, description=f"later {k}", action_hint="work")
for i in range(20):
    Agent.objects.create(name=f"Other {i:02d}", status=Agent.Status.PAUSED)
print(json.dumps({"session": client.cookies["sessionid"].value, "plan": plan.pk, "step": step.pk, "user": user.pk}))
"""


class Stack:
    """A throwaway database, the real server, and the bare server, on free ports."""

    def __init__(self, serve_args: tuple[str, ...] = ()) -> None:
        self.tmp = Path(tempfile.mkdtemp(prefix="planner-bench-live-"))
        self.serve_args = serve_args
        self.scaleout = reachable(PG_URL) and reachable(REDIS_URL)
        self.db_name = f"planner_bench_live_{os.getpid()}"
        self.env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "REDIS_URL", "TEST_DATABASE_NAME")}
        self.env |= {"DJANGO_SETTINGS_MODULE": "planner_site.settings", "PLANNER_VAR_DIR": str(self.tmp / "var"),
                     "SQLITE_PATH": str(self.tmp / "live.sqlite3"), "AGENT_WORKSPACES": str(self.tmp / "ws"),
                     "SECRET_KEY": "bench-not-secret-0123456789-abcdefghijklmnopqrstuvwxyz",
                     "ALLOWED_HOSTS": "127.0.0.1,localhost", "PYTHONUNBUFFERED": "1", "LOG_LEVEL": "WARNING",
                     "CHANNELS_PREFIX": f"bench-live-{os.getpid()}", "DB_CONN_MAX_AGE": "600"}
        if self.scaleout:
            import psycopg
            from psycopg import sql

            with psycopg.connect(PG_URL, autocommit=True) as conn:
                conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(self.db_name)))
                conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(self.db_name)))
            self.env["DATABASE_URL"] = urlunsplit(urlsplit(PG_URL)._replace(path="/" + self.db_name))
            self.env["REDIS_URL"] = REDIS_URL
        self.processes: list[subprocess.Popen[Any]] = []
        self.manage("migrate", "--noinput")
        self.data = json.loads(self.manage("shell", "-c", SETUP).strip().splitlines()[-1])
        self.port = free_port()
        self.bare_port = free_port()
        self.spawn([sys.executable, "manage.py", "serve", "--no-runner", "--port", str(self.port), *serve_args])
        ports = [self.port]
        if self.scaleout:  # the bare baseline of the push figures (scale-out only)
            self.spawn([sys.executable, "-m", "tests.bench.live", "bare", str(self.bare_port)])
            ports.append(self.bare_port)
        for port in ports:
            self.wait_up(port)

    @property
    def stack_name(self) -> str:
        return "PostgreSQL + Redis" if self.scaleout else "embedded (SQLite, one process)"

    def manage(self, *args: str) -> str:
        result = subprocess.run([sys.executable, "manage.py", *args], cwd=ROOT, env=self.env, capture_output=True,
                                text=True, timeout=300)
        if result.returncode:
            raise RuntimeError(f"manage.py {args[0]} failed:\n{result.stdout}\n{result.stderr}")
        return result.stdout

    def spawn(self, cmd: list[str], **kwargs: Any) -> subprocess.Popen[Any]:
        log = (self.tmp / f"proc-{len(self.processes)}.log").open("ab")
        proc = subprocess.Popen(cmd, cwd=ROOT, env=self.env, stdout=kwargs.pop("stdout", log), stderr=log, **kwargs)
        self.processes.append(proc)
        return proc

    def wait_up(self, port: int) -> None:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=1):
                return
            time.sleep(0.1)
        raise RuntimeError(f"nothing listens on {port}; logs in {self.tmp}")

    def close(self) -> None:
        from tests.browser.conftest import stop

        for proc in self.processes:
            stop(proc)
        if self.scaleout:
            import psycopg
            from psycopg import sql

            with contextlib.suppress(Exception), psycopg.connect(PG_URL, autocommit=True) as conn:
                conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(self.db_name)))
        if not os.environ.get("BENCH_KEEP"):  # BENCH_KEEP=1 keeps the servers' logs for a profile
            shutil.rmtree(self.tmp, ignore_errors=True)


@contextlib.contextmanager
def stack(serve_args: tuple[str, ...] = ()) -> Iterator[Stack]:
    s = Stack(serve_args)
    try:
        yield s
    finally:
        s.close()


class Sender:
    """A helper process that makes one change per line it reads and answers with the time it committed."""

    def __init__(self, st: Stack, role: str) -> None:
        self.proc = st.spawn([sys.executable, "-m", "tests.bench.live", role, json.dumps(st.data)],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, bufsize=1)
        assert self.proc.stdout is not None
        assert self.proc.stdout.readline().strip() == "ready"

    def send(self, i: int) -> float:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(f"{i}\n")
        self.proc.stdin.flush()
        return float(self.proc.stdout.readline())

    def burst(self, n: int, rate: float) -> list[float]:
        """n changes at `rate` per second, paced by the helper itself; their commit times."""
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(f"burst {n} {rate}\n")
        self.proc.stdin.flush()
        return [float(self.proc.stdout.readline()) for _ in range(n)]

    def close(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        self.proc.wait(timeout=30)


async def client_connect(st: Stack, *, bare: bool, path: str) -> Any:
    from websockets.asyncio.client import connect

    port = st.bare_port if bare else st.port
    headers = {"Origin": f"http://127.0.0.1:{port}", "Cookie": f"sessionid={st.data['session']}"}
    ws = await connect(f"ws://127.0.0.1:{port}{path}", additional_headers=headers, max_size=None,
                       open_timeout=60, ping_interval=None)
    if not bare:
        await asyncio.wait_for(ws.recv(), 30)  # the full state
    return ws


async def arrivals(ws: Any, seen: dict[int, float], stop: asyncio.Event) -> None:
    while not stop.is_set():
        try:
            text = await asyncio.wait_for(ws.recv(), 0.5)
        except TimeoutError:
            continue
        now = time.time()
        for m in MARK.finditer(str(text)):
            seen.setdefault(int(m.group(1)), now)


async def latency_run(st: Stack, *, bare: bool, path: str, role: str, samples: int, base: int) -> list[float]:
    """One client; each change waited for before the next; latencies in ms."""
    ws = await client_connect(st, bare=bare, path=path)
    sender = await asyncio.to_thread(Sender, st, role)
    seen: dict[int, float] = {}
    stop = asyncio.Event()
    reader = asyncio.ensure_future(arrivals(ws, seen, stop))
    latencies = []
    try:
        for i in range(base, base + samples + 5):
            sent = await asyncio.to_thread(sender.send, i)
            for _ in range(500):
                if i in seen:
                    break
                await asyncio.sleep(0.002)
            if i in seen and i >= base + 5:  # the first few warm up caches and connections
                latencies.append((seen[i] - sent) * 1000)
    finally:
        stop.set()
        await reader
        await ws.close()
        await asyncio.to_thread(sender.close)
    return latencies


async def fanout_run(st: Stack, *, bare: bool, path: str, role: str, base: int) -> tuple[list[float], int]:
    clients = []
    for _ in range(FANOUT_CLIENTS):
        clients.append(await client_connect(st, bare=bare, path=path))
    sender = await asyncio.to_thread(Sender, st, role)
    stop = asyncio.Event()
    seen: list[dict[int, float]] = [{} for _ in clients]
    readers = [asyncio.ensure_future(arrivals(ws, s, stop)) for ws, s in zip(clients, seen, strict=True)]
    n = int(FANOUT_RATE * FANOUT_SECONDS)
    sent = await asyncio.to_thread(sender.burst, n, FANOUT_RATE)
    await asyncio.sleep(3)
    stop.set()
    await asyncio.gather(*readers)
    await asyncio.gather(*(ws.close() for ws in clients))
    await asyncio.to_thread(sender.close)
    # Changes that arrive during a render are merged into the next push, which shows only the latest
    # value: change k is delivered by the first push showing k or a later change.
    latencies, lost = [], 0
    for s in seen:
        delivered = sorted(s.items())
        for k, t0 in enumerate(sent):
            arrival = min((t for mark, t in delivered if mark >= base + k), default=None)
            if arrival is None:
                lost += 1
            else:
                latencies.append((arrival - t0) * 1000)
    return latencies, lost


def push_figures(st: Stack) -> list[dict[str, Any]]:
    out = []
    plan_path = f"/ws/plans/{st.data['plan']}/"
    bare = asyncio.run(latency_run(st, bare=True, path="/bare/", role="bare-sender", samples=PUSH_SAMPLES, base=0))
    bare_p95 = p95(bare)
    for name, path, base in (("push_plan_p95", plan_path, 10_000), ("push_dashboard_p95", "/ws/dashboard/", 20_000)):
        lat = asyncio.run(latency_run(st, bare=False, path=path, role="committer", samples=PUSH_SAMPLES, base=base))
        value = p95(lat)
        # Issue 17's figure is < 25 ms; the ratio to the bare relay (<= 1.5x, a micro-ratio the issue retired)
        # shows beside it as the baseline of the same run.
        out.append(figure(name, value, "ms", baseline=bare_p95, baseline_name="bare send -> minimal consumer -> client, p95",
                          goal="< 25 ms (the bare relay beside it)",
                          passed=bool(lat) and value < 25 and len(lat) == PUSH_SAMPLES,
                          note=f"{st.stack_name}; p50 {statistics.median(lat):.1f} ms vs bare {statistics.median(bare):.1f}; "
                               f"{len(lat)}/{PUSH_SAMPLES} delivered"))
    return out


def fanout_figures(st: Stack) -> list[dict[str, Any]]:
    bare, bare_lost = asyncio.run(fanout_run(st, bare=True, path="/bare/", role="bare-sender", base=30_000))
    lat, lost = asyncio.run(fanout_run(st, bare=False, path="/ws/dashboard/", role="committer", base=40_000))
    value = p95(lat) if lat else float("inf")
    return [figure("fanout_200_p95", value, "ms", baseline=p95(bare) if bare else None,
                   baseline_name=f"bare fan-out to {FANOUT_CLIENTS} clients, p95",
                   goal=f"< 25 ms with {FANOUT_CLIENTS} open dashboards at {FANOUT_RATE:.0f} changes/s (issue 17)",
                   passed=bool(lat) and value < 25 and lost == 0,
                   note=f"{st.stack_name}; {FANOUT_CLIENTS} clients; lost {lost} (bare lost {bare_lost}); "
                        f"p50 {statistics.median(lat) if lat else float('nan'):.1f} ms")]


# --- big pages, in this process (the bench's own database) ------------------------------------------------------

BARE_STEPS = """<!doctype html><html><body><h1>{{ plan.goal_text }}</h1><ol>{% for s in steps %}
<li id="step-{{ s.key }}"><span>{{ s.key }}</span> <span>{{ s.get_status_display }}</span> <b>{{ s.description }}</b>
<div>action <code>{{ s.action_hint }}</code> · expects: {{ s.expected_outcome }} · cycles {{ s.actual_cycles }}/{{ s.estimated_cycles }}</div></li>
{% endfor %}</ol></body></html>"""

BARE_ROWS = """<!doctype html><html><body><table>{% for r in rows %}
<tr><td><a href="/agents/{{ r.agent.pk }}/">{{ r.agent.name }}</a> {{ r.agent.kind }}</td><td>{{ r.agent.status }}</td>
<td>{% if r.plan %}<a href="/plans/{{ r.plan.pk }}/">{{ r.plan.goal_text }}</a> v{{ r.plan.version }}{% endif %}</td>
<td>{% if r.step %}{{ r.step.status }} {{ r.step.description }}{% endif %}</td><td>{{ r.done }}/{{ r.total }}</td>
<td>{% for n in r.needs %}{{ n.name }} {{ n.satisfaction }} {% endfor %}</td><td>{{ r.agent.cycle_count }}</td></tr>
{% endfor %}</table></body></html>"""


def timed_pair(fn: Callable[[], object], baseline: Callable[[], object], rounds: int = 9) -> tuple[float, float]:
    """Median ms of `fn` and of its baseline, measured in alternation so both meet the same load.

    Each call starts from a collected heap, the bench's own data frozen out of the collector (for the
    measurement only; the product leaves the collector as Python sets it): otherwise a full collection over that heap, due
    every few calls, lands on whichever call is running and makes the ratio swing (0.9x to 3.2x seen).
    """
    fn(), baseline()
    gc.collect()
    gc.freeze()
    times: tuple[list[float], list[float]] = ([], [])
    try:
        for _ in range(rounds):
            for f, out in ((fn, times[0]), (baseline, times[1])):
                gc.collect()
                started = time.perf_counter()
                f()
                out.append((time.perf_counter() - started) * 1000)
    finally:
        gc.unfreeze()
    return statistics.median(times[0]), statistics.median(times[1])


def page_figures() -> list[dict[str, Any]]:
    from django.contrib.auth.models import Group, User
    from django.db import connection
    from django.template import Context, Template
    from django.test import Client

    from agents.models import Agent, Need
    from goals.models import Goal
    from planning.models import Plan, PlanStep
    from planning.selectors import DashboardFilter, dashboard_page

    user = User.objects.create_user("bench-pages", "", "bench-not-secret-2")
    user.groups.add(Group.objects.get(name="operators"))
    client = Client()
    client.force_login(user)
    out = []

    def plan_with(n: int) -> Plan:
        agent = Agent.objects.create(name=f"plan-{n}", status=Agent.Status.PAUSED)
        goal = Goal.objects.create(agent=agent, description="A long plan", source_needs=["money"])
        plan = Plan.objects.create(agent=agent, goal=goal, goal_text="A long plan", status=Plan.Status.ACTIVE,
                                   approval_mode=Plan.ApprovalMode.ALL)
        PlanStep.objects.bulk_create([
            PlanStep(plan=plan, key=str(k), position=k, description=f"step number {k}", action_hint="work",
                     expected_outcome="earn a wage", status="completed" if k < n // 2 else "pending")
            for k in range(1, n + 1)])
        return plan

    big, small = plan_with(1000), plan_with(10)
    bare = Template(BARE_STEPS)

    def bare_plan() -> None:
        plan = Plan.objects.get(pk=big.pk)
        bare.render(Context({"plan": plan, "steps": list(plan.steps.order_by("position"))}))

    def view(url: str) -> Callable[[], None]:
        def get() -> None:
            assert client.get(url).status_code == 200
        return get

    def queries(fn: Callable[[], None]) -> int:
        count = [0]

        def counted(execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
            count[0] += 1
            return execute(sql, params, many, context)

        with connection.execute_wrapper(counted):
            fn()
        return count[0]

    started = time.perf_counter()
    view(f"/plans/{big.pk}/")()  # the first view of the page: no row drawn yet
    cold = (time.perf_counter() - started) * 1000
    q_small, q_big = queries(view(f"/plans/{small.pk}/")), queries(view(f"/plans/{big.pk}/"))
    value, base = timed_pair(view(f"/plans/{big.pk}/"), bare_plan)
    out.append(figure("plan_page_1000", value, "ms", baseline=base, baseline_name="bare template of the same 1,000 rows",
                      goal="<= 1.5x, queries constant", passed=value <= 1.5 * base and q_big == q_small,
                      note=f"queries: {q_big} with 1,000 steps, {q_small} with 10 (operator's view); "
                           f"the first view after a restart took {cold:.0f} ms"))

    agents = Agent.objects.bulk_create([Agent(name=f"agent-{i:04d}", status=Agent.Status.RUNNING) for i in range(1000)])
    Need.objects.bulk_create([Need(agent=a, name=n, satisfaction=0.5) for a in agents for n in ("hunger", "money")])
    for a in agents[:: 2]:
        plan = Plan.objects.create(agent=a, goal_text="Work a shift", status=Plan.Status.ACTIVE)
        PlanStep.objects.create(plan=plan, key="1", position=1, description="work", action_hint="work")
    bare_rows = Template(BARE_ROWS)

    def bare_dashboard() -> None:
        rows, _ = dashboard_page(DashboardFilter())
        bare_rows.render(Context({"rows": rows}))

    response = client.get("/")
    value, base = timed_pair(view("/"), bare_dashboard)
    out.append(figure("dashboard_1000", value, "ms", baseline=base,
                      baseline_name="bare template of the same rows (a page of 50)", goal="<= 1.5x, paginated",
                      passed=value <= 1.5 * base and b"page 1 of" in response.content,
                      note=f"{Agent.objects.count()} agents; page of {len(response.content) // 1024} KB"))
    return out


def figures() -> list[dict[str, Any]]:
    parts = set(os.environ.get("BENCH_LIVE_PARTS", "pages,push,fanout").split(","))
    out = page_figures() if "pages" in parts else []
    if parts & {"push", "fanout"} and not (reachable(PG_URL) and reachable(REDIS_URL)):
        print("  live pushes: SKIPPED, they need PostgreSQL and Redis on 127.0.0.1 (the scale-out stack): the embedded "
              "stack pushes only its serve process's own changes", flush=True)
    elif parts & {"push", "fanout"}:
        with stack() as st:
            print(f"  live pushes on {st.stack_name}", flush=True)
            if "push" in parts:
                out += push_figures(st)
            if "fanout" in parts:
                out += fanout_figures(st)
    return out


# --- helper processes ---------------------------------------------------------------------------------------------


def bare_server(port: int) -> None:
    """A minimal consumer: joins one group of the shared layer (Redis) and relays its text."""
    import django

    django.setup()
    import uvicorn
    from channels.generic.websocket import AsyncWebsocketConsumer
    from channels.routing import ProtocolTypeRouter, URLRouter
    from django.urls import path

    class Bare(AsyncWebsocketConsumer):
        groups = ["bench-bare"]

        async def bare_msg(self, event: dict[str, Any]) -> None:
            await self.send(text_data=event["text"])

    app = ProtocolTypeRouter({"websocket": URLRouter([path("bare/", Bare.as_asgi())])})

    async def main() -> None:
        await uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", lifespan="off")).serve()

    asyncio.run(main())


def serve_lines(act: Callable[[int], Awaitable[float]] | Callable[[int], float]) -> None:
    """Read "i" (one change) or "burst n rate" lines; answer each change with its commit time."""
    print("ready", flush=True)
    base = 0
    for line in sys.stdin:
        parts = line.split()
        if not parts:
            continue
        if parts[0] == "burst":
            n, rate = int(parts[1]), float(parts[2])
            start = time.perf_counter()
            base = 30_000 if "bare" in sys.argv[1] else 40_000
            for k in range(n):
                delay = start + k / rate - time.perf_counter()
                if delay > 0:
                    time.sleep(delay)
                print(act(base + k), flush=True)
        else:
            print(act(int(parts[0])), flush=True)


def committer(data: dict[str, Any]) -> None:
    """Changes through the product's one write path: a service call, committed, then published."""
    import django

    django.setup()
    from django.contrib.auth.models import User

    from planner_site.events import publisher
    from planning import services
    from planning.models import PlanStep

    user = User.objects.get(pk=data["user"])
    step = PlanStep.objects.select_related("plan", "plan__agent").get(pk=data["step"])

    def act(i: int) -> float:
        services.step_edit(step=step, user=user, changes={"description": f"ping {i}"})
        return time.time()

    serve_lines(act)
    publisher.drain()


def bare_sender(data: dict[str, Any]) -> None:
    """The baseline's sender: one long-lived loop, one bare group send per change."""
    import django

    django.setup()
    from channels.layers import get_channel_layer

    loop = asyncio.new_event_loop()
    layer = get_channel_layer()

    def act(i: int) -> float:
        t0 = time.time()
        loop.run_until_complete(layer.group_send("bench-bare", {"type": "bare.msg", "text": f"ping {i}"}))  # type: ignore[union-attr]
        return t0

    serve_lines(act)


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    role = sys.argv[1]
    if role == "bare":
        bare_server(int(sys.argv[2]))
    elif role == "committer":
        committer(json.loads(sys.argv[2]))
    elif role == "bare-sender":
        bare_sender(json.loads(sys.argv[2]))
    else:
        raise SystemExit(f"unknown role {role}")
