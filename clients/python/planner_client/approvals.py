"""The approval desk the framework adapters share: a pending tool call (or a whole plan) goes to the dashboard
as a plan over the API, and the operator's decision comes back from the long poll.

A call is a one-step plan whose step requires permission, so it waits in the dashboard's inbox and on its plan
page like any other step. A declined call leaves its plan due for a new version: the agent's next call (after the
model read the feedback) is submitted as that version, so the plan page shows how the agent changed course.
"""

from __future__ import annotations

import contextlib
import json
from dataclasses import dataclass
from typing import Any

from planner_client.client import (
    DEFAULT_WAIT,
    Action,
    AsyncClient,
    Client,
    Conflict,
    PlanInvalid,
    PlanRef,
    Step,
)

INTENT_MAX = 500
GOAL_MAX = 500
SAFE_RISKS = ("safe", "read")
PROPERTY_TYPES = ("string", "integer", "number", "boolean", "array", "object")
WITHDRAWN = "The agent went on without this call after the operator's feedback."


@dataclass(frozen=True)
class Decision:
    """The operator's answer to a call or a plan.

    approved: go ahead (for a call, its step is started on the dashboard: report it with `complete`).
    feedback: why not, in the operator's words (declined), or why the plan stopped (cancelled or failed).
    stopped: the plan was cancelled or failed on the dashboard rather than declined with feedback.
    plan_id: None when the dashboard refused the call or plan as not valid (`feedback` lists the problems, for
    the model to correct).
    """

    approved: bool
    plan_id: int | None
    feedback: str = ""
    step_id: int | None = None
    stopped: bool = False

    def as_dict(self) -> dict[str, Any]:
        """A plain value, e.g. to resume a LangGraph interrupt with (checkpoints store plain values)."""
        return {"approved": self.approved, "feedback": self.feedback, "plan_id": self.plan_id,
                "step_id": self.step_id, "stopped": self.stopped}


def clipped(text: str, limit: int) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def call_intent(tool: str, arguments: dict[str, Any]) -> str:
    """The step's one-line intent for a call the model wants to make: the tool and its arguments."""
    return clipped(f"Call {tool} with {json.dumps(arguments, ensure_ascii=False, sort_keys=True)}", INTENT_MAX)


def call_step(tool: str, arguments: dict[str, Any], intent: str | None) -> dict[str, Any]:
    return {"id": "1", "tool": tool, "intent": clipped(intent or call_intent(tool, arguments), INTENT_MAX),
            "input": arguments, "requiresPermission": True}


def input_schema(params: dict[str, Any]) -> dict[str, Any]:
    """A tool's JSON schema as the dashboard declares it: an object of typed properties, `required` kept."""
    properties: dict[str, Any] = {}
    for name, prop in dict(params.get("properties") or {}).items():
        prop = dict(prop) if isinstance(prop, dict) else {}
        kinds = [prop.get("type")] + [alt.get("type") for alt in prop.get("anyOf", []) if isinstance(alt, dict)]
        kind = next((k for k in kinds if k in PROPERTY_TYPES), None)
        declared: dict[str, Any] = {"type": kind} if kind else {}
        if isinstance(prop.get("description"), str):
            declared["description"] = prop["description"]
        properties[str(name)] = declared
    required = [str(r) for r in params.get("required") or [] if r in properties]
    return {"type": "object", "properties": properties, "required": required}


def refused(error: PlanInvalid) -> Decision:
    """A call or plan the dashboard's validator refused: declined, with its problems as the feedback."""
    problems = "; ".join(error.problems) or error.detail
    return Decision(approved=False, plan_id=None, feedback=f"The dashboard refused it as not valid: {problems}")


def needs_operator(agent: dict[str, Any], tool: str) -> bool:
    """Whether the dashboard wants an operator to decide a call of `tool`: the agent's policy is that an operator
    approves each plan, or the tool is declared risky (or not declared at all)."""
    if agent.get("approval_policy") == "plan":
        return True
    declared = {t.get("name"): t for t in agent.get("tools", [])}
    return str(declared.get(tool, {}).get("risk", "risky")) not in SAFE_RISKS


class _Desk:
    """What both desks remember: the declined plans due for a new version, and the calls started."""

    def __init__(self, goal: str, wait: float) -> None:
        self.goal = clipped(goal, GOAL_MAX) or "Agent run"
        self.wait = wait
        self.declined: list[int] = []  # declined plans, oldest first: the agent's next call revises the oldest
        self.started: dict[int, Step] = {}  # step id -> step, approved and started, result not reported yet

    def revised(self, revise: bool) -> int | None:
        """The declined plan a new call or plan is the next version of (None: a plan of its own)."""
        return self.declined.pop(0) if revise and self.declined else None

    def call_answer(self, plan: PlanRef, action: Action) -> Decision | None:
        """The decision an answer of `next` holds for a call's plan, None to wait on."""
        if action.action == "run" and action.step is not None:
            return Decision(approved=True, plan_id=plan.id, step_id=action.step.id)
        if action.action == "replan":
            self.declined.append(plan.id)
            return Decision(approved=False, plan_id=plan.id, feedback=action.feedback or action.reason)
        if action.action in ("cancelled", "failed", "replanned"):
            return Decision(approved=False, plan_id=plan.id, stopped=True,
                            feedback=action.reason or f"the plan was {action.action} on the dashboard")
        if action.action == "done":  # an operator skipped the step: the call is not made
            return Decision(approved=False, plan_id=plan.id, feedback="an operator skipped this call")
        return None

    def plan_answer(self, plan: PlanRef, action: Action, status: str | None) -> Decision | None:
        """The decision for a whole plan: approved once it is active (or done), declined with feedback."""
        if action.action == "replan":
            self.declined.append(plan.id)
            return Decision(approved=False, plan_id=plan.id, feedback=action.feedback or action.reason)
        if action.action in ("cancelled", "failed", "replanned"):
            return Decision(approved=False, plan_id=plan.id, stopped=True,
                            feedback=action.reason or f"the plan was {action.action} on the dashboard")
        if action.action in ("run", "done") or status == "active":
            return Decision(approved=True, plan_id=plan.id)
        return None


class ApprovalDesk(_Desk):
    """The synchronous desk (LangGraph's `invoke`): `ask_call` and `ask_plan` block until an operator decides.

    `revise` (default True): a call or plan after a declined one is submitted as the declined plan's next version;
    False for calls made at the same time as the declined one (parallel tool calls), which are not revisions."""

    def __init__(self, client: Client, *, goal: str, wait: float = DEFAULT_WAIT) -> None:
        super().__init__(goal, wait)
        self.client = client

    def submit(self, steps: list[dict[str, Any]], goal: str | None, revise: bool) -> PlanRef:
        previous = self.revised(revise)
        if previous is not None:
            with contextlib.suppress(Conflict):  # cancelled or replaced meanwhile: a plan of its own then
                return self.client.submit_version(previous, steps, goal=goal)
        return self.client.submit_plan(goal or self.goal, steps)

    def ask_call(self, tool: str, arguments: dict[str, Any], *, intent: str | None = None,
                 revise: bool = True) -> Decision:
        try:
            plan = self.submit([call_step(tool, arguments, intent)], None, revise)
        except PlanInvalid as error:
            return refused(error)
        while True:
            decision = self.call_answer(plan, self.client.next(plan.id, wait=self.wait))
            if decision is None:
                continue
            if decision.approved and decision.step_id is not None:
                self.started[decision.step_id] = Step.from_api(self.client.start(decision.step_id))
            return decision

    def ask_plan(self, goal: str, steps: list[dict[str, Any]], *, revise: bool = True) -> Decision:
        try:
            plan = self.submit(steps, clipped(goal, GOAL_MAX), revise)
        except PlanInvalid as error:
            return refused(error)
        while True:
            action = self.client.next(plan.id, wait=self.wait)
            status = self.client.plan(plan.id)["status"] if action.action == "wait" else None
            decision = self.plan_answer(plan, action, status)
            if decision is not None:
                return decision

    def close(self) -> None:
        """At the end of a run: each declined plan the agent gave no new version is withdrawn (cancelled by it)."""
        while self.declined:
            with contextlib.suppress(Conflict):  # an operator cancelled it already
                self.client.cancel(self.declined.pop(0), WITHDRAWN)

    def report(self, step_id: int, output: Any = None, *, error: str = "") -> None:
        """The result of an approved call, on its step: completed with `output`, or failed with `error`."""
        self.started.pop(step_id, None)
        if error:
            self.client.fail(step_id, error)
        else:
            self.client.complete(step_id, output)


class AsyncApprovalDesk(_Desk):
    """The asyncio desk (the OpenAI Agents SDK's `Runner.run`); the same methods as `ApprovalDesk`, awaited."""

    def __init__(self, client: AsyncClient, *, goal: str, wait: float = DEFAULT_WAIT) -> None:
        super().__init__(goal, wait)
        self.client = client

    async def submit(self, steps: list[dict[str, Any]], goal: str | None, revise: bool) -> PlanRef:
        previous = self.revised(revise)
        if previous is not None:
            with contextlib.suppress(Conflict):
                return await self.client.submit_version(previous, steps, goal=goal)
        return await self.client.submit_plan(goal or self.goal, steps)

    async def ask_call(self, tool: str, arguments: dict[str, Any], *, intent: str | None = None,
                       revise: bool = True) -> Decision:
        try:
            plan = await self.submit([call_step(tool, arguments, intent)], None, revise)
        except PlanInvalid as error:
            return refused(error)
        while True:
            decision = self.call_answer(plan, await self.client.next(plan.id, wait=self.wait))
            if decision is None:
                continue
            if decision.approved and decision.step_id is not None:
                self.started[decision.step_id] = Step.from_api(await self.client.start(decision.step_id))
            return decision

    async def ask_plan(self, goal: str, steps: list[dict[str, Any]], *, revise: bool = True) -> Decision:
        try:
            plan = await self.submit(steps, clipped(goal, GOAL_MAX), revise)
        except PlanInvalid as error:
            return refused(error)
        while True:
            action = await self.client.next(plan.id, wait=self.wait)
            status = (await self.client.plan(plan.id))["status"] if action.action == "wait" else None
            decision = self.plan_answer(plan, action, status)
            if decision is not None:
                return decision

    async def close(self) -> None:
        while self.declined:
            with contextlib.suppress(Conflict):
                await self.client.cancel(self.declined.pop(0), WITHDRAWN)

    async def report(self, step_id: int, output: Any = None, *, error: str = "") -> None:
        self.started.pop(step_id, None)
        if error:
            await self.client.fail(step_id, error)
        else:
            await self.client.complete(step_id, output)
