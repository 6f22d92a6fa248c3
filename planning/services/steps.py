"""A step's decisions and transitions: approved, declined, skipped, edited or rolled back by an operator;
put up for approval, started and finished by the runner. One transaction each, a PlanEvent, a push after
commit."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any, NamedTuple

from django.conf import settings
from django.contrib.auth.models import User
from django.db import transaction
from django.utils import timezone

from agents.agui_models import AguiInterrupt
from agents.declared_tools import agent_plan_terms
from agents.fencing import fence_hold
from agents.models import Agent
from agents.services import rows_write
from agents.signals import events_may_notify_on_commit
from agents.tools import ToolError, tool_precheck, tool_rollback, undo_dir_for
from agents.world import ACTIONS
from planner_site.events import publish_changed_on_commit
from planner_site.validators import json_problem, text_problem
from planning.engine.schedule import steps_transitions_refused
from planning.engine.shown import PLAN_CHANGED
from planning.engine.validate import plan_validate_edit
from planning.models import Plan, PlanEvent, PlanStep, steps_shown_fingerprint
from planning.services.agents import agent_waiting_set
from planning.services.errors import DecisionError, StepNotAwaitingApproval
from planning.services.events import actor_name, event_record, reason_clean
from planning.services.plans import plan_complete
from planning.services.transactions import atomic_retried, step_lock
from planning.signals import steps_await_approval_send
from planning.trace_spans import events_traced

EDITABLE_STEP_FIELDS = ("description", "action_hint", "tool", "tool_input", "expected_outcome", "requires_permission")
STEP_TEXT_LIMITS = {"description": 500, "action_hint": 200, "tool": 64, "expected_outcome": 500}
STEP_JSON_FIELDS = ("tool_input", "depends_on")
UNSTARTED = (PlanStep.Status.PENDING, PlanStep.Status.AWAITING_APPROVAL)


# --- operator decisions -------------------------------------------------------------------------------------


@atomic_retried
def step_approve(*, step: PlanStep, user: User, actor_label: str = "", detail: dict[str, Any] | None = None,
                 seen_steps: str | None = None) -> PlanEvent:
    """Approve a step that waits for an operator; the runner runs it in the agent's next cycle, which the
    approval brings forward (agents/signals.py). `seen_steps`: the fingerprint of the step as the operator saw it
    (planning/engine/shown.py); a step edited since is refused, nothing changed."""
    step = step_lock(step.pk)
    if step.status != PlanStep.Status.AWAITING_APPROVAL or step.plan.status != Plan.Status.ACTIVE:
        raise StepNotAwaitingApproval(step)
    if seen_steps is not None and seen_steps != steps_shown_fingerprint([step]):
        raise DecisionError(PLAN_CHANGED)
    step_move(step=step, status=PlanStep.Status.PENDING)
    step.approved_by = user  # type: ignore[assignment]
    step.save(update_fields=["status", "approved_by", "updated_at"])
    agent_waiting_set(agent_id=step.plan.agent_id, reason="")
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
    step_move(step=step, status=PlanStep.Status.DECLINED)
    step.failure_reason = f"declined by {actor_label or actor_name(user)}: {feedback}"
    step.save(update_fields=["status", "failure_reason", "updated_at"])
    plan = step.plan
    plan.replan_reason = f"step {step.key} declined: {feedback}"
    plan.save(update_fields=["replan_reason", "updated_at"])
    agent_waiting_set(agent_id=plan.agent_id, reason="")
    return event_record(plan=plan, step=step, kind=PlanEvent.Kind.STEP_DECLINED, actor=user, actor_label=actor_label,
                        reason=feedback, detail={"feedback": feedback} | (detail or {}))


@atomic_retried
def step_skip(*, step: PlanStep, user: User, reason: str = "") -> PlanEvent:
    """Skip a step that has not started; steps depending on it may then run."""
    reason = reason_clean(reason)
    step = step_lock(step.pk)
    if step.status == PlanStep.Status.AWAITING_APPROVAL and AguiInterrupt.objects.filter(step_id=step.pk).exists():
        raise DecisionError(f"Step {step.key} is the AG-UI agent's interrupt: approve it or decline it with feedback, "
                            "which resumes the agent's run. Nothing was changed.")
    if step.status not in (PlanStep.Status.PENDING, PlanStep.Status.AWAITING_APPROVAL) or not step.plan.is_open:
        raise DecisionError(f"Step {step.key} is {step.get_status_display().lower()}; only steps not yet started "
                            "can be skipped. Nothing was changed.")
    step_move(step=step, status=PlanStep.Status.SKIPPED)
    step.save(update_fields=["status", "updated_at"])
    agent_waiting_set(agent_id=step.plan.agent_id, reason="")
    plan = step.plan
    event = event_record(plan=plan, step=step, kind=PlanEvent.Kind.STEP_SKIPPED, actor=user,
                         reason=reason or f"skipped step {step.key}", detail={"skipped": step.key})
    if plan.status == Plan.Status.ACTIVE and not plan.steps.exclude(
            status__in=PlanStep.DONE_STATUSES).exists():
        plan_complete(plan=plan, runner=actor_name(user))
    return event


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
    if agent.kind == Agent.Kind.AGUI:
        # A remote AG-UI agent's tools are its own, unknown here: each value's form is checked, and the agent
        # gets the edited arguments in its resume[] (planning/services/agui.py).
        return [], []
    edited = PlanStep(**{f.attname: getattr(step, f.attname) for f in PlanStep._meta.get_fields() if f.concrete})
    for name, value in changes.items():
        setattr(edited, name, value)
    specs = [(edited if other.pk == step.pk else other).spec() for other in plan.steps.all()]
    if step.pk is None:
        specs.append(edited.spec())
    kind, tools = agent_plan_terms(agent.kind, agent.declared_tools, agent.tools)  # external agents: their declared tools
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


# --- the runner's transitions -------------------------------------------------------------------------------


def step_move(*, step: PlanStep, status: str) -> None:
    """Guarded transition (no completed -> running), a list of one for the state machine that checks a pass's
    moves too (steps_transitions_refused); raises IllegalTransition."""
    (refused,) = steps_transitions_refused([(step.status, [status])])
    if refused is not None:
        raise refused
    step.status = status


def step_awaiting(step: PlanStep) -> str:
    """A pending step put up for approval, without writing: its status, and what its tool will touch (seed 002,
    shown before the operator decides). The reason its event gives."""
    step_move(step=step, status=PlanStep.Status.AWAITING_APPROVAL)
    if step.tool:
        step.precheck = tool_precheck(step.tool, step.tool_input, step.plan.agent.workspace)[:2000]
    return "requires permission" if step.requires_permission else "step-by-step approval"


@atomic_retried
def steps_request_approval(steps: Sequence[PlanStep], *, runner: str) -> None:
    """Pending steps put up for an operator's approval (a runner's pass, or one step as a list of one): their
    plans (with their agents, whose workspace a tool's precheck reads), then the steps, locked in id order; those
    still pending put up for approval by the one rule (step_awaiting), written in one statement with one INSERT
    of their events, pushed after commit, the notifications' dispatch woken (bulk events send no post_save);
    each agent's row says which step waits; then the policies decide each, told by planning.signals in this
    transaction. A step no longer pending (decided meanwhile) is left as it is."""
    if not steps:
        return
    plans = {plan.pk: plan for plan in Plan.objects.select_for_update(no_key=True, of=("self",))
             .select_related("agent").filter(pk__in={step.plan_id for step in steps}).order_by("pk")}
    locked = list(PlanStep.objects.select_for_update(no_key=True)
                  .filter(pk__in=[step.pk for step in steps], status=PlanStep.Status.PENDING).order_by("pk"))
    now = timezone.now()
    events: list[PlanEvent] = []
    waiting: dict[int, str] = {}
    for step in locked:
        step.plan = plans[step.plan_id]
        reason = step_awaiting(step)
        step.updated_at = now
        waiting[step.plan.agent_id] = f"step {step.key} awaits approval"
        events.append(PlanEvent(plan=step.plan, agent_id=step.plan.agent_id, step=step,
                                kind=PlanEvent.Kind.STEP_AWAITING, actor_label=runner, reason=reason))
    rows_write(PlanStep, locked, ["status", "precheck", "updated_at"])  # locked and checked above
    # One UPDATE for each reason, not each agent: a pass puts a step up for few of its personas, and the reasons
    # name only the step's key, so a pass writes a few statements rather than one for each agent.
    by_text: dict[str, list[int]] = {}
    for agent_id, text in waiting.items():
        by_text.setdefault(text, []).append(agent_id)
    for text, agent_ids in sorted(by_text.items()):
        Agent.objects.filter(pk__in=agent_ids).update(waiting_reason=text)
    events_traced(PlanEvent.objects.bulk_create(events))
    if events:
        events_may_notify_on_commit()
    for step in locked:
        publish_changed_on_commit(agent_id=step.plan.agent_id, plan_id=step.plan_id, kind=PlanEvent.Kind.STEP_AWAITING)
    steps_await_approval_send(locked)


REPORTED_EVENTS: dict[str, str] = {PlanStep.Status.COMPLETED: PlanEvent.Kind.STEP_COMPLETED,
                                   PlanStep.Status.RUNNING: PlanEvent.Kind.STEP_STARTED,
                                   PlanStep.Status.AWAITING_APPROVAL: PlanEvent.Kind.STEP_AWAITING}


class StepReport(NamedTuple):
    """A step an outside agent reports (steps_reported): a new one (an unsaved row, completed, running or awaiting
    approval), or one it reported before (a row the caller locked with its plan) moved through the statuses of
    `path` with the other columns it set (`fields`), or only those columns; its event's reason and detail."""

    step: PlanStep
    reason: str
    path: tuple[str, ...] = ()
    fields: tuple[str, ...] = ()
    detail: dict[str, Any] | None = None


def steps_reported(*, plan: Plan, reported: Sequence[StepReport], actor_label: str) -> list[PlanStep]:
    """Steps an outside agent reports, in `plan` (the caller's locked plan): a remote A2A agent's messages and
    artifacts, an AG-UI agent's tool calls, their arguments and results, and its interrupts. New steps are
    appended after the plan's steps in one INSERT (keyed by their place unless they have a key): a step that
    begins completed, running or awaiting approval comes from nowhere, the state machine has no move to check.
    Steps reported before move by the one state machine (steps_transitions_refused: a move it refuses raises
    IllegalTransition, nothing written) and are written in one statement for each set of columns. One event each
    (started, completed, awaiting approval; what the agent reported of a step that did not move) in one INSERT,
    pushed after commit. Returns the steps, in order."""
    if not reported:
        return []
    moved = [report for report in reported if report.step.pk is not None]
    for problem in steps_transitions_refused([(report.step.status, report.path) for report in moved]):
        if problem is not None:
            raise problem
    position = plan.steps.count()
    kinds: list[str] = []
    written: dict[tuple[str, ...], list[PlanStep]] = {}
    now = timezone.now()
    for step, _, path, fields, _ in reported:
        if step.pk is None:
            if step.status not in REPORTED_EVENTS:
                raise ValueError(f"a reported step is completed, running or awaiting approval, not {step.status}")
            position += 1
            step.plan, step.position, step.key = plan, position, step.key or f"s{position}"
        elif path:
            step.status = path[-1]
            fields = (*fields, "status")
        kinds.append(REPORTED_EVENTS[step.status] if step.pk is None or path else PlanEvent.Kind.AGENT_REPORTED)
        if step.pk is not None and fields:
            step.updated_at = now
            written.setdefault(tuple(sorted({*fields, "updated_at"})), []).append(step)
    PlanStep.objects.bulk_create([report.step for report in reported if report.step.pk is None])
    for fields, rows in written.items():
        rows_write(PlanStep, rows, fields)  # locked by the caller, their moves checked above
    events_traced(PlanEvent.objects.bulk_create([
        PlanEvent(plan=plan, agent_id=plan.agent_id, step=report.step, kind=kind, actor_label=actor_label,
                  reason=report.reason[:4000], detail=report.detail or {})
        for report, kind in zip(reported, kinds, strict=True)]))
    events_may_notify_on_commit()
    for kind in sorted(set(kinds)):
        publish_changed_on_commit(agent_id=plan.agent_id, plan_id=plan.pk, kind=kind)
    return [report.step for report in reported]


@atomic_retried
def step_start(*, step: PlanStep, runner: str) -> PlanStep | None:
    """A tool step starts running (the runner calls its tool next, outside the transaction); None when it is no
    longer pending (an operator skipped it, another runner started it). The start is the runner's claim: in a
    runner's job only while it holds the job (agents/fencing.py), and the tool's own marker (runtime/cycle.py
    tool_call) says whether its tool began, should the runner stop before the step ends."""
    fence_hold()
    step = step_lock(step.pk)  # the plan first, then the step: the services' lock order
    if step.status != PlanStep.Status.PENDING:
        return None
    return step_started(step=step, actor_label=runner)


def step_started(*, step: PlanStep, actor_label: str) -> PlanStep:
    """A pending step, locked by the caller with its plan, starts running: a cycle more counted, its event says
    which tool with which input. The one start of a step, the runner's (step_start) and an agent's that runs
    its steps itself (planning/services/reported.py step_start)."""
    step_move(step=step, status=PlanStep.Status.RUNNING)
    step.actual_cycles += 1
    step.save(update_fields=["status", "actual_cycles", "updated_at"])
    event_record(plan=step.plan, step=step, kind=PlanEvent.Kind.STEP_STARTED, actor_label=actor_label,
                 reason=f"{step.tool} {json.dumps(step.tool_input, ensure_ascii=False)}"[:500])
    return step


@atomic_retried
def step_finish(*, step: PlanStep, runner: str, succeeded: bool, result: str = "", error: str = "",
                experience_id: int | None = None) -> PlanStep:
    """Complete a step, or count a failed try: retried up to max_retries, then failed and the plan replans. In a
    runner's job only while it holds the job (agents/fencing.py): a takeover decided this step already."""
    fence_hold()
    step = step_lock(step.pk)
    plan = step.plan
    if step.is_done or step.status in (PlanStep.Status.FAILED, PlanStep.Status.DECLINED, PlanStep.Status.CANCELLED):
        return step  # already decided (a cancelled step's plan was closed while it ran): never applied twice
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
        if not plan.steps.exclude(status__in=PlanStep.DONE_STATUSES).exists():
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


@atomic_retried
def step_outcome_unknown(*, step: PlanStep, runner: str, reason: str) -> bool:
    """A step found running whose tool began under a runner that stopped, and whose effect cannot be confirmed:
    it is neither run again nor called done. It waits for an operator (the inbox), who approves running it
    again or declines it (the agent replans). False when it is no longer running (decided meanwhile)."""
    fence_hold()
    step = step_lock(step.pk)
    if step.status != PlanStep.Status.RUNNING:
        return False
    step_move(step=step, status=PlanStep.Status.AWAITING_APPROVAL)
    step.error = reason[:20000]
    step.approved_by = None
    step.save(update_fields=["status", "error", "approved_by", "updated_at"])
    Agent.objects.filter(pk=step.plan.agent_id).update(
        waiting_reason=f"step {step.key}: outcome unknown, interrupted")
    event_record(plan=step.plan, step=step, kind=PlanEvent.Kind.STEP_AWAITING, actor_label=runner,
                 reason=reason[:500])
    return True


def step_elapsed_ms(step: PlanStep) -> int | None:
    """Seed 002: how long a step took, from its last start to now (None if it never started)."""
    started = (step.events.filter(kind=PlanEvent.Kind.STEP_STARTED).order_by("-created_at", "-pk")
               .values_list("created_at", flat=True).first())
    return None if started is None else max(int((timezone.now() - started).total_seconds() * 1000), 0)
