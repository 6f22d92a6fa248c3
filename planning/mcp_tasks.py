"""MCP waits as tasks: the `io.modelcontextprotocol/tasks` extension on the MCP server (docs/mcp-tasks.md).

A client on MCP 2026-07-28 that declares the extension in its request's capabilities gets a task where it would
otherwise wait for an operator: from `submit_plan` when the plan awaits approval, from `wait_for_decision` instead
of a "wait" answer, and from `report_step_start` instead of the refusal of a step that needs an operator's approval
first (the step is put up for approval, as `wait_for_decision` does). `tasks/get` answers with the task's state:
"working" while the operator has not decided, then "completed" with the decision in `result` (a tool result whose
structured content is the answer `wait_for_decision` would give: "run" with the step, "replan" with the operator's
feedback, "cancelled"...). A plan whose planner asks a question (needs clarification, seed 003) is a task in
"input_required" with the question as a form elicitation in `inputRequests`; the client's `tasks/update` with its
answer in `inputResponses` is recorded as an operator's answer would be (plan_clarify, the agent as the actor), and
the task goes on. Clients that do not declare the extension, and every client on 2025-11-25, get today's answer and
poll `wait_for_decision` as before (the question waits for an operator in the inbox).

A client may follow its tasks by notification instead of polling: `subscriptions/listen` with
`notifications.taskIds` is served by `TaskListen` (server middleware, since the SDK's own listen handler knows only
the core keys): the acknowledgement lists the ids it follows (the agent's own), then `notifications/tasks` carries a
task's full state, as `tasks/get` would answer it, whenever its plan or agent changes (`TaskStream`).

The server stays stateless: a task id is the plan's id and its agent, signed with the project's SECRET_KEY
(django.core.signing), so any server process can answer `tasks/get` and no id can be guessed or forged; the
request's token must also be the plan's agent's, else the task is unknown.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Literal, cast

import anyio
from asgiref.sync import sync_to_async
from django.core import signing
from django.db import close_old_connections
from mcp.server.context import CallNext, HandlerResult, ServerRequestContext
from mcp.server.extension import Extension, MethodBinding
from mcp.server.mcpserver import require_client_extension
from mcp.server.subscriptions import SubscriptionBus
from mcp.shared.exceptions import MCPError
from mcp.shared.subscriptions import (
    SUBSCRIPTION_ID_META_KEY,
    ServerEvent,
    event_matches,
    event_to_notification,
)
from mcp_types import (
    INVALID_PARAMS,
    INVALID_REQUEST,
    CallToolRequestParams,
    CallToolResult,
    ElicitRequest,
    ElicitRequestFormParams,
    GetTaskRequestParams,
    Notification,
    RequestParams,
    ServerNotification,
    SubscriptionFilter,
    SubscriptionsAcknowledgedNotification,
    SubscriptionsAcknowledgedNotificationParams,
    SubscriptionsListenRequestParams,
    SubscriptionsListenResult,
    TextContent,
)
from mcp_types.version import MODERN_PROTOCOL_VERSIONS
from ninja.errors import HttpError
from pydantic import ValidationError

from agents.models import AgentToken
from planning import api
from planning.api_ws import token_watched
from planning.live.hub import LiveHub, hub_get
from planning.models import Plan, PlanStep
from planning.services import reported
from planning.services.reported import ExternalError

TASKS_EXTENSION = "io.modelcontextprotocol/tasks"
TASK_SALT = "planning.mcp_tasks.plan"
TASK_POLL_MS = 1000  # the pollIntervalMs suggested to clients
# The tools that may answer with a task: a plan submitted for approval, a wait for a decision, the start of a step
# that needs an operator's approval first.
TASKS_TOOLS = frozenset({"submit_plan", "wait_for_decision", "report_step_start"})
TOOL_ARGUMENTS = {"wait_for_decision": {"plan_id", "timeout_seconds"}, "report_step_start": {"step_id", "request_id"}}
STATE_TOKEN = "agent_token"  # where the request's scope carries the authenticated token (set by McpEndpoint)
QUESTION_KEY = "answer"  # the key of the planner's question in inputRequests, of its answer in inputResponses
WAITING = frozenset({"working", "input_required"})  # a task in these states is returned as a task
TASK_KEPT_SECONDS = 30.0  # a task's state is forgotten (its watch ended) when not polled for this long
LISTEN = "subscriptions/listen"
LISTEN_TASKS_MAX = 100  # task ids one listen may follow


class UpdateTaskRequestParams(RequestParams):
    """`tasks/update`: the client's answers to the task's input requests, keyed as they were asked."""

    task_id: str
    input_responses: dict[str, Any] | None = None


def iso(moment: datetime) -> str:
    return moment.astimezone(UTC).isoformat().replace("+00:00", "Z")


def task_id_for(*, agent_id: int, plan_id: int) -> str:
    return signing.dumps({"a": agent_id, "p": plan_id}, salt=TASK_SALT, compress=True)


def plan_id_of(task_id: str, *, agent_id: int) -> int | None:
    """The plan of a task id this server signed for this agent, else None (forged, altered or another agent's)."""
    try:
        data = signing.loads(task_id, salt=TASK_SALT)
    except signing.BadSignature:
        return None
    if not isinstance(data, dict) or data.get("a") != agent_id or not isinstance(data.get("p"), int):
        return None
    return int(data["p"])


def task_declared(ctx: ServerRequestContext[Any, Any]) -> bool:
    """The request is on a modern protocol version and its client declared the tasks extension."""
    if ctx.protocol_version not in MODERN_PROTOCOL_VERSIONS:
        return False
    capabilities = ctx.session.client_capabilities
    return capabilities is not None and TASKS_EXTENSION in (capabilities.extensions or {})


def token_in(ctx: ServerRequestContext[Any, Any]) -> AgentToken | None:
    token = getattr(getattr(ctx.request, "state", None), STATE_TOKEN, None)
    return token if isinstance(token, AgentToken) else None


def arguments_valid(arguments: dict[str, Any]) -> bool:
    """The optional arguments a task does not use are still checked as the tool checks them."""
    timeout = arguments.get("timeout_seconds", 0)
    request_id = arguments.get("request_id", "-")
    return (type(timeout) in (int, float) and 0 <= timeout <= api.LONG_POLL_MAX_SECONDS
            and isinstance(request_id, str) and 1 <= len(request_id) <= reported.REQUEST_ID_MAX)


def plan_waited_on(*, token: AgentToken, tool: str, arguments: dict[str, Any]) -> int | None:
    """The plan that `wait_for_decision` would wait on, or whose step `report_step_start` would be refused until an
    operator approves it; None when the tool should answer itself (its arguments wrong, the plan not the agent's,
    the step free to start)."""
    if not set(arguments) <= TOOL_ARGUMENTS[tool] or not arguments_valid(arguments):
        return None  # the tool refuses an unknown or invalid argument itself
    close_old_connections()
    try:
        if tool == "wait_for_decision":
            plan_id = arguments.get("plan_id")
            if type(plan_id) is not int:
                return None
            try:
                plan = reported.agent_plan_get(agent=token.agent, plan_id=plan_id)
            except (ExternalError, HttpError):
                return None
            return plan.pk
        step_id = arguments.get("step_id")
        if type(step_id) is not int:
            return None
        step = PlanStep.objects.select_related("plan").filter(pk=step_id, plan__agent_id=token.agent_id).first()
        if step is None or step.status not in (PlanStep.Status.PENDING, PlanStep.Status.AWAITING_APPROVAL):
            return None
        if step.status == PlanStep.Status.PENDING and not step.needs_approval(step.plan):
            return None
        return step.plan_id
    finally:
        close_old_connections()


def task_read(*, token: AgentToken, plan_id: int, task_id: str) -> dict[str, Any]:
    """The task's state from the plan: working while the next action is "wait", else completed with it."""
    close_old_connections()
    try:
        agent = token.agent
        plan = reported.agent_plan_get(agent=agent, plan_id=plan_id)
        answer = reported.plan_next(agent=agent, plan_id=plan_id, via=reported.VIA_MCP)
        plan.refresh_from_db(fields=["status", "updated_at", "clarification_question"])
    finally:
        close_old_connections()
    state: dict[str, Any] = {
        "taskId": task_id, "createdAt": iso(plan.created_at), "lastUpdatedAt": iso(plan.updated_at),
        "ttlMs": None, "pollIntervalMs": TASK_POLL_MS,
        # The same under the names of 2025-11-25's core tasks, for clients that read them from this server before.
        "ttl": None, "pollInterval": TASK_POLL_MS}
    if answer["action"] == "wait" and plan.status == Plan.Status.CLARIFYING:
        question = plan.clarification_question
        return {**state, "status": "input_required", "statusMessage": f"The planner asks: {question}",
                "inputRequests": {QUESTION_KEY: question_request(question)}}
    if answer["action"] == "wait":
        return {**state, "status": "working",
                "statusMessage": f"Waiting: {answer.get('reason') or 'for an operator'}."}
    decided = {"id": plan.pk, "version": plan.version, "status": plan.status, "decision": answer}
    result = CallToolResult(content=[TextContent(text=decision_text(answer))], structured_content=decided)
    return {**state, "status": "completed", "statusMessage": f"The operator's decision: {answer['action']}.",
            "result": result.model_dump(by_alias=True, mode="json", exclude_none=True)}


@dataclass
class Kept:
    """A task's "working" state, kept while no push says its plan or agent changed."""

    hub: LiveHub
    used: float
    state: dict[str, Any] | None = None
    changes: int = 0  # pushes about its plan or agent so far
    watch: object = field(default=None)

    def forget(self) -> None:
        self.state = None
        self.changes += 1


class TaskStates:
    """The "working" state of each task this process answered, kept until the live hub says its plan or agent
    changed (from any process, as a waiting long poll learns it): clients following their tasks every
    `pollInterval` are answered from memory, not with the plan's queries each (200 clients polling every second
    held the server's database pool, and an operator's decision waited for a connection; docs/performance.md).
    Without live updates (the hub cannot listen, or its layer does not answer) every poll reads the plan."""

    def __init__(self) -> None:
        self.kept: dict[tuple[int, int], Kept] = {}

    async def state(self, *, agent_id: int, plan_id: int,
                    read: Callable[[], Awaitable[dict[str, Any]]]) -> dict[str, Any]:
        now = asyncio.get_running_loop().time()
        await self.forget_unused(now)
        key = (agent_id, plan_id)
        kept = self.kept.get(key)
        if kept is not None and kept.state is not None and kept.hub.healthy:
            kept.used = now
            return kept.state
        if kept is None:
            try:
                hub = await hub_get()
            except Exception:  # LayerUnavailable, or Redis refusing: read each time
                return await read()
            kept = self.kept.get(key)
            if kept is None:
                kept = self.kept[key] = Kept(hub=hub, used=now)
                kept.watch = hub.watch(agents={agent_id}, plans={plan_id}, notify=kept.forget)
        changes = kept.changes  # watched before the read: a change during it is not missed
        state = await read()
        kept.used = now
        if state["status"] == "working" and kept.changes == changes:
            kept.state = state
        return state

    async def forget_unused(self, now: float) -> None:
        for key, kept in list(self.kept.items()):
            if now - kept.used > TASK_KEPT_SECONDS:
                del self.kept[key]
                await kept.hub.unwatch(kept.watch)


_task_states: dict[asyncio.AbstractEventLoop, TaskStates] = {}


def task_states() -> TaskStates:
    """This event loop's (the hub is one a loop)."""
    loop = asyncio.get_running_loop()
    for old in [lp for lp in _task_states if lp.is_closed()]:
        del _task_states[old]
    return _task_states.setdefault(loop, TaskStates())


def question_request(question: str) -> dict[str, Any]:
    """The planner's question as a form elicitation: one text field, the answer."""
    request = ElicitRequest(params=ElicitRequestFormParams(message=question, requested_schema={
        "type": "object", "required": [QUESTION_KEY],
        "properties": {QUESTION_KEY: {"type": "string", "title": "Your answer", "maxLength": 2000}}}))
    return request.model_dump(by_alias=True, mode="json", exclude_none=True)


def answer_of(responses: dict[str, Any] | None) -> str:
    """The answer in the client's input responses; MCPError when there is none (declined, dismissed, empty)."""
    response = (responses or {}).get(QUESTION_KEY)
    content = response.get("content") if isinstance(response, dict) else None
    answer = content.get(QUESTION_KEY) if isinstance(content, dict) else None
    if not isinstance(response, dict) or response.get("action") != "accept" or not isinstance(answer, str) or (
            not answer.strip()):
        raise MCPError(INVALID_PARAMS, f"No answer in inputResponses.{QUESTION_KEY} (an accepted form with a text "
                                       "answer); the question still waits for an operator. Nothing was changed.")
    return answer


def decision_text(answer: dict[str, Any]) -> str:
    action = answer["action"]
    if action == "replan":
        return f"replan: {answer.get('feedback') or 'the operator declined'}"
    return str(action)


class PlanTasks(Extension):
    """`submit_plan` as a task for clients that declare the extension; `tasks/get` to follow it."""

    identifier = TASKS_EXTENSION

    def methods(self) -> Sequence[MethodBinding]:
        return (MethodBinding(method="tasks/get", params_type=GetTaskRequestParams, handler=self.task_get,
                              protocol_versions=frozenset(MODERN_PROTOCOL_VERSIONS)),
                MethodBinding(method="tasks/update", params_type=UpdateTaskRequestParams, handler=self.task_update,
                              protocol_versions=frozenset(MODERN_PROTOCOL_VERSIONS)))

    async def intercept_tool_call(self, params: CallToolRequestParams, ctx: ServerRequestContext[Any, Any],
                                  call_next: CallNext) -> HandlerResult:
        token = token_in(ctx)
        if params.name not in TASKS_TOOLS or token is None or not task_declared(ctx):
            return await call_next(ctx)
        arguments = params.arguments or {}
        if params.name == "submit_plan":
            result = await call_next(ctx)
            created = result.structured_content if isinstance(result, CallToolResult) and not result.is_error else None
            plan_id = (created or {}).get("id")
        else:  # wait_for_decision, report_step_start: a task instead of a wait or a refusal, else the tool's answer
            result = None
            plan_id = await sync_to_async(plan_waited_on)(token=token, tool=params.name, arguments=arguments)
        if isinstance(plan_id, int):
            task_id = task_id_for(agent_id=token.agent_id, plan_id=plan_id)
            state = await sync_to_async(task_read)(token=token, plan_id=plan_id, task_id=task_id)
            if state["status"] in WAITING:
                return {"resultType": "task", **state}
        return result if result is not None else await call_next(ctx)

    async def task_get(self, ctx: ServerRequestContext[Any, Any], params: Any) -> HandlerResult:
        token, plan_id, task_id = task_known(ctx, params.task_id if isinstance(params, GetTaskRequestParams) else "")
        try:
            state = await task_states().state(
                agent_id=token.agent_id, plan_id=plan_id,
                read=lambda: sync_to_async(task_read)(token=token, plan_id=plan_id, task_id=task_id))
        except (ExternalError, HttpError) as exc:
            raise MCPError(INVALID_PARAMS, str(getattr(exc, "message", exc))) from exc
        return {"resultType": "complete", **state}

    async def task_update(self, ctx: ServerRequestContext[Any, Any], params: Any) -> HandlerResult:
        """The client's answer to the planner's question: recorded as an operator's answer is, once; the task's
        state after it."""
        token, plan_id, task_id = task_known(
            ctx, params.task_id if isinstance(params, UpdateTaskRequestParams) else "")
        answer = answer_of(params.input_responses)

        def answered() -> dict[str, Any]:
            close_old_connections()
            try:
                reported.plan_answer(agent=token.agent, plan_id=plan_id, answer=answer, via=reported.VIA_MCP)
            finally:
                close_old_connections()
            return task_read(token=token, plan_id=plan_id, task_id=task_id)

        try:
            state = await sync_to_async(answered)()
        except (ExternalError, HttpError) as exc:
            raise MCPError(INVALID_PARAMS, str(getattr(exc, "message", exc))) from exc
        return {"resultType": "complete", **state}


def task_known(ctx: ServerRequestContext[Any, Any], task_id: str) -> tuple[AgentToken, int, str]:
    """The request's token and the plan of a task id this server signed for its agent; MCPError otherwise."""
    token = token_in(ctx)
    plan_id = plan_id_of(task_id, agent_id=token.agent_id) if token is not None else None
    if token is None or plan_id is None:
        raise MCPError(INVALID_PARAMS, "Unknown task id. Nothing was changed.")
    return token, plan_id, task_id



# --- following tasks by notification: subscriptions/listen with taskIds ------------------------------------------


class TaskStatusNotification(Notification[dict[str, Any], Literal["notifications/tasks"]]):
    """The extension's `notifications/tasks`: a task's full state, as `tasks/get` answers it (the SDK has no model
    of it; its `send_notification` is typed for the core notifications only, and sends any)."""

    method: Literal["notifications/tasks"] = "notifications/tasks"


def tasks_read(*, token: AgentToken, plans: dict[str, int], token_checked: bool) -> dict[str, dict[str, Any] | None]:
    """Each task's state, as `tasks/get` reads it (None: its plan is gone, or not the agent's); with `token_checked`,
    MCPError first when the token is no longer active (revoked or expired while the stream was open)."""
    if token_checked:
        close_old_connections()
        try:
            active = api.token_active(token.pk)
        finally:
            close_old_connections()
        if not active:
            raise MCPError(INVALID_REQUEST, "This token was revoked or expired while listening; nothing more is "
                                            "sent to it.")
    states: dict[str, dict[str, Any] | None] = {}
    for task_id, plan_id in plans.items():
        try:
            states[task_id] = task_read(token=token, plan_id=plan_id, task_id=task_id)
        except (ExternalError, HttpError):
            states[task_id] = None
    return states


def core_filter(requested: SubscriptionFilter) -> SubscriptionFilter:
    """The core keys of a listen's filter that are honoured, as the SDK's listen handler honours them (every key
    asked for; nothing false or empty echoed back)."""
    return SubscriptionFilter(
        tools_list_changed=True if requested.tools_list_changed else None,
        prompts_list_changed=True if requested.prompts_list_changed else None,
        resources_list_changed=True if requested.resources_list_changed else None,
        resource_subscriptions=list(requested.resource_subscriptions) if requested.resource_subscriptions else None)


class TaskStream:
    """One `subscriptions/listen` stream that follows tasks (and whatever core keys it also asked for).

    The tasks' plans and agent are watched on the live hub (the pushes a waiting long poll wakes on, from any
    process) before their states are read, so a change while the stream opens is not missed; the acknowledgement
    lists the task ids it follows (the request's agent's own, whose plans exist), then every task not "working" is
    sent at once (decided before the listen: no race lost). After that a task's state is read again when its plan or
    agent changes, and sent when it differs from the last one; a terminal one ("completed") is the last sent for
    that task. Without live updates (the hub cannot listen, or its heartbeat fails) the states are read every
    `pollInterval` instead. The stream ends (the listen's result) when no task is left to follow and it asked for
    nothing else; a token revoked or expired meanwhile ends it with an error."""

    def __init__(self, ctx: ServerRequestContext[Any, Any], token: AgentToken, requested: SubscriptionFilter,
                 task_ids: list[str], bus: SubscriptionBus) -> None:
        self.ctx = ctx
        self.token = token
        self.bus = bus
        self.meta: dict[str, Any] = {SUBSCRIPTION_ID_META_KEY: ctx.request_id}
        self.core = core_filter(requested)
        self.uris = frozenset(self.core.resource_subscriptions or ())
        self.core_wanted = bool(self.core.tools_list_changed or self.core.prompts_list_changed
                                or self.core.resources_list_changed or self.uris)
        self.plans = {task_id: plan_id for task_id in dict.fromkeys(task_ids)
                      if (plan_id := plan_id_of(task_id, agent_id=token.agent_id)) is not None}
        self.last: dict[str, dict[str, Any]] = {}
        self.events: dict[ServerEvent, None] = {}  # core events not sent yet (each a level trigger: kept once)
        self.changed = False
        self.woken = asyncio.Event()

    def deliver(self, event: ServerEvent) -> None:
        """The bus's listener: a core event this stream asked for."""
        if event_matches(self.core, self.uris, event):
            self.events[event] = None
            self.woken.set()

    def change(self) -> None:
        """The hub's (and the token watch's) notice: a followed plan or the agent changed."""
        self.changed = True
        self.woken.set()

    async def send(self, notification: Notification[Any, Any]) -> None:
        await self.ctx.session.send_notification(cast(ServerNotification, notification),
                                                 related_request_id=self.ctx.request_id)

    async def serve(self) -> SubscriptionsListenResult:
        unsubscribe = self.bus.subscribe(self.deliver)
        hub: LiveHub | None = None
        watch: object = None
        if self.plans:
            with contextlib.suppress(Exception):  # LayerUnavailable, or Redis refusing: read every pollInterval
                hub = await hub_get()
                watch = hub.watch(agents={self.token.agent_id}, plans=set(self.plans.values()), notify=self.change)
        try:
            with token_watched(self.token.pk, self.change):
                states = await sync_to_async(tasks_read)(token=self.token, plans=self.plans, token_checked=False)
                self.plans = {task_id: plan_id for task_id, plan_id in self.plans.items()
                              if states[task_id] is not None}
                honoured = SubscriptionFilter.model_validate(
                    {**self.core.model_dump(by_alias=True, exclude_none=True), "taskIds": list(self.plans)})
                await self.send(SubscriptionsAcknowledgedNotification(
                    params=SubscriptionsAcknowledgedNotificationParams(notifications=honoured, _meta=self.meta)))
                for task_id, state in states.items():
                    if state is not None and state["status"] == "working":
                        self.last[task_id] = state  # what the client was answered: nothing new to send
                await self.states_sent(states)
                await self.follow(hub)
        finally:
            unsubscribe()
            if hub is not None:
                with anyio.CancelScope(shield=True):  # also when the client went away (the handler cancelled)
                    await hub.unwatch(watch)
        return SubscriptionsListenResult(_meta=self.meta)

    async def follow(self, hub: LiveHub | None) -> None:
        while self.plans or self.core_wanted:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.woken.wait(), TASK_POLL_MS / 1000 if self.plans else None)
            self.woken.clear()
            events, self.events = list(self.events), {}
            for event in events:
                await self.send(event_to_notification(event, self.meta))
            if self.plans and (self.changed or hub is None or not hub.healthy):
                self.changed = False
                await self.states_sent(await sync_to_async(tasks_read)(token=self.token, plans=self.plans,
                                                                       token_checked=True))

    async def states_sent(self, states: dict[str, dict[str, Any] | None]) -> None:
        """Send each task's state that differs from the last one sent; stop following a task that ended."""
        for task_id, state in states.items():
            if state is None:  # its plan is gone: tasks/get knows it no more either
                self.plans.pop(task_id, None)
                continue
            if state != self.last.get(task_id):
                self.last[task_id] = state
                await self.send(TaskStatusNotification(params={**state, "_meta": self.meta}))
            if state["status"] not in WAITING:
                self.plans.pop(task_id, None)


def task_ids_asked(ctx: ServerRequestContext[Any, Any]) -> tuple[SubscriptionFilter, list[str]] | None:
    """A 2026-07-28 `subscriptions/listen` that asks for `notifications.taskIds`: its filter and the ids; None for
    any other request (the SDK answers it as before). MCPError -32021 when the client did not declare the tasks
    extension, -32602 when `taskIds` is not a list of at most LISTEN_TASKS_MAX strings."""
    if ctx.method != LISTEN or ctx.request_id is None or ctx.protocol_version not in MODERN_PROTOCOL_VERSIONS:
        return None
    try:
        params = SubscriptionsListenRequestParams.model_validate(ctx.params or {}, by_name=False)
    except ValidationError:
        return None  # the SDK refuses it as it refuses any malformed listen
    extra = params.notifications.model_extra or {}
    if "taskIds" not in extra:
        return None
    task_ids = extra["taskIds"]
    require_client_extension(ctx, TASKS_EXTENSION)
    if not isinstance(task_ids, list) or not all(isinstance(t, str) for t in task_ids) or (
            len(task_ids) > LISTEN_TASKS_MAX):
        raise MCPError(INVALID_PARAMS, f"notifications.taskIds takes a list of at most {LISTEN_TASKS_MAX} task "
                                       "ids.")
    return params.notifications, task_ids


class TaskListen:
    """Server middleware (`MCPServer(middleware=...)`) that serves a `subscriptions/listen` asking for task ids with
    a `TaskStream`, its core keys from the same bus as the SDK's listen handler; every other request goes on
    unchanged. (An extension may add methods but not bind a core one such as `subscriptions/listen`, and the SDK's
    handler honours only the core keys.)"""

    def __init__(self, bus: SubscriptionBus) -> None:
        self.bus = bus

    async def __call__(self, ctx: ServerRequestContext[Any, Any], call_next: CallNext) -> HandlerResult:
        asked = task_ids_asked(ctx)
        if asked is None:
            return await call_next(ctx)
        token = token_in(ctx)
        if token is None:
            raise MCPError(INVALID_PARAMS, "Not authenticated: send 'Authorization: Bearer <token>'.")
        requested, task_ids = asked
        return await TaskStream(ctx, token, requested, task_ids, self.bus).serve()
