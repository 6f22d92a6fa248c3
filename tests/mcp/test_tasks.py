"""MCP waits as tasks (the io.modelcontextprotocol/tasks extension, docs/mcp-tasks.md), spoken to with the official
SDK's client on MCP 2026-07-28 with the extension declared, and on 2025-11-25 as before."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Sequence
from typing import Any, Literal

import httpx2
import pytest
from mcp import Client, ClientSession
from mcp.client.extension import ClaimContext, ClientExtension, ResultClaim
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError
from mcp_types import CallToolResult, GetTaskRequest, GetTaskRequestParams, Result

from agents.models import Agent
from planner_site.asgi import application
from planning import mcp_tasks, services
from planning.models import Plan, PlanStep
from tests.api.conftest import PLAN
from tests.factories import UserFactory
from tests.mcp.test_server import BASE, db, ok, operator_approves_plan, rate_counters_cleared, setup

pytestmark = pytest.mark.django_db(transaction=True)
__all__ = ["rate_counters_cleared"]

TASKS = "io.modelcontextprotocol/tasks"


class TaskHandle(Result):
    """The extension's CreateTaskResult (Result & Task, flat)."""

    result_type: Literal["task"] = "task"
    task_id: str
    status: str
    status_message: str | None = None
    created_at: str
    last_updated_at: str
    ttl_ms: int | None  # the extension's names (SEP-2663): required, null for a task with no end of life
    poll_interval_ms: int | None = None


class TaskState(Result):
    """The answer to tasks/get: the task, and its result once completed."""

    task_id: str
    status: str
    status_message: str | None = None
    ttl_ms: int | None
    poll_interval_ms: int | None = None
    result: dict[str, Any] | None = None


async def task_get(session: ClientSession, task_id: str) -> TaskState:
    return await session.send_request(GetTaskRequest(params=GetTaskRequestParams(task_id=task_id)), TaskState)


async def follow(handle: TaskHandle, ctx: ClaimContext) -> CallToolResult:
    """The claim's resolver: poll tasks/get until the task is completed, and answer with its result, so that
    `call_tool` without allow_claimed returns when the operator decides."""
    while True:
        state = await task_get(ctx.session, handle.task_id)
        if state.status != "working":
            assert state.status == "completed" and state.result is not None, state
            return CallToolResult.model_validate(state.result)
        await asyncio.sleep((state.poll_interval_ms or 1000) / 1000)


@contextlib.asynccontextmanager
async def modern_session(raw: str, *, tasks: bool = True) -> AsyncIterator[ClientSession]:
    """A 2026-07-28 client (server/discover, no handshake), the tasks extension declared unless `tasks` is False."""
    claims = {TASKS: [ResultClaim(result_type="task", model=TaskHandle, resolve=follow)]} if tasks else {}
    async with (httpx2.AsyncClient(transport=httpx2.ASGITransport(app=application), base_url=BASE,
                                   headers={"Authorization": f"Bearer {raw}"}, timeout=60) as http,
                streamable_http_client(f"{BASE}/mcp", http_client=http) as (read, write),
                ClientSession(read, write, extensions={TASKS: {}} if tasks else None,
                              result_claims=claims or None) as session):
        await session.discover()
        yield session


@contextlib.asynccontextmanager
async def legacy_session(raw: str) -> AsyncIterator[ClientSession]:
    """A 2025-11-25 client (the initialize handshake), as tests/mcp/test_server.py connects."""
    async with (httpx2.AsyncClient(transport=httpx2.ASGITransport(app=application), base_url=BASE,
                                   headers={"Authorization": f"Bearer {raw}"}, timeout=60) as http,
                streamable_http_client(f"{BASE}/mcp", http_client=http) as (read, write),
                ClientSession(read, write) as session):
        await session.initialize()
        yield session


@db
def operator_declines_plan(plan_id: int, feedback: str) -> None:
    operator = UserFactory(username="omar", role="operators")
    services.plan_replan_request(plan=Plan.objects.get(pk=plan_id), user=operator, reason=feedback, once=True)


@db
def only_plan_id() -> int:
    return Plan.objects.get().pk


async def submitted_task(session: ClientSession) -> TaskHandle:
    handle = await session.call_tool("submit_plan", PLAN, allow_claimed=True)
    assert isinstance(handle, TaskHandle), handle
    return handle


async def test_a_2026_client_waits_on_a_task_that_completes_when_the_operator_approves() -> None:
    raw = await db(setup)()
    async with modern_session(raw) as session:
        assert session.protocol_version == "2026-07-28"
        discovered = session.discover_result
        assert discovered is not None and TASKS in (discovered.capabilities.extensions or {})  # the server offers it
        handle = await submitted_task(session)
        assert handle.status == "working"
        assert handle.status_message == "Waiting: plan v1 awaits an operator's approval."
        # The extension's field names (SEP-2663), as a client built to the spec reads them: ttlMs is required (the
        # handle would not parse without it), null for a task that lives as long as its plan.
        assert (handle.ttl_ms, handle.poll_interval_ms) == (None, 1000)
        state = await task_get(session, handle.task_id)
        assert state.status == "working" and state.result is None  # nobody decided yet
        await operator_approves_plan(await only_plan_id())
        state = await task_get(session, handle.task_id)
    assert state.status == "completed"
    assert state.result is not None
    decided = state.result["structuredContent"]
    assert decided["status"] == "active"
    assert decided["decision"]["action"] == "run"
    assert decided["decision"]["step"]["key"] == "1"  # the first step, to run now


class TasksFollowed(ClientExtension):
    """The tasks extension on the SDK's `Client`: a task result is followed to its end by `follow`."""

    identifier = TASKS

    def claims(self) -> Sequence[ResultClaim[Any]]:
        return [ResultClaim(result_type="task", model=TaskHandle, resolve=follow)]


async def test_the_sdks_client_with_the_extension_waits_in_call_tool_until_the_operator_decides() -> None:
    raw = await db(setup)()
    async with (httpx2.AsyncClient(transport=httpx2.ASGITransport(app=application), base_url=BASE,
                                   headers={"Authorization": f"Bearer {raw}"}, timeout=60) as http,
                Client(streamable_http_client(f"{BASE}/mcp", http_client=http), mode="2026-07-28",
                       extensions=[TasksFollowed()]) as client):
        calling = asyncio.create_task(client.call_tool("submit_plan", PLAN))
        while not await db(Plan.objects.exists)():
            await asyncio.sleep(0.05)
        await asyncio.sleep(0.3)
        assert not calling.done()  # the client waits on the task: nobody decided yet
        await operator_approves_plan(await only_plan_id())
        result = await asyncio.wait_for(calling, 30)
    decided = ok(result)
    assert (decided["status"], decided["decision"]["action"]) == ("active", "run")
    assert result.content[0].text == "run"  # type: ignore[union-attr]


async def test_a_task_polled_while_the_operator_decides_completes_with_the_feedback() -> None:
    raw = await db(setup)()
    feedback = "Don't email Dana, she's on leave; send it to Sam instead"
    async with modern_session(raw) as session:
        handle = await submitted_task(session)

        async def poll() -> TaskState:
            while True:
                state = await task_get(session, handle.task_id)
                if state.status != "working":
                    return state
                await asyncio.sleep((state.poll_interval_ms or 1000) / 1000 / 10)

        polling = asyncio.create_task(poll())
        await asyncio.sleep(0.3)
        assert not polling.done()
        await operator_declines_plan(await only_plan_id(), feedback)
        state = await asyncio.wait_for(polling, 30)
    assert state.status == "completed"
    assert state.result is not None
    decision = state.result["structuredContent"]["decision"]
    assert decision["action"] == "replan"
    assert decision["feedback"] == feedback
    assert feedback in state.result["content"][0]["text"]


async def test_a_task_id_of_another_agent_or_made_up_is_unknown() -> None:
    raw = await db(setup)()
    other = await db(setup)(name="Other bot")
    async with modern_session(raw) as session:
        handle = await submitted_task(session)
    async with modern_session(other) as session:
        for task_id in (handle.task_id, "1", handle.task_id[:-2] + "xx"):
            with pytest.raises(MCPError, match="Unknown task id"):
                await task_get(session, task_id)


async def test_a_plan_that_needs_no_approval_answers_at_once_without_a_task() -> None:
    raw = await db(setup)(policy=Agent.ApprovalPolicy.PERMISSION)
    async with modern_session(raw) as session:
        result = await session.call_tool("submit_plan", PLAN, allow_claimed=True)
    assert isinstance(result, CallToolResult)
    assert ok(result)["status"] == "active"


async def test_a_2026_client_without_the_extension_gets_todays_answer() -> None:
    raw = await db(setup)()
    async with modern_session(raw, tasks=False) as session:
        created = ok(await session.call_tool("submit_plan", PLAN))
        assert created["status"] == "awaiting_approval"
        with pytest.raises(MCPError):
            await task_get(session, "anything")


async def test_a_2025_client_submits_and_polls_wait_for_decision_as_before() -> None:
    raw = await db(setup)()
    async with legacy_session(raw) as session:
        assert session.protocol_version == "2025-11-25"
        created = ok(await session.call_tool("submit_plan", PLAN))
        assert (created["version"], created["status"]) == (1, "awaiting_approval")
        waiting = ok(await session.call_tool("wait_for_decision", {"plan_id": created["id"], "timeout_seconds": 0}))
        assert waiting["action"] == "wait"
        await operator_approves_plan(created["id"])
        decided = ok(await session.call_tool("wait_for_decision", {"plan_id": created["id"], "timeout_seconds": 5}))
    assert decided["action"] == "run"
    assert decided["step"]["key"] == "1"


# Step 3 sends mail: it waits for an operator's permission even in a plan that starts at once.
PERMISSION_PLAN = PLAN | {"steps": PLAN["steps"][:2] + [PLAN["steps"][2] | {"requiresPermission": True}]}


@db
def operator_decides_step(step_id: int, *, feedback: str = "") -> None:
    operator = UserFactory(username=f"olga{step_id}", role="operators")
    step_row = PlanStep.objects.get(pk=step_id)
    if feedback:
        services.step_decline(step=step_row, user=operator, feedback=feedback)
    else:
        services.step_approve(step=step_row, user=operator)


@db
def step_row(plan_id: int, key: str) -> tuple[int, str]:
    row = PlanStep.objects.get(plan_id=plan_id, key=key)
    return row.pk, row.status


async def steps_one_and_two_done(session: ClientSession, plan_id: int) -> None:
    for key in ("1", "2"):
        run = ok(await session.call_tool("wait_for_decision", {"plan_id": plan_id, "timeout_seconds": 5}))
        assert run["step"]["key"] == key
        ok(await session.call_tool("report_step_start", {"step_id": run["step"]["id"], "request_id": f"s{key}"}))
        ok(await session.call_tool("report_step_result", {"step_id": run["step"]["id"], "request_id": f"r{key}",
                                                           "succeeded": True, "output": f"found {key}"}))


async def test_starting_a_step_that_needs_approval_gives_a_task_that_completes_when_the_operator_approves() -> None:
    raw = await db(setup)(policy=Agent.ApprovalPolicy.PERMISSION)  # plans start at once; the email step waits
    async with modern_session(raw) as session:
        plan_id = int(ok(await session.call_tool("submit_plan", PERMISSION_PLAN, allow_claimed=True))["id"])
        await steps_one_and_two_done(session, plan_id)
        email_id, status = await step_row(plan_id, "3")
        assert status == PlanStep.Status.PENDING
        handle = await session.call_tool("report_step_start", {"step_id": email_id, "request_id": "s3"},
                                         allow_claimed=True)
        assert isinstance(handle, TaskHandle) and handle.status == "working"
        assert (await step_row(plan_id, "3"))[1] == PlanStep.Status.AWAITING_APPROVAL  # in the operator's inbox
        assert (await task_get(session, handle.task_id)).status == "working"
        await operator_decides_step(email_id)
        state = await task_get(session, handle.task_id)
        assert state.status == "completed" and state.result is not None
        decision = state.result["structuredContent"]["decision"]
        assert (decision["action"], decision["step"]["key"]) == ("run", "3")
        started = ok(await session.call_tool("report_step_start", {"step_id": email_id, "request_id": "s3"},
                                             allow_claimed=True))
    assert started["status"] == PlanStep.Status.RUNNING


async def test_waiting_for_a_step_decision_is_a_task_and_a_decline_completes_it_with_the_feedback() -> None:
    raw = await db(setup)(policy=Agent.ApprovalPolicy.PERMISSION)
    async with modern_session(raw) as session:
        plan_id = int(ok(await session.call_tool("submit_plan", PERMISSION_PLAN, allow_claimed=True))["id"])
        await steps_one_and_two_done(session, plan_id)
        handle = await session.call_tool("wait_for_decision", {"plan_id": plan_id, "timeout_seconds": 30},
                                         allow_claimed=True)
        assert isinstance(handle, TaskHandle) and handle.status == "working"  # at once, not after 30 s
        await operator_decides_step((await step_row(plan_id, "3"))[0], feedback="not to Dana!! finance only")
        state = await task_get(session, handle.task_id)
    assert state.status == "completed" and state.result is not None
    decision = state.result["structuredContent"]["decision"]
    assert (decision["action"], decision["feedback"]) == ("replan", "not to Dana!! finance only")
    assert [s["key"] for s in decision["kept"]] == ["1", "2"]


async def test_a_2025_client_is_refused_a_step_that_needs_approval_as_before() -> None:
    raw = await db(setup)(policy=Agent.ApprovalPolicy.PERMISSION)
    async with legacy_session(raw) as session:
        plan_id = int(ok(await session.call_tool("submit_plan", PERMISSION_PLAN))["id"])
        await steps_one_and_two_done(session, plan_id)
        refused = await session.call_tool("report_step_start", {"step_id": (await step_row(plan_id, "3"))[0],
                                                                "request_id": "s3"})
    assert refused.is_error
    assert "needs an operator's approval first" in refused.content[0].text  # type: ignore[union-attr]


@pytest.mark.parametrize("arguments", [{"timeout_seconds": -1}, {"timeout_seconds": "soon"}, {"timeout_seconds": 9999},
                                       {"wait": 5}])
async def test_a_2026_client_with_bad_wait_arguments_gets_the_tools_refusal_not_a_task(arguments: dict[str, Any]) -> None:
    raw = await db(setup)()
    async with modern_session(raw) as session:
        handle = await submitted_task(session)
        assert handle.status == "working"
        refused = await session.call_tool("wait_for_decision", {"plan_id": await only_plan_id(), **arguments},
                                          allow_claimed=True)
    assert isinstance(refused, CallToolResult) and refused.is_error


async def test_a_task_followed_while_nothing_changes_reads_its_plan_once_and_sees_the_decision_at_once(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """200 clients following their tasks every second each read their plan every second, and the server's database
    pool was where an operator's decision waited (docs/performance.md): a task is read again only once its plan
    or agent changed."""
    reads: list[int] = []
    task_read = mcp_tasks.task_read

    def counted(**kwargs: Any) -> dict[str, Any]:
        reads.append(kwargs["plan_id"])
        return task_read(**kwargs)

    monkeypatch.setattr(mcp_tasks, "task_read", counted)
    raw = await db(setup)()
    async with modern_session(raw) as session:
        handle = await submitted_task(session)
        before = len(reads)
        for _ in range(5):
            assert (await task_get(session, handle.task_id)).status == "working"
        assert len(reads) - before == 1  # the first poll read the plan; the next four were answered from memory
        await operator_approves_plan(await only_plan_id())
        state = await task_get(session, handle.task_id)
    assert state.status == "completed"
    assert state.result is not None and state.result["structuredContent"]["decision"]["action"] == "run"
