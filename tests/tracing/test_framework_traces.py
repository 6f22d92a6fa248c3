"""The client's agent and the dashboard share a trace (docs/tracing.md): an agent built with LangGraph or the OpenAI
Agents SDK traces its own run with OpenTelemetry and talks to the dashboard through the Python client's adapters;
the dashboard (a real server process, export on) and the agent both send their spans to one OTLP/HTTP receiver on
loopback, which then holds ONE trace: the agent's run, and under it the dashboard's lineage (the wait for the
operator with the decision, the step run), with correct parent links across both. No network: the model is a
local stand-in (tests/llm_server.py)."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any, TypedDict

import pytest

from tests.api.conftest import (
    CLIENT_PATH,
    OPERATOR_LOGIN,
    TOOLS,
    LiveServer,
    Operator,
    eventually,
    live_server,
)
from tests.api.test_framework_adapters import MAILER, awaiting_step
from tests.llm_server import LLMTestServer, answer, tool_call
from tests.tracing.conftest import OtlpReceiver, Received

pytestmark = pytest.mark.timeout(300)

from planner_client import Client  # noqa: E402  (from clients/python, put on the path by tests/api/conftest)


@pytest.fixture(scope="module")
def otlp() -> Iterator[OtlpReceiver]:
    with OtlpReceiver() as receiver:
        yield receiver


@pytest.fixture(scope="module")
def traced_server(request: pytest.FixtureRequest, otlp: OtlpReceiver) -> Iterator[LiveServer]:
    """The dashboard with export on, to the receiver (its batches sent within a tenth of a second)."""
    with live_server(request, "traces", OTEL_EXPORTER_OTLP_ENDPOINT=otlp.url, OTEL_BSP_SCHEDULE_DELAY="100") as server:
        yield server


def operator_deciding(server: LiveServer, token: str, *decisions: tuple[str, str]) -> threading.Thread:
    """An operator on the dashboard, in a thread: each step that comes up for approval decided in turn
    (("approve", ""), or ("decline", feedback))."""

    def decide() -> None:
        operator = Operator(server.url)
        decided: set[int] = set()
        with Client(server.url, token) as watcher:
            for verb, feedback in decisions:
                step = eventually(lambda: (s := awaiting_step(watcher)) and s["id"] not in decided and s,
                                  what=f"a step to {verb}")
                operator.post(f"/steps/{step['id']}/{verb}/", {"feedback": feedback} if feedback else None)
                decided.add(step["id"])
        operator.close()

    thread = threading.Thread(target=decide, daemon=True)
    thread.start()
    return thread


def joint_trace(otlp: OtlpReceiver, *, agent_service: str, agent_root: str, dashboard_agent: str,
                lineages: int = 1) -> tuple[Received, list[Received]]:
    """The agent's root span and every span of its trace, once the dashboard's lineages ended there (their root
    spans come with the lineage's end)."""
    [root] = [r for r in otlp.spans() if r.service == agent_service and r.span.name == agent_root]

    def spans() -> list[Received]:
        found = [r for r in otlp.spans() if r.trace_id == root.trace_id]
        roots = [r for r in found if r.span.name == f"invoke_agent {dashboard_agent}"]
        return found if len(roots) == lineages else []

    return root, eventually(spans, what="the dashboard's spans in the agent's trace")


def named(spans: list[Received], service: str, name: str) -> list[Received]:
    return [r for r in spans if r.service == service and r.span.name == name]


def value(any_value: Any) -> Any:
    """An OTLP attribute's value as Python's."""
    return getattr(any_value, any_value.WhichOneof("value"))


def attributes(span: Received) -> dict[str, Any]:
    return {a.key: value(a.value) for a in span.span.attributes}


def events(span: Received) -> dict[str, dict[str, Any]]:
    return {e.name: {a.key: value(a.value) for a in e.attributes} for e in span.span.events}


def assert_one_tree(root: Received, spans: list[Received]) -> None:
    """One trace, one root (the agent's run), every other span's parent in it: nothing orphaned."""
    ids = {r.span_id for r in spans}
    assert [r for r in spans if not r.parent_id] == [root]
    assert all(r.parent_id in ids for r in spans if r.span_id != root.span_id)


class Mail(TypedDict, total=False):
    sent: bool


def test_a_langgraph_agent_and_the_dashboard_share_one_trace(traced_server: LiveServer, otlp: OtlpReceiver) -> None:
    from langgraph.checkpoint.memory import InMemorySaver
    from langgraph.graph import END, START, StateGraph
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from planner_client.langgraph import GraphApprovals

    # The agent's own tracing, in this process, to the same receiver as the dashboard's.
    provider = TracerProvider(resource=Resource.create({"service.name": "graph-agent"}))
    provider.add_span_processor(SimpleSpanProcessor(OTLPSpanExporter(endpoint=f"{otlp.url}/v1/traces")))
    tracer = provider.get_tracer("graph-agent")
    token = traced_server.token("Traced graph", "--policy", "permission")

    def send_email(to: str, body: str) -> str:
        with tracer.start_as_current_span("execute_tool send_email"):
            return f"sent to {to}"

    with Client(traced_server.url, token) as client:
        approvals = GraphApprovals(client, tools=TOOLS, wait=5)

        def send(state: Mail) -> Mail:
            return {"sent": approvals.call("send_email", {"to": "dana@example.com", "body": "Q3"},
                                           run=send_email).approved}

        builder = StateGraph(Mail)
        builder.add_node("send", send)
        builder.add_edge(START, "send")
        builder.add_edge("send", END)
        graph = builder.compile(checkpointer=InMemorySaver())
        deciding = operator_deciding(traced_server, token, ("approve", ""))
        with tracer.start_as_current_span("invoke_agent Graph"):
            state = approvals.invoke(graph, {}, {"configurable": {"thread_id": "traced"}})
        deciding.join(60)
    provider.shutdown()
    assert state == {"sent": True}

    root, spans = joint_trace(otlp, agent_service="graph-agent", agent_root="invoke_agent Graph",
                              dashboard_agent="Traced graph")
    assert_one_tree(root, spans)
    [dashboard] = named(spans, "agent-planner", "invoke_agent Traced graph")
    assert dashboard.parent_id == root.span_id  # the dashboard's lineage inside the agent's run
    # The plan went on by the agent's policy; its step waited for the operator, who approved it.
    [plan_wait, wait] = sorted(named(spans, "agent-planner", "await_approval"), key=lambda r: "planner.step.key" in
                               attributes(r))
    assert "decided_by_policy" in events(plan_wait)
    [ran] = named(spans, "agent-planner", "execute_tool send_email")
    assert plan_wait.parent_id == wait.parent_id == ran.parent_id == dashboard.span_id
    assert events(wait)["approved"]["planner.operator"] == OPERATOR_LOGIN[0]
    [tool] = named(spans, "graph-agent", "execute_tool send_email")  # the agent's own span of the call it ran
    assert tool.parent_id == root.span_id
    assert wait.span.end_time_unix_nano <= tool.span.start_time_unix_nano  # it ran once the operator approved


def test_an_openai_agents_sdk_agent_and_the_dashboard_share_one_trace(
        traced_server: LiveServer, otlp: OtlpReceiver, tmp_path: Path) -> None:
    token = traced_server.token("Traced mailer", "--policy", "permission")
    with LLMTestServer() as llm:  # the stand-in model: a call declined, the revised call approved, the answer
        llm.script("model-traced", tool_call("send_email", {"to": "dana@example.com", "body": "Q3"}, call_id="call_1"),
                   tool_call("send_email", {"to": "dana@example.com", "body": "Q3 summary"}, call_id="call_2"),
                   answer("Sent the summary to Dana."))
        env = {k: v for k, v in os.environ.items() if not k.startswith(("OPENAI_", "DJANGO_", "DATABASE_", "REDIS_",
                                                                        "OTEL_"))}
        # The SDK's own exporter, pointed at the receiver by the standard variable (it appends /v1/traces).
        env |= {"PLANNER_URL": traced_server.url, "PLANNER_TOKEN": token, "OPENAI_BASE_URL": llm.base_url,
                "MODEL": "model-traced", "PYTHONPATH": str(CLIENT_PATH), "OTEL_EXPORTER_OTLP_ENDPOINT": otlp.url}
        deciding = operator_deciding(traced_server, token, ("decline", "Only the summary, no figures"),
                                     ("approve", ""))
        agent = subprocess.run([sys.executable, str(MAILER)], env=env, cwd=tmp_path, capture_output=True, text=True,
                               timeout=180)
        deciding.join(60)
    assert agent.returncode == 0, agent.stdout + agent.stderr
    assert '"sent": [{"to": "dana@example.com", "body": "Q3 summary"}]' in agent.stdout

    root, spans = joint_trace(otlp, agent_service="mailer", agent_root="invoke_agent Mailer",
                              dashboard_agent="Traced mailer")
    assert_one_tree(root, spans)
    [dashboard] = named(spans, "agent-planner", "invoke_agent Traced mailer")
    assert dashboard.parent_id == root.span_id
    # The decline and the revised call are one lineage: two versions, each step's wait under the dashboard's root.
    assert attributes(dashboard)["planner.versions"] == 2 and attributes(dashboard)["planner.outcome"] == "completed"
    waits = [w for w in named(spans, "agent-planner", "await_approval") if "planner.step.key" in attributes(w)]
    assert len(waits) == 2 and all(w.parent_id == dashboard.span_id for w in waits)
    acts = {name: act for w in waits for name, act in events(w).items()}
    assert acts["declined"]["planner.feedback"] == "Only the summary, no figures"
    assert acts["approved"]["planner.channel"] == "dashboard"
    [ran] = named(spans, "agent-planner", "execute_tool send_email")
    [tool] = named(spans, "mailer", "execute_tool send_email")  # the SDK ran the approved call, in the agent's trace
    assert ran.parent_id == dashboard.span_id and tool.parent_id == root.span_id
    assert max(w.span.end_time_unix_nano for w in waits) <= tool.span.start_time_unix_nano


def test_without_tracing_the_agent_sends_no_traceparent_and_the_dashboard_starts_its_own_trace(
        traced_server: LiveServer, otlp: OtlpReceiver) -> None:
    from planner_client.approvals import ApprovalDesk

    token = traced_server.token("Untraced agent", "--policy", "permission")
    deciding = operator_deciding(traced_server, token, ("approve", ""))
    with Client(traced_server.url, token) as client:
        client.declare_tools(TOOLS)
        desk = ApprovalDesk(client, goal="Mail the report", wait=5)
        decision = desk.ask_call("send_email", {"to": "dana@example.com", "body": "Q3"})  # outside any span
        assert decision.approved and decision.step_id is not None
        desk.report(decision.step_id, "sent")
        deciding.join(60)
        [plan] = client.plans()

    [dashboard] = eventually(lambda: [r for r in otlp.spans() if r.span.name == "invoke_agent Untraced agent"],
                             what="the dashboard's own trace")
    assert dashboard.parent_id == ""  # its own trace, not a child of any agent's span
    assert plan["status"] == "completed"

