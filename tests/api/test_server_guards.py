"""The real server (`manage.py serve`, uvicorn) against clients no browser would be: a body declared huge, a
forged X-Forwarded-For, an agent's websocket without an Origin; and what its websockets negotiate."""

from __future__ import annotations

import asyncio
import json
import socket
from urllib.parse import urlsplit

import httpx
import pytest
import websockets

from tests.api.conftest import PLAN, TOOLS, LiveServer
from tests.browser.conftest import manage


def raw_request(url: str, head: bytes, *, timeout: float = 10) -> bytes:
    """Send only a request's head (a body is declared, none is sent) and return the first bytes of the answer."""
    parts = urlsplit(url)
    with socket.create_connection((parts.hostname, parts.port), timeout=timeout) as conn:
        conn.sendall(head)
        return conn.recv(4096)


def test_a_declared_gigabyte_is_refused_at_once_without_being_sent(live_server_process: LiveServer) -> None:
    answer = raw_request(live_server_process.url, b"POST /api/v1/plans HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                                                  b"Content-Type: application/json\r\nContent-Length: 1073741824\r\n\r\n")
    assert answer.startswith(b"HTTP/1.1 413"), answer[:200]


def test_a_forged_forwarded_for_does_not_escape_the_lockout_by_address(live_server_process: LiveServer) -> None:
    """TRUSTED_PROXY_COUNT is 0 (no proxy): X-Forwarded-For from 127.0.0.1 is not the address."""
    try:
        with httpx.Client(base_url=live_server_process.url, timeout=30) as http:
            http.get("/accounts/login/")
            statuses = []
            for attempt in range(12):  # another username each time: only the address can lock
                response = http.post("/accounts/login/", data={
                    "username": f"nobody-{attempt}", "password": "wrong",
                    "csrfmiddlewaretoken": http.cookies["csrftoken"]},
                    headers={"X-Forwarded-For": f"203.0.113.{attempt}"})
                statuses.append(response.status_code)
        assert statuses[-1] == 429 and statuses.count(429) >= 12 - 5, statuses
    finally:
        manage(live_server_process.env, "axes_reset")  # the other tests log in from 127.0.0.1 too


def ws_url(server: LiveServer, path: str) -> str:
    return server.url.replace("http://", "ws://") + path


def plan_submitted(server: LiveServer, name: str) -> tuple[str, dict[str, object]]:
    """A new external agent's token, and the plan it submitted over the API."""
    token = server.token(name)
    with httpx.Client(base_url=server.url, timeout=30, headers={"Authorization": f"Bearer {token}"}) as http:
        assert http.put("/api/v1/agent/tools", json={"tools": TOOLS}).status_code == 200
        response = http.post("/api/v1/plans", json=PLAN)
        assert response.status_code == 201, response.text
        return token, response.json()


def test_an_agent_socket_needs_no_origin_and_says_why_it_closes(live_server_process: LiveServer) -> None:
    token, plan = plan_submitted(live_server_process, "Socket agent")

    async def talk() -> tuple[dict[str, object], int | None, int | None]:
        url = ws_url(live_server_process, f"/ws/api/plans/{plan['id']}/")
        async with websockets.connect(url, additional_headers={"Authorization": f"Bearer {token}"}) as ws:
            first = json.loads(await asyncio.wait_for(ws.recv(), timeout=10))
        async with websockets.connect(url, additional_headers={"Authorization": "Bearer apt_wrong"}) as ws:
            with pytest.raises(websockets.ConnectionClosed):
                await asyncio.wait_for(ws.recv(), timeout=10)
            bad_token = ws.close_code
        other = ws_url(live_server_process, "/ws/api/plans/999999999/")
        async with websockets.connect(other, additional_headers={"Authorization": f"Bearer {token}"}) as ws:
            with pytest.raises(websockets.ConnectionClosed):
                await asyncio.wait_for(ws.recv(), timeout=10)
            not_its_plan = ws.close_code
        return first, bad_token, not_its_plan

    first, bad_token, not_its_plan = asyncio.run(talk())
    assert first["action"] in ("wait", "run") and (bad_token, not_its_plan) == (4401, 4404)


def test_sockets_are_not_compressed_unless_the_setting_asks(live_server_process: LiveServer) -> None:
    """A client offering per-message compression (as browsers and `websockets` do) gets plain frames by default
    (LIVE_WS_DEFLATE): a fan-out compressed each update again for every open page. The setting turns it on."""
    from django.test import override_settings

    from agents.management.commands.serve import server_config

    token, plan = plan_submitted(live_server_process, "Plain socket agent")

    async def talk() -> tuple[str | None, str | None, dict[str, object]]:
        url = ws_url(live_server_process, f"/ws/api/plans/{plan['id']}/")
        async with websockets.connect(url, additional_headers={"Authorization": f"Bearer {token}"}) as ws:
            first = json.loads(await asyncio.wait_for(ws.recv(), timeout=10))
            assert ws.request is not None and ws.response is not None
            return ws.request.headers.get("Sec-WebSocket-Extensions"), ws.response.headers.get(
                "Sec-WebSocket-Extensions"), first

    offered, accepted, first = asyncio.run(talk())
    assert offered is not None and "permessage-deflate" in offered
    assert accepted is None and first["action"] in ("wait", "run")
    assert server_config("127.0.0.1", 0).ws_per_message_deflate is False
    with override_settings(LIVE_WS_DEFLATE=True):
        assert server_config("127.0.0.1", 0).ws_per_message_deflate is True
