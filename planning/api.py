"""The HTTP API for external agents, /api/v1/ (django-ninja: typed schemas, OpenAPI at /api/openapi.json,
interactive docs at /api/docs).

Authentication is a bearer token (`Authorization: Bearer <token>`, see `manage.py agent_token`) that acts
only on its own agent; the API accepts no session cookie, so it needs no CSRF token and a browser
session cannot be used against it. Every refusal is JSON `{"detail": "...", "problems": [...]}` and
changes nothing. Request bodies are limited in size and each token in rate.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import os
import random
from collections.abc import Callable
from functools import partial, wraps
from typing import Annotated, Any, Literal

from asgiref.sync import sync_to_async
from django.conf import settings
from django.contrib.auth.views import redirect_to_login
from django.core.exceptions import RequestDataTooBig
from django.db import connection
from django.http import HttpRequest, HttpResponse
from django.urls import URLPattern, URLResolver
from django.utils import timezone
from django.views.decorators.http import require_safe
from ninja import Field, NinjaAPI, Query, Router, Schema
from ninja.errors import AuthenticationError, HttpError, Throttled, ValidationError
from ninja.responses import Status
from ninja.security import HttpBearer
from ninja.throttling import SimpleRateThrottle
from pydantic import AliasChoices, BaseModel, ConfigDict, model_validator

from agents.connections import in_transaction
from agents.declared_tools import DESCRIPTION_MAX, MAX_PROPERTIES, MAX_TOOLS, NAME_PATTERN, RISK_NAMES
from agents.models import Agent, AgentToken
from agents.tools import MAX_LOOP_RUNS
from planner_site import tracing
from planner_site.bearer import bearer_token
from planner_site.validators import json_problem
from planning.api_ws import token_watched
from planning.live.hub import changes_watched
from planning.schemas import StepOut
from planning.services import reported
from planning.services.reported import ExternalError

# From the environment; a Django setting of the same name overrides (tests do).
API_MAX_BODY_BYTES = int(os.environ.get("API_MAX_BODY_BYTES", 256 * 1024))  # a 20-step plan is a few kilobytes
API_RATE_LIMIT = os.environ.get("API_RATE_LIMIT", "600/m")  # requests per token: N/s, N/m, N/h or N/d
LONG_POLL_MAX_SECONDS = int(os.environ.get("API_LONG_POLL_MAX_SECONDS", "60"))  # the longest ?wait= allowed
# While live updates are down (no push can come), the long poll re-reads this often. While they are up it reads
# only when pushed: the hub tells every waiter to look again after a gap (a lost message, a Redis outage), and
# the process's TokenWatch (planning/api_ws.py) checks every waiter's token in one query.
POLL_SECONDS = 5.0
# A long poll with nothing to say ends up to this fraction of its wait sooner, at random: agents that began waiting
# together (a fleet started at once, a server restarted under them) would otherwise come back at the same instant,
# wait after wait (their re-reads within a wait follow its start, so they spread as the waits do), and their
# answers all at once would stall the pages served beside them (docs/performance.md).
LONG_POLL_SPREAD = 0.1
API_JSON_MAX_DEPTH = 32  # a tool's input schema nests a little deeper than a step's input
API_JSON_MAX_VALUES = 100_000  # in effect unbounded: the body size limit bounds a request
LAST_USED_EVERY_SECONDS = 60  # last_used_at is written at most this often per token
PLAN_MAX_STEPS_DOC = int(os.environ.get("PLAN_MAX_STEPS", "20"))  # settings.PLAN_MAX_STEPS, as the schema says it


class PayloadTooLarge(HttpError):
    def __init__(self, size: int, limit: int) -> None:
        super().__init__(413, f"The request body is too large ({size} > {limit} bytes). Nothing was changed.")


def body_limit() -> int:
    return int(getattr(settings, "API_MAX_BODY_BYTES", API_MAX_BODY_BYTES))


class AgentTokenAuth(HttpBearer):
    """The bearer token of an external agent; checks the body size first, so a huge body is never read.

    `give_back`: the connection the check took goes back to the pool at once (the long poll's). An async view's
    first read comes a hop later, after the event loop has run the request on; held across that hop, under load,
    each waiting agent kept a connection for hundreds of milliseconds, the pool ran out, and every request (pages,
    an operator's decision) queued for one (docs/performance.md)."""

    def __init__(self, *, give_back: bool = False) -> None:
        super().__init__()
        self.give_back = give_back

    def __call__(self, request: HttpRequest) -> Any:
        limit = body_limit()
        try:
            declared = int(request.META.get("CONTENT_LENGTH") or 0)
        except ValueError:
            declared = 0
        if declared > limit:
            raise PayloadTooLarge(declared, limit)
        if request.method in ("POST", "PUT", "PATCH") and len(request.body) > limit:
            raise PayloadTooLarge(len(request.body), limit)
        # The header read by the project's one parser (planner_site/bearer.py), as the socket and MCP read it.
        return self.authenticate(request, bearer_token(request.META.get("HTTP_AUTHORIZATION")))

    def authenticate(self, request: HttpRequest, token: str) -> AgentToken | None:
        try:
            return token_authenticate(token) if token else None
        finally:
            if self.give_back and not in_transaction():  # a caller's transaction (a test's) keeps its connection
                connection.close()


def token_authenticate(raw: str) -> AgentToken | None:
    """The active token `raw` of an external agent (its use noted), None for a missing, unknown or revoked one;
    the token of an agent of another kind is refused (403). The API and the MCP endpoint both ask this."""
    row = AgentToken.objects.lookup(raw)
    if row is None:
        return None
    if row.agent.kind != Agent.Kind.EXTERNAL:
        raise HttpError(403, f"{row.agent.name} is not an external agent; only external agents use the API.")
    now = timezone.now()
    if row.last_used_at is None or (now - row.last_used_at).total_seconds() > LAST_USED_EVERY_SECONDS:
        AgentToken.objects.filter(pk=row.pk).update(last_used_at=now)
    return row


class TokenRateThrottle(SimpleRateThrottle):
    """Requests per token in a sliding window, counted in Django's cache; the rate is read per request."""

    scope = "api-token"

    def __init__(self) -> None:
        super().__init__(API_RATE_LIMIT)

    def allow_request(self, request: HttpRequest) -> bool:
        self.rate = str(getattr(settings, "API_RATE_LIMIT", API_RATE_LIMIT))
        self.num_requests, self.duration = self.parse_rate(self.rate)
        return super().allow_request(request)

    def get_cache_key(self, request: HttpRequest) -> str | None:
        token = getattr(request, "auth", None)
        return f"throttle_{self.scope}_{token.pk}" if isinstance(token, AgentToken) else None


api = NinjaAPI(
    title="Agent planner API", version="1", urls_namespace="api", docs_url="/docs", openapi_url="/openapi.json",
    auth=AgentTokenAuth(), throttle=[TokenRateThrottle()],
    description="Bring your own agent: declare its tools, submit plans, run the steps an operator allows, "
                "report results, and replan after feedback. Authenticate with `Authorization: Bearer <token>` "
                "(`manage.py agent_token NAME` prints one).",
)


def error_response(request: HttpRequest, status: int, detail: str, problems: list[str] | None = None) -> HttpResponse:
    body: dict[str, Any] = {"detail": detail}
    if problems:
        body["problems"] = problems
    return api.create_response(request, body, status=status)


@api.exception_handler(ExternalError)
def external_error(request: HttpRequest, exc: ExternalError) -> HttpResponse:
    return error_response(request, exc.status, exc.message, exc.problems)


@api.exception_handler(ValidationError)
def request_invalid(request: HttpRequest, exc: ValidationError) -> HttpResponse:
    problems = []
    for error in exc.errors:
        where = ".".join(str(part) for part in error.get("loc", ()))
        problems.append(f"{where}: {error.get('msg', 'invalid')}")
    return error_response(request, 422, "The request is not valid. Nothing was changed.", problems)


@api.exception_handler(AuthenticationError)
def unauthenticated(request: HttpRequest, exc: AuthenticationError) -> HttpResponse:
    response = error_response(request, 401, "Missing, unknown, revoked or expired token: send 'Authorization: Bearer <token>'.")
    response["WWW-Authenticate"] = "Bearer"
    return response


@api.exception_handler(Throttled)
def throttled(request: HttpRequest, exc: Throttled) -> HttpResponse:
    response = error_response(request, 429, "Too many requests for this token; slow down. Nothing was changed.")
    if exc.wait:
        response["Retry-After"] = str(int(exc.wait) + 1)
    return response


@api.exception_handler(HttpError)
def http_error(request: HttpRequest, exc: HttpError) -> HttpResponse:
    detail = str(exc)
    if exc.status_code == 400:  # ninja's "Cannot parse request body"
        detail = "The request body is not valid JSON. Nothing was changed."
    return error_response(request, exc.status_code, detail)


@api.exception_handler(RequestDataTooBig)
def body_too_big(request: HttpRequest, exc: RequestDataTooBig) -> HttpResponse:
    return error_response(request, 413, "The request body is too large. Nothing was changed.")


# --- schemas ------------------------------------------------------------------------------------------------


class StrictSchema(BaseModel):
    """A request body: exactly these fields, each of its type (a plain pydantic model, not ninja's Schema, which
    reads any object's attributes and so would take a list where an object is declared)."""

    model_config = ConfigDict(extra="forbid")

    @model_validator(mode="before")
    @classmethod
    def storable(cls, data: Any) -> Any:
        """What the database would choke on (NUL, lone surrogates, NaN, huge numbers, deep nesting) is refused
        here with the operator forms' message, not as a server error (the body size bounds the rest)."""
        body = getattr(data, "_obj", data)  # ninja hands schemas its DjangoGetter around the parsed body
        if problem := json_problem(body, max_depth=API_JSON_MAX_DEPTH, max_nodes=API_JSON_MAX_VALUES):
            raise ValueError(f"the request {problem}")
        return data


TOOL_NAME_PATTERN = NAME_PATTERN.pattern
ID_MAX = 2**63 - 1  # the largest id either database stores
StepKey = Annotated[str, Field(min_length=1, max_length=32)] | Annotated[int, Field(ge=0, le=ID_MAX)]
ObjectId = Annotated[int, Field(ge=1, le=ID_MAX)]  # a plan's or a step's id in the address


class InputPropertyIn(BaseModel):
    """One property of a tool's input; other JSON-schema keys (a description...) are kept and not enforced."""

    model_config = ConfigDict(extra="allow")
    type: Literal["string", "integer", "number", "boolean", "array", "object"] = "string"
    enum: list[str] | None = Field(None, min_length=1, description="The values a string property may take")


class InputSchemaIn(StrictSchema):
    """A tool's input: an object with typed properties; `required` names some of them."""

    type: Literal["object"] = "object"
    properties: dict[str, InputPropertyIn] = Field(default_factory=dict, max_length=MAX_PROPERTIES)
    required: list[str] = Field(default_factory=list, description="Names of properties (each one of `properties`)")


class ToolIn(StrictSchema):
    name: str = Field(..., examples=["search"], pattern=TOOL_NAME_PATTERN,
                      description="Letters, digits, '_', '.', '-'; starts with a letter; unique among the tools")
    description: str = Field("", max_length=DESCRIPTION_MAX)
    input_schema: InputSchemaIn = Field(default_factory=InputSchemaIn,
                                        description="JSON schema of the input: an object with typed properties")
    risk: Literal[tuple(RISK_NAMES)] = Field(  # type: ignore[valid-type]
        "safe", description="safe | risky (or read | write | network | system); risky steps always require an "
                            "operator's permission")


def aliases(*names: str) -> AliasChoices:
    return AliasChoices(*names)


class StepIn(StrictSchema):
    """One step: a call of one of the agent's declared tools. The other names models use for a field (in
    parentheses) are accepted too."""

    id: StepKey = Field(..., validation_alias=aliases("id", "step", "step_id"),
                        description="Unique in the plan (step, step_id)")
    tool: str = Field(..., pattern=TOOL_NAME_PATTERN, description="A tool the agent declared")
    intent: str = Field(..., min_length=1, max_length=500, validation_alias=aliases("intent", "description"),
                        description="What the step is for, on one line (description)")
    input: dict[str, Any] = Field(default_factory=dict, description="The tool's input, as its input_schema says")
    requiresPermission: bool = Field(..., strict=True, validation_alias=aliases("requiresPermission", "requires_permission"),
                                     description="Ask an operator first; risky tools always do (requires_permission)")
    dependencies: list[StepKey] = Field(default_factory=list,
                                        validation_alias=aliases("dependencies", "dependsOn", "depends_on"),
                                        description="Ids of steps of this plan that must complete first "
                                                    "(dependsOn, depends_on)")
    expects: str | None = Field(None, max_length=500,
                                validation_alias=aliases("expects", "expected_outcome", "expectedOutcome"),
                                description="What the step should produce (expected_outcome)")
    risk: Literal["safe", "low", "none", "risky", "medium", "high"] | None = None
    estimatedCycles: int | None = Field(None, ge=1, le=20, strict=True,
                                        validation_alias=aliases("estimatedCycles", "estimated_cycles"))
    toolsNeeded: list[str] | None = Field(None, max_length=10, validation_alias=aliases("toolsNeeded", "tools_needed"))
    forEach: StepKey | None = Field(None, validation_alias=aliases("forEach", "for_each", "FOR_EACH"),
                                    description="Run once per item of the list an earlier step produced; the input "
                                                "uses {item}")
    repeat: int | None = Field(None, ge=1, le=MAX_LOOP_RUNS, strict=True, validation_alias=aliases("repeat", "REPEAT"),
                               description="Run this many times; the input may use {index}")


class ToolsIn(StrictSchema):
    tools: list[ToolIn] = Field(..., max_length=MAX_TOOLS)


class ToolsOut(Schema):
    tools: list[dict[str, Any]]


class AgentOut(Schema):
    id: int
    name: str
    status: str
    approval_policy: str
    tools: list[dict[str, Any]]


STEP_EXAMPLE = {"id": "1", "tool": "search", "intent": "Find the report", "input": {"query": "q3 report"},
                "requiresPermission": False, "dependencies": []}


class PlanIn(StrictSchema):
    goal: str = Field(..., min_length=1, max_length=500)
    steps: list[StepIn] = Field(..., min_length=1, max_length=PLAN_MAX_STEPS_DOC,
                                description="The steps, in order; each calls one of the agent's declared tools",
                                examples=[[STEP_EXAMPLE]])
    thinking_summary: str | None = Field(None, max_length=4000)
    risks: list[str] | None = None
    # strict: a JSON true is not a number (pydantic would take it as 1.0)
    confidence: float | None = Field(None, ge=0, le=100, strict=True, description="0-1 (or a percentage, 1-100)")


class VersionIn(StrictSchema):
    goal: str | None = Field(None, max_length=500, description="Defaults to the previous version's goal")
    steps: list[StepIn] = Field(..., min_length=1, max_length=PLAN_MAX_STEPS_DOC,
                                description="The remaining steps; completed steps are kept anyway")
    thinking_summary: str | None = Field(None, max_length=4000)
    risks: list[str] | None = None
    # strict: a JSON true is not a number (pydantic would take it as 1.0)
    confidence: float | None = Field(None, ge=0, le=100, strict=True, description="0-1 (or a percentage, 1-100)")


class GoalIn(StrictSchema):
    goal: str = Field(..., min_length=1, max_length=500)


class PlanCreated(Schema):
    id: int
    version: int
    status: str


class PlanSummary(Schema):
    id: int
    version: int
    status: str
    goal: str
    previous: int | None


class PlanOut(PlanSummary):
    replan_reason: str
    steps: list[StepOut]


class NextOut(Schema):
    """What the agent may do now; only the fields of its action are present."""

    action: Literal["run", "wait", "replan", "cancelled", "failed", "replanned", "done"]
    step: StepOut | None = Field(None, description="run: the step to run; wait: the step that waits for an operator")
    reason: str | None = Field(None, description="wait, replan, cancelled, failed: why")
    feedback: str | None = Field(None, description="replan: the operators' words, newest first")
    kept: list[StepOut] | None = Field(None, description="replan: the steps done, kept in the next version")
    plan: PlanOut | None = Field(None, description="replanned: the version that followed")


class ResultOut(Schema):
    step: StepOut
    plan: PlanCreated


class StartIn(StrictSchema):
    request_id: str = Field(..., min_length=1, max_length=100, description="The same id for a retried call")


class ResultIn(StrictSchema):
    """A failed step (`succeeded: false`) needs an `error` saying what went wrong."""

    model_config = ConfigDict(extra="forbid", json_schema_extra={
        "if": {"properties": {"succeeded": {"const": False}}, "required": ["succeeded"]},
        "then": {"required": ["error"], "properties": {"error": {"type": "string", "pattern": r"\S"}}},
    })
    request_id: str = Field(..., min_length=1, max_length=100, description="The same id for a retried call")
    succeeded: bool = Field(..., strict=True)
    output: Any = Field(None, description="What the step produced (at most 20,000 characters as JSON or text)")
    error: str = Field("", max_length=4000, description="Required (not blank) when succeeded is false")

    @model_validator(mode="after")
    def failure_explained(self) -> ResultIn:
        if not self.succeeded and not self.error.strip():
            raise ValueError("a failed step needs an 'error' saying what went wrong")
        return self


class ErrorOut(Schema):
    detail: str
    problems: list[str] | None = None


# 400: a body that is not JSON, or a NUL or invalid UTF-8 in the address; 408: a body that stalls; 413: too large.
ERRORS: dict[int, type[Schema]] = dict.fromkeys((400, 401, 403, 404, 408, 409, 413, 422, 429), ErrorOut)


def body_data(payload: BaseModel) -> dict[str, Any]:
    """The body as the planner's validator reads it: fields not given are left out, steps included."""
    return payload.model_dump(exclude_none=True)


def created(plan: Any) -> dict[str, Any]:
    return {"id": plan.pk, "version": plan.version, "status": plan.status}


def agent_of(request: HttpRequest) -> Agent:
    token: AgentToken = request.auth  # type: ignore[attr-defined]
    return token.agent


# --- endpoints ----------------------------------------------------------------------------------------------

v1 = Router(tags=["agents"])


@v1.get("/agent", response={200: AgentOut, **ERRORS}, summary="The agent this token acts for")
def agent_get(request: HttpRequest) -> dict[str, Any]:
    agent = Agent.objects.get(pk=agent_of(request).pk)
    return {"id": agent.pk, "name": agent.name, "status": agent.status, "approval_policy": agent.approval_policy,
            "tools": agent.declared_tools}


@v1.put("/agent/tools", response={200: ToolsOut, **ERRORS}, summary="Declare the agent's tools")
def tools_put(request: HttpRequest, payload: ToolsIn) -> dict[str, Any]:
    tools = reported.agent_tools_declare(agent=agent_of(request),
                                         tools=[t.model_dump(exclude_unset=True) for t in payload.tools])
    return {"tools": tools}


@v1.post("/plans", response={201: PlanCreated, **ERRORS}, summary="Submit a plan")
def plan_post(request: HttpRequest, payload: PlanIn) -> Status[dict[str, Any]]:
    with tracing.joined(request.headers.get("traceparent")):  # the caller's trace holds the plan's (docs/tracing.md)
        plan = reported.plan_submit(agent=agent_of(request), data=body_data(payload))
    return Status(201, created(plan))


@v1.post("/goals", response={201: PlanCreated, **ERRORS}, summary="Let the built-in planner plan a goal")
def goal_post(request: HttpRequest, payload: GoalIn) -> Status[dict[str, Any]]:
    with tracing.joined(request.headers.get("traceparent")):
        plan = reported.goal_plan(agent=agent_of(request), goal=payload.goal)
    return Status(201, created(plan))


@v1.get("/plans", response={200: list[PlanSummary], **ERRORS}, summary="The agent's plans, newest first")
def plans_get(request: HttpRequest) -> list[dict[str, Any]]:
    return reported.agent_plans(agent=agent_of(request))


@v1.get("/plans/{plan_id}", response={200: PlanOut, **ERRORS}, summary="A plan and its steps")
def plan_get(request: HttpRequest, plan_id: ObjectId) -> dict[str, Any]:
    return reported.plan_data(reported.agent_plan_get(agent=agent_of(request), plan_id=plan_id))


class NextQuery(Schema):
    wait: float = Field(0, ge=0, le=LONG_POLL_MAX_SECONDS, description="Seconds to wait while the answer is 'wait'")


def rate_wait(request: HttpRequest) -> float | None:
    """Seconds to wait when the request's token is over its rate, else None (TokenRateThrottle's counter)."""
    throttle = TokenRateThrottle()
    return None if throttle.allow_request(request) else (throttle.wait() or 1.0)


# The long poll's rate is checked in the request's thread (`rate_wait`), not by django-ninja, which checks an async
# view's on the event loop: each check there opened a Redis connection (Django's cache is one per request context)
# and blocked every other request of the process meanwhile (docs/performance.md).
@v1.get("/plans/{plan_id}/next", response={200: NextOut, **ERRORS}, exclude_unset=True,
        auth=AgentTokenAuth(give_back=True), throttle=[],
        summary="What the agent may do now (long poll)",
        description='One of {"action": "run", "step"}, {"action": "wait", "reason"}, {"action": "replan", '
                    '"reason", "feedback", "kept"}, {"action": "cancelled"}, {"action": "failed"}, '
                    '{"action": "replanned", "plan"} or {"action": "done"}. With wait=N the answer comes as soon '
                    'as it is no longer "wait", or else "wait" after N seconds at most (up to '
                    f'{LONG_POLL_SPREAD * 100:.0f} % sooner, at random, so that agents that began waiting together do not '
                    'all come back at once).')
async def plan_next_get(request: HttpRequest, plan_id: ObjectId, query: Query[NextQuery]) -> dict[str, Any]:
    token: AgentToken = request.auth  # type: ignore[attr-defined]
    wait = await sync_to_async(rate_wait)(request)
    if wait is not None:
        raise Throttled(wait=math.ceil(wait))
    return await plan_next_wait(agent=token.agent, plan_id=plan_id, wait=query.wait, token_id=token.pk)


class TokenRevoked(HttpError):
    def __init__(self) -> None:
        super().__init__(401, "This token was revoked or expired while waiting; nothing more is sent to it.")


def token_active(token_id: int) -> bool:
    return AgentToken.objects.active().filter(pk=token_id).exists()


def plan_next_checked(*, agent: Agent, plan_id: int, token_id: int | None, via: str = reported.VIA_API) -> dict[str, Any]:
    """While a long poll waits: the token still active, then `plan_next_read`, in one hop to a thread and one
    connection taken from the pool and given back (200 waiting agents wake every POLL_SECONDS)."""
    try:
        if token_id is not None and not token_active(token_id):
            raise TokenRevoked
    except BaseException:
        if not in_transaction():
            connection.close()
        raise
    return reported.plan_next_read(agent=agent, plan_id=plan_id, via=via)


async def plan_next_wait(*, agent: Agent, plan_id: int, wait: float, token_id: int | None = None,
                         via: str = reported.VIA_API) -> dict[str, Any]:
    """Answer at once unless it is "wait"; then wait for a push about the plan or agent, holding no database
    connection in between, until the wait ends (spread: LONG_POLL_SPREAD). A token revoked meanwhile ends the
    wait with a 401 (its revocation is pushed as a change of the agent; an expiry, which nothing pushes, is found
    by the process's TokenWatch, with every other waiter's and socket's token in one query). With live updates
    down, the wait re-reads every POLL_SECONDS instead. 2,000 waiters each re-reading every few seconds kept the
    server's database thread busy, and an operator's decision waited behind them (docs/performance.md)."""
    read = sync_to_async(partial(reported.plan_next_read, via=via))
    checked = sync_to_async(partial(plan_next_checked, via=via))
    loop = asyncio.get_running_loop()
    deadline = loop.time() + wait * (1 - random.uniform(0, LONG_POLL_SPREAD))
    if wait <= 0:
        return await read(agent=agent, plan_id=plan_id)
    revoked = asyncio.Event()
    async with changes_watched(agents={agent.pk}, plans={plan_id}) as changed:
        def on_revoked() -> None:
            revoked.set()
            if changed is not None:
                changed.set()

        with token_watched(token_id, on_revoked) if token_id is not None else contextlib.nullcontext():
            # Watched first, then read once: a change during the read is not missed, and the read is the first
            # hop back to the request's thread, on the connection its token check took (one checkout a poll).
            answer = await read(agent=agent, plan_id=plan_id)
            if answer["action"] != "wait":
                return answer
            while True:
                remaining = deadline - loop.time()
                if remaining <= 0:
                    return answer
                if changed is None:
                    await asyncio.sleep(min(remaining, POLL_SECONDS))
                else:
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(changed.wait(), timeout=remaining)
                    if not changed.is_set():
                        return answer  # the wait is over and nothing changed
                    changed.clear()
                if revoked.is_set():
                    raise TokenRevoked
                answer = await checked(agent=agent, plan_id=plan_id, token_id=token_id)
                if answer["action"] != "wait":
                    return answer


@v1.post("/plans/{plan_id}/versions", response={201: PlanCreated, **ERRORS},
         summary="Submit the next version after feedback (completed steps stay kept)")
def version_post(request: HttpRequest, plan_id: ObjectId, payload: VersionIn) -> Status[dict[str, Any]]:
    agent = agent_of(request)
    plan = reported.agent_plan_get(agent=agent, plan_id=plan_id)
    new = reported.plan_version_submit(agent=agent, plan=plan, data=body_data(payload))
    return Status(201, created(new))


class WithdrawIn(StrictSchema):
    reason: str = Field("", max_length=2000, description="Why the agent stops pursuing the plan (shown on its timeline)")


@v1.post("/plans/{plan_id}/cancel", response={200: PlanCreated, **ERRORS},
         summary="Withdraw the agent's own open plan (cancelled, with the agent as the actor)")
def plan_cancel_post(request: HttpRequest, plan_id: ObjectId, payload: WithdrawIn) -> dict[str, Any]:
    return created(reported.plan_withdraw(agent=agent_of(request), plan_id=plan_id, reason=payload.reason))


def replayed(response: HttpResponse, again: bool) -> HttpResponse:
    response["Idempotent-Replayed"] = "true" if again else "false"
    return response


@v1.post("/steps/{step_id}/start", response={200: StepOut, **ERRORS}, summary="Start a step (idempotent)")
def step_start_post(request: HttpRequest, step_id: ObjectId, payload: StartIn, response: HttpResponse) -> dict[str, Any]:
    answer, again = reported.step_start(agent=agent_of(request), step_id=step_id, request_id=payload.request_id)
    replayed(response, again)
    return answer


@v1.post("/steps/{step_id}/result", response={200: ResultOut, **ERRORS},
         summary="Report a step's result (idempotent)")
def step_result_post(request: HttpRequest, step_id: ObjectId, payload: ResultIn, response: HttpResponse) -> dict[str, Any]:
    answer, again = reported.step_result(agent=agent_of(request), step_id=step_id, request_id=payload.request_id,
                                         succeeded=payload.succeeded, output=payload.output, error=payload.error)
    replayed(response, again)
    return answer


api.add_router("/v1", v1)


def token_or_login(view: Callable[..., HttpResponse]) -> Callable[..., HttpResponse]:
    """The schema for an agent's bearer token as for a signed-in person; without either, a browser goes to the
    login page and a client that sent a token is told it is not valid (401)."""

    @wraps(view)
    def wrapper(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        if request.user.is_authenticated:
            return view(request, *args, **kwargs)
        header = request.META.get("HTTP_AUTHORIZATION", "")
        if not header:
            return redirect_to_login(request.get_full_path())
        raw = bearer_token(header)
        token = AgentToken.objects.lookup(raw) if raw else None
        if token is None:
            return unauthenticated(request, AuthenticationError())
        return view(request, *args, **kwargs)

    wrapper.login_required = False  # type: ignore[attr-defined]
    return wrapper


def api_urls() -> tuple[list[URLPattern | URLResolver], str, str]:
    """The API's URLs, exempt from the site's login redirect: a token, not a session, authenticates. Its docs
    stay behind the login like every page; its schema is for an agent's token too."""
    urls = api.urls
    for pattern in urls[0]:
        if not isinstance(pattern, URLPattern):
            continue
        if pattern.name == "openapi-json":
            pattern.callback = token_or_login(require_safe(pattern.callback))  # read only: a POST gets 405
        elif str(pattern.name or "").startswith("openapi"):
            pattern.callback = require_safe(pattern.callback)
        else:
            pattern.callback.login_required = False  # type: ignore[attr-defined]
    return urls  # type: ignore[return-value]
