"""A small remote A2A agent for the tests, written with the official a2a-sdk's server and served on loopback by
uvicorn in a thread: it plans a few file steps (a status message and a plan artifact), asks which format the
summary should use (input-required), then writes the summary (an artifact) and completes after the answer.

`served(streaming=True)` serves a card that offers streaming; `served(push=True)` one that offers push
notifications (the SDK's config store and sender: the agent POSTs each update of a task to the URL it was given,
with its token; PUSHED records the answers it got; `push_refused=True`: the card offers them, the agent
refuses every config); `served(token=...)` one that asks for a bearer token, the
JSON-RPC endpoint refusing (HTTP 401) a request without it. METHODS records the JSON-RPC methods called."""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import httpx
import uvicorn
from a2a.helpers.proto_helpers import new_task
from a2a.server.agent_execution import AgentExecutor, RequestContext
from a2a.server.events import EventQueue
from a2a.server.request_handlers import DefaultRequestHandlerV2
from a2a.server.routes import create_agent_card_routes, create_jsonrpc_routes
from a2a.server.tasks import (
    BasePushNotificationSender,
    InMemoryPushNotificationConfigStore,
    InMemoryTaskStore,
    TaskUpdater,
)
from a2a.types import (
    AgentCapabilities,
    AgentCard,
    AgentInterface,
    AgentSkill,
    HTTPAuthSecurityScheme,
    Part,
    SecurityRequirement,
    SecurityScheme,
    StringList,
    TaskState,
)
from starlette.applications import Starlette
from starlette.middleware.base import BaseHTTPMiddleware, RequestResponseEndpoint
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

QUESTION = "Which format should the summary use: Markdown or plain text?"
ANSWERS: list[str] = []  # what the agent was told, in order (the tests read it)
CANCELLED: list[str] = []  # the tasks cancelled on the agent
METHODS: list[str] = []  # the request handler's methods called, in order
AUTHORIZATIONS: list[str] = []  # the Authorization header of each JSON-RPC request
THINK_SECONDS = 0.0  # how long the agent works before it asks (a test of a stream left and subscribed to again)
WRITE_SECONDS = 0.0  # how long the agent works on the answer before it completes
PUSHED: list[tuple[str, int]] = []  # each push notification the agent sent: (its JSON payload's kind, HTTP status)


class FileAgent(AgentExecutor):
    async def execute(self, context: RequestContext, event_queue: EventQueue) -> None:
        task_id, context_id = context.task_id or "", context.context_id or ""
        updater = TaskUpdater(event_queue, task_id, context_id)
        if context.current_task is None:
            assert context.message is not None
            await event_queue.enqueue_event(new_task(task_id, context_id, TaskState.TASK_STATE_SUBMITTED,
                                                     history=[context.message]))
            await updater.start_work(updater.new_agent_message([Part(text="Planned 3 steps: read notes.txt, "
                                                                          "outline the summary, write summary.md")]))
            await updater.add_artifact([Part(text="1. read notes.txt\n2. outline\n3. write summary.md")], name="plan")
            await asyncio.sleep(THINK_SECONDS)
            await updater.requires_input(updater.new_agent_message([Part(text=QUESTION)]))
            return
        answer = context.get_user_input()
        ANSWERS.append(answer)
        await updater.start_work(updater.new_agent_message([Part(text=f"Writing summary.md as {answer}")]))
        await asyncio.sleep(WRITE_SECONDS)
        await updater.add_artifact([Part(text=f"# Summary ({answer})\nThree notes, one line each.")],
                                   name="summary.md")
        await updater.complete(updater.new_agent_message([Part(text="summary.md written")]))

    async def cancel(self, context: RequestContext, event_queue: EventQueue) -> None:
        CANCELLED.append(context.task_id or "")
        await TaskUpdater(event_queue, context.task_id or "", context.context_id or "").cancel()


class RecordingHandler(DefaultRequestHandlerV2):
    """The SDK's request handler, recording which of its methods the client called."""

    async def on_message_send(self, *args: Any, **kwargs: Any) -> Any:
        METHODS.append("SendMessage")
        return await super().on_message_send(*args, **kwargs)

    async def on_message_send_stream(self, *args: Any, **kwargs: Any) -> Any:
        METHODS.append("SendStreamingMessage")
        async for event in super().on_message_send_stream(*args, **kwargs):
            yield event

    async def on_create_task_push_notification_config(self, *args: Any, **kwargs: Any) -> Any:
        METHODS.append("CreateTaskPushNotificationConfig")
        return await super().on_create_task_push_notification_config(*args, **kwargs)

    async def on_get_task(self, *args: Any, **kwargs: Any) -> Any:
        METHODS.append("GetTask")
        return await super().on_get_task(*args, **kwargs)

    async def on_subscribe_to_task(self, *args: Any, **kwargs: Any) -> Any:
        METHODS.append("SubscribeToTask")
        async for event in super().on_subscribe_to_task(*args, **kwargs):
            yield event


class BearerOnly(BaseHTTPMiddleware):
    def __init__(self, app: Any, token: str) -> None:
        super().__init__(app)
        self.token = token

    async def dispatch(self, request: Request, call_next: RequestResponseEndpoint) -> Response:
        if request.url.path.startswith("/a2a"):
            AUTHORIZATIONS.append(request.headers.get("authorization", ""))
            if self.token and request.headers.get("authorization") != f"Bearer {self.token}":
                return JSONResponse({"error": "unauthorized"}, status_code=401)
        return await call_next(request)


async def pushed(response: httpx.Response) -> None:
    await response.aread()
    kind = next(iter(json.loads(response.request.content) or {"?": 0}), "?")
    PUSHED.append((kind, response.status_code))


def app_for(base: str, *, streaming: bool = False, push: bool = False, push_refused: bool = False,
            token: str = "") -> Starlette:
    security: dict[str, Any] = {}
    if token:
        security = {"security_schemes": {"bearer": SecurityScheme(
                        http_auth_security_scheme=HTTPAuthSecurityScheme(scheme="bearer"))},
                    "security_requirements": [SecurityRequirement(schemes={"bearer": StringList(list=[])})]}
    card = AgentCard(name="Summary writer", description="Summarises the notes in a folder", version="1.0",
                     supported_interfaces=[AgentInterface(url=f"{base}/a2a", protocol_binding="JSONRPC",
                                                          protocol_version="1.0")],
                     capabilities=AgentCapabilities(streaming=streaming, push_notifications=push),
                     default_input_modes=["text/plain"],
                     default_output_modes=["text/plain"],
                     skills=[AgentSkill(id="summarise", name="Summarise notes", description="Summarises notes",
                                        tags=["files"])], **security)
    pushes: dict[str, Any] = {}
    if push and not push_refused:  # refused: the card offers push, the SDK's handler has no store to keep configs
        store = InMemoryPushNotificationConfigStore()
        sender = BasePushNotificationSender(httpx.AsyncClient(event_hooks={"response": [pushed]}), store)
        pushes = {"push_config_store": store, "push_sender": sender}
    handler = RecordingHandler(agent_executor=FileAgent(), task_store=InMemoryTaskStore(), agent_card=card, **pushes)
    app = Starlette(routes=[*create_agent_card_routes(card), *create_jsonrpc_routes(handler, "/a2a")])
    app.add_middleware(BearerOnly, token=token)
    return app


@contextmanager
def served(make: Callable[[str], Starlette] | None = None, *, streaming: bool = False, push: bool = False,
           push_refused: bool = False, token: str = "") -> Iterator[str]:
    """The agent (`make`'s app for its base address, else the test agent's) on a free loopback port: yields its base
    address."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    base = f"http://127.0.0.1:{port}"
    app = make(base) if make is not None else app_for(base, streaming=streaming, push=push, push_refused=push_refused,
                                                                token=token)
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning",
                                           lifespan="off"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started and time.monotonic() < deadline:
        time.sleep(0.02)
    try:
        yield base
    finally:
        server.should_exit = True
        thread.join(5)
