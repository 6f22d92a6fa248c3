"""Following MCP tasks by notification (docs/mcp-tasks.md): `subscriptions/listen` with `notifications.taskIds`,
spoken to with the official SDK's client on 2026-07-28 with the tasks extension declared, over a real HTTP server
(a listen's answer is a stream, which the in-process transport of the other MCP tests would hold until it ends)."""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import AsyncIterator, Sequence
from typing import Any

import httpx2
import pytest
import uvicorn
from mcp import Client, ClientSession
from mcp.client.extension import ClientExtension, NotificationBinding, ResultClaim
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError
from mcp_types import (
    NotificationParams,
    SubscriptionFilter,
    SubscriptionsAcknowledgedNotification,
    SubscriptionsListenRequest,
    SubscriptionsListenRequestParams,
    SubscriptionsListenResult,
)

from agents import services
from agents.models import AgentToken
from planner_site.asgi import application
from planning import mcp_tasks
from planning.live.hub import LayerUnavailable
from tests.api.conftest import PLAN
from tests.mcp.test_server import db, ok, operator_approves_plan, rate_counters_cleared, setup
from tests.mcp.test_tasks import TASKS, TaskHandle, follow, legacy_session, operator_declines_plan, task_get

pytestmark = pytest.mark.django_db(transaction=True)
__all__ = ["rate_counters_cleared"]


class TaskNotice(NotificationParams):
    """The params of `notifications/tasks`: the task's full state."""

    task_id: str
    status: str
    status_message: str | None = None
    ttl_ms: int | None
    poll_interval_ms: int | None = None
    result: dict[str, Any] | None = None


@contextlib.asynccontextmanager
async def served() -> AsyncIterator[str]:
    """The project's ASGI application on a free loopback port, in this test's event loop."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(application, host="127.0.0.1", port=port, log_level="warning",
                                           lifespan="off", timeout_graceful_shutdown=5))
    serving = asyncio.create_task(server.serve())
    while not server.started:
        assert not serving.done(), serving
        await asyncio.sleep(0.01)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        await asyncio.wait_for(serving, 15)


class Listener:
    """A 2026-07-28 client of the official SDK: the tasks extension declared (unless `tasks` is False), the
    acknowledgements and `notifications/tasks` it receives kept in order."""

    def __init__(self) -> None:
        self.acks: list[SubscriptionFilter] = []
        self.notices: asyncio.Queue[TaskNotice] = asyncio.Queue()

    async def message(self, message: Any) -> None:
        if isinstance(message, SubscriptionsAcknowledgedNotification):
            self.acks.append(message.params.notifications)

    async def notice(self, params: TaskNotice) -> None:
        await self.notices.put(params)

    @contextlib.asynccontextmanager
    async def session(self, base: str, raw: str, *, tasks: bool = True) -> AsyncIterator[ClientSession]:
        binding = NotificationBinding(method="notifications/tasks", params_type=TaskNotice, handler=self.notice)
        claims = {TASKS: [ResultClaim(result_type="task", model=TaskHandle, resolve=follow)]} if tasks else None
        async with (httpx2.AsyncClient(base_url=base, headers={"Authorization": f"Bearer {raw}"}, timeout=60) as http,
                    streamable_http_client(f"{base}/mcp", http_client=http) as (read, write),
                    ClientSession(read, write, extensions={TASKS: {}} if tasks else None, result_claims=claims,
                                  message_handler=self.message, notification_bindings=[binding]) as session):
            await session.discover()
            yield session


def listen(session: ClientSession, *task_ids: str, **core: Any) -> asyncio.Task[SubscriptionsListenResult]:
    """`subscriptions/listen` for these task ids (and core keys), as a task: it ends when the stream does."""
    notifications = SubscriptionFilter.model_validate({**core, "taskIds": list(task_ids)})
    request = SubscriptionsListenRequest(params=SubscriptionsListenRequestParams(notifications=notifications))
    return asyncio.create_task(session.send_request(request, SubscriptionsListenResult))


async def acknowledged(listener: Listener, listening: asyncio.Task[Any], count: int = 1) -> SubscriptionFilter:
    async with asyncio.timeout(10):
        while len(listener.acks) < count:
            if listening.done():
                listening.result()  # its error, if it failed before the acknowledgement
            await asyncio.sleep(0.01)
    return listener.acks[count - 1]


async def submitted(session: ClientSession) -> TaskHandle:
    handle = await session.call_tool("submit_plan", PLAN, allow_claimed=True)
    assert isinstance(handle, TaskHandle) and handle.status == "working", handle
    return handle


@db
def plan_of_task(raw: str) -> int:
    return AgentToken.objects.lookup(raw).agent.plans.get().pk  # type: ignore[union-attr]


def reads_counted(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    reads: list[int] = []
    task_read = mcp_tasks.task_read

    def counted(**kwargs: Any) -> dict[str, Any]:
        reads.append(kwargs["plan_id"])
        return task_read(**kwargs)

    monkeypatch.setattr(mcp_tasks, "task_read", counted)
    return reads


async def test_a_listening_client_is_told_the_operators_approval_without_polling(
        monkeypatch: pytest.MonkeyPatch) -> None:
    reads = reads_counted(monkeypatch)
    raw = await db(setup)()
    listener = Listener()
    async with served() as base, listener.session(base, raw) as session:
        handle = await submitted(session)
        listening = listen(session, handle.task_id)
        ack = await acknowledged(listener, listening)
        assert (ack.model_extra or {}).get("taskIds") == [handle.task_id]
        before = len(reads)
        await asyncio.sleep(2.5)  # more than two pollIntervals: nothing changed, nothing read, nothing sent
        assert len(reads) == before
        assert listener.notices.empty() and not listening.done()
        await operator_approves_plan(await plan_of_task(raw))
        notice = await asyncio.wait_for(listener.notices.get(), 10)
        result = await asyncio.wait_for(listening, 10)  # its only task ended: so does the stream, gracefully
    assert notice.task_id == handle.task_id
    assert notice.status == "completed"
    assert notice.result is not None
    decided = notice.result["structuredContent"]
    assert (decided["status"], decided["decision"]["action"]) == ("active", "run")
    assert decided["decision"]["step"]["key"] == "1"
    assert isinstance(result, SubscriptionsListenResult)


async def test_the_notification_carries_what_tasks_get_answers_and_the_operators_feedback() -> None:
    raw = await db(setup)()
    feedback = "Don't email Dana, she's on leave; send it to Sam instead"
    listener = Listener()
    async with served() as base, listener.session(base, raw) as session:
        handle = await submitted(session)
        listening = listen(session, handle.task_id)
        await acknowledged(listener, listening)
        await operator_declines_plan(await plan_of_task(raw), feedback)
        notice = await asyncio.wait_for(listener.notices.get(), 10)
        polled = await task_get(session, handle.task_id)
        await asyncio.wait_for(listening, 10)
    assert notice.status == polled.status == "completed"
    assert notice.result == polled.result
    assert notice.result is not None and notice.result["structuredContent"]["decision"]["feedback"] == feedback


async def test_a_task_decided_before_the_listen_is_sent_right_after_the_acknowledgement() -> None:
    raw = await db(setup)()
    listener = Listener()
    async with served() as base, listener.session(base, raw) as session:
        handle = await submitted(session)
        await operator_approves_plan(await plan_of_task(raw))  # decided while nobody listened
        listening = listen(session, handle.task_id)
        await acknowledged(listener, listening)
        notice = await asyncio.wait_for(listener.notices.get(), 10)
        await asyncio.wait_for(listening, 10)
    assert (notice.task_id, notice.status) == (handle.task_id, "completed")


async def test_another_agents_task_id_or_a_made_up_one_is_not_followed() -> None:
    mine, theirs = await db(setup)(), await db(setup)(name="Other bot")
    listener, other = Listener(), Listener()
    async with (served() as base, listener.session(base, mine) as session,
                other.session(base, theirs) as others_session):
        own = await submitted(session)
        not_mine = await submitted(others_session)
        listening = listen(session, not_mine.task_id, own.task_id, "1", own.task_id[:-2] + "xx")
        ack = await acknowledged(listener, listening)
        assert (ack.model_extra or {}).get("taskIds") == [own.task_id]
        await operator_declines_plan(await plan_of_task(theirs), "not now")
        await operator_approves_plan(await plan_of_task(mine))
        notice = await asyncio.wait_for(listener.notices.get(), 10)
        await asyncio.wait_for(listening, 10)
        alone = listen(others_session, own.task_id)  # only another agent's: nothing followed, the stream ends
        ack = await acknowledged(other, alone)
        await asyncio.wait_for(alone, 10)
    assert notice.task_id == own.task_id  # the other agent's decision was not sent to this one
    assert listener.notices.empty()
    assert (ack.model_extra or {}).get("taskIds") == []
    assert other.notices.empty()


async def test_a_client_without_the_extension_is_refused_task_notifications() -> None:
    raw = await db(setup)()
    listener = Listener()
    async with served() as base, listener.session(base, raw, tasks=False) as session:
        with pytest.raises(MCPError) as refused:
            await asyncio.wait_for(listen(session, "any"), 10)
    assert refused.value.error.code == -32021
    assert refused.value.error.data == {"requiredCapabilities": {"extensions": {TASKS: {}}}}


async def test_a_listen_without_task_ids_is_the_sdks_and_the_core_keys_are_kept_beside_task_ids() -> None:
    raw = await db(setup)()
    listener = Listener()
    async with served() as base, listener.session(base, raw) as session:
        handle = await submitted(session)
        notifications = SubscriptionFilter(tools_list_changed=True)
        request = SubscriptionsListenRequest(params=SubscriptionsListenRequestParams(notifications=notifications))
        core_only = asyncio.create_task(session.send_request(request, SubscriptionsListenResult))
        core_ack = await acknowledged(listener, core_only)
        both = listen(session, handle.task_id, toolsListChanged=True)
        both_ack = await acknowledged(listener, both, 2)
        await operator_approves_plan(await plan_of_task(raw))
        notice = await asyncio.wait_for(listener.notices.get(), 10)
        await asyncio.sleep(0.3)
        assert not both.done()  # it asked for the tool list's changes too: it stays open after the task's end
        core_only.cancel()
        both.cancel()
    assert core_ack.tools_list_changed is True and "taskIds" not in (core_ack.model_extra or {})
    assert both_ack.tools_list_changed is True and (both_ack.model_extra or {}).get("taskIds") == [handle.task_id]
    assert notice.status == "completed"


async def test_without_live_updates_the_stream_reads_the_task_every_poll_interval(
        monkeypatch: pytest.MonkeyPatch) -> None:
    async def unavailable() -> Any:
        raise LayerUnavailable("Redis is away")

    monkeypatch.setattr(mcp_tasks, "hub_get", unavailable)
    reads = reads_counted(monkeypatch)
    raw = await db(setup)()
    listener = Listener()
    async with served() as base, listener.session(base, raw) as session:
        handle = await submitted(session)
        listening = listen(session, handle.task_id)
        await acknowledged(listener, listening)
        before = len(reads)
        await asyncio.sleep(2.5)
        assert len(reads) - before >= 2  # read again every pollInterval
        assert listener.notices.empty()  # still working: nothing new to send
        await operator_approves_plan(await plan_of_task(raw))
        notice = await asyncio.wait_for(listener.notices.get(), 10)
        await asyncio.wait_for(listening, 10)
    assert (notice.task_id, notice.status) == (handle.task_id, "completed")


@db
def token_revoked(raw: str) -> None:
    services.tokens_revoke(tokens=AgentToken.objects.filter(pk=AgentToken.objects.lookup(raw).pk))  # type: ignore[union-attr]


async def test_a_token_revoked_while_listening_ends_the_stream() -> None:
    raw = await db(setup)()
    listener = Listener()
    async with served() as base, listener.session(base, raw) as session:
        handle = await submitted(session)
        listening = listen(session, handle.task_id)
        await acknowledged(listener, listening)
        await token_revoked(raw)
        with pytest.raises(MCPError, match="revoked"):
            await asyncio.wait_for(listening, 10)
    assert listener.notices.empty()


class TasksNoticed(ClientExtension):
    """The extension on the SDK's `Client` as docs/mcp-tasks.md shows it: the task claimed, its notifications bound."""

    identifier = TASKS

    def __init__(self) -> None:
        self.decided: asyncio.Queue[TaskNotice] = asyncio.Queue()

    async def noticed(self, notice: TaskNotice) -> None:
        if notice.status != "working":
            await self.decided.put(notice)

    def claims(self) -> Sequence[ResultClaim[Any]]:
        return [ResultClaim(result_type="task", model=TaskHandle, resolve=follow)]

    def notifications(self) -> Sequence[NotificationBinding[Any]]:
        return [NotificationBinding(method="notifications/tasks", params_type=TaskNotice, handler=self.noticed)]


async def test_the_sdks_client_as_the_docs_show_it_is_told_the_decision() -> None:
    raw = await db(setup)()
    tasks = TasksNoticed()
    async with (served() as base,
                httpx2.AsyncClient(base_url=base, headers={"Authorization": f"Bearer {raw}"}, timeout=60) as http,
                Client(streamable_http_client(f"{base}/mcp", http_client=http), mode="2026-07-28",
                       extensions=[tasks]) as client):
        handle = await client.session.call_tool("submit_plan", PLAN, allow_claimed=True)
        assert isinstance(handle, TaskHandle)
        request = SubscriptionsListenRequest(params=SubscriptionsListenRequestParams(
            notifications=SubscriptionFilter.model_validate({"taskIds": [handle.task_id]})))
        stream = asyncio.create_task(client.session.send_request(request, SubscriptionsListenResult))
        await asyncio.sleep(0.5)
        assert tasks.decided.empty() and not stream.done()
        await operator_approves_plan(await plan_of_task(raw))
        notice = await asyncio.wait_for(tasks.decided.get(), 10)
        await asyncio.wait_for(stream, 10)
    assert notice.result is not None and notice.result["structuredContent"]["decision"]["action"] == "run"


async def test_a_2025_client_has_no_listen_as_before() -> None:
    raw = await db(setup)()
    async with legacy_session(raw) as session:
        assert session.protocol_version == "2025-11-25"
        handle = ok(await session.call_tool("submit_plan", PLAN))  # today's answer, no task
        with pytest.raises(MCPError) as refused:
            await listen(session, "any")
    assert handle["status"] == "awaiting_approval"
    assert refused.value.error.code == -32601  # the method does not exist on 2025-11-25
