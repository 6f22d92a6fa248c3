"""The runner's figures: a round of 100 tool agents planning through a real model server, and the rows
the product stores per agent-hour with retention on and off.

round_100_agents: 100 tool agents each plan a goal with two sequential model calls (restatement, then
the plan) of 300 ms each, against the local OpenAI-compatible test server (tests/llm_server.py) over
real HTTP with the real `openai` client, driven by the runners with their default settings: on PostgreSQL two
`runagents` processes (the engine's workers, as the scale figures run them; the agents are set running and
their chains started, as resuming them does, when the clock starts: their shards' start passes plan them), on SQLite the embedded scheduler
in this process (`--cycles 1`). The server runs in
a process of its own, as a real model server does (in the runner's process its thread per request took
about 1 ms of the runner's CPU per call, under the same GIL). The ideal is
0.6 s (every agent's two calls overlapping all others'); the baseline is one agent alone, measured the
same way in the same run (it includes the runner's fixed costs: start, claim, heartbeat, stop).

rows_per_agent_hour: persona agents cycle with the offline model; the rows their cycles add to the four
growing tables (experiences, goal samples, model calls, events) are counted per cycle and scaled to an
hour at the default cycle interval. That is the growth without retention (the baseline). With
retention on, the same cycles' rows are aged past every RETAIN_* window (their timestamps moved back,
as a long-running demo would age them) and pruned by the runner's own pruning function: what stays is
what the product would keep forever, per agent-hour. The issue measured 1,800 + 4,300 + 2,550 + 245.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from datetime import timedelta

from django.conf import settings
from django.db.models import F

from tests.bench.common import figure
from tests.bench.scale import ROOT, RUNNERS, cpu_seconds, postgres_cpu_seconds

IDEAL_ROUND_SECONDS = 0.6  # two sequential model calls of 300 ms
MODEL_DELAY = 0.3
RESTATE = '<json>{"who": "Bench", "what": "list files", "when": "now", "where": "workspace", "why": "asked"}</json>'
PLAN = ('<json>{"goal": "List the workspace", "steps": [{"id": "1", "tool": "file.list", "intent": "List the files", '
        '"input": {"path": "."}, "requiresPermission": false}]}</json>')
PERSONA_AGENTS = 10
PERSONA_CYCLES = 24
ROUND_CPU: dict[str, float] = {}  # CPU seconds of the runner's process during each round, by prefix
# On PostgreSQL, the machine during each round, by prefix: the core-seconds of PostgreSQL, the model server and
# this process (the round's defers and its looks at the plans).
ROUND_MACHINE: dict[str, dict[str, float]] = {}
ROUND_TIMEOUT_SECONDS = 120.0
WARM_UP_ROUNDS = 6
DEFAULT_CYCLE_SECONDS = 2.0  # Agent.cycle_interval's default: 1,800 cycles an agent-hour


def tool_agents(n: int, prefix: str, *, status: str = "running") -> list[int]:
    """`n` fresh tool agents with one goal each (the runners' rounds create them paused: runners_round sets them
    running when its clock starts)."""
    from agents.models import Agent
    from goals.models import Goal

    ids = []
    for i in range(n):
        agent = Agent.objects.create(name=f"{prefix}-{i}", kind=Agent.Kind.TOOL, status=status)  # default interval
        Goal.objects.create(agent=agent, description="List the workspace", source_needs=[])
        ids.append(agent.pk)
    return ids


def planned(ids: list[int]) -> int:
    """How many of these agents have a plan awaiting approval."""
    from planning.models import Plan

    return Plan.objects.filter(agent_id__in=ids, status=Plan.Status.AWAITING_APPROVAL).count()


@contextlib.contextmanager
def runner_processes(server: object) -> Iterator[list[subprocess.Popen[str]]]:
    """RUNNERS `manage.py runagents` processes (the engine's workers) on this database, asking the model
    server; stopped with SIGTERM (their graceful stop) at the end."""
    env = dict(os.environ, OPENAI_BASE_URL=server.base_url, OPENAI_API_KEY="bench",  # type: ignore[attr-defined]
               PLANNER_MODELS="bench-planner", FAST_MODELS="bench-fast", LOG_LEVEL="WARNING",
               LLM_LOCAL_CONCURRENCY="0")  # the scripted server answers any number at once
    runners = [subprocess.Popen([sys.executable, "manage.py", "runagents", "--runner-id", f"bench-round-{i}"], env=env,
                                cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                                start_new_session=True) for i in range(RUNNERS)]
    try:
        for runner in runners:
            if "started" not in (runner.stdout.readline() if runner.stdout else ""):
                raise RuntimeError("a runner did not start")
        yield runners
    finally:
        for runner in runners:
            with contextlib.suppress(ProcessLookupError):
                runner.send_signal(signal.SIGTERM)
        for runner in runners:
            try:
                runner.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(runner.pid, signal.SIGKILL)


def runners_round(runners: list[subprocess.Popen[str]], ids: list[int], prefix: str, server_pid: int) -> float:
    """The agents `ids` (created paused, with their goals) set running and their chains started, as resuming them
    does (runtime/tasks.py chain_start_on_save: a start pass of each one's shard); the seconds until the last
    one's plan awaits approval (looked at every 20 ms), the runners' CPU meanwhile (ROUND_CPU) and the rest of the
    machine's (ROUND_MACHINE)."""
    from agents.models import Agent
    from runtime.tasks import chain_start

    cpu = sum(cpu_seconds(r.pid) for r in runners)
    postgres, server, own = postgres_cpu_seconds(), cpu_seconds(server_pid), time.process_time()
    started = time.perf_counter()
    Agent.objects.filter(pk__in=ids).update(status=Agent.Status.RUNNING)
    for pk in ids:
        chain_start(pk)
    while planned(ids) < len(ids):
        if time.perf_counter() - started > ROUND_TIMEOUT_SECONDS or any(r.poll() is not None for r in runners):
            raise RuntimeError(f"only {planned(ids)} of {len(ids)} agents planned")
        time.sleep(0.02)
    elapsed = time.perf_counter() - started
    ROUND_CPU[prefix] = sum(cpu_seconds(r.pid) for r in runners) - cpu
    ROUND_MACHINE[prefix] = {"postgres": postgres_cpu_seconds() - postgres, "server": cpu_seconds(server_pid) - server,
                             "own": time.process_time() - own}
    return elapsed


def jobs_drop(ids: list[int]) -> None:
    """The agents' next cycles, deferred by the round's, are not the next round's work."""
    from procrastinate.contrib.django import app
    from procrastinate.contrib.django.models import ProcrastinateJob

    from runtime.tasks import agent_lock

    waiting = ProcrastinateJob.objects.filter(  # type: ignore[misc]  # the engine's read-only model
        lock__in=[agent_lock(pk) for pk in ids], status="todo").values_list("id", flat=True)
    for job_id in waiting:
        app.job_manager.cancel_job_by_id(job_id, delete_job=True)


def round_seconds(server: object, n: int, prefix: str, runners: list[subprocess.Popen[str]] | None = None) -> float:
    """Time the runners take to have `n` fresh tool agents plan once: on PostgreSQL `runners` (RUNNERS
    `runagents` processes, as the scale figures run them), on SQLite the embedded scheduler in this process
    (`--cycles 1`: the embedded stack is one process)."""
    from agents.models import Agent
    from runtime.embedded import Scheduler
    from tests.llm_server import answer

    server.script("bench-fast", *[answer(RESTATE, delay=MODEL_DELAY) for _ in range(n)])  # type: ignore[attr-defined]
    server.script("bench-planner", *[answer(PLAN, delay=MODEL_DELAY) for _ in range(n)])  # type: ignore[attr-defined]
    if runners is not None:
        ids = tool_agents(n, prefix, status=Agent.Status.PAUSED)
        elapsed = runners_round(runners, ids, prefix, server.pid)  # type: ignore[attr-defined]
    else:
        ids = tool_agents(n, prefix)
        started, cpu = time.perf_counter(), time.process_time()
        asyncio.run(Scheduler(runner_id=f"bench-{prefix}", cycles=1, prune_seconds=0).run())
        elapsed = time.perf_counter() - started
        ROUND_CPU[prefix] = time.process_time() - cpu
    if (done := planned(ids)) != n:
        raise RuntimeError(f"only {done} of {n} agents planned")
    Agent.objects.filter(pk__in=ids).update(status=Agent.Status.PAUSED)
    if runners is not None:
        jobs_drop(ids)
    return elapsed


def sdk_round_seconds(server: object, n: int, prefix: str) -> tuple[float, float]:
    """The floor under the round: the runner's own openai client (`openai_acomplete`, same settings and
    transport) making the same `n` x 2 calls, with the prompts the agent alone sent (its call log), and nothing
    else: no database, no cycle. Its wall time and its CPU milliseconds a call."""
    from agents.llm.openai_provider import openai_acomplete
    from agents.models import LLMCall
    from tests.llm_server import answer

    prompts = {c.purpose: c.prompt for c in LLMCall.objects.filter(agent__name__startswith=f"{prefix}-")}
    server.script("bench-fast", *[answer(RESTATE, delay=MODEL_DELAY) for _ in range(n)])  # type: ignore[attr-defined]
    server.script("bench-planner", *[answer(PLAN, delay=MODEL_DELAY) for _ in range(n)])  # type: ignore[attr-defined]

    async def agent() -> None:
        await openai_acomplete(model="bench-fast", messages=prompts["restate"])
        await openai_acomplete(model="bench-planner", messages=prompts["plan"])

    async def everyone() -> None:
        await asyncio.gather(*(agent() for _ in range(n)))

    started, cpu = time.perf_counter(), time.process_time()
    asyncio.run(everyone())
    return time.perf_counter() - started, (time.process_time() - cpu) * 1000 / (2 * n)


def warm_up(server: object, runners: list[subprocess.Popen[str]] | None) -> None:
    """Imports, the first clients and connections: not the runners' pace. Rounds of a few agents until every
    runner has planned one (which runner takes a job is the engine's choice; an agent's plan names it)."""
    from planning.models import PlanEvent

    for attempt in range(WARM_UP_ROUNDS):
        prefix = f"warm-up-{attempt}"
        round_seconds(server, 2 * RUNNERS if runners else 1, prefix, runners)
        if not runners:
            return
        labels = set(PlanEvent.objects.filter(agent__name__startswith=f"{prefix}-", kind=PlanEvent.Kind.CREATED)
                     .values_list("actor_label", flat=True))
        if len(labels) >= len(runners):
            return
    print(f"  round: not every runner planned in {WARM_UP_ROUNDS} warm-up rounds", flush=True)


def bench_round() -> list[dict]:
    from tests.llm_server import LLMServerProcess

    saved = settings.OPENAI_BASE_URL, settings.OPENAI_API_KEY, settings.LLM_MODELS
    with LLMServerProcess() as server, (runner_processes(server) if settings.SCALE_OUT
                                         else contextlib.nullcontext()) as runners:
        settings.OPENAI_BASE_URL, settings.OPENAI_API_KEY = server.base_url, "bench"
        settings.LLM_MODELS = {"planner": ["bench-planner"], "fast": ["bench-fast"]}
        settings.LLM_LOCAL_CONCURRENCY = 0  # the scripted server answers any number at once
        try:
            warm_up(server, runners)
            alone = round_seconds(server, 1, "alone", runners)
            hundred = round_seconds(server, 100, "hundred", runners)
            cpu = ROUND_CPU["hundred"]  # the runners' processes during the round (the model server has its own)
            overlap = server.max_in_flight
            sdk_alone, sdk_cpu = sdk_round_seconds(server, 100, "alone")
        finally:
            settings.OPENAI_BASE_URL, settings.OPENAI_API_KEY, settings.LLM_MODELS = saved
    return [figure(
        "round_100_agents", hundred, "s", baseline=alone, baseline_name="one agent alone, same run",
        goal="<= 1.5x (the ideal is 0.6 s)", passed=hundred <= 1.5 * alone,
        note=f"{hundred / IDEAL_ROUND_SECONDS:.2f}x the ideal 0.6 s; {overlap} model calls at once at most; "
             f"CPU {cpu:.2f} s ({cpu * 1000 / 100:.1f} ms an agent); the openai client alone making the same calls: "
             f"{sdk_alone:.2f} s, {sdk_cpu:.1f} ms of CPU a call ({settings.LLM_HTTP_TRANSPORT}); "
             f"runners: {f'{RUNNERS} runagents processes' if settings.SCALE_OUT else 'the embedded scheduler'}, "
             f"RUNNER_CONCURRENCY={settings.RUNNER_CONCURRENCY}, DB {settings.DATABASES['default']['ENGINE'].rsplit('.', 1)[-1]}"
             f"{machine_busy(cpu, hundred, ROUND_MACHINE.get('hundred'))}",
    )]


def machine_busy(runners: float, seconds: float, machine: dict[str, float] | None) -> str:
    """What the whole machine spent during the round, beside what its cores had: a round whose core-seconds come
    near cores x seconds is as fast as the machine allows, whatever the model's latency."""
    if not machine:
        return ""
    used = runners + machine["postgres"] + machine["server"] + machine["own"]
    cores = os.cpu_count() or 1
    return (f"; the machine during the round: runners {runners:.2f} + PostgreSQL {machine['postgres']:.2f} + model "
            f"server {machine['server']:.2f} + this process {machine['own']:.2f} = {used:.2f} core-seconds of the "
            f"{cores * seconds:.2f} its {cores} cores had ({100 * used / (cores * seconds):.0f} %)")


def table_rows() -> dict[str, int]:
    from agents.models import Experience, LLMCall
    from planning.models import PlanEvent

    return {"experiences": Experience.objects.count(),
            "model calls": LLMCall.objects.count(), "events": PlanEvent.objects.count()}


def rows_age_and_prune() -> dict[str, int]:
    """Move every row's time back past the longest RETAIN_* window, prune as a runner does, count what stays."""
    from agents.models import Experience, LLMCall
    from planning.models import PlanEvent
    from runtime.retention import retention_prune

    longest = max(settings.RETAIN_EXPERIENCES_HOURS, settings.RETAIN_LLM_BODIES_HOURS,
                  settings.RETAIN_LLM_CALLS_HOURS, settings.RETAIN_EVENTS_HOURS)
    age = timedelta(hours=longest + 1)
    Experience.objects.update(created_at=F("created_at") - age)
    LLMCall.objects.update(created_at=F("created_at") - age)
    PlanEvent.objects.update(created_at=F("created_at") - age)
    retention_prune()
    return table_rows()


def bench_rows() -> list[dict]:
    """Two equal rounds of persona cycles. Round one fills the tables; aged and pruned, what stays is the
    floor a running demo keeps (e.g. the events of plans still open). Round two adds as many rows again:
    without retention all of them stay (the baseline); with it, the growth over the floor is what the
    product keeps for good per agent-hour (an open plan's events go once it closes)."""
    from agents.models import Agent, Need
    from runtime.embedded import Scheduler

    for i in range(PERSONA_AGENTS):
        agent = Agent.objects.create(name=f"rows-{i}", kind=Agent.Kind.PERSONA, cycle_interval=0)
        Need.objects.bulk_create([Need(agent=agent, name=n, satisfaction=0.5, decay_per_hour=0.05)
                                  for n in ("hunger", "energy", "social", "money", "fun")])
    asyncio.run(Scheduler(runner_id="bench-rows-1", cycles=PERSONA_CYCLES, prune_seconds=0).run())
    floor = rows_age_and_prune()
    second = Scheduler(runner_id="bench-rows-2", cycles=PERSONA_CYCLES, prune_seconds=0)
    asyncio.run(second.run())
    added = {k: n - floor[k] for k, n in table_rows().items()}
    kept = {k: n - floor[k] for k, n in rows_age_and_prune().items()}
    agent_hours = sum(second.done.values()) * DEFAULT_CYCLE_SECONDS / 3600
    without = sum(added.values()) / agent_hours
    with_retention = max(0, sum(kept.values())) / agent_hours
    per_kind = ", ".join(f"{k} {added[k] / agent_hours:,.0f} -> {kept[k] / agent_hours:,.0f}" for k in added)
    return [figure(
        "rows_per_agent_hour", with_retention, "rows", baseline=without, baseline_name="the same cycles, retention off",
        goal="bounded by settings: <= 0.05x (issue measured 8,895 without)", passed=with_retention <= 0.05 * without,
        note=f"rows kept for good per agent-hour once past the RETAIN_* windows, {sum(second.done.values())} persona "
             f"cycles at {DEFAULT_CYCLE_SECONDS:g} s each; per kind without -> with: {per_kind}",
    )]


def figures() -> list[dict]:
    return [*bench_round(), *bench_rows()]
