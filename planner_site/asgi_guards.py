"""Guards in front of Django and Channels, at the ASGI level: what must be refused before any of it is read.

- `BodyLimit`: a request body is read here, in memory, before Django sees it: a declared Content-Length over
  the limit is a 413 before one byte is read, a body that grows past it (chunked, or longer than declared) a
  413 as soon as it does, and a body that stalls (or is declared and never sent) a 408 after
  REQUEST_BODY_TIMEOUT_SECONDS. Django would otherwise spool any size to a temporary file first.
- `SameOriginValidator`: a browser's websocket must come from this very site: the Origin's host and port are
  the ones the browser connected to (the Host header), and that host is allowed. Channels' own validator
  ignores the port, so a page on another port of the same host could open the operator's sockets.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any
from urllib.parse import urlsplit

from channels.security.websocket import WebsocketDenier
from django.conf import settings
from django.http.request import split_domain_port, validate_host

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[..., Awaitable[None]]  # Django's handler and Channels' routers type their arguments apart

DEFAULT_PORTS = {"http": 80, "https": 443}


def for_agents(path: str) -> bool:
    """The agents' endpoints: the API and the MCP server (a token, JSON), not the operators' pages."""
    return path.startswith("/api/") or path in ("/mcp", "/mcp/")


# An agent page's Upload files (planning/urls.py, agent-upload).
WORKSPACE_UPLOAD_PATH = re.compile(r"/agents/\d+/workspace/")


def body_limit(path: str) -> int:
    """The largest body a request to `path` may have: the API's own limit for the API and the MCP server; for an
    upload into a workspace the upload's limit (WORKSPACE_UPLOAD_MAX_BYTES) on top of the forms', so that an upload
    somewhat over it reaches the page, which says why it was refused; the forms' elsewhere."""
    if for_agents(path):
        from planning.api import body_limit as api_body_limit

        return api_body_limit()
    if WORKSPACE_UPLOAD_PATH.fullmatch(path):
        return int(settings.WORKSPACE_UPLOAD_MAX_BYTES) + int(settings.REQUEST_MAX_BODY_BYTES)
    return int(settings.REQUEST_MAX_BODY_BYTES)


def header(scope: Scope, name: bytes) -> str | None:
    for key, value in scope.get("headers", []):
        if key.lower() == name:
            return bytes(value).decode("latin1")
    return None


async def refuse(scope: Scope, send: Send, status: int, detail: str) -> None:
    """Answer and close: JSON for the agents' endpoints (like every API refusal), plain text elsewhere."""
    if for_agents(scope.get("path", "")):
        body, content_type = json.dumps({"detail": detail}).encode(), b"application/json"
    else:
        body, content_type = detail.encode(), b"text/plain; charset=utf-8"
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", content_type), (b"content-length", str(len(body)).encode()),
                            (b"connection", b"close")]})
    await send({"type": "http.response.body", "body": body})


class BodyLimit:
    """Read each request body under a size limit and a time limit before the application sees it."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        limit = body_limit(scope.get("path", ""))
        declared = header(scope, b"content-length")
        if declared is not None:
            digits = declared.strip()
            if not (digits.isascii() and digits.isdigit()):
                await refuse(scope, send, 400, "The Content-Length header is not a number. Nothing was changed.")
                return
            if len(digits) > 18 or int(digits) > limit:  # 19 digits and more: beyond any limit, never parsed
                await refuse(scope, send, 413, f"The request body is too large ({digits[:30]} > {limit} bytes). "
                                               "Nothing was changed.")
                return
        messages: list[Message] = []
        received = 0
        try:
            async with asyncio.timeout(float(settings.REQUEST_BODY_TIMEOUT_SECONDS)):
                while True:
                    message = await receive()
                    messages.append(message)
                    if message["type"] != "http.request":
                        break  # a disconnect: the application hears it in turn
                    received += len(message.get("body", b""))
                    if received > limit:
                        await refuse(scope, send, 413, f"The request body is too large (more than {limit} bytes). "
                                                       "Nothing was changed.")
                        return
                    if not message.get("more_body", False):
                        break
        except TimeoutError:
            await refuse(scope, send, 408, "The request body did not arrive in time "
                                           f"({settings.REQUEST_BODY_TIMEOUT_SECONDS} s). Nothing was changed.")
            return

        async def replay() -> Message:
            return messages.pop(0) if messages else await receive()

        await self.app(scope, replay, send)


def origin_allowed(scope: Scope) -> bool:
    """The Origin names this site: an allowed host and, when the browser sent its Host, the same host and port."""
    origin = header(scope, b"origin")
    if not origin:
        return False
    parts = urlsplit(origin.strip())
    try:
        origin_port = parts.port or DEFAULT_PORTS.get(parts.scheme)
    except ValueError:
        return False
    if not parts.hostname or origin_port is None:
        return False
    allowed = ["localhost", "127.0.0.1", "[::1]"] if settings.DEBUG and not settings.ALLOWED_HOSTS else settings.ALLOWED_HOSTS
    if not validate_host(parts.hostname, allowed):
        return False
    host = header(scope, b"host")
    if host is None:
        return True  # no Host to compare with (not a browser): the allowed host is all that can be checked
    domain, port = split_domain_port(host)
    # A Host without a port is a default port: 443 behind a proxy ending TLS, though this server sees ws.
    if len(port) > 5:
        return False
    expected_ports = {int(port)} if port.isdigit() else {80, 443}
    return domain == parts.hostname.lower() and origin_port in expected_ports


class SameOriginValidator:
    """Refuse a browser websocket whose Origin is not this site (another host, or another port)."""

    def __init__(self, application: ASGIApp) -> None:
        self.application = application  # the name Channels' own OriginValidator gives it

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "websocket" and not origin_allowed(scope):
            await WebsocketDenier()(scope, receive, send)  # type: ignore[no-untyped-call]
            return
        await self.application(scope, receive, send)


class WebsocketByPath:
    """The API's sockets (an agent's bearer token, no browser, no Origin) apart from the browser's (a session
    and this site's Origin)."""

    def __init__(self, *, api: ASGIApp, browser: ASGIApp) -> None:
        self.api, self.browser = api, browser

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        app = self.api if str(scope.get("path", "")).startswith("/ws/api/") else self.browser
        await app(scope, receive, send)
