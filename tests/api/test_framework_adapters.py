"""The client's framework adapters (clients/python: planner_client.openai_agents and .langgraph) without a browser:
how they declare tools and ask the dashboard, and what becomes of a declined call the agent gives up on.
The operator's side in Chromium is tests/browser/test_framework_agents.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any, TypedDict

import httpx
import pytest

from agents.declared_tools import tools_declaration_problems
from tests.api.conftest import CLIENT_PATH, ROOT, TOOLS, LiveServer, Operator, eventually
from tests.llm_server import LLMTestServer, answer, tool_call, tool_results

pytestmark = pytest.mark.timeout(300)

from planner_client import Client  # noqa: E402  (from clients/python, put on the path by conftest)
from planner_client.approvals import (  # noqa: E402
    WITHDRAWN,
    ApprovalDesk,
    call_intent,
    input_schema,
    needs_operator,
)

MAILER = ROOT / "tests" / "browser" / "framework_agents" / "openai_agents_mailer.py"


def test_a_tools_json_schema_is_declared_as_the_dashboard_takes_it() -> None:
    # As the OpenAI Agents SDK writes a function's parameters (pydantic: titles, anyOf for Optional, strict).
    params = {"type": "object", "title": "send_email_args", "additionalProperties": False,
              "properties": {"to": {"type": "string", "title": "To", "description": "Who gets it"},
                             "cc": {"anyOf": [{"type": "string"}, {"type": "null"}], "title": "Cc"},
                             "urgent": {"type": "boolean"}, "copies": {"type": "integer"}},
              "required": ["to", "cc", "urgent", "copies", "not_a_property"]}
    schema = input_schema(params)
    assert schema == {"type": "object", "required": ["to", "cc", "urgent", "copies"], "properties": {
        "to": {"type": "string", "description": "Who gets it"}, "cc": {"type": "string"},
        "urgent": {"type": "boolean"}, "copies": {"type": "integer"}}}
    assert tools_declaration_problems([{"name": "send_email", "input_schema": schema, "risk": "risky"}]) == []


def test_the_dashboard_decides_which_calls_wait_for_an_operator() -> None:
    tools = [{"name": "search", "risk": "safe"}, {"name": "read_file", "risk": "read"},
             {"name": "send_email", "risk": "risky"}]
    permission = {"approval_policy": "permission", "tools": tools}
    assert [needs_operator(permission, t) for t in ("search", "read_file", "send_email", "undeclared")] == [
        False, False, True, True]
    every_plan = {"approval_policy": "plan", "tools": tools}  # an operator approves each plan: every call asks
    assert needs_operator(every_plan, "search") is True


def test_a_calls_intent_names_the_tool_and_its_arguments_on_one_line() -> None:
    assert call_intent("send_email", {"to": "dana@example.com", "body": "Hi\nDana"}) == (
        'Call send_email with {"body": "Hi\\nDana", "to": "dana@example.com"}')
    assert len(call_intent("search", {"q": "x" * 1000})) == 500


@pytest.fixture
def llm() -> Any:
    with LLMTestServer() as server:
        yield server


def awaiting_step(client: Client) -> dict[str, Any] | None:
    for summary in client.plans():
        for s in client.plan(summary["id"])["steps"]:
            if s["status"] == "awaiting_approval":
                return s
    return None


def test_openai_agents_sdk_run_that_gives_up_after_a_decline_withdraws_the_call(
        live_server_process: LiveServer, web_operator: Operator, llm: LLMTestServer, tmp_path: Path) -> None:
    token = live_server_process.token("SDK quitter", "--policy", "permission")
    llm.script("model-quitter", tool_call("send_email", {"to": "dana@example.com", "body": "Q3"}, call_id="call_1"),
               answer("Understood: I will not send it."))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OPENAI_", "DJANGO_", "DATABASE_", "REDIS_"))}
    env |= {"PLANNER_URL": live_server_process.url, "PLANNER_TOKEN": token, "OPENAI_BASE_URL": llm.base_url,
            "MODEL": "model-quitter", "PYTHONPATH": str(CLIENT_PATH), "OPENAI_AGENTS_DISABLE_TRACING": "1"}
    agent = subprocess.Popen([sys.executable, str(MAILER)], env=env, cwd=tmp_path, stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True)
    try:
        with Client(live_server_process.url, token) as watcher:
            waiting = eventually(lambda: awaiting_step(watcher), what="the email to await approval")
            web_operator.post(f"/steps/{waiting['id']}/decline/", {"feedback": "Not before the board meeting"})
            output, _ = agent.communicate(timeout=120)
            assert agent.returncode == 0, output
            assert json.loads(output.strip().splitlines()[-1]) == {"final": "Understood: I will not send it.",
                                                                   "sent": []}
            assert "Not before the board meeting" in tool_results(llm.requests_for("model-quitter")[1])["call_1"]
            [plan] = watcher.plans()  # no version 2: the model did not try again; the plan is withdrawn
            assert plan["status"] == "cancelled"
            assert watcher.next(plan["id"]).reason == WITHDRAWN
    finally:
        if agent.poll() is None:
            agent.kill()


class Mail(TypedDict, total=False):
    sent: bool
    feedback: str


def test_langgraph_call_approved_runs_the_tool_and_reports_declined_returns_the_feedback(
        live_server_process: LiveServer, web_operator: Operator) -> None:
    from langgraph.checkpoint.memory import InMemorySaver
    from langgraph.graph import END, START, StateGraph
    from planner_client.langgraph import GraphApprovals

    token = live_server_process.token("Graph unit", "--policy", "permission")
    sent: list[str] = []

    def send_email(to: str, body: str) -> str:
        sent.append(to)
        return f"sent to {to}"

    with Client(live_server_process.url, token) as client:
        approvals = GraphApprovals(client, tools=TOOLS, wait=5)

        def first(state: Mail) -> Mail:
            outcome = approvals.call("send_email", {"to": "dana@example.com", "body": "Q3"}, run=send_email)
            return {"sent": outcome.approved}

        def second(state: Mail) -> Mail:
            outcome = approvals.call("send_email", {"to": "all@example.com", "body": "Q3"}, run=send_email)
            return {"feedback": outcome.feedback}

        builder = StateGraph(Mail)
        builder.add_node("first", first)
        builder.add_node("second", second)
        builder.add_edge(START, "first")
        builder.add_edge("first", "second")
        builder.add_edge("second", END)
        graph = builder.compile(checkpointer=InMemorySaver())

        def operator() -> None:
            approve = eventually(lambda: awaiting_step(client), what="the first email to await approval")
            web_operator.post(f"/steps/{approve['id']}/approve/")
            decline = eventually(lambda: (s := awaiting_step(client)) and s["id"] != approve["id"] and s,
                                 what="the second email to await approval")
            web_operator.post(f"/steps/{decline['id']}/decline/", {"feedback": "Only Dana, please"})

        deciding = threading.Thread(target=operator)
        deciding.start()
        state = approvals.invoke(graph, {}, {"configurable": {"thread_id": "unit"}})
        deciding.join()
        assert state == {"sent": True, "feedback": "Only Dana, please"}
        assert sent == ["dana@example.com"]  # the declined call never ran, the approved one ran once
        second_plan, first_plan = client.plans()
        assert client.plan(first_plan["id"])["steps"][0]["result"] == "sent to dana@example.com"
        assert (first_plan["status"], second_plan["status"]) == ("completed", "cancelled")  # withdrawn at the end


class FakeApi:
    """The API as the desk sees it, in memory: every call's plan is declined at once with the same feedback."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str]] = []
        self.plans = 0

    def handle(self, request: httpx.Request) -> httpx.Response:
        path = request.url.path.removeprefix("/api/v1")
        self.calls.append((request.method, path))
        if request.method == "POST" and b'"nope"' in request.content:
            return httpx.Response(422, json={"detail": "The plan is not valid. Nothing was stored.",
                                             "problems": ["step 1: unknown tool 'nope'; did you mean: search?"]})
        if request.method == "POST" and (path == "/plans" or path.endswith("/versions")):
            self.plans += 1
            return httpx.Response(201, json={"id": self.plans, "version": 1, "status": "active"})
        if path.endswith("/next"):
            return httpx.Response(200, json={"action": "replan", "reason": "step 1 declined: no",
                                             "feedback": "no", "kept": []})
        if path.endswith("/cancel"):
            return httpx.Response(200, json={"id": int(path.split("/")[2]), "version": 1, "status": "cancelled"})
        return httpx.Response(404, json={"detail": "not here"})


def test_a_call_after_a_decline_revises_it_calls_beside_it_do_not_and_the_rest_are_withdrawn() -> None:
    api = FakeApi()
    with Client("http://planner.test", "apt_x", transport=httpx.MockTransport(api.handle)) as client:
        desk = ApprovalDesk(client, goal="Mail the report", wait=0)
        first = desk.ask_call("send_email", {"to": "dana@example.com"})
        beside = desk.ask_call("send_email", {"to": "sam@example.com"}, revise=False)  # the same batch
        assert (first.approved, first.feedback, beside.plan_id) == (False, "no", 2)
        later = desk.ask_call("send_email", {"to": "finance@example.com"})  # the model's next try
        desk.close()
    posts = [call for call in api.calls if call[0] == "POST"]
    assert posts == [("POST", "/plans"), ("POST", "/plans"), ("POST", "/plans/1/versions"),
                     ("POST", "/plans/2/cancel"), ("POST", "/plans/3/cancel")]
    assert later.plan_id == 3


def test_a_call_the_dashboard_refuses_is_declined_with_the_validators_problems() -> None:
    api = FakeApi()
    with Client("http://planner.test", "apt_x", transport=httpx.MockTransport(api.handle)) as client:
        desk = ApprovalDesk(client, goal="Look it up", wait=0)
        decision = desk.ask_call("nope", {"q": "x"})
        plan = desk.ask_plan("Look it up", [{"id": "1", "tool": "nope", "intent": "x", "input": {},
                                             "requiresPermission": False}])
        desk.close()
    problem = "The dashboard refused it as not valid: step 1: unknown tool 'nope'; did you mean: search?"
    assert (decision.approved, decision.plan_id, decision.feedback) == (False, None, problem)
    assert (plan.approved, plan.plan_id, plan.feedback) == (False, None, problem)
    assert [c for c in api.calls if c[1].endswith(("/next", "/cancel"))] == []  # nothing stored, nothing to wait on
