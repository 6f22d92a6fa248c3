"""`runagents` processes: on PostgreSQL, workers of the job engine share the agents without running one agent's
cycle twice, and a killed worker's cycles are retried by the others once its heartbeats stop; on both stacks a
runner process plans through a real OpenAI-compatible server."""

from __future__ import annotations

import signal
import time
from pathlib import Path

import pytest
from django.conf import settings

from agents.models import Agent, Experience, LLMCall
from planning.models import Plan
from tests.factories import AgentFactory, GoalFactory
from tests.runners import personas, runagents, runner_env

pytestmark = pytest.mark.django_db(transaction=True)
scale_out_only = pytest.mark.skipif(
    "postgresql" not in settings.DATABASES["default"]["ENGINE"],
    reason="several runner processes share agents on the scale-out stack only (PostgreSQL + the job engine); "
           "it runs in the scale-out pass of `make test`")


def assert_each_cycle_once(agents: list[Agent]) -> None:
    for agent in agents:
        agent.refresh_from_db()
        cycles = sorted(Experience.objects.filter(agent=agent).values_list("cycle", flat=True))
        # Each cycle of an agent happened exactly once: one cycle at a time, none lost, none doubled.
        assert cycles == list(range(1, agent.cycle_count + 1))


@scale_out_only
def test_two_runners_share_agents_without_driving_one_twice(tmp_path: Path) -> None:
    agents = personas(6)
    env = runner_env(tmp_path)
    procs = [runagents(env, "--cycles", "3", "--runner-id", f"r{i}") for i in (1, 2)]
    outputs = [p.communicate(timeout=120) for p in procs]
    for proc, (_out, err) in zip(procs, outputs, strict=True):
        assert proc.returncode == 0, err
        assert "failed" not in err, err
    assert_each_cycle_once(agents)
    assert all(agent.cycle_count >= 3 for agent in agents)


@scale_out_only
def test_killed_runner_cycles_are_retried_and_another_runner_continues(tmp_path: Path) -> None:
    agents = personas(3, cycle_interval=0.2)
    env = runner_env(tmp_path)
    doomed = runagents(env, "--runner-id", "doomed")
    deadline = time.monotonic() + 60
    while Experience.objects.filter(agent__in=agents).count() < 6:
        assert time.monotonic() < deadline, "the first runner never drove the agents"
        time.sleep(0.1)
    doomed.send_signal(signal.SIGKILL)
    doomed.communicate(timeout=10)
    before = {a.pk: Agent.objects.get(pk=a.pk).cycle_count for a in agents}
    rescuer = runagents(env, "--cycles", "2", "--runner-id", "rescuer")
    _out, err = rescuer.communicate(timeout=120)
    assert rescuer.returncode == 0, err
    assert_each_cycle_once(agents)
    for agent in agents:
        assert agent.cycle_count >= before[agent.pk] + 2


def test_runner_process_plans_with_an_openai_compatible_server(tmp_path: Path) -> None:
    """The runner in its own process, the real `openai` client, HTTP to a local model server."""
    from tests.llm_server import LLMTestServer, answer

    agent = AgentFactory(kind=Agent.Kind.TOOL, cycle_interval=0, name="Remote")
    GoalFactory(agent=agent, description="List the workspace", source_needs=[])
    restate = '<json>{"who": "Remote", "what": "list files", "when": "now", "where": "workspace", "why": "asked"}</json>'
    plan_text = ('<json>{"goal": "List the workspace", "steps": [{"id": "1", "tool": "file.list", "intent": '
                 '"List the files", "input": {"path": "."}, "requiresPermission": false}]}</json>')
    with LLMTestServer() as server:
        server.script("remote-fast", answer(restate, tokens_in=31, tokens_out=17))
        server.script("remote-planner", answer(plan_text, tokens_in=250, tokens_out=60))
        env = runner_env(tmp_path, OPENAI_BASE_URL=server.base_url, OPENAI_API_KEY="k",
                         PLANNER_MODELS="remote-planner", FAST_MODELS="remote-fast")
        proc = runagents(env, "--cycles", "1")
        _out, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err
        assert len(server.requests_for("remote-planner")) == 1
    plan = Plan.objects.get(agent=agent)
    assert plan.status == Plan.Status.AWAITING_APPROVAL and plan.model == "remote-planner"
    assert plan.who == "Remote"
    call = LLMCall.objects.get(plan=plan, purpose="plan")
    assert (call.model, call.provider, call.tokens_in, call.tokens_out) == ("remote-planner", "openai", 250, 60)


@pytest.mark.skipif("postgresql" not in settings.DATABASES["default"]["ENGINE"],
                    reason="connection pool: PostgreSQL only (SQLite has no server connections to count)")
def test_agents_waiting_for_models_hold_no_database_connection(tmp_path: Path) -> None:
    """Twelve agents wait for their models at once through a runner with two database connections."""
    from tests.llm_server import LLMTestServer, answer

    for i in range(12):
        agent = AgentFactory(kind=Agent.Kind.TOOL, cycle_interval=0, name=f"Waiting {i}")
        GoalFactory(agent=agent, description="List the workspace", source_needs=[])
    restate = '<json>{"who": "W", "what": "list", "when": "now", "where": "here", "why": "asked"}</json>'
    plan_text = ('<json>{"goal": "List", "steps": [{"id": "1", "tool": "file.list", "intent": "List the files", '
                 '"input": {"path": "."}, "requiresPermission": false}]}</json>')
    with LLMTestServer() as server:
        server.script("wait-fast", *[answer(restate, delay=1.5) for _ in range(12)])
        server.script("wait-planner", *[answer(plan_text) for _ in range(12)])
        env = runner_env(tmp_path, OPENAI_BASE_URL=server.base_url, OPENAI_API_KEY="k", DB_POOL_MAX_SIZE="2",
                         PLANNER_MODELS="wait-planner", FAST_MODELS="wait-fast")
        proc = runagents(env, "--cycles", "1")
        _out, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err
        assert server.max_in_flight == 12
    assert Plan.objects.filter(status=Plan.Status.AWAITING_APPROVAL).count() == 12
