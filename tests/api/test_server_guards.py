"""The real server (`manage.py serve`, uvicorn) against clients no browser would be: a body declared huge, a
forged X-Forwarded-For, an agent's websocket without an Origin."""

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


def test_an_agent_socket_needs_no_origin_and_says_why_it_closes(live_server_process: LiveServer) -> None:
    token = live_server_process.token("Socket agent")
    with httpx.Client(base_url=live_server_process.url, timeout=30,
                      headers={"Authorization": f"Bearer {token}"}) as http:
        assert http.put("/api/v1/agent/tools", json={"tools": TOOLS}).status_code == 200
        response = http.post("/api/v1/plans", json=PLAN)
        assert response.status_code == 201, response.text
        plan = response.json()

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
