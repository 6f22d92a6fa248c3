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

The server stays stateless: a task id is the plan's id and its agent, signed with the project's SECRET_KEY
(django.core.signing), so any server process can answer `tasks/get` and no id can be guessed or forged; the
request's token must also be the plan's agent's, else the task is unknown.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from asgiref.sync import sync_to_async
from django.core import signing
from django.db import close_old_connections
from mcp.server.context import CallNext, HandlerResult, ServerRequestContext
from mcp.server.extension import Extension, MethodBinding
from mcp.shared.exceptions import MCPError
from mcp_types import (
    INVALID_PARAMS,
    CallToolRequestParams,
    CallToolResult,
    ElicitRequest,
    ElicitRequestFormParams,
    GetTaskRequestParams,
    RequestParams,
    TextContent,
)
from mcp_types.version import MODERN_PROTOCOL_VERSIONS
from ninja.errors import HttpError

from agents.models import AgentToken
from planning import api
from planning.live.hub import LiveHub, hub_get
from planning.models import Plan, PlanStep
from planning.services import reported
from planning.services.reported import ExternalError

TASKS_EXTENSION = "io.modelcontextprotocol/tasks"
TASK_SALT = "planning.mcp_tasks.plan"
TASK_POLL_MS = 1000  # the pollInterval suggested to clients
# The tools that may answer with a task: a plan submitted for approval, a wait for a decision, the start of a step
# that needs an operator's approval first.
TASKS_TOOLS = frozenset({"submit_plan", "wait_for_decision", "report_step_start"})
TOOL_ARGUMENTS = {"wait_for_decision": {"plan_id", "timeout_seconds"}, "report_step_start": {"step_id", "request_id"}}
STATE_TOKEN = "agent_token"  # where the request's scope carries the authenticated token (set by McpEndpoint)
QUESTION_KEY = "answer"  # the key of the planner's question in inputRequests, of its answer in inputResponses
WAITING = frozenset({"working", "input_required"})  # a task in these states is returned as a task
TASK_KEPT_SECONDS = 30.0  # a task's state is forgotten (its watch ended) when not polled for this long


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

