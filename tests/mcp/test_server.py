"""The MCP endpoint at /mcp, spoken to with the official SDK's own client over streamable HTTP (in process, through
the project's ASGI application and its guards): who may connect, and what each tool accepts, refuses and changes."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from typing import Any

import httpx2
import pytest
from asgiref.sync import sync_to_async
from django.core.cache import cache
from django.db import connection
from django.test import Client
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client
from mcp_types import CallToolResult

from agents.models import Agent, AgentToken, ApiRequest
from planner_site.asgi import application
from planning import api as api_module
from planning import services
from planning.models import Plan, PlanEvent, PlanStep
from tests.api.conftest import PLAN, TOOLS, step
from tests.factories import UserFactory

pytestmark = pytest.mark.django_db(transaction=True)

BASE = "http://testserver"
INITIALIZE = {"jsonrpc": "2.0", "id": 1, "method": "initialize",
              "params": {"protocolVersion": "2025-06-18", "capabilities": {},
                         "clientInfo": {"name": "tests", "version": "1"}}}
MCP_HEADERS = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}


@pytest.fixture(autouse=True)
def rate_counters_cleared() -> None:
    cache.clear()


def agent_with_token(name: str = "MCP bot", *, tools: bool = True, kind: str = Agent.Kind.EXTERNAL,
                     policy: str = Agent.ApprovalPolicy.PLAN) -> str:
    agent = Agent.objects.create(name=name, kind=kind, declared_tools=TOOLS if tools else [], approval_policy=policy)
    return AgentToken.issue(agent=agent, label="tests")[1]


def setup(**kwargs: Any) -> str:
    try:
        return agent_with_token(**kwargs)
    finally:
        connection.close()


@contextlib.asynccontextmanager
async def mcp_session(raw: str) -> AsyncIterator[ClientSession]:
    """The SDK's client, with the agent's token on the HTTP client it is given, against the ASGI application."""
    async with (httpx2.AsyncClient(transport=httpx2.ASGITransport(app=application), base_url=BASE,
                                   headers={"Authorization": f"Bearer {raw}"}, timeout=60) as http,
                streamable_http_client(f"{BASE}/mcp", http_client=http) as (read, write),
                ClientSession(read, write) as session):
        await session.initialize()
        yield session


async def raw_post(headers: dict[str, str], body: Any = INITIALIZE, *, content: bytes | None = None) -> httpx2.Response:
    async with httpx2.AsyncClient(transport=httpx2.ASGITransport(app=application), base_url=BASE) as http:
        return await http.post("/mcp", headers=MCP_HEADERS | headers,
                               content=content if content is not None else json.dumps(body).encode())


def text(result: CallToolResult) -> str:
    return "\n".join(getattr(block, "text", "") for block in result.content)


def ok(result: CallToolResult) -> dict[str, Any]:
    assert not result.is_error, text(result)
    assert result.structured_content is not None
    return result.structured_content


def db(fn: Any) -> Any:
    """A sync check of the database from the async test, on a thread of its own that closes its connection."""

    def run(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        finally:
            connection.close()

    return sync_to_async(run, thread_sensitive=False)


@db
def counts() -> tuple[int, int, int]:
    return Plan.objects.count(), PlanEvent.objects.count(), ApiRequest.objects.count()


@db
def operator_approves_plan(plan_id: int) -> None:
    operator = UserFactory(username="olga", role="operators")
    services.plan_approve(plan=Plan.objects.get(pk=plan_id), user=operator, mode=Plan.ApprovalMode.ALL)


@db
def operator_decides_step(step_id: int, *, feedback: str = "") -> None:
    operator = UserFactory(username=f"olga{step_id}", role="operators")
    step_row = PlanStep.objects.get(pk=step_id)
    if feedback:
        services.step_decline(step=step_row, user=operator, feedback=feedback)
    else:
        services.step_approve(step=step_row, user=operator)


# --- who may connect ----------------------------------------------------------------------------------------


@db
def revoked_token() -> str:
    raw = agent_with_token("Revoked bot")
    AgentToken.objects.filter(agent__name="Revoked bot").update(revoked_at=Agent.objects.first().created_at)  # type: ignore[union-attr]
    return raw


@pytest.mark.parametrize("authorization", [None, "Bearer apt_wrong", "Basic dXNlcjpwYXNz", "Bearer ", "revoked"])
async def test_a_missing_unknown_or_revoked_token_gets_401_and_nothing_else(authorization: str | None) -> None:
    if authorization == "revoked":
        authorization = f"Bearer {await revoked_token()}"
    response = await raw_post({"Authorization": authorization} if authorization else {})
    assert response.status_code == 401
    assert response.headers["www-authenticate"] == "Bearer"
    assert response.json() == {"detail": "Missing, unknown or revoked token: send 'Authorization: Bearer <token>'."}
    assert "mcp-session-id" not in response.headers


@pytest.mark.parametrize("method", ["GET", "DELETE"])
async def test_only_post_is_served_the_server_keeps_no_stream_or_session(method: str) -> None:
    raw = await db(agent_with_token)()
    async with httpx2.AsyncClient(transport=httpx2.ASGITransport(app=application), base_url=BASE) as http:
        response = await http.request(method, "/mcp", headers={"Authorization": f"Bearer {raw}",
                                                               "Accept": "text/event-stream"})
        anonymous = await http.request(method, "/mcp")
    assert (response.status_code, response.headers["allow"]) == (405, "POST")
    assert anonymous.status_code == 401  # a missing token is told only that


async def test_the_token_of_a_persona_is_refused() -> None:
    raw = await db(agent_with_token)("Persona", kind=Agent.Kind.PERSONA)
    response = await raw_post({"Authorization": f"Bearer {raw}"})
    assert response.status_code == 403
    assert "not an external agent" in response.json()["detail"]


async def test_a_host_not_allowed_is_refused() -> None:
    raw = await db(agent_with_token)()
    response = await raw_post({"Authorization": f"Bearer {raw}", "Host": "evil.example"})
    assert response.status_code == 400
    assert "ALLOWED_HOSTS" in response.json()["detail"]


async def test_a_body_over_the_api_limit_is_refused_before_it_is_read(settings: Any) -> None:
    settings.API_MAX_BODY_BYTES = 1000
    raw = await db(agent_with_token)()
    response = await raw_post({"Authorization": f"Bearer {raw}"}, content=b"{" + b" " * 2000 + b"}")
    assert response.status_code == 413
    assert "too large" in response.json()["detail"]


async def test_requests_count_against_the_tokens_api_rate(settings: Any) -> None:
    settings.API_RATE_LIMIT = "2/m"
    raw = await db(agent_with_token)()
    statuses = [(await raw_post({"Authorization": f"Bearer {raw}"})).status_code for _ in range(3)]
    assert statuses == [200, 200, 429]


async def test_a_valid_token_connects_and_lists_the_tools_with_typed_schemas() -> None:
    raw = await db(agent_with_token)()
    async with mcp_session(raw) as session:
        tools = {t.name: t for t in (await session.list_tools()).tools}
    assert set(tools) == {"declare_tools", "submit_plan", "wait_for_decision", "report_step_start",
                          "report_step_result", "submit_version", "get_plan"}
    plan_schema = tools["submit_plan"].input_schema
    assert plan_schema["required"] == ["goal", "steps"]
    step_schema = plan_schema["$defs"]["StepIn"]
    assert {"id", "tool", "intent", "requiresPermission"} <= set(step_schema["required"])
    wait = tools["wait_for_decision"].input_schema["properties"]["timeout_seconds"]
    assert (wait["type"], wait["maximum"]) == ("number", api_module.LONG_POLL_MAX_SECONDS)
    assert tools["report_step_result"].input_schema["properties"]["succeeded"]["type"] == "boolean"


# --- submit_plan --------------------------------------------------------------------------------------------


async def test_declare_tools_then_submit_a_plan_recorded_like_any_agents() -> None:
    raw = await db(agent_with_token)(tools=False)
    async with mcp_session(raw) as session:
        refused = await session.call_tool("submit_plan", PLAN)
        assert refused.is_error and "Declare your tools first" in text(refused)
        assert ok(await session.call_tool("declare_tools", {"tools": TOOLS}))["tools"][0]["name"] == "search"
        created = ok(await session.call_tool("submit_plan", PLAN))
    assert (created["version"], created["status"]) == (1, "awaiting_approval")  # the agent's policy: plan approval

    @db
    def stored() -> tuple[str, list[str], list[tuple[str, str]]]:
        plan = Plan.objects.get(pk=created["id"])
        return (plan.goal_text, list(plan.steps.values_list("key", flat=True)),
                list(plan.events.values_list("kind", "actor_label")))

    goal, keys, events = await stored()
    assert (goal, keys) == (PLAN["goal"], ["1", "2", "3"])
    assert (PlanEvent.Kind.CREATED, "MCP bot (MCP)") in events


async def test_a_plan_the_validator_refuses_returns_its_reasons_and_stores_nothing() -> None:
    raw = await db(agent_with_token)()
    async with mcp_session(raw) as session:
        result = await session.call_tool("submit_plan", {"goal": "Look it up", "steps": [
            step("1", "serch"), step("2", depends=["9"])]})
    assert result.is_error
    assert "The plan is not valid. Nothing was stored." in text(result)
    assert "step 1: unknown tool 'serch'; did you mean: search?" in text(result)
    assert (await counts())[0] == 0


BAD_PLANS = {
    "a step without requiresPermission": ({"goal": "g", "steps": [{"id": "1", "tool": "search", "intent": "i"}]},
                                          "requiresPermission"),
    "a JSON true as confidence": (PLAN | {"confidence": True}, "confidence"),
    "no steps": ({"goal": "g", "steps": []}, "steps"),
    "a misspelt optional argument": (PLAN | {"confidance": 0.8}, "Unknown argument 'confidance'"),
    "a NUL in the goal": (PLAN | {"goal": "Mail\x00it"}, "NUL"),
    "a step that is not an object": ({"goal": "g", "steps": ["search q3"]}, "steps.0"),
}


@pytest.mark.parametrize("case", BAD_PLANS)
async def test_bad_arguments_are_a_clear_tool_error_and_change_nothing(case: str) -> None:
    arguments, said = BAD_PLANS[case]
    raw = await db(agent_with_token)()
    async with mcp_session(raw) as session:
        result = await session.call_tool("submit_plan", arguments)
    assert result.is_error
    assert said in text(result)
    assert await counts() == (0, 0, 0)


def submit_plan_body(arguments: Any) -> str:
    return json.dumps({"jsonrpc": "2.0", "id": 2, "method": "tools/call",
                       "params": {"name": "submit_plan", "arguments": arguments}})


HOSTILE_BODIES = {
    "a NaN in a step's input": (submit_plan_body(PLAN).replace('"q3 report"', "NaN"), "not finite"),
    "a NUL in a step's input": (submit_plan_body(PLAN).replace('"q3 report"', '"\\u0000"'), "NUL"),
    "a lone surrogate": (submit_plan_body(PLAN).replace('"q3 report"', '"\\ud800"'), "Parse error"),
    "a huge number": (submit_plan_body(PLAN).replace('"q3 report"', "1" * 5000), "Parse error"),
    "nesting 3000 deep": (submit_plan_body("PLACE").replace('"PLACE"', "[" * 3000 + "]" * 3000), "Parse error"),
    "arguments that are not an object": (submit_plan_body("a plan"), "Invalid request parameters"),
    "not JSON": ("submit my plan", "Parse error"),
}


@pytest.mark.parametrize("case", HOSTILE_BODIES)
async def test_hostile_requests_are_refused_with_a_reason_and_change_nothing(case: str) -> None:
    content, said = HOSTILE_BODIES[case]
    raw = await db(agent_with_token)()
    response = await raw_post({"Authorization": f"Bearer {raw}", "Mcp-Protocol-Version": "2025-06-18"},
                              content=content.encode())
    assert response.status_code in (200, 400)  # a tool error, or JSON-RPC's own refusal; never a server error
    assert said in response.text
    assert '"isError":false' not in response.text
    assert await counts() == (0, 0, 0)


# --- wait_for_decision, steps and versions ------------------------------------------------------------------


# Step 3 sends mail: it waits for an operator's permission even in a plan approved as a whole.
PERMISSION_PLAN = PLAN | {"steps": PLAN["steps"][:2] + [PLAN["steps"][2] | {"requiresPermission": True}]}


async def submitted(session: ClientSession) -> int:
    return int(ok(await session.call_tool("submit_plan", PERMISSION_PLAN))["id"])


async def test_wait_for_decision_waits_then_returns_the_step_to_run() -> None:
    raw = await db(agent_with_token)()
    async with mcp_session(raw) as session:
        plan_id = await submitted(session)
        waiting = ok(await session.call_tool("wait_for_decision", {"plan_id": plan_id, "timeout_seconds": 0}))
        assert waiting == {"action": "wait", "reason": "plan v1 awaits an operator's approval"}
        await operator_approves_plan(plan_id)
        run = ok(await session.call_tool("wait_for_decision", {"plan_id": plan_id, "timeout_seconds": 5}))
    assert (run["action"], run["step"]["key"], run["step"]["tool"]) == ("run", "1", "search")


async def test_wait_for_decision_answers_as_soon_as_the_operator_decides(monkeypatch: pytest.MonkeyPatch) -> None:
    """With no push the wait would re-read only after POLL_SECONDS (made longer than the wait): an answer before
    the wait ends is the operator's decision waking it."""
    monkeypatch.setattr(api_module, "POLL_SECONDS", 120.0)
    raw = await db(agent_with_token)()
    async with mcp_session(raw) as session:
        plan_id = await submitted(session)
        wait = asyncio.create_task(session.call_tool("wait_for_decision", {"plan_id": plan_id,
                                                                           "timeout_seconds": 60}))
        await asyncio.sleep(0.5)
        assert not wait.done()
        await operator_approves_plan(plan_id)
        answer = ok(await asyncio.wait_for(wait, timeout=30))  # the wait was 60 s
    assert (answer["action"], answer["step"]["key"]) == ("run", "1")


@pytest.mark.parametrize(("arguments", "said"), [
    ({"timeout_seconds": 3600}, "less than or equal to 60"),
    ({"plan_id": 999999}, "Plan 999999 not found for agent MCP bot"),
    ({"timeout_seconds": "soon"}, "timeout_seconds"),
])
async def test_wait_for_decision_refuses_bad_arguments(arguments: dict[str, Any], said: str) -> None:
    raw = await db(agent_with_token)()
    async with mcp_session(raw) as session:
        plan_id = await submitted(session)
        result = await session.call_tool("wait_for_decision", {"plan_id": plan_id} | arguments)
    assert result.is_error and said in text(result)


async def test_another_agents_plan_and_steps_are_not_found() -> None:
    mine, theirs = await db(agent_with_token)("Mine"), await db(agent_with_token)("Theirs")
    async with mcp_session(theirs) as session:
        plan_id = await submitted(session)
    await operator_approves_plan(plan_id)
    step_id = await db(lambda: PlanStep.objects.get(plan_id=plan_id, key="1").pk)()
    async with mcp_session(mine) as session:
        plan = await session.call_tool("get_plan", {"plan_id": plan_id})
        start = await session.call_tool("report_step_start", {"step_id": step_id, "request_id": "r1"})
    assert plan.is_error and f"Plan {plan_id} not found for agent Mine" in text(plan)
    assert start.is_error and f"Step {step_id} not found for agent Mine" in text(start)
    assert await db(lambda: PlanStep.objects.get(pk=step_id).status)() == PlanStep.Status.PENDING


async def test_step_start_and_result_are_idempotent_by_request_id() -> None:
    raw = await db(agent_with_token)()
    async with mcp_session(raw) as session:
        plan_id = await submitted(session)
        await operator_approves_plan(plan_id)
        run = ok(await session.call_tool("wait_for_decision", {"plan_id": plan_id, "timeout_seconds": 5}))
        step_id = run["step"]["id"]
        start = {"step_id": step_id, "request_id": "start-1"}
        first = ok(await session.call_tool("report_step_start", start))
        again = ok(await session.call_tool("report_step_start", start))
        result = {"step_id": step_id, "request_id": "result-1", "succeeded": True, "output": {"found": "q3.pdf"}}
        done = ok(await session.call_tool("report_step_result", result))
        done_again = ok(await session.call_tool("report_step_result", result))
        state = ok(await session.call_tool("get_plan", {"plan_id": plan_id}))
    assert (first["status"], first["replayed"], again["replayed"]) == ("running", False, True)
    assert (done["step"]["status"], done["replayed"], done_again["replayed"]) == ("completed", False, True)
    assert state["steps"][0]["result"] == '{"found": "q3.pdf"}'
    kinds = await db(lambda: list(PlanEvent.objects.filter(step_id=step_id).values_list("kind", flat=True)))()
    assert kinds.count(PlanEvent.Kind.STEP_STARTED) == 1 and kinds.count(PlanEvent.Kind.STEP_COMPLETED) == 1
    # One rendering of a step (StepOut): the REST API answers the plan exactly as the MCP server does.
    async with httpx2.AsyncClient(transport=httpx2.ASGITransport(app=application), base_url=BASE,
                                  headers={"Authorization": f"Bearer {raw}"}) as http:
        rest = (await http.get(f"/api/v1/plans/{plan_id}")).json()
    assert rest == state and set(rest["steps"][0]) == set(api_module.StepOut.model_fields)


async def test_step_reports_the_api_refuses_change_nothing() -> None:
    raw = await db(agent_with_token)()
    async with mcp_session(raw) as session:
        plan_id = await submitted(session)
        step_id = await db(lambda: PlanStep.objects.get(plan_id=plan_id, key="1").pk)()
        early = await session.call_tool("report_step_start", {"step_id": step_id, "request_id": "s"})
        await operator_approves_plan(plan_id)
        unstarted = await session.call_tool("report_step_result", {"step_id": step_id, "request_id": "r",
                                                                    "succeeded": True})
        ok(await session.call_tool("report_step_start", {"step_id": step_id, "request_id": "s2"}))
        unexplained = await session.call_tool("report_step_result", {"step_id": step_id, "request_id": "r2",
                                                                      "succeeded": False})
        not_a_bool = await session.call_tool("report_step_result", {"step_id": step_id, "request_id": "r3",
                                                                     "succeeded": "yes"})
    assert early.is_error and "Plan v1 is awaiting approval" in text(early)
    assert unstarted.is_error and "not running: start it before reporting its result" in text(unstarted)
    assert unexplained.is_error and "needs an 'error' saying what went wrong" in text(unexplained)
    assert not_a_bool.is_error and "succeeded" in text(not_a_bool)
    assert await db(lambda: PlanStep.objects.get(pk=step_id).status)() == PlanStep.Status.RUNNING
    assert await db(lambda: list(ApiRequest.objects.values_list("request_id", flat=True)))() == ["s2"]


async def test_a_decline_brings_the_feedback_and_kept_steps_and_submit_version_makes_version_two() -> None:
    raw = await db(agent_with_token)(policy=Agent.ApprovalPolicy.PERMISSION)  # plans start at once
    async with mcp_session(raw) as session:
        plan_id = await submitted(session)
        for key in ("1", "2"):
            run = ok(await session.call_tool("wait_for_decision", {"plan_id": plan_id, "timeout_seconds": 5}))
            assert run["step"]["key"] == key
            ok(await session.call_tool("report_step_start", {"step_id": run["step"]["id"], "request_id": f"s{key}"}))
            ok(await session.call_tool("report_step_result", {"step_id": run["step"]["id"], "request_id": f"r{key}",
                                                               "succeeded": True, "output": f"found {key}"}))
        email = ok(await session.call_tool("wait_for_decision", {"plan_id": plan_id, "timeout_seconds": 0}))
        assert (email["action"], email["step"]["key"]) == ("wait", "3")  # send_email is risky: an operator decides
        await operator_decides_step(email["step"]["id"], feedback="Send it to finance instead")
        replan = ok(await session.call_tool("wait_for_decision", {"plan_id": plan_id, "timeout_seconds": 5}))
        assert (replan["action"], replan["feedback"]) == ("replan", "Send it to finance instead")
        assert [s["key"] for s in replan["kept"]] == ["1", "2"]
        invalid = await session.call_tool("submit_version", {"plan_id": plan_id, "steps": [step("4", "mail")]})
        assert invalid.is_error and "unknown tool 'mail'" in text(invalid)
        v2 = ok(await session.call_tool("submit_version", {"plan_id": plan_id, "steps": [
            step("4", "send_email", depends=["2"], permission=True, to="finance@example.com", body="Q3")]}))
        again = await session.call_tool("submit_version", {"plan_id": plan_id, "steps": [step("5")]})
    assert v2["version"] == 2
    assert again.is_error and "cannot get a new version" in text(again)

    @db
    def versions() -> tuple[str, list[tuple[str, str, bool]]]:
        old = Plan.objects.get(pk=plan_id)
        new = Plan.objects.get(pk=v2["id"])
        return old.status, [(s.key, s.status, s.carried_over) for s in new.steps.all()]

    old_status, steps = await versions()
    assert old_status == Plan.Status.REPLANNED
    assert steps == [("1", "completed", True), ("2", "completed", True), ("4", "pending", False)]


async def test_a_wait_ends_with_an_error_when_the_token_is_revoked(monkeypatch: pytest.MonkeyPatch) -> None:
    from agents.services import tokens_revoke

    # The wait re-checks its token at each push and each re-read (made frequent here, so a revocation that lands
    # before the wait listens for pushes is caught too); without that check it would answer "wait" after 60 s.
    monkeypatch.setattr(api_module, "POLL_SECONDS", 0.2)
    raw = await db(agent_with_token)()
    async with mcp_session(raw) as session:
        plan_id = await submitted(session)
        wait = asyncio.create_task(session.call_tool("wait_for_decision", {"plan_id": plan_id,
                                                                           "timeout_seconds": 60}))
        await asyncio.sleep(0.5)
        await db(lambda: tokens_revoke(tokens=AgentToken.objects.all()))()
        result = await asyncio.wait_for(wait, timeout=30)
        assert result.is_error and "revoked" in text(result)
        refused = await raw_post({"Authorization": f"Bearer {raw}"})
    assert refused.status_code == 401


async def test_every_event_an_mcp_agent_makes_is_labelled_mcp_not_api() -> None:
    """Tools declared, plan created, a step put up for approval when reached, started and completed, a new
    version: each is "<name> (MCP)" on the timeline and in the audit log, never "(API)"."""
    raw = await db(agent_with_token)(tools=False, policy=Agent.ApprovalPolicy.PERMISSION)  # plans start at once
    async with mcp_session(raw) as session:
        ok(await session.call_tool("declare_tools", {"tools": TOOLS}))
        plan_id = await submitted(session)
        for key in ("1", "2"):
            run = ok(await session.call_tool("wait_for_decision", {"plan_id": plan_id, "timeout_seconds": 5}))
            ok(await session.call_tool("report_step_start", {"step_id": run["step"]["id"], "request_id": f"s{key}"}))
            ok(await session.call_tool("report_step_result", {"step_id": run["step"]["id"], "request_id": f"r{key}",
                                                               "succeeded": True, "output": key}))
        email = ok(await session.call_tool("wait_for_decision", {"plan_id": plan_id, "timeout_seconds": 0}))
        await operator_decides_step(email["step"]["id"], feedback="Not to the board")
        ok(await session.call_tool("wait_for_decision", {"plan_id": plan_id, "timeout_seconds": 5}))
        ok(await session.call_tool("submit_version", {"plan_id": plan_id, "steps": [step("4")]}))

    @db
    def agent_events() -> list[tuple[str, str]]:
        return list(PlanEvent.objects.filter(actor_label__startswith="MCP bot").values_list("kind", "actor_label"))

    events = await agent_events()
    kinds = {kind for kind, _ in events}
    assert {PlanEvent.Kind.TOOLS_DECLARED, PlanEvent.Kind.CREATED, PlanEvent.Kind.STEP_STARTED,
            PlanEvent.Kind.STEP_COMPLETED} <= kinds
    assert {label for _, label in events} == {"MCP bot (MCP)"}

    @db
    def audit_page() -> str:
        client = Client()
        client.force_login(UserFactory(username="auditor", role="operators"))
        return client.get(f"/audit/?plan={plan_id}").content.decode()

    page = await audit_page()
    assert "MCP bot (MCP)" in page and "MCP bot (API)" not in page
