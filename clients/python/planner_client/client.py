"""The sync and async clients. Both build the same requests (`_Calls`) and read the same answers."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from typing import Any

import httpx

API = "/api/v1"
RETRY_STATUSES = {429, 502, 503, 504}
DEFAULT_WAIT = 30.0  # seconds one long poll waits for an operator before asking again


class PlannerError(Exception):
    """The server refused a request; `detail` says why, `problems` lists each one (e.g. of a plan)."""

    def __init__(self, status: int, detail: str, problems: list[str] | None = None) -> None:
        super().__init__(f"{status}: {detail}" + ("".join(f"\n  - {p}" for p in problems) if problems else ""))
        self.status = status
        self.detail = detail
        self.problems = problems or []


class Unauthorized(PlannerError):
    """401/403: the token is missing, unknown, revoked, or not an external agent's."""


class NotFound(PlannerError):
    """404: no such plan or step for this agent."""


class Conflict(PlannerError):
    """409: not possible in the plan's current state (e.g. a step awaiting approval)."""


class PlanInvalid(PlannerError):
    """422: the request or the plan is not valid; nothing was stored. `problems` says what to fix."""


class RateLimited(PlannerError):
    """429 after every retry."""


ERRORS: dict[int, type[PlannerError]] = {401: Unauthorized, 403: Unauthorized, 404: NotFound, 409: Conflict,
                                         422: PlanInvalid, 429: RateLimited}


@dataclass(frozen=True)
class PlanRef:
    id: int
    version: int
    status: str


@dataclass(frozen=True)
class Step:
    """A step of a plan, in the names the agent submitted it with."""

    id: int
    key: str
    tool: str
    intent: str
    input: dict[str, Any]
    requires_permission: bool = False
    dependencies: list[str] = field(default_factory=list)
    status: str = ""
    result: str = ""
    error: str = ""

    @classmethod
    def from_api(cls, data: dict[str, Any]) -> Step:
        return cls(id=data["id"], key=data["key"], tool=data["tool"], intent=data["intent"], input=data["input"],
                   requires_permission=data.get("requiresPermission", False),
                   dependencies=list(data.get("dependencies", [])), status=data.get("status", ""),
                   result=data.get("result", ""), error=data.get("error", ""))


@dataclass(frozen=True)
class Action:
    """What the agent may do now: run, wait, replan, replanned, cancelled, failed or done."""

    action: str
    reason: str = ""
    step: Step | None = None
    feedback: str = ""
    kept: list[Step] = field(default_factory=list)
    plan: dict[str, Any] | None = None

    @classmethod
    def from_api(cls, data: dict[str, Any]) -> Action:
        step = data.get("step")
        return cls(action=data["action"], reason=data.get("reason", ""),
                   step=Step.from_api(step) if step else None, feedback=data.get("feedback", ""),
                   kept=[Step.from_api(s) for s in data.get("kept", [])], plan=data.get("plan"))


class ReplanNeeded(Exception):  # noqa: N818 (a request to the agent, not an error of the client)
    """An operator declined a step (or a step failed for good): submit the next version with `submit_version`."""

    def __init__(self, plan_id: int, action: Action) -> None:
        super().__init__(f"plan {plan_id} needs a new version: {action.feedback or action.reason}")
        self.plan_id = plan_id
        self.reason = action.reason
        self.feedback = action.feedback
        self.kept = action.kept


class PlanCancelled(Exception):  # noqa: N818
    """An operator cancelled the plan: stop working on it."""


class PlanFailed(Exception):  # noqa: N818
    """The plan failed (e.g. abandoned); an operator may replan it."""


def trace_headers() -> dict[str, str]:
    """The caller's trace context (W3C `traceparent`), when it traces with OpenTelemetry: a plan it submits then
    joins its trace, and the dashboard's spans (the wait for an operator, the decision) show inside it. Nothing
    without opentelemetry installed or outside a span."""
    try:
        from opentelemetry.propagate import inject
    except ImportError:
        return {}
    headers: dict[str, str] = {}
    inject(headers)
    return headers


def new_request_id() -> str:
    return uuid.uuid4().hex


@dataclass(frozen=True)
class Call:
    method: str
    path: str
    json: Any = None
    params: dict[str, Any] | None = None
    read_timeout: float | None = None


class _Calls:
    """The requests of the API as values, shared by both clients."""

    @staticmethod
    def agent() -> Call:
        return Call("GET", f"{API}/agent")

    @staticmethod
    def declare_tools(tools: list[dict[str, Any]]) -> Call:
        return Call("PUT", f"{API}/agent/tools", {"tools": tools})

    @staticmethod
    def submit_plan(goal: str, steps: list[dict[str, Any]], extra: dict[str, Any]) -> Call:
        return Call("POST", f"{API}/plans", {"goal": goal, "steps": steps, **extra})

    @staticmethod
    def plan_goal(goal: str) -> Call:
        return Call("POST", f"{API}/goals", {"goal": goal}, read_timeout=600)

    @staticmethod
    def plans() -> Call:
        return Call("GET", f"{API}/plans")

    @staticmethod
    def plan(plan_id: int) -> Call:
        return Call("GET", f"{API}/plans/{plan_id}")

    @staticmethod
    def next(plan_id: int, wait: float) -> Call:
        return Call("GET", f"{API}/plans/{plan_id}/next", params={"wait": wait}, read_timeout=wait + 15)

    @staticmethod
    def cancel(plan_id: int, reason: str) -> Call:
        return Call("POST", f"{API}/plans/{plan_id}/cancel", {"reason": reason})

    @staticmethod
    def start(step_id: int, request_id: str) -> Call:
        return Call("POST", f"{API}/steps/{step_id}/start", {"request_id": request_id})

    @staticmethod
    def result(step_id: int, request_id: str, succeeded: bool, output: Any, error: str) -> Call:
        return Call("POST", f"{API}/steps/{step_id}/result",
                    {"request_id": request_id, "succeeded": succeeded, "output": output, "error": error})

    @staticmethod
    def submit_version(plan_id: int, steps: list[dict[str, Any]], goal: str | None, extra: dict[str, Any]) -> Call:
        body = {"steps": steps, **extra} | ({"goal": goal} if goal else {})
        return Call("POST", f"{API}/plans/{plan_id}/versions", body)


def answer_read(response: httpx.Response) -> Any:
    if response.status_code < 400:
        return response.json()
    try:
        body = response.json()
        detail, problems = str(body.get("detail", response.reason_phrase)), list(body.get("problems") or [])
    except ValueError:
        detail, problems = response.text[:500] or response.reason_phrase, []
    raise ERRORS.get(response.status_code, PlannerError)(response.status_code, detail, problems)


def retry_delay(attempt: int, response: httpx.Response | None) -> float:
    if response is not None and response.headers.get("Retry-After", "").isdigit():
        return min(float(response.headers["Retry-After"]), 60.0)
    return min(0.5 * 2**attempt, 10.0)


def plan_ref(data: dict[str, Any]) -> PlanRef:
    return PlanRef(id=data["id"], version=data["version"], status=data["status"])


class _Steps:
    """The walk through a plan's steps, shared by both clients: what each `next` answer means."""

    def __init__(self, plan_id: int) -> None:
        self.plan_id = plan_id
        self.unreported: Step | None = None

    def step_to_run(self, action: Action) -> Step | None:
        """The step to hand to the agent, None to ask again, or StopIteration-like outcomes as exceptions."""
        if action.action == "run" and action.step is not None:
            again = self.unreported is not None and self.unreported.id == action.step.id
            if again and action.step.status == "running":  # a failed try comes back pending, to run again
                raise RuntimeError(f"report step {action.step.key} with complete() or fail() before the next one")
            return action.step
        if action.action == "replan":
            raise ReplanNeeded(self.plan_id, action)
        if action.action == "cancelled":
            raise PlanCancelled(action.reason)
        if action.action == "failed":
            raise PlanFailed(action.reason)
        if action.action == "replanned":
            raise PlanCancelled(f"plan {self.plan_id} was replaced by a newer version")
        return None  # "wait": ask again (the long poll already waited)


class Client:
    """The synchronous client. `Client(base_url, token)`; use as a context manager or call `close()`."""

    def __init__(self, base_url: str, token: str, *, timeout: float = 30.0, max_retries: int = 4,
                 transport: httpx.BaseTransport | None = None) -> None:
        self.max_retries = max_retries
        self.timeout = timeout
        self.http = httpx.Client(base_url=base_url.rstrip("/"), headers={"Authorization": f"Bearer {token}"},
                                 timeout=timeout, transport=transport)

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self.http.close()

    def call(self, call: Call) -> Any:
        timeout = httpx.Timeout(self.timeout, read=max(self.timeout, call.read_timeout or 0))
        for attempt in range(self.max_retries + 1):
            response = None
            try:
                response = self.http.request(call.method, call.path, json=call.json, params=call.params,
                                             timeout=timeout, headers=trace_headers())
            except httpx.TransportError:
                if attempt >= self.max_retries:
                    raise
            if response is not None and (response.status_code not in RETRY_STATUSES or attempt >= self.max_retries):
                return answer_read(response)
            time.sleep(retry_delay(attempt, response))
        raise AssertionError("unreachable")

    def agent(self) -> dict[str, Any]:
        return dict(self.call(_Calls.agent()))

    def declare_tools(self, tools: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return list(self.call(_Calls.declare_tools(tools))["tools"])

    def submit_plan(self, goal: str, steps: list[dict[str, Any]], **extra: Any) -> PlanRef:
        return plan_ref(self.call(_Calls.submit_plan(goal, steps, extra)))

    def plan_goal(self, goal: str) -> PlanRef:
        """Let the dashboard's built-in planner plan `goal` with your declared tools."""
        return plan_ref(self.call(_Calls.plan_goal(goal)))

    def plans(self) -> list[dict[str, Any]]:
        return list(self.call(_Calls.plans()))

    def plan(self, plan_id: int) -> dict[str, Any]:
        return dict(self.call(_Calls.plan(plan_id)))

    def next(self, plan_id: int, *, wait: float = DEFAULT_WAIT) -> Action:
        return Action.from_api(self.call(_Calls.next(plan_id, wait)))

    def cancel(self, plan_id: int, reason: str = "") -> PlanRef:
        """Withdraw one of the agent's open plans: it is cancelled, with the agent named as who did it."""
        return plan_ref(self.call(_Calls.cancel(plan_id, reason)))

    def start(self, step: Step | int, *, request_id: str | None = None) -> dict[str, Any]:
        step_id = step.id if isinstance(step, Step) else step
        return dict(self.call(_Calls.start(step_id, request_id or new_request_id())))

    def report(self, step: Step | int, *, succeeded: bool, output: Any = None, error: str = "",
               request_id: str | None = None) -> dict[str, Any]:
        step_id = step.id if isinstance(step, Step) else step
        return dict(self.call(_Calls.result(step_id, request_id or new_request_id(), succeeded, output, error)))

    def complete(self, step: Step | int, output: Any = None) -> dict[str, Any]:
        return self.report(step, succeeded=True, output=output)

    def fail(self, step: Step | int, error: str) -> dict[str, Any]:
        return self.report(step, succeeded=False, error=error)

    def submit_version(self, plan_id: int, steps: list[dict[str, Any]], *, goal: str | None = None,
                       **extra: Any) -> PlanRef:
        return plan_ref(self.call(_Calls.submit_version(plan_id, steps, goal, extra)))

    def steps(self, plan_id: int, *, wait: float = DEFAULT_WAIT) -> Iterator[Step]:
        """The steps the operator allows, each started before it is yielded; blocks through approvals.

        Report each with `complete()` or `fail()`. Ends when the plan is done; raises ReplanNeeded when a
        new version is due, PlanCancelled or PlanFailed when it stops.
        """
        walk = _Steps(plan_id)
        while True:
            action = self.next(plan_id, wait=wait)
            if action.action == "done":
                return
            step = walk.step_to_run(action)
            if step is None:
                continue
            if step.status != "running":
                self.start(step)
            walk.unreported = step
            yield step


class AsyncClient:
    """The asyncio client: the same methods as `Client`, awaited; `async for step in client.steps(id)`."""

    def __init__(self, base_url: str, token: str, *, timeout: float = 30.0, max_retries: int = 4,
                 transport: httpx.AsyncBaseTransport | None = None) -> None:
        self.max_retries = max_retries
        self.timeout = timeout
        self.http = httpx.AsyncClient(base_url=base_url.rstrip("/"), headers={"Authorization": f"Bearer {token}"},
                                      timeout=timeout, transport=transport)

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        await self.http.aclose()

    async def call(self, call: Call) -> Any:
        timeout = httpx.Timeout(self.timeout, read=max(self.timeout, call.read_timeout or 0))
        for attempt in range(self.max_retries + 1):
            response = None
            try:
                response = await self.http.request(call.method, call.path, json=call.json, params=call.params,
                                                   timeout=timeout, headers=trace_headers())
            except httpx.TransportError:
                if attempt >= self.max_retries:
                    raise
            if response is not None and (response.status_code not in RETRY_STATUSES or attempt >= self.max_retries):
                return answer_read(response)
            await asyncio.sleep(retry_delay(attempt, response))
        raise AssertionError("unreachable")

    async def agent(self) -> dict[str, Any]:
        return dict(await self.call(_Calls.agent()))

    async def declare_tools(self, tools: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return list((await self.call(_Calls.declare_tools(tools)))["tools"])

    async def submit_plan(self, goal: str, steps: list[dict[str, Any]], **extra: Any) -> PlanRef:
        return plan_ref(await self.call(_Calls.submit_plan(goal, steps, extra)))

    async def plan_goal(self, goal: str) -> PlanRef:
        return plan_ref(await self.call(_Calls.plan_goal(goal)))

    async def plans(self) -> list[dict[str, Any]]:
        return list(await self.call(_Calls.plans()))

    async def plan(self, plan_id: int) -> dict[str, Any]:
        return dict(await self.call(_Calls.plan(plan_id)))

    async def next(self, plan_id: int, *, wait: float = DEFAULT_WAIT) -> Action:
        return Action.from_api(await self.call(_Calls.next(plan_id, wait)))

    async def cancel(self, plan_id: int, reason: str = "") -> PlanRef:
        return plan_ref(await self.call(_Calls.cancel(plan_id, reason)))

    async def start(self, step: Step | int, *, request_id: str | None = None) -> dict[str, Any]:
        step_id = step.id if isinstance(step, Step) else step
        return dict(await self.call(_Calls.start(step_id, request_id or new_request_id())))

    async def report(self, step: Step | int, *, succeeded: bool, output: Any = None, error: str = "",
                     request_id: str | None = None) -> dict[str, Any]:
        step_id = step.id if isinstance(step, Step) else step
        return dict(await self.call(_Calls.result(step_id, request_id or new_request_id(), succeeded, output, error)))

    async def complete(self, step: Step | int, output: Any = None) -> dict[str, Any]:
        return await self.report(step, succeeded=True, output=output)

    async def fail(self, step: Step | int, error: str) -> dict[str, Any]:
        return await self.report(step, succeeded=False, error=error)

    async def submit_version(self, plan_id: int, steps: list[dict[str, Any]], *, goal: str | None = None,
                             **extra: Any) -> PlanRef:
        return plan_ref(await self.call(_Calls.submit_version(plan_id, steps, goal, extra)))

    async def steps(self, plan_id: int, *, wait: float = DEFAULT_WAIT) -> AsyncIterator[Step]:
        walk = _Steps(plan_id)
        while True:
            action = await self.next(plan_id, wait=wait)
            if action.action == "done":
                return
            step = walk.step_to_run(action)
            if step is None:
                continue
            if step.status != "running":
                await self.start(step)
            walk.unreported = step
            yield step
