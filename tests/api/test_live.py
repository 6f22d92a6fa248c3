"""The long poll and the websocket wake on an operator's decision; racing retries are recorded once."""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
import time
from typing import Any

import pytest
from asgiref.sync import sync_to_async
from channels.db import database_sync_to_async
from channels.testing import WebsocketCommunicator
from django.db import connection
from django.test import AsyncClient

from agents.models import Agent, AgentToken, ApiRequest
from planner_site.asgi import application
from planning import api as api_module
from planning import services
from planning.models import Plan, PlanEvent, PlanStep
from planning.services import reported
from tests.api.conftest import PLAN, TOOLS
from tests.factories import UserFactory

pytestmark = pytest.mark.django_db(transaction=True)
ORIGIN = (b"origin", b"http://localhost")


def approve(plan_id: int, operator: Any) -> None:
    try:
        services.plan_approve(plan=Plan.objects.get(pk=plan_id), user=operator, mode=Plan.ApprovalMode.ALL)
    finally:
        connection.close()


def other_agent_token() -> str:
    return AgentToken.issue(agent=Agent.objects.create(name="Other", kind=Agent.Kind.EXTERNAL))[1]


def setup_plan() -> tuple[str, int, Any]:
    """An external agent with tools and a submitted plan (awaiting approval), a token, an operator."""
    agent = Agent.objects.create(name="Poller", kind=Agent.Kind.EXTERNAL, declared_tools=TOOLS)
    raw = AgentToken.issue(agent=agent)[1]
    plan = reported.plan_submit(agent=agent, data=PLAN)
    return raw, plan.pk, UserFactory(username="olga", role="operators")


async def test_long_poll_answers_as_soon_as_the_operator_approves(monkeypatch: pytest.MonkeyPatch) -> None:
    """With no push the poll would only re-read after POLL_SECONDS (made longer than the wait): an answer
    well before the wait ends is the push waking it."""
    monkeypatch.setattr(api_module, "POLL_SECONDS", 120.0)
    raw, plan_id, operator = await database_sync_to_async(setup_plan)()
    poll = asyncio.create_task(AsyncClient().get(f"/api/v1/plans/{plan_id}/next?wait=60",
                                                 headers={"Authorization": f"Bearer {raw}"}))
    await asyncio.sleep(0.3)
    assert not poll.done()
    # The operator acts from another thread, as another request of a real server would.
    await sync_to_async(approve, thread_sensitive=False)(plan_id, operator)
    response = await asyncio.wait_for(poll, timeout=30)  # the wait was 60 s
    body = json.loads(response.content)
    assert (response.status_code, body["action"], body["step"]["key"]) == (200, "run", "1")


async def test_long_poll_returns_wait_when_nothing_changes(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(api_module, "POLL_SECONDS", 0.1)
    raw, plan_id, _ = await database_sync_to_async(setup_plan)()
    response = await AsyncClient().get(f"/api/v1/plans/{plan_id}/next?wait=0.5",
                                       headers={"Authorization": f"Bearer {raw}"})
    assert json.loads(response.content) == {"action": "wait", "reason": "plan v1 awaits an operator's approval"}


async def test_long_polls_begun_together_do_not_all_end_together(monkeypatch: pytest.MonkeyPatch) -> None:
    """Agents that wait together (a fleet started at once, a server restarted under them) come back spread over
    the last tenth of their wait, not at one instant: each answers "wait" within the wait, and some well before
    the whole of it (without the spread every one took at least the whole wait). The long poll's own function
    (the endpoint's and the MCP tool's), twelve at once: the test client serves one request at a time. A wait of
    3 s: a first wait of 1 s in the whole suite once ended every poll after it (the loop busy at their start)."""
    monkeypatch.setattr(api_module, "POLL_SECONDS", 120.0)  # no re-read: the wait's end alone answers
    _, plan_id, _ = await database_sync_to_async(setup_plan)()
    agent = await Agent.objects.aget(name="Poller")

    async def poll() -> tuple[float, dict[str, Any]]:
        started = time.monotonic()
        answer = await api_module.plan_next_wait(agent=agent, plan_id=plan_id, wait=3.0)
        return time.monotonic() - started, answer

    results = await asyncio.gather(*(poll() for _ in range(12)))
    assert {answer["action"] for _, answer in results} == {"wait"}
    elapsed = sorted(seconds for seconds, _ in results)
    assert 2.7 <= elapsed[0] < 2.91, elapsed


def test_long_poll_releases_its_database_connection_between_reads() -> None:
    raw, plan_id, _ = setup_plan()
    agent = Agent.objects.get(name="Poller")
    assert connection.connection is not None
    reported.plan_next_read(agent=agent, plan_id=plan_id)
    assert connection.connection is None


def test_racing_retries_of_one_result_are_recorded_once() -> None:
    raw, plan_id, operator = setup_plan()
    agent = Agent.objects.get(name="Poller")
    services.plan_approve(plan=Plan.objects.get(pk=plan_id), user=operator, mode=Plan.ApprovalMode.ALL)
    first = PlanStep.objects.get(plan_id=plan_id, key="1")
    reported.step_start(agent=agent, step_id=first.pk, request_id="start")
    barrier = threading.Barrier(4)
    answers: list[Any] = []
    errors: list[BaseException] = []

    def report() -> None:
        try:
            barrier.wait()
            answers.append(reported.step_result(agent=agent, step_id=first.pk, request_id="same", succeeded=True,
                                                output="done"))
        except BaseException as exc:  # the assertion below names it
            errors.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=report) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    assert len({json.dumps(a[0], sort_keys=True) for a in answers}) == 1
    assert sorted(again for _, again in answers) == [False, True, True, True]
    assert PlanEvent.objects.filter(step=first, kind=PlanEvent.Kind.STEP_COMPLETED).count() == 1
    assert ApiRequest.objects.filter(request_id="same").count() == 1


async def agent_socket_waiting() -> tuple[WebsocketCommunicator, int, Any]:
    """An agent's socket on its plan awaiting approval, its first answer ("wait") read; the plan, the operator."""
    raw, plan_id, operator = await database_sync_to_async(setup_plan)()
    ws = WebsocketCommunicator(application, f"/ws/api/plans/{plan_id}/",
                               headers=[ORIGIN, (b"authorization", f"Bearer {raw}".encode())])
    connected, _ = await ws.connect()
    assert connected
    assert (await ws.receive_json_from(timeout=5))["action"] == "wait"
    return ws, plan_id, operator


async def approved_run_arrives(ws: WebsocketCommunicator, plan_id: int, operator: Any) -> None:
    await database_sync_to_async(approve)(plan_id, operator)
    message = await ws.receive_json_from(timeout=10)
    assert (message["action"], message["step"]["key"]) == ("run", "1")


async def test_websocket_pushes_the_next_action_when_it_changes() -> None:
    ws, plan_id, operator = await agent_socket_waiting()
    try:
        await approved_run_arrives(ws, plan_id, operator)
    finally:
        await ws.disconnect()


async def closed_with(ws: WebsocketCommunicator) -> int | None:
    """The close code of a socket the server accepted and then closed (how any client reads why)."""
    connected, _ = await ws.connect()
    assert connected
    message = await ws.receive_output(timeout=10)
    await ws.wait()
    assert message["type"] == "websocket.close"
    return message.get("code")


@pytest.mark.parametrize(("token", "code"), [(None, 4401), ("Bearer apt_wrong", 4401)])
async def test_websocket_refuses_without_a_valid_token(token: str | None, code: int) -> None:
    _, plan_id, _ = await database_sync_to_async(setup_plan)()
    headers = [ORIGIN] + ([(b"authorization", token.encode())] if token else [])
    ws = WebsocketCommunicator(application, f"/ws/api/plans/{plan_id}/", headers=headers)
    assert await closed_with(ws) == code


async def test_websocket_refuses_another_agents_plan() -> None:
    _, plan_id, _ = await database_sync_to_async(setup_plan)()
    raw = await database_sync_to_async(other_agent_token)()
    ws = WebsocketCommunicator(application, f"/ws/api/plans/{plan_id}/",
                               headers=[ORIGIN, (b"authorization", f"Bearer {raw}".encode())])
    assert await closed_with(ws) == 4404


async def test_websocket_of_an_agent_needs_no_origin() -> None:
    """An agent is not a browser: Python's websockets and the like send no Origin."""
    raw, plan_id, _ = await database_sync_to_async(setup_plan)()
    ws = WebsocketCommunicator(application, f"/ws/api/plans/{plan_id}/",
                               headers=[(b"authorization", f"Bearer {raw}".encode()), (b"host", b"127.0.0.1:8000")])
    connected, _ = await ws.connect()
    try:
        assert connected
        assert (await ws.receive_json_from(timeout=5))["action"] == "wait"
    finally:
        await ws.disconnect()


def revoke(raw: str) -> None:
    from agents.services import tokens_revoke

    try:
        tokens_revoke(tokens=AgentToken.objects.filter(pk=AgentToken.objects.lookup(raw).pk))  # type: ignore[union-attr]
    finally:
        connection.close()


async def test_websocket_closes_when_its_token_is_revoked() -> None:
    raw, plan_id, _ = await database_sync_to_async(setup_plan)()
    ws = WebsocketCommunicator(application, f"/ws/api/plans/{plan_id}/",
                               headers=[(b"authorization", f"Bearer {raw}".encode())])
    connected, _ = await ws.connect()
    try:
        assert connected
        assert (await ws.receive_json_from(timeout=5))["action"] == "wait"
        await sync_to_async(revoke, thread_sensitive=False)(raw)
        message = await ws.receive_output(timeout=10)
        assert (message["type"], message.get("code")) == ("websocket.close", 4401)
    finally:
        await ws.disconnect()


async def test_long_poll_ends_with_401_when_its_token_is_revoked(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(api_module, "POLL_SECONDS", 120.0)  # only the revocation's push can end it in time
    raw, plan_id, _ = await database_sync_to_async(setup_plan)()
    poll = asyncio.create_task(AsyncClient().get(f"/api/v1/plans/{plan_id}/next?wait=60",
                                                 headers={"Authorization": f"Bearer {raw}"}))
    await asyncio.sleep(0.3)
    assert not poll.done()
    await sync_to_async(revoke, thread_sensitive=False)(raw)
    response = await asyncio.wait_for(poll, timeout=30)
    assert response.status_code == 401 and "revoked" in json.loads(response.content)["detail"]


def expire_soon(raw: str, seconds: float) -> None:
    """The token's expiry moves to `seconds` from now (as an operator sets it in the admin, without a push)."""
    from datetime import timedelta

    from django.utils import timezone
    try:
        AgentToken.objects.filter(pk=AgentToken.objects.lookup(raw).pk).update(  # type: ignore[union-attr]
            expires_at=timezone.now() + timedelta(seconds=seconds))
    finally:
        connection.close()


async def test_websocket_closes_when_its_token_expires() -> None:
    raw, plan_id, _ = await database_sync_to_async(setup_plan)()
    ws = WebsocketCommunicator(application, f"/ws/api/plans/{plan_id}/",
                               headers=[(b"authorization", f"Bearer {raw}".encode())])
    connected, _ = await ws.connect()
    try:
        assert connected
        assert (await ws.receive_json_from(timeout=5))["action"] == "wait"
        await sync_to_async(expire_soon, thread_sensitive=False)(raw, 0.5)
        message = await ws.receive_output(timeout=15)  # nothing is pushed: the socket's own check finds it
        assert (message["type"], message.get("code")) == ("websocket.close", 4401)
    finally:
        await ws.disconnect()


async def test_long_poll_ends_with_401_when_its_token_expires() -> None:
    raw, plan_id, _ = await database_sync_to_async(setup_plan)()
    await sync_to_async(expire_soon, thread_sensitive=False)(raw, 1.0)
    response = await asyncio.wait_for(AsyncClient().get(f"/api/v1/plans/{plan_id}/next?wait=60",
                                                        headers={"Authorization": f"Bearer {raw}"}), timeout=30)
    assert response.status_code == 401 and "expired" in json.loads(response.content)["detail"]
    again = await AsyncClient().get(f"/api/v1/plans/{plan_id}/next", headers={"Authorization": f"Bearer {raw}"})
    assert again.status_code == 401  # and it stays refused


async def test_open_websockets_tokens_are_checked_in_one_query_and_a_revoked_one_closes_only_its_socket(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """With thousands of agents connected, a query a socket every TOKEN_CHECK_SECONDS kept the server's database
    thread busy: the process checks every open socket's token in one query; the socket of a token found expired
    closes (4401), the others stay open and still get their answers."""
    from planning import api_ws

    monkeypatch.setattr(api_ws, "TOKEN_CHECK_SECONDS", 0.3)
    checks: list[set[int]] = []
    tokens_active = api_ws.tokens_active

    def counted(token_ids: set[int]) -> set[int]:
        checks.append(set(token_ids))
        return tokens_active(token_ids)

    monkeypatch.setattr(api_ws, "tokens_active", counted)

    def agents() -> list[tuple[str, int, int]]:
        out = []
        for i in range(3):
            agent = Agent.objects.create(name=f"Socket {i}", kind=Agent.Kind.EXTERNAL, declared_tools=TOOLS)
            token, raw = AgentToken.issue(agent=agent)
            out.append((raw, reported.plan_submit(agent=agent, data=PLAN).pk, token.pk))
        return out

    fleet = await database_sync_to_async(agents)()
    sockets = [WebsocketCommunicator(application, f"/ws/api/plans/{plan_id}/",
                                     headers=[(b"authorization", f"Bearer {raw}".encode())]) for raw, plan_id, _ in fleet]
    try:
        for ws in sockets:
            assert (await ws.connect())[0]
            assert (await ws.receive_json_from(timeout=5))["action"] == "wait"
        await asyncio.sleep(0.8)
        assert checks and all(ids == {pk for _, _, pk in fleet} for ids in checks)  # one query for all three
        await sync_to_async(expire_soon, thread_sensitive=False)(fleet[0][0], 0)  # no push: the watch finds it
        message = await sockets[0].receive_output(timeout=10)
        assert (message["type"], message.get("code")) == ("websocket.close", 4401)
        assert await sockets[1].receive_nothing(timeout=0.5)
        operator = await database_sync_to_async(UserFactory)(username="omar", role="operators")
        await database_sync_to_async(approve)(fleet[1][1], operator)
        assert (await sockets[1].receive_json_from(timeout=10))["action"] == "run"
    finally:
        for ws in sockets:
            await ws.disconnect()


async def test_a_long_poll_reads_nothing_while_nothing_changes_and_a_token_that_expires_ends_it(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """With live updates up, a waiting long poll reads only when pushed (2,000 waiters re-reading every few seconds
    kept the server's database thread busy); an expiry, which nothing pushes, is found by the process's check of
    every waiter's token in one query, and ends the wait with 401."""
    from planning import api_ws

    monkeypatch.setattr(api_ws, "TOKEN_CHECK_SECONDS", 0.3)
    reads: list[int] = []
    checked = api_module.plan_next_checked

    def counted(**kwargs: Any) -> dict[str, Any]:
        reads.append(kwargs["plan_id"])
        return checked(**kwargs)

    monkeypatch.setattr(api_module, "plan_next_checked", counted)
    raw, plan_id, _ = await database_sync_to_async(setup_plan)()
    response = await AsyncClient().get(f"/api/v1/plans/{plan_id}/next?wait=1.5",
                                       headers={"Authorization": f"Bearer {raw}"})
    assert json.loads(response.content)["action"] == "wait" and reads == []
    poll = asyncio.create_task(AsyncClient().get(f"/api/v1/plans/{plan_id}/next?wait=60",
                                                 headers={"Authorization": f"Bearer {raw}"}))
    await asyncio.sleep(0.5)
    await sync_to_async(expire_soon, thread_sensitive=False)(raw, 0)
    response = await asyncio.wait_for(poll, timeout=10)
    assert response.status_code == 401 and reads == []


async def test_websocket_is_pushed_again_once_live_updates_are_back(monkeypatch: pytest.MonkeyPatch) -> None:
    """A socket opened while live updates were down looks every POLL_SECONDS; once they are back it is pushed
    again, instead of polling the database for as long as it stays open."""
    from planning import api_ws

    real = api_ws.changes_watched
    entered: list[bool] = []

    @contextlib.asynccontextmanager
    async def down_first(**kwargs: Any) -> Any:
        if not entered:
            entered.append(False)
            yield None  # live updates unavailable: the socket polls
            return
        async with real(**kwargs) as changed:
            entered.append(changed is not None)
            yield changed

    monkeypatch.setattr(api_ws, "changes_watched", down_first)
    monkeypatch.setattr(api_ws, "POLL_SECONDS", 0.1)
    ws, plan_id, operator = await agent_socket_waiting()
    try:
        for _ in range(100):
            if True in entered:
                break
            await asyncio.sleep(0.05)
        assert entered[:1] == [False] and True in entered
        monkeypatch.setattr(api_ws, "POLL_SECONDS", 120.0)  # a socket still polling would not look again in time
        await approved_run_arrives(ws, plan_id, operator)
    finally:
        await ws.disconnect()
