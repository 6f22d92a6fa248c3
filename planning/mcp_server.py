"""The MCP server for external agents: streamable HTTP at /mcp, built on the official `mcp` SDK.

An MCP client (an editor, a desktop assistant, an agent runtime) connects with an agent's API token
(`Authorization: Bearer <token>`, from `manage.py agent_token NAME`) and acts only on that agent, as over
/api/v1/. Its tools call the very services the API calls (planning.services.reported): plans are checked by the
planner's validator against the tools the agent declared, each write records its PlanEvent with the
agent as the actor and pushes after commit, so the dashboard shows an MCP agent like any other.

Every request is checked here before the SDK reads it: the Host (ALLOWED_HOSTS, as Django would), the token
(a missing, unknown or revoked one is a 401 and nothing else), and the token's rate (shared with the API).
The server is stateless (no MCP session kept between requests), so any server process can answer any request.
"""

from __future__ import annotations

import asyncio
import contextvars
import inspect
import json
from collections.abc import Callable
from typing import Annotated, Any

from asgiref.sync import ThreadSensitiveContext, sync_to_async
from django.conf import settings
from django.db import close_old_connections
from django.http import HttpRequest
from django.http.request import split_domain_port, validate_host
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
from mcp.server.subscriptions import InMemorySubscriptionBus
from mcp.server.transport_security import TransportSecuritySettings
from ninja.errors import HttpError
from pydantic import Field, ValidationError

from agents.declared_tools import MAX_TOOLS
from agents.models import AgentToken
from planner_site import tracing
from planner_site.asgi_guards import ASGIApp, Receive, Scope, Send, header
from planner_site.bearer import bearer_token
from planning import api, mcp_tasks
from planning.api import PLAN_MAX_STEPS_DOC, PlanIn, StepIn, ToolIn, VersionIn
from planning.mcp_tasks import PlanTasks, TaskListen
from planning.services import reported
from planning.services.reported import ExternalError

MCP_PATHS = ("/mcp", "/mcp/")
WAIT_MAX_SECONDS = api.LONG_POLL_MAX_SECONDS  # as the API's ?wait= (API_LONG_POLL_MAX_SECONDS)
WAIT_DEFAULT_SECONDS = 30.0
STATE_TOKEN = mcp_tasks.STATE_TOKEN  # where the request's scope carries the authenticated token to the tools

INSTRUCTIONS = """\
You act for one agent of an agent-planner dashboard, where human operators approve, decline (with feedback)
or cancel your plans and steps. Work like this:
1. declare_tools once: the tools your plans may call (risky ones always wait for an operator).
2. submit_plan: a goal and steps; each step calls one declared tool. A refused plan says why; nothing is stored.
3. Loop: wait_for_decision(plan_id). On "run": report_step_start, do the step yourself, report_step_result.
   On "wait": call wait_for_decision again. On "replan": read the operator's feedback and the kept steps,
   then submit_version with the remaining steps. On "cancelled", "failed" or "done": stop.
Step start and result are idempotent by request_id: retry with the same id and nothing happens twice."""


def tool_error(exc: ExternalError | HttpError | ValidationError) -> ToolError:
    """The API's refusal as a tool error: the same message and problems, so a model can correct itself."""
    if isinstance(exc, ExternalError):
        message, problems = exc.message, exc.problems
    elif isinstance(exc, HttpError):
        message, problems = str(exc), []
    else:
        message = "The arguments are not valid. Nothing was changed."
        problems = [f"{'.'.join(str(p) for p in e.get('loc', ()))}: {e.get('msg', 'invalid')}" for e in exc.errors()]
    if problems:
        message += "\nProblems:\n" + "\n".join(f"- {p}" for p in problems)
    return ToolError(message)


async def db_call[T](fn: Callable[..., T], /, **kwargs: Any) -> T:
    """Run a service in Django's thread for sync code, with the connection handling of a Django request
    (connections past their age closed before and after), its refusals turned into tool errors."""

    def call() -> T:
        close_old_connections()
        try:
            return fn(**kwargs)
        finally:
            close_old_connections()

    try:
        return await sync_to_async(call)()
    except (ExternalError, HttpError, ValidationError) as exc:
        raise tool_error(exc) from exc


def token_of(ctx: Context) -> AgentToken:
    """The token the MCP endpoint authenticated this request with (see McpEndpoint)."""
    request = ctx.request_context.request
    token = getattr(getattr(request, "state", None), STATE_TOKEN, None)
    if not isinstance(token, AgentToken):  # only reachable if the server were mounted without McpEndpoint
        raise ToolError("Not authenticated: send 'Authorization: Bearer <token>'.")
    return token


def arguments_known(ctx: Context, tool: Callable[..., Any]) -> None:
    """Refuse an argument the tool does not take (a misspelt optional one would otherwise be dropped unseen), as
    the API refuses an unknown field."""
    params = ctx.request_context.params or {}
    given = params.get("arguments") or {}
    taken = [name for name in inspect.signature(tool).parameters if name != "ctx"]
    unknown = sorted(set(given) - set(taken))
    if unknown:
        raise ToolError(f"Unknown argument{'s' if len(unknown) > 1 else ''} {', '.join(map(repr, unknown))}; "
                        f"this tool takes {', '.join(taken)}. Nothing was changed.")


def traceparent_of(ctx: Context) -> str | None:
    """The caller's W3C trace context: the call's `_meta.traceparent` (MCP's trace context), else the HTTP
    request's `traceparent` header (docs/tracing.md)."""
    params = ctx.request_context.params or {}
    meta = params.get("_meta") if isinstance(params, dict) else None
    if isinstance(meta, dict) and isinstance(meta.get("traceparent"), str):
        return str(meta["traceparent"])
    headers = getattr(ctx.request_context.request, "headers", None)
    return headers.get("traceparent") if headers is not None else None


def body(model: type[PlanIn] | type[VersionIn], fields: dict[str, Any]) -> dict[str, Any]:
    """The arguments checked by the API's own request model (the same limits, the same refusal of what the
    database cannot store), then as the planner's validator reads them (fields not given left out)."""
    given = {k: v for k, v in fields.items() if v is not None}
    given["steps"] = [s.model_dump(exclude_none=True) for s in fields["steps"]]
    return api.body_data(model.model_validate(given))


PlanId = Annotated[int, Field(ge=1, le=api.ID_MAX, description="The plan's id, as submit_plan returned it")]
StepId = Annotated[int, Field(ge=1, le=api.ID_MAX, description="The step's id (not its key), as wait_for_decision "
                                                               "returned it in step.id")]
RequestId = Annotated[str, Field(min_length=1, max_length=reported.REQUEST_ID_MAX,
                                 description="Your id for this call; send the same id when you retry it")]
Steps = Annotated[list[StepIn], Field(min_length=1, max_length=PLAN_MAX_STEPS_DOC,
                                      description="The steps, in order; each calls one of your declared tools")]
ThinkingSummary = Annotated[str | None, Field(max_length=4000, description="Why this plan, in a few sentences")]
Risks = Annotated[list[str] | None, Field(description="What could go wrong")]
Confidence = Annotated[float | None, Field(ge=0, le=100, strict=True, description="0-1 (or a percentage, 1-100)")]


def server_build() -> MCPServer:
    """The MCP server and its tools; the tools act for the agent of the request's token. A listen for task ids is
    served by TaskListen, on the bus of the SDK's own listen handler."""
    bus = InMemorySubscriptionBus()
    app = MCPServer("agent-planner", instructions=INSTRUCTIONS, log_level="WARNING", extensions=[PlanTasks()],
                    subscriptions=bus, middleware=[TaskListen(bus)])

    @app.tool()
    async def declare_tools(
        ctx: Context,
        tools: Annotated[list[ToolIn], Field(max_length=MAX_TOOLS,
                                             description="Every tool your plans may call (replaces the earlier "
                                                         "declaration)")],
    ) -> dict[str, Any]:
        """Declare the tools your plans may call, with their input schemas and risk (risky steps always wait for
        an operator). Do this before submit_plan."""
        arguments_known(ctx, declare_tools)
        agent = token_of(ctx).agent
        declared = await db_call(reported.agent_tools_declare, agent=agent, via=reported.VIA_MCP,
                                 tools=[t.model_dump(exclude_unset=True) for t in tools])
        return {"tools": declared}

    @app.tool()
    async def submit_plan(
        ctx: Context,
        goal: Annotated[str, Field(min_length=1, max_length=500, description="What the plan achieves")],
        steps: Steps,
        thinking_summary: ThinkingSummary = None,
        risks: Risks = None,
        confidence: Confidence = None,
    ) -> dict[str, Any]:
        """Submit a plan (as POST /api/v1/plans). It is checked against your declared tools; a refused plan
        lists every problem and nothing is stored. Returns the plan's id, version and status (awaiting_approval
        while an operator reviews it, or active). Then call wait_for_decision."""
        arguments_known(ctx, submit_plan)
        agent = token_of(ctx).agent
        try:
            data = body(PlanIn, {"goal": goal, "steps": steps, "thinking_summary": thinking_summary,
                                 "risks": risks, "confidence": confidence})
        except ValidationError as exc:
            raise tool_error(exc) from exc
        with tracing.joined(traceparent_of(ctx)):
            plan = await db_call(reported.plan_submit, agent=agent, data=data, via=reported.VIA_MCP)
        return api.created(plan)

    @app.tool()
    async def wait_for_decision(
        ctx: Context,
        plan_id: PlanId,
        timeout_seconds: Annotated[float, Field(ge=0, le=WAIT_MAX_SECONDS,
                                                description=f"How long to wait while the answer is 'wait' "
                                                            f"(at most {WAIT_MAX_SECONDS} s)")] = WAIT_DEFAULT_SECONDS,
    ) -> dict[str, Any]:
        """What to do next on a plan, waiting up to timeout_seconds for an operator. The answer's "action":
        "run" (the step to run now, in "step": report_step_start, run it, report_step_result), "wait" (still
        waiting for an operator: call again), "replan" (the operator declined: "feedback" says why, "kept" lists
        the completed steps that stay; call submit_version), "cancelled" (stop), "failed", "replanned" (a newer
        version exists, in "plan") or "done"."""
        arguments_known(ctx, wait_for_decision)
        token = token_of(ctx)
        try:
            return await api.plan_next_wait(agent=token.agent, plan_id=plan_id, wait=timeout_seconds,
                                             token_id=token.pk, via=reported.VIA_MCP)
        except (ExternalError, HttpError) as exc:
            raise tool_error(exc) from exc

    @app.tool()
    async def report_step_start(ctx: Context, step_id: StepId, request_id: RequestId) -> dict[str, Any]:
        """Say that you start a step wait_for_decision told you to run. Idempotent: a retry with the same
        request_id changes nothing and returns the first answer ("replayed": true)."""
        arguments_known(ctx, report_step_start)
        agent = token_of(ctx).agent
        answer, again = await db_call(reported.step_start, agent=agent, step_id=step_id, request_id=request_id,
                                      via=reported.VIA_MCP)
        return {**answer, "replayed": again}

    @app.tool()
    async def report_step_result(
        ctx: Context,
        step_id: StepId,
        request_id: RequestId,
        succeeded: Annotated[bool, Field(strict=True, description="Whether the step did what it was for")],
        output: Annotated[Any, Field(description="What the step produced (at most 20,000 characters as JSON)")] = None,
        error: Annotated[str, Field(max_length=4000, description="What went wrong; required when succeeded is "
                                                                 "false")] = "",
    ) -> dict[str, Any]:
        """Report how a started step went. A failed step is retried or, in the end, replanned. Idempotent: a
        retry with the same request_id changes nothing and returns the first answer ("replayed": true)."""
        arguments_known(ctx, report_step_result)
        agent = token_of(ctx).agent
        answer, again = await db_call(reported.step_result, agent=agent, step_id=step_id, request_id=request_id,
                                      succeeded=succeeded, output=output, error=error, via=reported.VIA_MCP)
        return {**answer, "replayed": again}

    @app.tool()
    async def submit_version(
        ctx: Context,
        plan_id: PlanId,
        steps: Annotated[list[StepIn], Field(min_length=1, max_length=PLAN_MAX_STEPS_DOC,
                                             description="The remaining steps; completed steps are kept anyway "
                                                         "(repeat or leave them out)")],
        goal: Annotated[str | None, Field(max_length=500, description="Defaults to the previous version's "
                                                                      "goal")] = None,
        thinking_summary: ThinkingSummary = None,
        risks: Risks = None,
        confidence: Confidence = None,
    ) -> dict[str, Any]:
        """Submit the next version of a plan after wait_for_decision answered "replan" (as POST
        /api/v1/plans/{id}/versions): the operator's feedback taken into account, completed steps kept. Checked
        like submit_plan; returns the new version's id, version and status."""
        arguments_known(ctx, submit_version)
        agent = token_of(ctx).agent
        try:
            data = body(VersionIn, {"goal": goal, "steps": steps, "thinking_summary": thinking_summary,
                                    "risks": risks, "confidence": confidence})
        except ValidationError as exc:
            raise tool_error(exc) from exc

        def version_submit() -> Any:
            plan = reported.agent_plan_get(agent=agent, plan_id=plan_id)
            return reported.plan_version_submit(agent=agent, plan=plan, data=data, via=reported.VIA_MCP)

        return api.created(await db_call(version_submit))

    @app.tool()
    async def get_plan(ctx: Context, plan_id: PlanId) -> dict[str, Any]:
        """A plan of yours with its steps and their statuses, results and errors (as GET /api/v1/plans/{id})."""
        arguments_known(ctx, get_plan)
        agent = token_of(ctx).agent

        def read() -> dict[str, Any]:
            return reported.plan_data(reported.agent_plan_get(agent=agent, plan_id=plan_id))

        return await db_call(read)

    return app


# --- the ASGI endpoint --------------------------------------------------------------------------------------


def host_allowed(scope: Scope) -> bool:
    """The Host is one of ALLOWED_HOSTS, as Django checks it for every page (these requests bypass Django)."""
    allowed = settings.ALLOWED_HOSTS
    if settings.DEBUG and not allowed:
        allowed = [".localhost", "127.0.0.1", "[::1]"]
    domain, _port = split_domain_port(header(scope, b"host") or "")
    return bool(domain) and validate_host(domain, allowed)


async def answer(send: Send, status: int, detail: str, headers: list[tuple[bytes, bytes]] | None = None) -> None:
    """A refusal in the API's shape (JSON with a detail), before the MCP server has read anything."""
    content = json.dumps({"detail": detail}).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(content)).encode()),
                            *(headers or [])]})
    await send({"type": "http.response.body", "body": content})


def token_authenticated(authorization: str) -> AgentToken | None:
    """The token of an `Authorization: Bearer <token>` header, as the API authenticates it."""
    close_old_connections()
    try:
        raw = bearer_token(authorization)
        return api.token_authenticate(raw) if raw else None
    finally:
        close_old_connections()


def token_throttled(token: AgentToken) -> float | None:
    """Seconds to wait when the token is over its rate (the API's throttle and counters), else None."""
    throttle = api.TokenRateThrottle()
    request = HttpRequest()
    request.auth = token  # type: ignore[attr-defined]  # what the throttle keys its counter on, as in the API
    if throttle.allow_request(request):
        return None
    return throttle.wait() or 1.0


class McpEndpoint:
    """Serve the MCP server at /mcp and pass every other request on to `app` (Django).

    The SDK's session manager needs a task group alive for as long as requests come; it is started on the first
    request, in a task of its own on that event loop (the server runs with lifespan="off"), and started anew on
    another loop (each test has its own)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app
        self.loop: asyncio.AbstractEventLoop | None = None
        self.manager: StreamableHTTPSessionManager | None = None
        self.ready: asyncio.Event | None = None
        self.task: asyncio.Task[None] | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope.get("path") not in MCP_PATHS:
            await self.app(scope, receive, send)
            return
        # As Django does for each request: its sync calls get a thread of their own, not the one thread that the
        # rest of the process (the live pages' consumers) shares.
        async with ThreadSensitiveContext():
            await self.serve(scope, receive, send)

    async def serve(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Check the Host, the token, its rate and the method before the SDK reads the request."""
        if not host_allowed(scope):
            await answer(send, 400, "Invalid Host header; add the host to ALLOWED_HOSTS.")
            return
        try:
            token = await sync_to_async(token_authenticated)(header(scope, b"authorization") or "")
        except HttpError as exc:  # the token of an agent that is not external
            await answer(send, exc.status_code, str(exc))
            return
        if token is None:
            await answer(send, 401, "Missing, unknown or revoked token: send 'Authorization: Bearer <token>'.",
                         [(b"www-authenticate", b"Bearer")])
            return
        wait = await sync_to_async(token_throttled)(token)
        if wait is not None:
            await answer(send, 429, "Too many requests for this token; slow down. Nothing was changed.",
                         [(b"retry-after", str(int(wait) + 1).encode())])
            return
        if scope.get("method") != "POST":
            # Stateless: no stream for the server to speak on later (GET), no session to end (DELETE).
            await answer(send, 405, "Only POST: this MCP server keeps no session and opens no stream of its own.",
                         [(b"allow", b"POST")])
            return
        scope = dict(scope, state={**scope.get("state", {}), STATE_TOKEN: token})
        manager = await self.manager_running()
        await manager.handle_request(scope, receive, send)

    async def manager_running(self) -> StreamableHTTPSessionManager:
        loop = asyncio.get_running_loop()
        if self.loop is not loop or self.manager is None or self.ready is None:
            server = server_build()
            # Stateless: no session lives in one process's memory. The Host was checked above (ALLOWED_HOSTS), so
            # the SDK's own check, which knows only localhost names, is off; bodies are limited by BodyLimit.
            server.streamable_http_app(
                stateless_http=True, max_request_body_size=api.body_limit(),
                transport_security=TransportSecuritySettings(enable_dns_rebinding_protection=False))
            self.loop, self.manager, self.ready = loop, server.session_manager, asyncio.Event()
            # A context of its own: the manager outlives this request and must not carry its context along.
            self.task = loop.create_task(self.manager_run(self.manager, self.ready), context=contextvars.Context())
        await self.ready.wait()
        return self.manager

    @staticmethod
    async def manager_run(manager: StreamableHTTPSessionManager, ready: asyncio.Event) -> None:
        async with manager.run():
            ready.set()
            await asyncio.Event().wait()  # until the server stops (its loop's tasks are cancelled)
