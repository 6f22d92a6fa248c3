"""Every change to plans and steps, by operators or the runner: one transaction, a PlanEvent, a push after commit."""

from __future__ import annotations

import functools
import logging
import random
import time
from collections.abc import Callable
from typing import Any

from django.conf import settings
from django.contrib.auth.models import User
from django.db import OperationalError, transaction
from django.utils import timezone

from agents.declared_tools import agent_plan_terms
from agents.models import Agent
from agents.tools import ToolError, tool_precheck, tool_rollback, undo_dir_for
from agents.world import ACTIONS
from goals.models import Goal
from goals.system import MAX_GOALS, PLAN_ABANDON_PENALTY, PLAN_COMPLETION_BONUS, clamp_unit
from planner_site.events import publish_changed_on_commit
from planner_site.validators import json_problem, text_problem
from planning.engine.schedule import step_transition_check
from planning.engine.validate import plan_validate_edit
from planning.models import Plan, PlanEvent, PlanStep

logger = logging.getLogger("planner.services")

# PostgreSQL's serialization failure and deadlock, SQLite's busy database: the transaction was rolled back
# as a whole and may simply run again.
RETRYABLE_SQLSTATES = {"40001", "40P01"}
CONFLICT_ATTEMPTS = 5


class DecisionError(Exception):
    """An operator decision that cannot apply as asked; the message says why, and nothing changed."""


class StepNotAwaitingApproval(DecisionError):
    def __init__(self, step: PlanStep) -> None:
        super().__init__(
            f"Step {step.key} is no longer awaiting approval (it is {step.get_status_display().lower()}); "
            "someone else may have decided it already. Nothing was changed."
        )


class PlanNotAwaitingApproval(DecisionError):
    def __init__(self, plan: Plan) -> None:
        super().__init__(
            f"Plan v{plan.version} is no longer awaiting approval (it is {plan.get_status_display().lower()}). "
            "Nothing was changed."
        )


def conflict_retryable(exc: OperationalError) -> bool:
    cause = exc.__cause__
    return getattr(cause, "sqlstate", None) in RETRYABLE_SQLSTATES or "database is locked" in str(exc)


def atomic_retried[**P, R](func: Callable[P, R]) -> Callable[P, R]:
    """Run a service in one transaction; the rare deadlock or serialization failure between concurrent
    writers is retried with a short random backoff instead of reaching the user as a server error.

    Inside an outer transaction nothing can be retried here (the outer one was rolled back too), so the
    error goes up to whoever owns that transaction."""

    @functools.wraps(func)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        if transaction.get_connection().in_atomic_block:
            with transaction.atomic():
                return func(*args, **kwargs)
        for attempt in range(1, CONFLICT_ATTEMPTS + 1):
            try:
                with transaction.atomic():
                    return func(*args, **kwargs)
            except OperationalError as exc:
                if attempt == CONFLICT_ATTEMPTS or not conflict_retryable(exc):
                    raise
                logger.info("%s: %s; retrying (attempt %d)", func.__name__, exc, attempt + 1)
                time.sleep(random.uniform(0.005, 0.02 * 2 ** attempt))
        raise AssertionError("unreachable")

    return wrapper


# --- locks: one order everywhere (plan, then its steps, then the agent and goal rows), so no two services
# can wait on each other. FOR NO KEY UPDATE, because nothing here changes a primary key: inserting an event
# that points at a locked plan or step (a KEY SHARE lock) then never waits.


def plan_lock(pk: int) -> Plan:
    """The plan, locked for this transaction."""
    return Plan.objects.select_for_update(no_key=True).get(pk=pk)


def step_lock(pk: int) -> PlanStep:
    """The step, locked after its plan (the plan comes with it, as `step.plan`)."""
    plan_id = PlanStep.objects.values_list("plan_id", flat=True).get(pk=pk)
    plan = plan_lock(plan_id)
    step = PlanStep.objects.select_for_update(no_key=True).get(pk=pk)
    step.plan = plan
    return step


def reason_clean(reason: str, *, what: str = "Reason", required: bool = False) -> str:
    """A reason or feedback as stored: trimmed and checked; DecisionError says what is wrong with it."""
    reason = reason.strip()
    if required and not reason:
        raise DecisionError(f"{what} is required. Nothing was changed.")
    if problem := text_problem(reason, max_length=REASON_MAX_LENGTH):
        raise DecisionError(f"{what} {problem}. Nothing was changed.")
    return reason


REASON_MAX_LENGTH = 2000


def actor_name(user: User) -> str:
    return user.get_username()


def event_record(*, plan: Plan, kind: str, actor: User | None = None, actor_label: str = "",
                 step: PlanStep | None = None, reason: str = "", detail: dict[str, Any] | None = None) -> PlanEvent:
    """Record an event and push the plan to open pages once the transaction commits."""
    event = PlanEvent.objects.create(
        plan=plan, agent_id=plan.agent_id, step=step, kind=kind, actor=actor,
        actor_label=actor_label or (actor_name(actor) if actor else "system"), reason=reason, detail=detail or {},
    )
    publish_changed_on_commit(agent_id=plan.agent_id, plan_id=plan.pk, kind=kind)
    return event


def event_agent_record(*, agent: Agent, kind: str, actor: User | None = None, actor_label: str = "",
                       reason: str = "", detail: dict[str, Any] | None = None) -> PlanEvent:
    """Record an event about an agent that no plan carries (a goal given, a pause while idle), and push it."""
    event = PlanEvent.objects.create(agent=agent, kind=kind, actor=actor,
                                     actor_label=actor_label or (actor_name(actor) if actor else "system"),
                                     reason=reason, detail=detail or {})
    publish_changed_on_commit(agent_id=agent.pk, kind=kind)
    return event


# --- operator decisions -------------------------------------------------------------------------------------


@atomic_retried
def plan_approve(*, plan: Plan, user: User, mode: str, actor_label: str = "", detail: dict[str, Any] | None = None,
                 approve_permission_steps: bool = True) -> PlanEvent:
    """Approve a validated plan: run all steps, or ask for each step (seed 002). A policy (`actor_label` names it)
    may leave the steps that require permission to be decided one by one."""
    if mode not in (Plan.ApprovalMode.ALL, Plan.ApprovalMode.STEP):
        raise DecisionError(f"Unknown approval mode {mode!r}. Nothing was changed.")
    plan = plan_lock(plan.pk)
    if plan.status != Plan.Status.AWAITING_APPROVAL:
        raise PlanNotAwaitingApproval(plan)
    plan.status = Plan.Status.ACTIVE
    plan.approval_mode = mode
    plan.save(update_fields=["status", "approval_mode", "updated_at"])
    Agent.objects.filter(pk=plan.agent_id).update(waiting_reason="")
    approved: list[str] = []
    if mode == Plan.ApprovalMode.ALL:
        # "Approve all" is what it says: every step, risky and requires-permission ones included.
        unapproved = plan.steps.filter(status=PlanStep.Status.PENDING, approved_by__isnull=True)
        if not approve_permission_steps:
            unapproved = unapproved.exclude(requires_permission=True)
        approved = list(unapproved.values_list("key", flat=True))
        unapproved.update(approved_by=user)
    label = f"approved all {len(approved)} steps" if mode == Plan.ApprovalMode.ALL else "approved step by step"
    return event_record(plan=plan, kind=PlanEvent.Kind.PLAN_APPROVED, actor=user, actor_label=actor_label,
                        reason=label, detail={"mode": mode, "approved_steps": approved} | (detail or {}))


@atomic_retried
def plan_cancel(*, plan: Plan, user: User | None, reason: str = "", seen_status: str | None = None,
                actor_label: str = "") -> PlanEvent:
    """Cancel an open plan; its pending steps are skipped and the agent stops pursuing it. An operator (`user`)
    cancels it, or an external agent withdraws its own plan (no user; `actor_label` names the agent).

    `seen_status` is the status the operator saw when they chose to cancel (None: not known): a plan that moved on
    since (approved by another operator meanwhile, an answered question) is not cancelled: of two opposite
    decisions at once, the first wins and the second is refused.

    A plan whose planning failed can be cancelled too: its automatic retries stop (a planning still under way
    stops at its next write, see planning/plan_services.py)."""
    reason = reason_clean(reason)
    plan = plan_lock(plan.pk)
    retrying = plan.status == Plan.Status.FAILED and not Plan.objects.filter(previous=plan).exists()
    if not plan.is_open and not retrying:
        raise DecisionError(f"Plan v{plan.version} is already {plan.get_status_display().lower()}. Nothing was changed.")
    if seen_status and plan.status != seen_status:
        if seen_status == Plan.Status.AWAITING_APPROVAL:
            raise PlanNotAwaitingApproval(plan)
        raise DecisionError(f"Plan v{plan.version} is now {plan.get_status_display().lower()}, no longer "
                            f"{Plan.Status(seen_status).label.lower() if seen_status in Plan.Status.values else seen_status}; "
                            "look at it again before cancelling. Nothing was changed.")
    plan.status = Plan.Status.CANCELLED
    plan.retry_at = None
    plan.save(update_fields=["status", "retry_at", "updated_at"])
    if retrying:
        from planning.plan_services import agent_retry_sync  # plan_services imports this module

        agent_retry_sync(agent_id=plan.agent_id)  # the agent's next automatic retry is another plan's, or none
    unfinished = plan.steps.exclude(status__in=[PlanStep.Status.COMPLETED, PlanStep.Status.FAILED,
                                                PlanStep.Status.DECLINED, PlanStep.Status.SKIPPED])
    # Steps locked in one order (by id) after the plan, like every other service.
    keys = [s.key for s in unfinished.select_for_update(no_key=True).order_by("pk").only("pk", "key")]
    PlanStep.objects.filter(plan=plan, key__in=keys).update(status=PlanStep.Status.SKIPPED)
    Agent.objects.filter(pk=plan.agent_id).update(waiting_reason="")
    if plan.goal_id:
        Goal.objects.filter(pk=plan.goal_id).active().update(status=Goal.Status.ABANDONED)
    return event_record(plan=plan, kind=PlanEvent.Kind.PLAN_CANCELLED, actor=user, actor_label=actor_label,
                        reason=reason, detail={"skipped": keys})


@atomic_retried
def step_approve(*, step: PlanStep, user: User, actor_label: str = "", detail: dict[str, Any] | None = None) -> PlanEvent:
    """Approve a step that waits for an operator; the runner runs it next cycle."""
    step = step_lock(step.pk)
    if step.status != PlanStep.Status.AWAITING_APPROVAL or step.plan.status != Plan.Status.ACTIVE:
        raise StepNotAwaitingApproval(step)
    step.status = PlanStep.Status.PENDING
    step.approved_by = user  # type: ignore[assignment]
    step.save(update_fields=["status", "approved_by", "updated_at"])
    Agent.objects.filter(pk=step.plan.agent_id).update(waiting_reason="")
    return event_record(plan=step.plan, step=step, kind=PlanEvent.Kind.STEP_APPROVED, actor=user,
                        actor_label=actor_label, reason=f"approved step {step.key}: {step.description}",
                        detail=detail)


@atomic_retried
def step_decline(*, step: PlanStep, user: User, feedback: str, actor_label: str = "",
                 detail: dict[str, Any] | None = None) -> PlanEvent:
    """Decline a step with the operator's feedback; the agent replans, keeping its completed steps."""
    if not feedback.strip():
        raise DecisionError("Feedback is required to decline a step. Nothing was changed.")
    feedback = reason_clean(feedback, what="Feedback")
    step = step_lock(step.pk)
    if step.status != PlanStep.Status.AWAITING_APPROVAL or step.plan.status != Plan.Status.ACTIVE:
        raise StepNotAwaitingApproval(step)
    step.status = PlanStep.Status.DECLINED
    step.failure_reason = f"declined by {actor_label or actor_name(user)}: {feedback}"
    step.save(update_fields=["status", "failure_reason", "updated_at"])
    plan = step.plan
    plan.replan_reason = f"step {step.key} declined: {feedback}"
    plan.save(update_fields=["replan_reason", "updated_at"])
    Agent.objects.filter(pk=plan.agent_id).update(waiting_reason="")
    return event_record(plan=plan, step=step, kind=PlanEvent.Kind.STEP_DECLINED, actor=user, actor_label=actor_label,
                        reason=feedback, detail={"feedback": feedback} | (detail or {}))


@atomic_retried
def step_skip(*, step: PlanStep, user: User, reason: str = "") -> PlanEvent:
    """Skip a step that has not started; steps depending on it may then run."""
    reason = reason_clean(reason)
    step = step_lock(step.pk)
    if step.status not in (PlanStep.Status.PENDING, PlanStep.Status.AWAITING_APPROVAL) or not step.plan.is_open:
        raise DecisionError(f"Step {step.key} is {step.get_status_display().lower()}; only steps not yet started "
                            "can be skipped. Nothing was changed.")
    step_move(step=step, status=PlanStep.Status.SKIPPED)
    step.save(update_fields=["status", "updated_at"])
    Agent.objects.filter(pk=step.plan.agent_id).update(waiting_reason="")
    plan = step.plan
    event = event_record(plan=plan, step=step, kind=PlanEvent.Kind.STEP_SKIPPED, actor=user,
                         reason=reason or f"skipped step {step.key}", detail={"skipped": step.key})
    if plan.status == Plan.Status.ACTIVE and not plan.steps.exclude(
            status__in=[PlanStep.Status.COMPLETED, PlanStep.Status.SKIPPED]).exists():
        plan_complete(plan=plan, runner=actor_name(user))
    return event


@atomic_retried
def plan_replan_request(*, plan: Plan, user: User, reason: str, actor_label: str = "",
                        detail: dict[str, Any] | None = None, once: bool = False) -> PlanEvent:
    """An operator asks for a new version of an active plan; the runner replans next cycle. With `once`, a plan
    whose new version is already asked for is refused (two operators declining the same plan at once)."""
    if not reason.strip():
        raise DecisionError("Say why the plan should be replanned. Nothing was changed.")
    reason = reason_clean(reason)
    plan = plan_lock(plan.pk)
    if plan.status not in (Plan.Status.ACTIVE, Plan.Status.AWAITING_APPROVAL, Plan.Status.FAILED):
        raise DecisionError(f"Plan v{plan.version} is {plan.get_status_display().lower()}; it cannot be replanned. "
                            "Nothing was changed.")
    if once and plan.replan_reason:
        raise DecisionError(f"Plan v{plan.version} was already sent back ({plan.replan_reason}); it waits for the "
                            "agent's next version. Nothing was changed.")
    if plan.status == Plan.Status.FAILED:
        plan.status = Plan.Status.ACTIVE
    plan.replan_reason = f"{actor_label or 'operator'}: {reason}"
    plan.save(update_fields=["status", "replan_reason", "updated_at"])
    return event_record(plan=plan, kind=PlanEvent.Kind.REPLAN_REQUESTED, actor=user, actor_label=actor_label,
                        reason=reason, detail={"replan_requested": reason} | (detail or {}))


EDITABLE_STEP_FIELDS = ("description", "action_hint", "tool", "tool_input", "expected_outcome", "requires_permission")
STEP_TEXT_LIMITS = {"description": 500, "action_hint": 200, "tool": 64, "expected_outcome": 500}
STEP_JSON_FIELDS = ("tool_input", "depends_on")
UNSTARTED = (PlanStep.Status.PENDING, PlanStep.Status.AWAITING_APPROVAL)
# A plan in one of these states is history: nothing reopens it (a failed plan may still be replanned).
PLAN_FINAL = (Plan.Status.COMPLETED, Plan.Status.CANCELLED, Plan.Status.REPLANNED, Plan.Status.REJECTED)


def step_changes_problems(*, step: PlanStep, plan: Plan, changes: dict[str, Any]) -> tuple[list[str], list[str]]:
    """Why a step cannot be saved with these changes, and the risk flags raised: each value checked on its
    own, then the whole plan validated again as it would be (a new step, without a pk, is appended).

    The one check of a step's content, for the operator's edit form, the admin and the API alike."""
    problems: list[str] = []
    for name, value in changes.items():
        label = PlanStep._meta.get_field(name).verbose_name.capitalize()  # type: ignore[union-attr]
        if name in STEP_JSON_FIELDS:
            problem = json_problem(value)
        elif isinstance(value, str):
            problem = text_problem(value, max_length=STEP_TEXT_LIMITS.get(name))
        else:
            problem = None
        if problem:
            problems.append(f"{label} {problem}")
    if problems:
        return problems, []
    agent = plan.agent
    edited = PlanStep(**{f.attname: getattr(step, f.attname) for f in PlanStep._meta.get_fields() if f.concrete})
    for name, value in changes.items():
        setattr(edited, name, value)
    specs = [(edited if other.pk == step.pk else other).as_spec() for other in plan.steps.all()]
    if step.pk is None:
        specs.append(edited.as_spec())
    kind, tools = agent_plan_terms(agent.kind, agent.declared_tools)  # external agents: their declared tools
    return plan_validate_edit(kind=kind, steps=specs, key=edited.key, changes={},
                              workspace=agent.workspace if agent.kind == Agent.Kind.TOOL else None,
                              max_steps=settings.PLAN_MAX_STEPS, allowed_actions=list(ACTIONS), tools=tools)


@atomic_retried
def step_edit(*, step: PlanStep, user: User, changes: dict[str, Any], reason: str = "") -> PlanEvent:
    """Edit a step that has not started; the whole plan is validated again and the diff recorded."""
    reason = reason_clean(reason)
    step = step_lock(step.pk)
    if step.status not in UNSTARTED:
        raise DecisionError(f"Step {step.key} is {step.get_status_display().lower()}; only steps not yet started "
                            "can be edited. Nothing was changed.")
    if not step.plan.is_open:
        raise DecisionError(f"Plan v{step.plan.version} is {step.plan.get_status_display().lower()}; it cannot be "
                            "edited. Nothing was changed.")
    changes = {k: v for k, v in changes.items() if k in EDITABLE_STEP_FIELDS and getattr(step, k) != v}
    if not changes:
        raise DecisionError("Nothing to change.")
    problems, flags = step_changes_problems(step=step, plan=step.plan, changes=changes)
    if problems:
        raise DecisionError("The edited plan is not valid: " + "; ".join(problems) + ". Nothing was changed.")
    diff = {k: [getattr(step, k), v] for k, v in changes.items()}
    for k, v in changes.items():
        setattr(step, k, v)
    if flags and step.tool:
        step.requires_permission = True
        step.risk = PlanStep.Risk.RISKY
    step.save()
    return event_record(plan=step.plan, step=step, kind=PlanEvent.Kind.STEP_EDITED, actor=user, reason=reason,
                        detail={"changed": {step.key: diff}, "flags": flags})


@atomic_retried
def agent_set_status(*, agent: Agent, user: User, status: str) -> Agent:
    """Pause, resume or stop an agent; recorded on its open plan's timeline when it has one."""
    if status not in Agent.Status.values:
        raise DecisionError(f"Unknown status {status!r}.")
    agent = Agent.objects.select_for_update(no_key=True).get(pk=agent.pk)
    if agent.status == status:
        raise DecisionError(f"{agent.name} is already {agent.get_status_display().lower()}.")
    old = agent.status
    agent.status = status
    agent.save(update_fields=["status"])
    plan = Plan.objects.filter(agent=agent).open().order_by("-created_at").first()
    kind = {Agent.Status.RUNNING: PlanEvent.Kind.AGENT_RESUMED, Agent.Status.PAUSED: PlanEvent.Kind.AGENT_PAUSED,
            Agent.Status.STOPPED: PlanEvent.Kind.AGENT_STOPPED}[Agent.Status(status)]
    if plan is not None:
        event_record(plan=plan, kind=kind, actor=user, reason=f"{old} -> {status}")
    else:
        event_agent_record(agent=agent, kind=kind, actor=user, reason=f"{old} -> {status}")
    return agent


@atomic_retried
def agent_give_goal(*, agent: Agent, user: User, description: str, horizon: str = Goal.Horizon.SHORT) -> Goal:
    """Give an agent a goal in words; the runner plans it next cycle."""
    description = " ".join(description.split())
    if not description:
        raise DecisionError("Describe the goal. Nothing was changed.")
    if problem := text_problem(description, max_length=500):
        raise DecisionError(f"The goal {problem}. Nothing was changed.")
    if horizon not in Goal.Horizon.values:
        raise DecisionError(f"Unknown horizon {horizon!r}.")
    agent = Agent.objects.select_for_update(no_key=True).get(pk=agent.pk)
    if agent.kind == Agent.Kind.EXTERNAL:
        raise DecisionError(f"{agent.name} runs elsewhere and submits its own plans over the API; it cannot be "
                            "given a goal here. Nothing was changed.")
    active = Goal.objects.filter(agent=agent).active()
    if active.filter(description__iexact=description).exists():
        raise DecisionError(f"{agent.name} already has this goal.")
    if active.count() >= MAX_GOALS:  # seed 001's cap holds for an operator's goals too
        raise DecisionError(f"{agent.name} already has {MAX_GOALS} active goals, the most an agent pursues at once; "
                            "finish or abandon one first. Nothing was changed.")
    goal = Goal.objects.create(agent=agent, description=description[:500], horizon=horizon, confidence=1.0)
    event_agent_record(agent=agent, kind=PlanEvent.Kind.GOAL_GIVEN, actor=user, reason=goal.description,
                       detail={"goal": goal.pk, "horizon": horizon})
    return goal


# --- the runner's transitions -------------------------------------------------------------------------------


def step_move(*, step: PlanStep, status: str) -> None:
    """Guarded transition (no completed -> running); raises IllegalTransition."""
    step_transition_check(step.status, status)
    step.status = status


@atomic_retried
def step_request_approval(*, step: PlanStep, runner: str) -> None:
    step = step_lock(step.pk)
    if step.status != PlanStep.Status.PENDING:
        return
    step_move(step=step, status=PlanStep.Status.AWAITING_APPROVAL)
    if step.tool:  # seed 002: what the step will touch, shown before the operator decides
        step.precheck = tool_precheck(step.tool, step.tool_input, step.plan.agent.workspace)[:2000]
    step.save(update_fields=["status", "precheck", "updated_at"])
    Agent.objects.filter(pk=step.plan.agent_id).update(waiting_reason=f"step {step.key} awaits approval")
    reason = "requires permission" if step.requires_permission else "step-by-step approval"
    event_record(plan=step.plan, step=step, kind=PlanEvent.Kind.STEP_AWAITING, actor_label=runner, reason=reason)
    from policies.services import policies_step_waiting  # noqa: PLC0415 (policies decide through these services)

    policies_step_waiting(step=step)


@atomic_retried
def step_start(*, step: PlanStep, runner: str) -> PlanStep | None:
    """A tool step starts running (the runner calls its tool next, outside the transaction); None when it is no
    longer pending (an operator skipped it, another runner started it)."""
    step = step_lock(step.pk)  # the plan first, then the step: the services' lock order
    if step.status != PlanStep.Status.PENDING:
        return None
    step_move(step=step, status=PlanStep.Status.RUNNING)
    step.actual_cycles += 1
    step.save(update_fields=["status", "actual_cycles", "updated_at"])
    event_record(plan=step.plan, step=step, kind=PlanEvent.Kind.STEP_STARTED, actor_label=runner,
                 reason=f"{step.tool} {step.tool_input}"[:500])
    return step


@atomic_retried
def plan_replan_schedule(*, plan: Plan, runner: str, reason: str) -> PlanEvent | None:
    """The runner found the plan cannot go on as it is (steps that can never run): it is replanned next cycle.
    None when a replan is already scheduled or the plan is no longer active."""
    plan = plan_lock(plan.pk)
    if plan.status != Plan.Status.ACTIVE or plan.replan_reason:
        return None
    plan.replan_reason = reason
    plan.save(update_fields=["replan_reason", "updated_at"])
    return event_record(plan=plan, kind=PlanEvent.Kind.REPLAN_REQUESTED, actor_label=runner, reason=reason,
                        detail={"replan_requested": reason})


@atomic_retried
def step_finish(*, step: PlanStep, runner: str, succeeded: bool, result: str = "", error: str = "",
                experience_id: int | None = None) -> PlanStep:
    """Complete a step, or count a failed try: retried up to max_retries, then failed and the plan replans."""
    step = step_lock(step.pk)
    plan = step.plan
    if step.is_done or step.status in (PlanStep.Status.FAILED, PlanStep.Status.DECLINED):
        return step  # already decided: never applied twice
    detail: dict[str, Any] = {"experience": experience_id} if experience_id else {}
    step.elapsed_ms = step_elapsed_ms(step)
    if step.elapsed_ms is not None:
        detail["elapsed_ms"] = step.elapsed_ms
    if succeeded:
        step_move(step=step, status=PlanStep.Status.COMPLETED)
        step.result = result[:20000]
        step.error = ""
        step.save()
        event_record(plan=plan, step=step, kind=PlanEvent.Kind.STEP_COMPLETED, actor_label=runner,
                     reason=result[:500], detail=detail)
        if not plan.steps.exclude(status__in=[PlanStep.Status.COMPLETED, PlanStep.Status.SKIPPED]).exists():
            plan_complete(plan=plan, runner=runner)
        return step
    step.error = error[:20000]
    if step.retries < step.max_retries:
        step.retries += 1
        if step.status != PlanStep.Status.PENDING:
            step_move(step=step, status=PlanStep.Status.PENDING)
        step.save()
        event_record(plan=plan, step=step, kind=PlanEvent.Kind.STEP_RETRIED, actor_label=runner, reason=error[:500],
                     detail=detail | {"retry": step.retries, "max_retries": step.max_retries})
        return step
    step_move(step=step, status=PlanStep.Status.FAILED)
    step.failure_reason = error[:2000]
    step.save()
    plan.replan_reason = f"step {step.key} failed after {step.retries} retries: {error[:300]}"
    plan.save(update_fields=["replan_reason", "updated_at"])
    event_record(plan=plan, step=step, kind=PlanEvent.Kind.STEP_FAILED, actor_label=runner, reason=error[:500], detail=detail)
    return step


def plan_complete(*, plan: Plan, runner: str) -> None:
    plan.status = Plan.Status.COMPLETED
    plan.save(update_fields=["status", "updated_at"])
    if plan.goal_id:
        goal = Goal.objects.select_for_update(no_key=True).get(pk=plan.goal_id)
        goal.progress = clamp_unit(goal.progress + PLAN_COMPLETION_BONUS)
        if plan.agent.kind == Agent.Kind.TOOL:
            goal.progress = 1.0
            goal.status = Goal.Status.COMPLETED
        goal.save()
    event_record(plan=plan, kind=PlanEvent.Kind.PLAN_COMPLETED, actor_label=runner, reason="all steps done")


@atomic_retried
def plan_abandon(*, plan: Plan, runner: str, reason: str) -> None:
    """MAX_REPLANS exceeded (seed 000): the plan fails and its goal loses confidence."""
    plan = plan_lock(plan.pk)
    plan.status = Plan.Status.FAILED
    plan.failure_reason = reason
    plan.replan_reason = ""
    plan.save(update_fields=["status", "failure_reason", "replan_reason", "updated_at"])
    if plan.goal_id:
        goal = Goal.objects.select_for_update(no_key=True).get(pk=plan.goal_id)
        goal.confidence = clamp_unit(goal.confidence - PLAN_ABANDON_PENALTY)
        goal.save(update_fields=["confidence"])
    Agent.objects.filter(pk=plan.agent_id).update(waiting_reason=f"plan '{plan.goal_text[:60]}' abandoned: {reason[:120]}")
    event_record(plan=plan, kind=PlanEvent.Kind.PLAN_FAILED, actor_label=runner, reason=reason,
                 detail={"abandoned": True, "confidence_penalty": PLAN_ABANDON_PENALTY})



def step_elapsed_ms(step: PlanStep) -> int | None:
    """Seed 002: how long a step took, from its last start to now (None if it never started)."""
    started = (step.events.filter(kind=PlanEvent.Kind.STEP_STARTED).order_by("-created_at", "-pk")
               .values_list("created_at", flat=True).first())
    return None if started is None else max(int((timezone.now() - started).total_seconds() * 1000), 0)


@atomic_retried
def plan_clarify(*, plan: Plan, user: User, answer: str) -> PlanEvent:
    """Answer the planner's question (seed 003); planning resumes with the answer as part of the goal."""
    answer = " ".join(answer.split())
    if not answer:
        raise DecisionError("Write an answer to the planner's question. Nothing was changed.")
    answer = reason_clean(answer, what="The answer")
    plan = plan_lock(plan.pk)
    if plan.status != Plan.Status.CLARIFYING:
        raise DecisionError(f"Plan v{plan.version} is {plan.get_status_display().lower()}; it asks no question. "
                            "Nothing was changed.")
    plan.clarification_answer = answer[:2000]
    plan.status = Plan.Status.ACTIVE
    plan.replan_reason = f"operator answered '{plan.clarification_question[:200]}': {answer[:500]}"
    plan.save(update_fields=["clarification_answer", "status", "replan_reason", "updated_at"])
    Agent.objects.filter(pk=plan.agent_id).update(waiting_reason="")
    return event_record(plan=plan, kind=PlanEvent.Kind.CLARIFIED, actor=user, reason=answer[:4000],
                        detail={"question": plan.clarification_question, "answer": answer})


@transaction.atomic  # not retried: it restores files, which a second attempt would do again
def step_rollback(*, step: PlanStep, user: User) -> PlanEvent:
    """Undo a completed tool step (seed 003 rollback): the files it changed are restored, the files it created
    removed; refused while a completed step that changed files on top of it still stands."""
    step = step_lock(step.pk)
    if step.status != PlanStep.Status.COMPLETED or not step.tool:
        raise DecisionError(f"Step {step.key} is {step.get_status_display().lower()}; only a completed tool step "
                            "can be rolled back. Nothing was changed.")
    later = step.plan.steps.filter(status=PlanStep.Status.COMPLETED, risk=PlanStep.Risk.RISKY).only("key", "depends_on")
    later_keys = [s.key for s in later if step.key in s.depends_on]
    if later_keys:
        raise DecisionError(f"Step {', '.join(later_keys)} built on step {step.key}: roll "
                            f"{'it' if len(later_keys) == 1 else 'them'} back first. Nothing was changed.")
    workspace = step.plan.agent.workspace
    try:
        done = tool_rollback(workspace, undo_dir_for(workspace, str(step.pk)))
    except ToolError as exc:
        raise DecisionError(f"Step {step.key} cannot be rolled back: {exc}. Nothing was changed.") from exc
    step_move(step=step, status=PlanStep.Status.ROLLED_BACK)
    step.save(update_fields=["status", "updated_at"])
    return event_record(plan=step.plan, step=step, kind=PlanEvent.Kind.STEP_ROLLED_BACK, actor=user,
                        reason=f"rolled back step {step.key}: " + ("; ".join(done) or "nothing to undo"),
                        detail={"undone": done})
