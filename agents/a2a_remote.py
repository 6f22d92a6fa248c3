"""The client side of a remote A2A agent (A2A v1.0, the official `a2a-sdk`): read its agent card, send it a
message, read a task, cancel a task. No Django models here; every request goes through the outbound guard
(planner_site/outbound.py): the address an operator typed is checked, resolved once and the request sent to
the very address checked (a card that names an internal interface URL is refused the same way).

Each call is synchronous for the runner and the views: it runs the SDK's async client on an event loop of its
own in a short-lived thread, so a caller inside a running loop is never blocked by a nested one. A streamed call
(an agent whose card says `capabilities.streaming`) yields the task as each event of the stream changes it, to the
caller's thread, so that the caller records each change in its own transaction while the stream goes on. An
agent whose card says `capabilities.pushNotifications` is asked to POST its task's updates to the dashboard
(push_register); push_parse reads such a POST's body, and task_follow applies it as it applies a streamed event.

An agent whose card asks for a credential (an HTTP bearer scheme, an API key in a header, or a bearer token for
OAuth 2 / OpenID Connect) gets the one its operator gave when adding it, through the SDK's `AuthInterceptor`; the
guarded transport takes it off any request to another origin than the agent card's."""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import queue
import threading
import uuid
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import httpx
from a2a.client import ClientCallContext, ClientConfig, ClientFactory
from a2a.client.auth import AuthInterceptor, CredentialService
from a2a.client.card_resolver import parse_agent_card
from a2a.client.interceptors import ClientCallInterceptor
from a2a.types import (
    AgentCard,
    CancelTaskRequest,
    GetTaskRequest,
    Message,
    Part,
    Role,
    SendMessageConfiguration,
    SendMessageRequest,
    StreamResponse,
    SubscribeToTaskRequest,
    Task,
    TaskPushNotificationConfig,
    TaskState,
)
from a2a.utils.constants import AGENT_CARD_WELL_KNOWN_PATH
from django.conf import settings
from google.protobuf.json_format import MessageToDict, ParseDict, ParseError

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
    credential: str  # what the card asks for ("a bearer token", ...), "" when it asks for none


@dataclass
class TaskView:
    """What the dashboard reads of an A2A task."""

    task_id: str
    context_id: str
    state: str
    status_text: str  # the status message's text: the agent's question when it asks
    messages: list[tuple[str, str]] = field(default_factory=list)  # (role, text), in order
    message_ids: list[str] = field(default_factory=list)  # each message's id, in the same order
    artifacts: list[tuple[str, str, str]] = field(default_factory=list)  # (id, name, text), in order
    task_json: dict[str, Any] = field(default_factory=dict)  # the whole task, as A2A's JSON writes it


def card_address(url: str) -> str:
    """The agent card's URL: the address as typed, or its well-known path when only the agent's base was typed."""
    url = url.strip()
    path = urlsplit(url).path
    if path in ("", "/"):
        return url.rstrip("/") + AGENT_CARD_WELL_KNOWN_PATH
    return url


def origin(url: str) -> tuple[str, str, int | None]:
    parts = urlsplit(url)
    return parts.scheme.lower(), (parts.hostname or "").lower(), parts.port or {"http": 80, "https": 443}.get(
        parts.scheme.lower())


@dataclass(frozen=True)
class Remote:
    """Where and how to reach one remote agent: its card, the card's address (its origin is the only one its
    credential is sent to) and the credential its operator gave ("" for none)."""

    card_json: dict[str, Any]
    url: str = ""
    credential: str = ""

    @property
    def streams(self) -> bool:
        """The card offers streaming (SendStreamingMessage, SubscribeToTask)."""
        return bool(card_parse(self.card_json).capabilities.streaming)

    @property
    def pushes(self) -> bool:
        """The card offers push notifications (CreateTaskPushNotificationConfig, then POSTs to a webhook)."""
        return bool(card_parse(self.card_json).capabilities.push_notifications)


class GuardedTransport(httpx.AsyncBaseTransport):
    """Every request checked by the outbound guard and sent to the address it checked (Host and SNI kept). A
    header that carries the agent's credential is taken off a request to any other origin than the agent's."""

    def __init__(self, remote: Remote | None = None) -> None:
        self.inner = httpx.AsyncHTTPTransport()
        self.remote = remote

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        try:
            destination = outbound.destination_check(str(request.url))
        except outbound.OutboundRefused as exc:
            raise RemoteError(f"The agent's address {exc}. Nothing was changed.") from None
        secret = self.remote.credential if self.remote is not None else ""
        if secret and origin(str(request.url)) != origin(self.remote.url if self.remote else ""):
            for name in [name for name, value in request.headers.items() if secret in value]:
                del request.headers[name]
        request.url = request.url.copy_with(host=str(destination.address))
        request.headers["Host"] = destination.host_header
        if destination.scheme == "https":
            request.extensions = {**request.extensions, "sni_hostname": destination.host}
        return await self.inner.handle_async_request(request)

    async def aclose(self) -> None:
        await self.inner.aclose()


def http_client(remote: Remote | None = None, *, timeout: float | None = None) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=GuardedTransport(remote), follow_redirects=False, trust_env=False,
                             timeout=settings.A2A_TIMEOUT_SECONDS if timeout is None else timeout)


async def guarded[T](make: Callable[[], Awaitable[T]]) -> T:
    """The coroutine's value; the SDK's and httpx's errors become a RemoteError, alike for the operator."""
    try:
        return await make()
    except RemoteError:
        raise
    except Exception as exc:
        cause = exc.__cause__ or exc.__context__
        if isinstance(cause, RemoteError):
            raise cause from None
        raise RemoteError(f"The A2A agent did not answer as expected ({type(exc).__name__}).") from exc


def run[T](make: Callable[[], Awaitable[T]]) -> T:
    """Run a coroutine to its end on a loop of its own, in a thread of its own; errors become RemoteError."""
    with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(asyncio.run, guarded(make)).result()


def credential_asked(card: AgentCard) -> str:
    """What credential the card asks for, in words ("" for none); RemoteError for a scheme the dashboard cannot
    send (an API key in a query or a cookie, mutual TLS)."""
    if not card.security_requirements or not card.security_schemes:
        return ""
    for requirement in card.security_requirements:
        for name in requirement.schemes:
            scheme = card.security_schemes.get(name) if name in card.security_schemes else None
            if scheme is None:
                continue
            if scheme.HasField("http_auth_security_scheme") and scheme.http_auth_security_scheme.scheme.lower() == (
                    "bearer"):
                return "a bearer token"
            if scheme.HasField("oauth2_security_scheme") or scheme.HasField("open_id_connect_security_scheme"):
                return "a bearer token (OAuth 2 access token)"
            if scheme.HasField("api_key_security_scheme") and (
                    scheme.api_key_security_scheme.location.lower() == "header"):
                return f"an API key (sent in the {scheme.api_key_security_scheme.name} header)"
    raise RemoteError("The agent card asks for a kind of authentication the dashboard cannot send (only a bearer "
                      "token or an API key in a header). Nothing was changed.")


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
        return CardInfo(name=card.name, description=card.description, url=address, card_json=data,
                        credential=credential_asked(card))

    return run(fetch)


def card_parse(card_json: dict[str, Any]) -> AgentCard:
    return parse_agent_card(dict(card_json))


def task_view(task: Task) -> TaskView:
    """What the dashboard reads of the task. A working status's message is said already (as a streamed one is,
    task_follow), though the agent moves it to the history only at its next status: what the agent said is
    recorded before what it did next, however the task is read."""
    def text(parts: Any) -> str:
        return "\n".join(p.text for p in parts if p.text)

    history = list(task.history)
    if task.status.state == TaskState.TASK_STATE_WORKING and task.status.HasField("message") and not said(
            task, task.status.message):
        history.append(task.status.message)

    return TaskView(
        task_id=task.id, context_id=task.context_id, state=STATES.get(task.status.state, "unknown"),
        status_text=text(task.status.message.parts) if task.status.HasField("message") else "",
        messages=[("agent" if m.role == Role.ROLE_AGENT else "user", text(m.parts)) for m in history],
        message_ids=[m.message_id or f"#{index}" for index, m in enumerate(history)],
        artifacts=[(a.artifact_id, a.name, text(a.parts)) for a in task.artifacts],
        task_json=MessageToDict(task),
    )


def task_of(task_json: dict[str, Any]) -> Task:
    """A task kept as A2A's JSON writes it (TaskView.task_json), back as the SDK's type."""
    return ParseDict(task_json, Task(), ignore_unknown_fields=True)


class StoredCredential(CredentialService):
    """The credential its operator gave for the agent, for every scheme its card names (the SDK's
    AuthInterceptor picks the scheme and the header)."""

    def __init__(self, credential: str) -> None:
        self.credential = credential

    async def get_credentials(self, security_scheme_name: str, context: ClientCallContext | None) -> str | None:
        return self.credential or None


async def with_client[T](remote: Remote, use: Callable[[Any], Awaitable[T]], *, streaming: bool = False,
                         timeout: float | None = None) -> T:
    async with http_client(remote, timeout=timeout) as httpx_client:
        factory = ClientFactory(ClientConfig(streaming=streaming, polling=not streaming, httpx_client=httpx_client))
        interceptors: list[ClientCallInterceptor] = (
            [AuthInterceptor(StoredCredential(remote.credential))] if remote.credential else [])
        client = factory.create(card_parse(remote.card_json), interceptors=interceptors)
        try:
            return await use(client)
        finally:
            await client.close()


def user_message(text: str, *, task_id: str = "", context_id: str = "") -> Message:
    return Message(message_id=uuid.uuid4().hex, role=Role.ROLE_USER, parts=[Part(text=text)], task_id=task_id,
                   context_id=context_id)


def message_send(remote: Remote, text: str, *, task_id: str = "", context_id: str = "") -> TaskView:
    """Send a user message (a new task, or one more message on `task_id`); the task as the agent answers it."""
    message = user_message(text, task_id=task_id, context_id=context_id)
    request = SendMessageRequest(message=message, configuration=SendMessageConfiguration(return_immediately=True))

    async def send(client: Any) -> TaskView:
        async for event in client.send_message(request):
            if event.HasField("task"):
                return task_view(event.task)
            if event.HasField("message"):
                raise RemoteError("The A2A agent answered with a message and started no task.")
        raise RemoteError("The A2A agent answered nothing.")

    return run(lambda: with_client(remote, send))


def task_get(remote: Remote, task_id: str) -> TaskView:
    async def get(client: Any) -> TaskView:
        return task_view(await client.get_task(GetTaskRequest(id=task_id)))

    return run(lambda: with_client(remote, get))


def push_register(remote: Remote, task_id: str, *, url: str, token: str) -> None:
    """Ask the agent to POST the task's updates to `url` (CreateTaskPushNotificationConfig), each carrying `token`
    (the X-A2A-Notification-Token header) by which the webhook knows them; RemoteError when it refuses."""
    config = TaskPushNotificationConfig(task_id=task_id, url=url, token=token)

    async def register(client: Any) -> None:
        await client.create_task_push_notification_config(config)

    run(lambda: with_client(remote, register))


def push_parse(body: bytes) -> StreamResponse:
    """A push notification's body: one StreamResponse (a task, a status update, an artifact update or a message),
    as A2A's JSON writes it; RemoteError saying what is wrong with it."""
    try:
        data = json.loads(body)
    except (UnicodeDecodeError, ValueError):
        raise RemoteError("The notification is not JSON. Nothing was changed.") from None
    if not isinstance(data, dict):
        raise RemoteError("The notification is not a JSON object. Nothing was changed.")
    try:
        event = ParseDict(data, StreamResponse())
    except ParseError as exc:
        raise RemoteError(f"The notification is not an A2A task update ({exc}). Nothing was changed.") from None
    if event.WhichOneof("payload") is None:
        raise RemoteError("The notification carries no task, status update, artifact update or message. "
                          "Nothing was changed.")
    return event


def push_task_id(event: StreamResponse) -> str:
    """The id of the task a notification is about."""
    kind = event.WhichOneof("payload")
    if kind == "task":
        return event.task.id
    if kind == "status_update":
        return event.status_update.task_id
    if kind == "artifact_update":
        return event.artifact_update.task_id
    return event.message.task_id


def task_cancel(remote: Remote, task_id: str) -> TaskView:
    async def cancel(client: Any) -> TaskView:
        return task_view(await client.cancel_task(CancelTaskRequest(id=task_id)))

    return run(lambda: with_client(remote, cancel))


# --- streaming ------------------------------------------------------------------------------------------------


def task_follow(task: Task, event: StreamResponse) -> None:
    """One event of a task's stream applied to the task as the agent keeps it: a task replaces it; a status update
    moves the previous status message to the history (as the agent's task store does; a working status's message
    at once, so that what the agent said is recorded before what it did next) and sets the new status;
    an artifact update adds the artifact or, with `append`, its parts. The same status or message again (a
    push notification delivered twice) changes nothing."""
    if event.HasField("task"):
        task.CopyFrom(event.task)
    elif event.HasField("status_update"):
        update = event.status_update
        if task.status == update.status:
            return  # the same update again (a notification delivered twice): nothing new
        task.id = task.id or update.task_id
        task.context_id = task.context_id or update.context_id
        if task.status.HasField("message") and not said(task, task.status.message):
            task.history.append(task.status.message)
        task.status.CopyFrom(update.status)
        if task.status.state == TaskState.TASK_STATE_WORKING and task.status.HasField("message"):
            task.history.append(task.status.message)  # said now: in the history at once, where it will be
    elif event.HasField("artifact_update"):
        artifact = event.artifact_update.artifact
        known = next((a for a in task.artifacts if a.artifact_id == artifact.artifact_id), None)
        if known is None:
            task.artifacts.append(artifact)
        elif event.artifact_update.append:
            known.parts.extend(artifact.parts)
        else:
            known.CopyFrom(artifact)
    elif event.HasField("message"):
        if not task.id:
            raise RemoteError("The A2A agent answered with a message and started no task.")
        if not said(task, event.message):
            task.history.append(event.message)


def said(task: Task, message: Message) -> bool:
    return any(m.message_id == message.message_id for m in task.history)


def streamed(follow: Callable[[Any, Callable[[Task], None]], Awaitable[None]], remote: Remote, *,
             seconds: float) -> Iterator[TaskView]:
    """The task as each event of a stream leaves it, yielded to the caller's thread while the stream goes on (the
    SDK's client runs on a loop of its own in a thread of its own). The stream is read for at most `seconds`,
    then left: the task is followed again later. RemoteError when the stream could not be opened or broke."""
    views: queue.Queue[TaskView | RemoteError | None] = queue.Queue()

    def emit(task: Task) -> None:
        views.put(task_view(task))

    async def read(client: Any) -> None:
        try:
            async with asyncio.timeout(seconds):
                await follow(client, emit)
        except TimeoutError:
            pass

    def main() -> None:
        try:
            asyncio.run(guarded(lambda: with_client(remote, read, streaming=True, timeout=seconds)))
        except RemoteError as exc:
            views.put(exc)
        finally:
            views.put(None)

    threading.Thread(target=main, name="a2a-stream", daemon=True).start()
    while (item := views.get()) is not None:
        if isinstance(item, RemoteError):
            raise item
        yield item


def message_stream(remote: Remote, text: str, *, task_id: str = "", context_id: str = "",
                   seconds: float | None = None) -> Iterator[TaskView]:
    """Send a user message by SendStreamingMessage (a new task, or one more message on `task_id`) and follow the
    task as it streams, until the agent closes the stream (the task waits for input or ended) or `seconds`."""
    message = user_message(text, task_id=task_id, context_id=context_id)

    async def follow(client: Any, emit: Callable[[Task], None]) -> None:
        task = Task()
        if task_id:  # the task as it is, then this message added to its history as the agent adds it
            task.CopyFrom(await client.get_task(GetTaskRequest(id=task_id)))
            if task.status.HasField("message"):
                task.history.append(task.status.message)
                task.status.ClearField("message")
            task.history.append(message)
        async for event in client.send_message(SendMessageRequest(message=message)):
            task_follow(task, event)
            emit(task)

    return streamed(follow, remote, seconds=settings.A2A_STREAM_MAX_SECONDS if seconds is None else seconds)


def task_subscribe(remote: Remote, task_id: str, *, seconds: float | None = None) -> Iterator[TaskView]:
    """Follow a task already under way by SubscribeToTask (its first event is the task as it is)."""
    async def follow(client: Any, emit: Callable[[Task], None]) -> None:
        task = Task()
        async for event in client.subscribe(SubscribeToTaskRequest(id=task_id)):
            task_follow(task, event)
            emit(task)

    return streamed(follow, remote, seconds=settings.A2A_STREAM_MAX_SECONDS if seconds is None else seconds)
