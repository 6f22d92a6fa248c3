"""The client side of a remote A2A agent (A2A v1.0, the official `a2a-sdk`): read its agent card, send it a
message, read a task, cancel a task. No Django models here; every request goes through the outbound guard
(planner_site/outbound.py): the address an operator typed is checked, resolved once and the request sent to
the very address checked (a card that names an internal interface URL is refused the same way).

Each call is synchronous for the runner and the views: it runs the SDK's async client on an event loop of its
own in a short-lived thread, so a caller inside a running loop is never blocked by a nested one."""

from __future__ import annotations

import asyncio
import concurrent.futures
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import httpx
from a2a.client import ClientConfig, ClientFactory
from a2a.client.card_resolver import parse_agent_card
from a2a.types import (
    AgentCard,
    CancelTaskRequest,
    GetTaskRequest,
    Message,
    Part,
    Role,
    SendMessageConfiguration,
    SendMessageRequest,
    Task,
    TaskState,
)
from a2a.utils.constants import AGENT_CARD_WELL_KNOWN_PATH
from django.conf import settings

from planner_site import outbound

CARD_MAX_BYTES = 256 * 1024

# A2A task states as this dashboard names them.
SUBMITTED, WORKING, INPUT_REQUIRED, AUTH_REQUIRED = "submitted", "working", "input-required", "auth-required"
COMPLETED, FAILED, CANCELED, REJECTED = "completed", "failed", "canceled", "rejected"
STATES = {TaskState.TASK_STATE_SUBMITTED: SUBMITTED, TaskState.TASK_STATE_WORKING: WORKING,
          TaskState.TASK_STATE_INPUT_REQUIRED: INPUT_REQUIRED, TaskState.TASK_STATE_AUTH_REQUIRED: AUTH_REQUIRED,
          TaskState.TASK_STATE_COMPLETED: COMPLETED, TaskState.TASK_STATE_FAILED: FAILED,
          TaskState.TASK_STATE_CANCELED: CANCELED, TaskState.TASK_STATE_REJECTED: REJECTED}
TERMINAL = {COMPLETED, FAILED, CANCELED, REJECTED}
ASKING = {INPUT_REQUIRED, AUTH_REQUIRED}
ANSWERED = "answered"  # not an A2A state: the dashboard sent the operator's answer and has not read the task since


class RemoteError(Exception):
    """The remote agent could not be reached or answered wrongly; the message is for the operator."""


@dataclass(frozen=True)
class CardInfo:
    name: str
    description: str
    url: str  # the card's address, as typed (the well-known path added when only a base was typed)
    card_json: dict[str, Any]


@dataclass
class TaskView:
    """What the dashboard reads of an A2A task."""

    task_id: str
    context_id: str
    state: str
    status_text: str  # the status message's text: the agent's question when it asks
    messages: list[tuple[str, str]] = field(default_factory=list)  # (role, text), in order
    artifacts: list[tuple[str, str, str]] = field(default_factory=list)  # (id, name, text), in order


def card_address(url: str) -> str:
    """The agent card's URL: the address as typed, or its well-known path when only the agent's base was typed."""
    url = url.strip()
    path = urlsplit(url).path
    if path in ("", "/"):
        return url.rstrip("/") + AGENT_CARD_WELL_KNOWN_PATH
    return url


class GuardedTransport(httpx.AsyncBaseTransport):
    """Every request checked by the outbound guard and sent to the address it checked (Host and SNI kept)."""

    def __init__(self) -> None:
        self.inner = httpx.AsyncHTTPTransport()

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        try:
            destination = outbound.destination_check(str(request.url))
        except outbound.OutboundRefused as exc:
            raise RemoteError(f"The agent's address {exc}. Nothing was changed.") from None
        request.url = request.url.copy_with(host=str(destination.address))
        request.headers["Host"] = destination.host_header
        if destination.scheme == "https":
            request.extensions = {**request.extensions, "sni_hostname": destination.host}
        return await self.inner.handle_async_request(request)

    async def aclose(self) -> None:
        await self.inner.aclose()


def http_client() -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=GuardedTransport(), follow_redirects=False, trust_env=False,
                             timeout=settings.A2A_TIMEOUT_SECONDS)


def run[T](make: Callable[[], Awaitable[T]]) -> T:
    """Run a coroutine to its end on a loop of its own, in a thread of its own; errors become RemoteError."""
    async def guarded() -> T:
        try:
            return await make()
        except RemoteError:
            raise
        except Exception as exc:  # the SDK's and httpx's errors, alike for the operator
            cause = exc.__cause__ or exc.__context__
            if isinstance(cause, RemoteError):
                raise cause from None
            raise RemoteError(f"The A2A agent did not answer as expected ({type(exc).__name__}).") from exc

    with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(asyncio.run, guarded()).result()


def card_fetch(url: str) -> CardInfo:
    """Read and parse the agent card at `url` (through the guard); RemoteError says why not."""
    address = card_address(url)
    try:
        outbound.destination_check(address)
    except outbound.OutboundRefused as exc:
        raise RemoteError(f"The agent's address {exc}. Nothing was changed.") from None

    async def fetch() -> CardInfo:
        async with http_client() as client:
            response = await client.get(address)
        if response.status_code != 200:
            raise RemoteError(f"The agent card's address answered HTTP {response.status_code}. Nothing was changed.")
        if len(response.content) > CARD_MAX_BYTES:
            raise RemoteError("The agent card is too large. Nothing was changed.")
        try:
            data = response.json()
            card = parse_agent_card(dict(data))
        except Exception:
            raise RemoteError("The address does not serve an A2A agent card. Nothing was changed.") from None
        if not card.name or not card.supported_interfaces:
            raise RemoteError("The agent card names no agent or no interface. Nothing was changed.")
        return CardInfo(name=card.name, description=card.description, url=address, card_json=data)

    return run(fetch)


def card_parse(card_json: dict[str, Any]) -> AgentCard:
    return parse_agent_card(dict(card_json))


def task_view(task: Task) -> TaskView:
    def text(parts: Any) -> str:
        return "\n".join(p.text for p in parts if p.text)

    return TaskView(
        task_id=task.id, context_id=task.context_id, state=STATES.get(task.status.state, "unknown"),
        status_text=text(task.status.message.parts) if task.status.HasField("message") else "",
        messages=[("agent" if m.role == Role.ROLE_AGENT else "user", text(m.parts)) for m in task.history],
        artifacts=[(a.artifact_id, a.name, text(a.parts)) for a in task.artifacts],
    )


async def with_client[T](card_json: dict[str, Any], use: Callable[[Any], Awaitable[T]]) -> T:
    async with http_client() as httpx_client:
        factory = ClientFactory(ClientConfig(streaming=False, polling=True, httpx_client=httpx_client))
        client = factory.create(card_parse(card_json))
        try:
            return await use(client)
        finally:
            await client.close()


def message_send(card_json: dict[str, Any], text: str, *, task_id: str = "", context_id: str = "") -> TaskView:
    """Send a user message (a new task, or one more message on `task_id`); the task as the agent answers it."""
    message = Message(message_id=uuid.uuid4().hex, role=Role.ROLE_USER, parts=[Part(text=text)],
                      task_id=task_id, context_id=context_id)
    request = SendMessageRequest(message=message, configuration=SendMessageConfiguration(return_immediately=True))

    async def send(client: Any) -> TaskView:
        async for event in client.send_message(request):
            if event.HasField("task"):
                return task_view(event.task)
            if event.HasField("message"):
                raise RemoteError("The A2A agent answered with a message and started no task.")
        raise RemoteError("The A2A agent answered nothing.")

    return run(lambda: with_client(card_json, send))


def task_get(card_json: dict[str, Any], task_id: str) -> TaskView:
    async def get(client: Any) -> TaskView:
        return task_view(await client.get_task(GetTaskRequest(id=task_id)))

    return run(lambda: with_client(card_json, get))


def task_cancel(card_json: dict[str, Any], task_id: str) -> TaskView:
    async def cancel(client: Any) -> TaskView:
        return task_view(await client.cancel_task(CancelTaskRequest(id=task_id)))

    return run(lambda: with_client(card_json, cancel))
