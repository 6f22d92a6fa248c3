"""Plans and steps an agent reports itself (an agent outside, over the REST API or the MCP server): its tools
declared, its plans submitted, its steps started and their results, through the same services as everyone else.

Each write is one transaction that records its PlanEvent with the token's agent as the actor and pushes
after commit, so the dashboard, the timeline and the audit show an external agent exactly like a
built-in one. Plans are checked by the planner's own validator against the tools the agent declared;
a rejected plan stores nothing. Step start and result are idempotent by the client's request id.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import Any

from django.conf import settings
from django.db import IntegrityError, connection, transaction

from agents.connections import in_transaction
from agents.declared_tools import tool_registry, tools_declaration_problems
from agents.models import Agent, ApiRequest
from planning.engine.schedule import steps_blocked, steps_runnable
from planning.engine.validate import ValidationResult, plan_validate, step_plan_data
from planning.goal_terms import goal_plan_check
from planning.models import Plan, PlanEvent, PlanStep
from planning.planner import plan_generate
from planning.schemas import StepOut
from planning.selectors import plan_feedback
from planning.services.errors import DecisionError, PlanAlreadyReplanned
from planning.services.events import event_agent_record
from planning.services.plans import plan_cancel, plan_clarify
from planning.services.steps import step_finish, step_started, steps_request_approval
from planning.services.versions import plan_accept, plan_start, plan_start_by_policy

RESULT_MAX_CHARS = 20000
REQUEST_ID_MAX = 100


class ExternalError(Exception):
    """A request the API refuses, with its HTTP status and a message saying that nothing was changed."""

    status = 409

    def __init__(self, message: str, *, status: int | None = None, problems: list[str] | None = None) -> None:
        super().__init__(message)
        self.message = message
        if status is not None:
            self.status = status
        self.problems = problems or []


class NotFound(ExternalError):
    status = 404


class PlanInvalid(ExternalError):
    status = 422


VIA_API = "API"  # the REST API (/api/v1/)
VIA_MCP = "MCP"  # the MCP server (/mcp)


def agent_actor(agent: Agent, via: str = VIA_API) -> str:
    """The actor of an external agent's events, as the timeline and the audit show it: its name and the way it
    came in (the REST API or the MCP server)."""
    return f"{agent.name} ({via})"[:150]


# --- reading ------------------------------------------------------------------------------------------------


def step_data(step: PlanStep) -> dict[str, Any]:
    """A step as the API and the MCP server show it (StepOut), in the names the agent submitted it with."""
    return StepOut.model_validate(step).model_dump()


def plan_data(plan: Plan, steps: list[PlanStep] | None = None) -> dict[str, Any]:
    steps = list(plan.steps.all()) if steps is None else steps
    return {
        "id": plan.pk, "version": plan.version, "status": plan.status, "goal": plan.goal_text,
        "previous": plan.previous_id, "replan_reason": plan.replan_reason, "steps": [step_data(s) for s in steps],
    }


PLANS_LISTED = 50


def agent_plans(*, agent: Agent) -> list[dict[str, Any]]:
    """The agent's latest plans, newest first (one query, on plan_agent_latest_idx)."""
    rows = Plan.objects.filter(agent=agent).order_by("-created_at").values(
        "id", "version", "status", "goal_text", "previous_id")[:PLANS_LISTED]
    return [{"id": r["id"], "version": r["version"], "status": r["status"], "goal": r["goal_text"],
             "previous": r["previous_id"]} for r in rows]


def agent_plan_get(*, agent: Agent, plan_id: int) -> Plan:
    """The agent's own plan; another agent's plan is as invisible as a missing one."""
    plan = Plan.objects.filter(pk=plan_id, agent=agent).first()
    if plan is None:
        raise NotFound(f"Plan {plan_id} not found for agent {agent.name}.")
    return plan


def agent_step_get(*, agent: Agent, step_id: int) -> PlanStep:
    step = PlanStep.objects.select_related("plan").filter(pk=step_id, plan__agent=agent).first()
    if step is None:
        raise NotFound(f"Step {step_id} not found for agent {agent.name}.")
    return step


def replan_feedback(plan: Plan) -> str:
    """The operators' words (plan_feedback: on this plan and its earlier versions), newest first, as one line
    for the agent; the replan's reason when there are none."""
    return "; ".join(reversed(plan_feedback(plan))) or plan.replan_reason


def plan_next(*, agent: Agent, plan_id: int, via: str = VIA_API) -> dict[str, Any]:
    """What the agent may do now on this plan: run a step, wait, replan, or stop (cancelled, failed, done).

    A step that needs an operator's approval is put up for approval here, the moment the agent reaches it.
    """
    agent = Agent.objects.get(pk=agent.pk)
    plan = agent_plan_get(agent=agent, plan_id=plan_id)
    status = Plan.Status
    if plan.status == status.CANCELLED:
        reason = plan.events.filter(kind=PlanEvent.Kind.PLAN_CANCELLED).values_list("reason", flat=True).first()
        return {"action": "cancelled", "reason": reason or "cancelled by an operator"}
    if plan.status == status.COMPLETED:
        return {"action": "done"}
    if plan.status == status.REPLANNED:
        following = Plan.objects.filter(previous=plan).first()
        return {"action": "replanned", "plan": plan_data(following) if following else None}
    if plan.replan_reason:
        done = plan.steps.filter(status__in=PlanStep.DONE_STATUSES)
        return {"action": "replan", "reason": plan.replan_reason, "feedback": replan_feedback(plan),
                "kept": [step_data(s) for s in done]}
    if plan.status in (status.FAILED, status.REJECTED):
        return {"action": "failed", "reason": plan.failure_reason or "the plan failed"}
    if plan.status == status.AWAITING_APPROVAL:
        return {"action": "wait", "reason": f"plan v{plan.version} awaits an operator's approval"}
    if plan.status != status.ACTIVE:
        return {"action": "wait", "reason": f"plan v{plan.version} is {plan.get_status_display().lower()}"}
    if agent.status != Agent.Status.RUNNING:
        return {"action": "wait", "reason": f"{agent.name} is {agent.get_status_display().lower()} by an operator"}
    steps = list(plan.steps.all())
    running = [s for s in steps if s.status == PlanStep.Status.RUNNING]
    if running:  # started and not reported: the agent (maybe restarted) finishes it first
        return {"action": "run", "step": step_data(running[0])}
    awaiting = [s for s in steps if s.status == PlanStep.Status.AWAITING_APPROVAL]
    if awaiting:
        return {"action": "wait", "reason": f"step {awaiting[0].key} awaits an operator's approval",
                "step": step_data(awaiting[0])}
    table = [(s.key, s.status, s.depends_on) for s in steps]
    keys = steps_runnable(table, limit=1)
    if keys:
        step = next(s for s in steps if s.key == keys[0])
        if step.needs_approval(plan):
            steps_request_approval([step], runner=agent_actor(agent, via))
            step.refresh_from_db()
            if step.status != PlanStep.Status.AWAITING_APPROVAL:  # a policy decided it at once: what now
                return plan_next(agent=agent, plan_id=plan_id, via=via)
            return {"action": "wait", "reason": f"step {step.key} awaits an operator's approval",
                    "step": step_data(step)}
        return {"action": "run", "step": step_data(step)}
    blocked = steps_blocked(table)
    if blocked:
        kept = [s for s in steps if s.is_done]
        return {"action": "replan", "reason": f"steps {', '.join(blocked)} can never run",
                "feedback": f"steps {', '.join(blocked)} can never run", "kept": [step_data(s) for s in kept]}
    return {"action": "done"}


def plan_next_read(*, agent: Agent, plan_id: int, via: str = VIA_API) -> dict[str, Any]:
    """`plan_next` for the long poll: between two reads the request holds no database connection."""
    try:
        return plan_next(agent=agent, plan_id=plan_id, via=via)
    finally:
        if not in_transaction():  # a caller's transaction (a test's) keeps its connection
            connection.close()


# --- tools and plans ----------------------------------------------------------------------------------------


@transaction.atomic
def agent_tools_declare(*, agent: Agent, tools: list[Any], via: str = VIA_API) -> list[dict[str, Any]]:
    """Store the agent's tools; its plans are validated against them from now on."""
    problems = tools_declaration_problems(tools)
    if problems:
        raise PlanInvalid("The tools declaration is not valid. Nothing was changed.", problems=problems)
    agent = Agent.objects.select_for_update().get(pk=agent.pk)
    before = sorted(str(t.get("name", "")) for t in agent.declared_tools or [] if isinstance(t, Mapping))
    agent.declared_tools = [dict(t) for t in tools]
    agent.save(update_fields=["declared_tools"])
    after = sorted(str(t.get("name", "")) for t in agent.declared_tools)
    event_agent_record(agent=agent, kind=PlanEvent.Kind.TOOLS_DECLARED, actor_label=agent_actor(agent, via),
                       reason=", ".join(after)[:4000], detail={"diff": {"tools": [before, after]}})
    return agent.declared_tools


def plan_check_external(*, agent: Agent, data: Mapping[str, Any], steered: bool = False) -> ValidationResult:
    """The planner's validator, against the agent's declared tools; raises PlanInvalid with every problem.
    `steered`: a version after an operator's feedback, which may leave the goal's action for later."""
    if not agent.declared_tools:
        raise PlanInvalid("Declare your tools first (PUT /api/v1/agent/tools). Nothing was stored.")
    result = plan_validate(dict(data), kind="tool", workspace=None, max_steps=settings.PLAN_MAX_STEPS,
                           tools=tool_registry(agent.declared_tools))
    if not result.ok or result.plan is None:
        raise PlanInvalid("The plan is not valid. Nothing was stored.", problems=result.problems)
    # Checked against its goal as far as the declared tools tell (planning/engine/goal_check.py). An outside
    # agent may do the rest in a later plan or step of its own (a graph that plans a search, then asks for the
    # e-mail), so what the plan leaves undone is told to the operator who approves it, not refused.
    unreached = goal_plan_check(agent, " ".join(str(data.get("goal") or "").split()), result.plan.steps,
                                steered=steered)
    result.flags.extend(f"not in this plan: {problem}" for problem in unreached)
    return result


def plan_store(*, agent: Agent, goal_text: str, result: ValidationResult, previous: Plan | None, kept: list[PlanStep],
               reason: str, via: str = VIA_API) -> Plan:
    """Create the validated plan (a new version when `previous` is given) with its events, by the agent."""
    actor = agent_actor(agent, via)
    try:
        plan = plan_start(agent=agent, goal_text=goal_text, goal=previous.goal if previous else None,
                          previous=previous, reason=reason, actor_label=actor)
    except PlanAlreadyReplanned as exc:
        raise ExternalError(f"Plan {previous.pk if previous else ''} already has a next version. "
                            "Nothing was stored.") from exc
    assert result.plan is not None  # plan_check_external raised otherwise
    plan = plan_accept(plan=plan, spec=result.plan, flags=list(result.flags), model="", kept=kept, actor_label=actor)
    if agent.approval_policy == Agent.ApprovalPolicy.PERMISSION:
        plan = plan_start_by_policy(plan=plan, actor_label=actor)
    return plan


def goal_plan(*, agent: Agent, goal: str, via: str = VIA_API) -> Plan:
    """The built-in planner plans a goal with the agent's declared tools (the model calls take a while)."""
    goal_text = " ".join(goal.split())
    if not goal_text:
        raise PlanInvalid("Describe the goal. Nothing was stored.", problems=["goal: empty"])
    if not agent.declared_tools:
        raise PlanInvalid("Declare your tools first (PUT /api/v1/agent/tools). Nothing was stored.")
    return plan_generate(agent=agent, goal_text=goal_text, actor_label=agent_actor(agent, via))


@transaction.atomic
def plan_submit(*, agent: Agent, data: Mapping[str, Any], via: str = VIA_API) -> Plan:
    """A plan the agent made itself: validated, stored, awaiting approval or active per its policy."""
    goal_text = " ".join(str(data.get("goal") or "").split())
    if not goal_text:
        raise PlanInvalid("The plan needs a 'goal'. Nothing was stored.", problems=["plan: missing 'goal'"])
    result = plan_check_external(agent=agent, data=data)
    return plan_store(agent=agent, goal_text=goal_text, result=result, previous=None, kept=[],
                      reason="submitted over the API" if via == VIA_API else f"submitted over {via}", via=via)


@transaction.atomic
def plan_version_submit(*, agent: Agent, plan: Plan, data: Mapping[str, Any], via: str = VIA_API) -> Plan:
    """The agent's next version after feedback: its completed steps stay completed and are never redone."""
    previous = Plan.objects.select_for_update().get(pk=plan.pk, agent=agent)
    if previous.status not in (Plan.Status.ACTIVE, Plan.Status.AWAITING_APPROVAL, Plan.Status.FAILED):
        raise ExternalError(f"Plan v{previous.version} is {previous.get_status_display().lower()}; "
                            "it cannot get a new version. Nothing was stored.")
    if previous.steps.filter(status=PlanStep.Status.RUNNING).exists():
        raise ExternalError("A step of this plan is still running: report its result first. Nothing was stored.")
    kept = list(previous.steps.filter(status__in=PlanStep.DONE_STATUSES))
    kept_keys = {s.key for s in kept}
    steps = data.get("steps")
    payload = dict(data)
    payload.setdefault("goal", previous.goal_text)
    if isinstance(steps, list):
        # Completed steps may be repeated or left out: either way they are kept as they were.
        new = [s for s in steps if not (isinstance(s, dict) and str(s.get("id", "")) in kept_keys)]
        if not new:
            raise PlanInvalid("The new version has no remaining steps. Nothing was stored.",
                              problems=["replan has no remaining steps"])
        payload["steps"] = [step_plan_data(s.spec(), "tool") for s in kept] + new
    result = plan_check_external(agent=agent, data=payload, steered=True)
    goal_text = " ".join(str(payload.get("goal") or "").split()) or previous.goal_text
    reason = previous.replan_reason or "replanned by the agent"
    return plan_store(agent=agent, goal_text=goal_text, result=result, previous=previous, kept=kept, reason=reason,
                      via=via)


def plan_answer(*, agent: Agent, plan_id: int, answer: str, via: str = VIA_API) -> Plan:
    """The planner's question on the agent's own plan answered by the agent's client (its user), as an operator's
    answer would be (plan_clarify), with the agent as the actor; refused when the plan asks nothing (any more)."""
    plan = agent_plan_get(agent=agent, plan_id=plan_id)
    try:
        plan_clarify(plan=plan, user=None, answer=answer, actor_label=agent_actor(agent, via))
    except DecisionError as exc:
        raise ExternalError(str(exc)) from exc
    return Plan.objects.get(pk=plan.pk)


def plan_withdraw(*, agent: Agent, plan_id: int, reason: str, via: str = VIA_API) -> Plan:
    """The agent stops pursuing its own open plan (e.g. it went on without the call an operator declined): the
    plan is cancelled with the agent as the actor, its unfinished steps skipped."""
    plan = agent_plan_get(agent=agent, plan_id=plan_id)
    try:
        plan_cancel(plan=plan, user=None, actor_label=agent_actor(agent, via),
                    reason=reason.strip() or "withdrawn by the agent")
    except DecisionError as exc:
        raise ExternalError(str(exc)) from exc
    return Plan.objects.get(pk=plan.pk)


# --- steps, idempotent by request id ------------------------------------------------------------------------


def request_once(*, agent: Agent, request_id: str, operation: str, step_id: int,
                 apply: Callable[[PlanStep], dict[str, Any]]) -> tuple[dict[str, Any], bool]:
    """Apply a step call once per request id: a retry gets the first answer back; (answer, replayed).

    The step row is locked first, so a racing twin waits and then finds the answer; should both still
    insert, the unique constraint rolls the second back whole and it returns the first's answer.
    """
    request_id = request_id.strip()
    if not request_id or len(request_id) > REQUEST_ID_MAX:
        raise ExternalError(f"'request_id' must be 1-{REQUEST_ID_MAX} characters. Nothing was changed.", status=422)
    try:
        with transaction.atomic():
            step = PlanStep.objects.select_for_update().select_related("plan").filter(
                pk=step_id, plan__agent=agent).first()
            if step is None:
                raise NotFound(f"Step {step_id} not found for agent {agent.name}.")
            replay = request_replay(agent=agent, request_id=request_id, operation=operation)
            if replay is not None:
                return replay, True
            answer = apply(step)
            ApiRequest.objects.create(agent=agent, request_id=request_id, operation=operation, response=answer)
            return answer, False
    except IntegrityError:
        replay = request_replay(agent=agent, request_id=request_id, operation=operation)
        if replay is None:
            raise
        return replay, True


def request_replay(*, agent: Agent, request_id: str, operation: str) -> dict[str, Any] | None:
    earlier = ApiRequest.objects.filter(agent=agent, request_id=request_id).first()
    if earlier is None:
        return None
    if earlier.operation != operation:
        raise ExternalError(f"request_id {request_id!r} was already used for {earlier.operation}. Nothing was changed.")
    return dict(earlier.response)


def step_start(*, agent: Agent, step_id: int, request_id: str, via: str = VIA_API) -> tuple[dict[str, Any], bool]:
    """The agent starts a step it was told to run."""

    def apply(step: PlanStep) -> dict[str, Any]:
        plan = step.plan
        if step.status == PlanStep.Status.RUNNING:
            return step_data(step)  # started before under another request id: still one start
        if plan.status != Plan.Status.ACTIVE or plan.replan_reason:
            raise ExternalError(f"Plan v{plan.version} is {plan.get_status_display().lower()}"
                                f"{' and due for a new version' if plan.replan_reason else ''}; "
                                "ask GET /api/v1/plans/{id}/next what to do. Nothing was changed.")
        if Agent.objects.filter(pk=agent.pk).exclude(status=Agent.Status.RUNNING).exists():
            raise ExternalError(f"{agent.name} is paused by an operator. Nothing was changed.")
        if step.status != PlanStep.Status.PENDING:
            raise ExternalError(f"Step {step.key} is {step.get_status_display().lower()}; it cannot start. "
                                "Nothing was changed.")
        if step.needs_approval(plan):
            raise ExternalError(f"Step {step.key} needs an operator's approval first; ask GET "
                                "/api/v1/plans/{id}/next. Nothing was changed.")
        table = [(s.key, s.status, s.depends_on) for s in plan.steps.all()]
        if step.key not in steps_runnable(table, limit=1):
            raise ExternalError(f"Step {step.key} cannot start yet: its dependencies are not done or another step "
                                "is running. Nothing was changed.")
        return step_data(step_started(step=step, actor_label=agent_actor(agent, via)))

    return request_once(agent=agent, request_id=request_id, operation=f"start of step {step_id}", step_id=step_id,
                        apply=apply)


def output_text(output: Any) -> str:
    return output if isinstance(output, str) else json.dumps(output, ensure_ascii=False)


def step_result(*, agent: Agent, step_id: int, request_id: str, succeeded: bool, output: Any = None,
                error: str = "", via: str = VIA_API) -> tuple[dict[str, Any], bool]:
    """The agent reports how a running step went: completed, or a failed try (retried, then replanned)."""
    text = "" if output is None else output_text(output)
    if len(text) > RESULT_MAX_CHARS:
        raise ExternalError(f"'output' is too long ({len(text)} > {RESULT_MAX_CHARS} characters). "
                            "Nothing was changed.", status=422)
    if not succeeded and not error.strip():
        raise ExternalError("A failed step needs an 'error' saying what went wrong. Nothing was changed.", status=422)

    def apply(step: PlanStep) -> dict[str, Any]:
        if step.status != PlanStep.Status.RUNNING:
            raise ExternalError(f"Step {step.key} is {step.get_status_display().lower()}, not running: "
                                "start it before reporting its result. Nothing was changed.")
        finished = step_finish(step=step, runner=agent_actor(agent, via), succeeded=succeeded, result=text,
                               error=error.strip())
        plan = Plan.objects.get(pk=finished.plan_id)
        return {"step": step_data(finished), "plan": {"id": plan.pk, "version": plan.version, "status": plan.status}}

    return request_once(agent=agent, request_id=request_id, operation=f"result of step {step_id}", step_id=step_id,
                        apply=apply)
