"""The fault suite for runners: real `runagents` processes (workers of the job engine) on this run's own
PostgreSQL test database, killed, cut off from the database and stopped, each test bounded in time on loopback.

A storm of SIGKILLs must leave no cycle run twice, no tool step run twice, no plan stuck in "validating", and
every agent moving; a runner whose database connections are terminated, or whose database refuses connections
for a while, carries on when it can; a runner stopped with SIGTERM finishes its cycles under way and leaves,
and the others go on with its agents at once, long before it would have been found dead.
"""

from __future__ import annotations

import contextlib
import random
import signal
import subprocess
import time
from collections import Counter
from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path

import pytest
from django.conf import settings
from django.db import connection
from django.utils import timezone

from agents.models import Agent
from planning.models import Plan, PlanEvent, PlanStep
from runtime.cycle import INTERRUPTED_UNKNOWN
from tests.factories import AgentFactory, GoalFactory
from tests.runners import personas, runagents, runner_env

pytestmark = [
    pytest.mark.skipif(
        "postgresql" not in settings.DATABASES["default"]["ENGINE"],
        reason="fault suite: needs PostgreSQL (connections to terminate, a server to refuse them); "
               "it runs in the scale-out pass of `make test`",
    ),
    pytest.mark.django_db(transaction=True),
]

STORM_SECONDS = 40
TOOL_STEPS = 30


def wait_until(condition: Callable[[], bool], *, timeout: float, what: str, log: Path | None = None) -> None:
    """Wait for `condition`; on giving up, say what was awaited, with the runner's `log` and its jobs."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() >= deadline:
            detail = "" if log is None else f"\njobs: {jobs_listed()}\nrunner log:\n{log.read_text()[-6000:]}"
            raise AssertionError(f"gave up after {timeout:.0f} s waiting for {what}{detail}")
        time.sleep(0.2)


def jobs_listed() -> list[tuple[str, str, str | None, int | None]]:
    from procrastinate.contrib.django.models import ProcrastinateJob

    return list(ProcrastinateJob.objects.values_list("task_name", "status", "lock", "worker_id"))


def workers_live(within: float = 3.0) -> int:
    from procrastinate.contrib.django.models import ProcrastinateWorker

    return ProcrastinateWorker.objects.filter(last_heartbeat__gte=timezone.now() - timedelta(seconds=within)).count()


def jobs_doing() -> int:
    from procrastinate.contrib.django.models import ProcrastinateJob

    return ProcrastinateJob.objects.filter(status="doing").count()


def jobs_doing_of_gone_workers() -> int:
    from procrastinate.contrib.django.models import ProcrastinateJob, ProcrastinateWorker

    live = ProcrastinateWorker.objects.filter(last_heartbeat__gte=timezone.now() - timedelta(seconds=3))
    return ProcrastinateJob.objects.filter(status="doing").exclude(worker_id__in=live.values("id")).count()


def tool_agent_story(agent: Agent, plan: Plan) -> str:
    """What became of a tool agent and its plan, for a failure's message."""
    agent.refresh_from_db()
    plan.refresh_from_db()
    steps = Counter(plan.steps.values_list("status", flat=True))
    events = list(PlanEvent.objects.filter(plan__agent=agent).order_by("created_at", "id")
                  .values_list("plan_id", "kind", "step__key", "actor_label", "reason")[:40])
    plans = list(Plan.objects.filter(agent=agent).values_list("pk", "version", "status", "failure_reason"))
    return (f"agent {agent.pk} {agent.status}, {agent.cycle_count} cycles; plan {plan.pk} {plan.status} "
            f"{plan.failure_reason!r}; steps {dict(steps)}; its plans {plans}; events {events}; "
            f"jobs {[j for j in jobs_listed() if j[2] == f'agent:{agent.pk}']}")


def cycles_of(agents: list[Agent]) -> dict[int, int]:
    return dict(Agent.objects.filter(pk__in=[a.pk for a in agents]).values_list("pk", "cycle_count"))


def other_backends(sql: str) -> None:
    """Run `sql` (with `{where}`) on every other connection to this test database: the runners' ones."""
    with connection.cursor() as cursor:
        cursor.execute(sql.format(where="datname = current_database() AND pid <> pg_backend_pid()"))


def terminate_runner_connections() -> None:
    other_backends("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE {where}")


@contextlib.contextmanager
def database_refusing_connections() -> Iterator[None]:
    """This run's test database refuses new connections (as during a restart) until the block ends;
    other databases on the server are untouched. Said from the server's maintenance database."""
    import psycopg

    db = connection.settings_dict
    with psycopg.connect(host=db["HOST"], port=db["PORT"] or 5432, user=db["USER"], password=db["PASSWORD"] or None,
                         dbname="postgres", autocommit=True) as admin:
        admin.execute(f'ALTER DATABASE "{db["NAME"]}" ALLOW_CONNECTIONS false')
        try:
            yield
        finally:
            admin.execute(f'ALTER DATABASE "{db["NAME"]}" ALLOW_CONNECTIONS true')


@pytest.fixture
def runners() -> Iterator[list[subprocess.Popen[str]]]:
    """Every runner a test starts; whatever is still running at the end is killed."""
    procs: list[subprocess.Popen[str]] = []
    yield procs
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
        proc.wait(timeout=10)


def tool_agent_with_plan(n_steps: int, workspace_note: str) -> tuple[Agent, Plan]:
    """A tool agent with an approved plan of sequential steps, each appending its own line to log.txt."""
    agent = AgentFactory(kind=Agent.Kind.TOOL, cycle_interval=0.3)
    goal = GoalFactory(agent=agent, description=f"Write the log ({workspace_note})", source_needs=[])
    plan = Plan.objects.create(agent=agent, goal=goal, goal_text=goal.description, status=Plan.Status.ACTIVE,
                               approval_mode=Plan.ApprovalMode.ALL)
    PlanStep.objects.bulk_create([
        PlanStep(plan=plan, key=str(i), position=i, description=f"line {i}", tool="file.append",
                 tool_input={"path": "log.txt", "content": f"line {i}\n"}, depends_on=[str(i - 1)] if i > 1 else [])
        for i in range(1, n_steps + 1)
    ])
    return agent, plan


def tool_agents_to_plan(n: int, server: object) -> list[Agent]:
    """Tool agents with a goal to plan through the scripted server, whose restatement takes seconds: their start
    passes are under way when runners die."""
    from tests.llm_server import answer

    restate = '<json>{"who": "Storm", "what": "list", "when": "now", "where": "here", "why": "asked"}</json>'
    plan_text = ('<json>{"goal": "List", "steps": [{"id": "1", "tool": "file.list", "intent": "List the files", '
                 '"input": {"path": "."}, "requiresPermission": false}]}</json>')
    server.script("storm-fast", *[answer(restate, delay=2.5) for _ in range(20 * n)])  # type: ignore[attr-defined]
    server.script("storm-planner", *[answer(plan_text) for _ in range(20 * n)])  # type: ignore[attr-defined]
    agents = []
    for i in range(n):
        agent = AgentFactory(kind=Agent.Kind.TOOL, cycle_interval=0.5, name=f"Storm planner {i}",
                             planner_models="storm-planner", plan_retry_backoff=1)
        GoalFactory(agent=agent, description="List the workspace", source_needs=[])
        agents.append(agent)
    return agents


def test_kill_storm_loses_nothing_and_doubles_nothing(tmp_path: Path, runners: list[subprocess.Popen[str]],
                                                      llm_server: object) -> None:
    people = personas(45, cycle_interval=3.0)
    tools = [tool_agent_with_plan(TOOL_STEPS, f"agent {i}") for i in range(15)]
    planners = tool_agents_to_plan(8, llm_server)
    every = people + [agent for agent, _plan in tools] + planners
    # The persona agents think offline; the planners restate through the scripted server (their own planner
    # chain too), and cycle at their interval while their plans wait (the final runner's cycle comes at once).
    env = runner_env(tmp_path, RUNNER_TICK_SECONDS="0.2", DB_POOL_MAX_SIZE="4", RUNNER_WAITING_SECONDS="0",
                     OPENAI_BASE_URL=llm_server.base_url, OPENAI_API_KEY="k",  # type: ignore[attr-defined]
                     PLANNER_MODELS="offline-rules", FAST_MODELS="offline-rules", RESTATE_MODELS="storm-fast")
    logs: list[Path] = []

    def start(slot: int, generation: int) -> subprocess.Popen[str]:
        log = tmp_path / f"runner-{slot}-{generation}.log"
        logs.append(log)
        proc = runagents(env, "--runner-id", f"storm-{slot}-{generation}", log=log)
        runners.append(proc)
        return proc

    slots = {slot: start(slot, 0) for slot in range(3)}
    rng = random.Random(9)
    kills = 0
    ends = time.monotonic() + STORM_SECONDS
    while time.monotonic() < ends:
        time.sleep(rng.uniform(3.0, 5.0))
        slot = rng.randrange(3)
        slots[slot].send_signal(signal.SIGKILL)
        slots[slot].wait(timeout=10)
        kills += 1
        slots[slot] = start(slot, kills)
    # A runner still importing Django has no handler yet: the last one started must be up to stop cleanly.
    wait_until(lambda: all(f"{name} started" in log.read_text() for name, log in
                           ((f"storm-{slot}-{kills}", logs[-1]),)), timeout=60, what="the last runner started")
    for proc in slots.values():
        proc.send_signal(signal.SIGTERM)
    for proc in slots.values():
        assert proc.wait(timeout=60) == 0
    assert kills >= 8

    # One more runner drives every agent once more: the killed runners' cycles are retried, interrupted
    # planning is settled.
    time.sleep(float(env["RUNNER_STALLED_SECONDS"]) + 0.5)
    final = runagents(env, "--cycles", "1", "--runner-id", "storm-final", log=tmp_path / "final.log")
    runners.append(final)
    assert final.wait(timeout=120) == 0
    output = "".join(log.read_text() for log in [*logs, tmp_path / "final.log"])

    # Every agent moved on, tool agents through their steps.
    assert all(count > 0 for count in cycles_of(every).values())
    for agent, plan in tools:
        done = plan.steps.filter(status=PlanStep.Status.COMPLETED).count()
        # A kill between a step's mark and its effect leaves that step waiting for an operator, "outcome unknown"
        # (runtime/cycle.py steps_interrupted): the agent stops there and says so, rather than run it again. A kill
        # landing there on an agent's first step leaves it with none done.
        unknown = plan.steps.filter(status=PlanStep.Status.AWAITING_APPROVAL, error=INTERRUPTED_UNKNOWN).count()
        assert done >= 1 or unknown == 1, f"{agent} completed no step: {tool_agent_story(agent, plan)}"
        completed = Counter(PlanEvent.objects.filter(plan=plan, kind=PlanEvent.Kind.STEP_COMPLETED)
                            .values_list("step__key", flat=True))
        assert all(n == 1 for n in completed.values()), completed
        # A step cut off by a kill counts as an interrupted try (retried, or failed); no other step ran twice.
        interrupted = Counter(PlanEvent.objects.filter(
            plan=plan, kind__in=[PlanEvent.Kind.STEP_RETRIED, PlanEvent.Kind.STEP_FAILED], reason__startswith="interrupted",
        ).values_list("step__key", flat=True))
        log = Path(env["AGENT_WORKSPACES"]) / str(agent.pk) / "log.txt"
        lines = Counter(log.read_text().splitlines() if log.exists() else [])
        assert len(lines) >= done
        assert all(n <= 1 + interrupted[line.removeprefix("line ")] for line, n in lines.items()), lines
    # Every planner's goal was planned, once: planning a killed runner cut off was failed (and retried as a next
    # version), never begun again beside it.
    for agent in planners:
        firsts = Plan.objects.filter(agent=agent, previous__isnull=True)
        assert firsts.count() == 1, list(firsts.values_list("status", "failure_reason"))
    assert jobs_doing() == 0  # every cycle a killed runner had under way was retried and ended
    assert workers_live() == 0  # stopped cleanly, or killed and found dead

    # No cycle was run twice: a re-run cycle fails on the experience's unique (agent, cycle) number.
    doubled = output.count("experience_cycle_unique_per_agent")
    assert doubled == 0 and "IntegrityError" not in output, output[-3000:]
    assert "Traceback" not in output, output[-3000:]
    assert not Plan.objects.filter(status=Plan.Status.VALIDATING).exists()


def test_terminated_connections_do_not_stop_a_runner(tmp_path: Path, runners: list[subprocess.Popen[str]]) -> None:
    agents = personas(8, cycle_interval=0.2)
    proc = runagents(runner_env(tmp_path), "--runner-id", "terminated",
                     log=tmp_path / "runner.log")
    runners.append(proc)
    wait_until(lambda: all(n >= 2 for n in cycles_of(agents).values()), timeout=60, what="the first cycles")
    for _ in range(5):
        before = cycles_of(agents)
        terminate_runner_connections()
        # It carries on: every agent cycles again after each cut, and the process is still there.
        wait_until(lambda before=before: all(n > before[pk] for pk, n in cycles_of(agents).items()),
                   timeout=60, what="cycles after pg_terminate_backend", log=tmp_path / "runner.log")
        assert proc.poll() is None, (tmp_path / "runner.log").read_text()[-3000:]
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=60) == 0


def test_database_outage_is_waited_out(tmp_path: Path, runners: list[subprocess.Popen[str]]) -> None:
    agents = personas(6, cycle_interval=0.2)
    log = tmp_path / "runner.log"
    proc = runagents(runner_env(tmp_path, RUNNER_DB_RETRY_MAX_SECONDS="1"),
                     "--runner-id", "outage", log=log)
    runners.append(proc)
    wait_until(lambda: all(n >= 2 for n in cycles_of(agents).values()), timeout=60, what="the first cycles")
    with database_refusing_connections():
        terminate_runner_connections()
        time.sleep(8)  # the outage: the runner cannot connect at all
        assert proc.poll() is None, log.read_text()[-3000:]
    # It finds the database again and says so; then every agent cycles again. (A pass under way when the outage
    # began can end once the database is back, before the worker is: cycles alone do not show the worker back.)
    wait_until(lambda: "lost the database for" in log.read_text(), timeout=60,
               what="the runner to find the database again")
    during = cycles_of(agents)
    wait_until(lambda: all(n > during[pk] for pk, n in cycles_of(agents).items()), timeout=60,
               what="cycles after the database came back")
    # One warning line for the outage, said when it ended (how long, fenced), and no traceback.
    text = log.read_text()
    lines = [line for line in text.splitlines() if "lost the database for" in line]
    assert len(lines) == 1 and "fenced after" in lines[0] and "; resuming" in lines[0], text[-3000:]
    assert "Traceback" not in text and "database unreachable" not in text, text[-3000:]
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=60) == 0
    assert jobs_doing() == 0


def test_graceful_stop_hands_agents_over_at_once(
    tmp_path: Path, runners: list[subprocess.Popen[str]], llm_server: object
) -> None:
    from tests.llm_server import answer

    agents = personas(6, cycle_interval=0.2)
    planner = AgentFactory(kind=Agent.Kind.TOOL, cycle_interval=0.2, name="Slow planner", planner_models="slow-planner")
    GoalFactory(agent=planner, description="List the workspace", source_needs=[])
    restate = '<json>{"who": "Slow", "what": "list", "when": "now", "where": "here", "why": "asked"}</json>'
    plan_text = ('<json>{"goal": "List", "steps": [{"id": "1", "tool": "file.list", "intent": "List the files", '
                 '"input": {"path": "."}, "requiresPermission": false}]}</json>')
    llm_server.script("slow-fast", answer(restate, delay=8.0))  # type: ignore[attr-defined]
    llm_server.script("slow-planner", answer(plan_text))  # type: ignore[attr-defined]
    # Dead only after a minute of silence: a hand-over within seconds can only come from a clean stop.
    env = runner_env(tmp_path, RUNNER_STALLED_SECONDS="60", OPENAI_BASE_URL=llm_server.base_url,  # type: ignore[attr-defined]
                     OPENAI_API_KEY="k", PLANNER_MODELS="offline-rules", FAST_MODELS="offline-rules",
                     RESTATE_MODELS="slow-fast")  # the persona agents think offline; only the tool agent waits
    first = runagents(env, "--runner-id", "leaving", log=tmp_path / "leaving.log")
    runners.append(first)
    wait_until(lambda: len(llm_server.requests) == 1 and all(n >= 1 for n in cycles_of(agents).values()),  # type: ignore[attr-defined]
               timeout=60, what="the first runner to cycle and to wait on the model")
    second = runagents(env, "--runner-id", "staying", log=tmp_path / "staying.log")
    runners.append(second)
    wait_until(lambda: workers_live() == 2, timeout=60, what="the second runner")
    first.send_signal(signal.SIGTERM)
    # The first runner stops its call to the model at once (a stop never waits on a model), fails the planning under
    # way saying so (a failed planning is retried as any other), then leaves.
    assert first.wait(timeout=30) == 0, (tmp_path / "leaving.log").read_text()[-3000:]
    assert workers_live() == 1
    assert jobs_doing_of_gone_workers() == 0  # nothing left under way by the runner that left
    stopped = Plan.objects.get(agent=planner)
    assert stopped.status == Plan.Status.FAILED
    assert stopped.failure_reason.startswith("planning stopped before a model answered"), stopped.failure_reason
    after = cycles_of(agents)
    wait_until(lambda: all(n > after[pk] for pk, n in cycles_of(agents).items()), timeout=20,
               what="the second runner to drive every agent")
    second.send_signal(signal.SIGTERM)
    assert second.wait(timeout=30) == 0
