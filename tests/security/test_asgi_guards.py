"""Bodies are limited before they are read, stalled bodies time out, and browser sockets come from this very
site: checked on the ASGI application itself, as the server runs it (tests/api/test_body_limits.py: the real
server)."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from planner_site.asgi import application

pytestmark = pytest.mark.django_db(transaction=True)


class Exchange:
    """One HTTP request to the ASGI application: what it read of the body, and what it answered."""

    def __init__(self, chunks: list[bytes], *, stall: bool = False) -> None:
        self.chunks, self.stall, self.reads, self.sent = list(chunks), stall, 0, []  # type: list[dict[str, Any]]

    async def receive(self) -> dict[str, Any]:
        self.reads += 1
        if self.chunks:
            chunk = self.chunks.pop(0)
            return {"type": "http.request", "body": chunk, "more_body": bool(self.chunks) or self.stall}
        await asyncio.sleep(3600)  # stalled mid-body, or the whole body sent: waiting for the answer
        return {"type": "http.disconnect"}

    async def send(self, message: dict[str, Any]) -> None:
        self.sent.append(message)

    @property
    def status(self) -> int:
        return int(next(m["status"] for m in self.sent if m["type"] == "http.response.start"))

    @property
    def body(self) -> bytes:
        return b"".join(m.get("body", b"") for m in self.sent if m["type"] == "http.response.body")


async def request(exchange: Exchange, path: str, headers: list[tuple[bytes, bytes]]) -> None:
    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST", "scheme": "http",
             "path": path, "raw_path": path.encode(), "query_string": b"", "root_path": "",
             "headers": [(b"host", b"127.0.0.1"), *headers], "client": ("127.0.0.1", 5000),
             "server": ("127.0.0.1", 8000)}
    await asyncio.wait_for(application(scope, exchange.receive, exchange.send), timeout=30)


@pytest.mark.parametrize("path", ["/api/v1/plans", "/accounts/login/"])
async def test_a_declared_huge_body_is_refused_before_one_byte_is_read(path: str) -> None:
    exchange = Exchange([b"x" * 1024], stall=True)
    await request(exchange, path, [(b"content-length", b"1073741824"), (b"content-type", b"application/json")])
    assert exchange.status == 413 and exchange.reads == 0
    assert b"too large" in exchange.body


async def test_a_body_larger_than_declared_stops_being_read_at_the_limit(settings: Any) -> None:
    settings.API_MAX_BODY_BYTES = 10_000
    exchange = Exchange([b"x" * 4_000] * 1_000)  # 4 MB, sent without a Content-Length (chunked)
    await request(exchange, "/api/v1/plans", [(b"content-type", b"application/json")])
    assert exchange.status == 413 and exchange.reads <= 3
    assert json.loads(exchange.body)["detail"].startswith("The request body is too large")


@pytest.mark.parametrize("chunks", [[], [b'{"goal": ']], ids=["declared and never sent", "stalled mid-body"])
async def test_a_body_that_stalls_is_timed_out_with_408(settings: Any, chunks: list[bytes]) -> None:
    settings.REQUEST_BODY_TIMEOUT_SECONDS = 0.5
    exchange = Exchange(chunks, stall=True)
    await request(exchange, "/api/v1/plans", [(b"content-length", b"100"), (b"content-type", b"application/json")])
    assert exchange.status == 408 and b"did not arrive in time" in exchange.body


async def test_a_body_within_the_limit_reaches_the_api() -> None:
    exchange = Exchange([b'{"goal": "x", ', b'"steps": []}'])
    await request(exchange, "/api/v1/plans", [(b"content-length", b"26"), (b"content-type", b"application/json")])
    assert exchange.status == 401  # read whole and handed on: the API then asks for a token


@pytest.mark.parametrize(("length", "status"), [(b"\xc2\xb2", 400), (b"1" * 5_000, 413), (b"-5", 400)])
async def test_a_content_length_that_is_no_size_is_refused_not_a_server_error(length: bytes, status: int) -> None:
    exchange = Exchange([b"{}"])
    await request(exchange, "/api/v1/plans", [(b"content-length", length), (b"content-type", b"application/json")])
    assert exchange.status == status and exchange.reads == 0
