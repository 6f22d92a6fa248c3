"""A plan's decisions and transitions: approved, cancelled, sent back to be replanned, a question answered
(by operators, policies and external agents), and completed or abandoned (by the runner). One transaction
each, a PlanEvent, a push after commit."""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

from django.contrib.auth.models import User
from django.db import transaction
from django.db.models import Case, F, Value, When
from django.utils import timezone

from agents.llm.limits import plan_calls_abort
from agents.models import Agent
from agents.signals import events_may_notify_on_commit
from agents.tools import MAX_FILE_BYTES, ToolError, workspace_resolve
from goals.models import Goal
from goals.system import PLAN_ABANDON_PENALTY, PLAN_COMPLETION_BONUS, clamp_unit
from planner_site.events import publish_changed_on_commit
from planning.engine.goal_check import Outcome, OutputFile, outcome_check, outcome_targets
from planning.engine.meaning import StepView
from planning.engine.schedule import CLOSED_AS, steps_transitions_refused
from planning.engine.shown import PLAN_CHANGED
from planning.models import Plan, PlanEvent, PlanStep, steps_shown_fingerprint
from planning.selectors import plan_feedback
from planning.services.agents import agent_retry_sync, agent_waiting_set
from planning.services.errors import DecisionError, PlanNotAwaitingApproval
from planning.services.events import actor_name, event_record, reason_clean
from planning.services.transactions import atomic_retried, plan_lock
from planning.trace_spans import events_traced

# A plan in one of these states is history: nothing reopens it (a failed plan may still be replanned).
PLAN_FINAL = (Plan.Status.COMPLETED, Plan.Status.ACCEPTED, Plan.Status.CANCELLED, Plan.Status.REPLANNED,
              Plan.Status.REJECTED)


# --- operator decisions -------------------------------------------------------------------------------------


@atomic_retried
def plan_approve(*, plan: Plan, user: User, mode: str, actor_label: str = "", detail: dict[str, Any] | None = None,
                 approve_permission_steps: bool = True, seen_steps: str | None = None) -> PlanEvent:
    """Approve a validated plan: run all steps, or ask for each step (seed 002). A policy (`actor_label` names it)
    may leave the steps that require permission to be decided one by one. `seen_steps`: the fingerprint of the
    steps the operator saw (planning/engine/shown.py); steps changed since are refused, nothing changed."""
    if mode not in (Plan.ApprovalMode.ALL, Plan.ApprovalMode.STEP):
        raise DecisionError(f"Unknown approval mode {mode!r}. Nothing was changed.")
    plan = plan_lock(plan.pk)
    if plan.status != Plan.Status.AWAITING_APPROVAL:
        raise PlanNotAwaitingApproval(plan)
    if seen_steps is not None and seen_steps != steps_shown_fingerprint(plan.steps.all()):
        raise DecisionError(PLAN_CHANGED)
    plan.status = Plan.Status.ACTIVE
    plan.approval_mode = mode
    plan.save(update_fields=["status", "approval_mode", "updated_at"])
    agent_waiting_set(agent_id=plan.agent_id, reason="")
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
    """Cancel an open plan; its steps not started are skipped, a running one cancelled (plans_steps_close), and
    the agent stops pursuing it. An operator (`user`)
    cancels it, or an external agent withdraws its own plan (no user; `actor_label` names the agent).

    `seen_status` is the status the operator saw when they chose to cancel (None: not known): a plan that moved on
    since (approved by another operator meanwhile, an answered question) is not cancelled: of two opposite
    decisions at once, the first wins and the second is refused.

    A plan whose planning failed can be cancelled too: its automatic retries stop (a planning still under way
    stops at its next write, see planning/services/versions.py)."""
    reason = reason_clean(reason)
    plan = plan_lock(plan.pk)
    retrying = plan.status == Plan.Status.UNVERIFIED or (
        plan.status == Plan.Status.FAILED and not Plan.objects.filter(previous=plan).exists())
    if not plan.is_open and not retrying:
        raise DecisionError(f"Plan v{plan.version} is already {plan.get_status_display().lower()}. Nothing was changed.")
    if seen_status and plan.status != seen_status:
        if seen_status == Plan.Status.AWAITING_APPROVAL:
            raise PlanNotAwaitingApproval(plan)
        raise DecisionError(f"Plan v{plan.version} is now {plan.get_status_display().lower()}, no longer "
                            f"{Plan.Status(seen_status).label.lower() if seen_status in Plan.Status.values else seen_status}; "
                            "look at it again before cancelling. Nothing was changed.")
    planning = plan.status == Plan.Status.VALIDATING
    plan.status = Plan.Status.CANCELLED
    plan.retry_at = None
    plan.save(update_fields=["status", "retry_at", "updated_at"])
    if planning:  # its model calls, waiting or in flight in any process, stop now (agents/llm/limits.py)
        transaction.on_commit(functools.partial(plan_calls_abort, plan.pk))
    if retrying:
        agent_retry_sync(agent_id=plan.agent_id)  # the agent's next automatic retry is another plan's, or none
    steps = plans_steps_close([plan], now=timezone.now()).get(plan.pk, [])
    agent_waiting_set(agent_id=plan.agent_id, reason="")
    if plan.goal_id:
        Goal.objects.filter(pk=plan.goal_id).active().update(status=Goal.Status.ABANDONED)
    said, detail, step_events = plan_closed_steps_said(plan, steps, reason=reason, actor=user, actor_label=actor_label)
    if step_events:  # bulk events send no post_save: the notifications' dispatch is woken after commit
        events_traced(PlanEvent.objects.bulk_create(step_events))
        events_may_notify_on_commit()
    return event_record(plan=plan, kind=PlanEvent.Kind.PLAN_CANCELLED, actor=user, actor_label=actor_label,
                        reason=said, detail=detail)


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


@atomic_retried
def plan_clarify(*, plan: Plan, user: User | None, answer: str, actor_label: str = "") -> PlanEvent:
    """Answer the planner's question (seed 003); planning resumes with the answer as part of the goal. An
    operator answers (`user`), or an external agent's client the question reached (no user; `actor_label`
    names the agent: MCP tasks' input_required, docs/mcp-tasks.md)."""
    answer = " ".join(answer.split())
    if not answer:
        raise DecisionError("Write an answer to the planner's question. Nothing was changed.")
    answer = reason_clean(answer, what="The answer")
    plan = plan_lock(plan.pk)
    if plan.status not in (Plan.Status.CLARIFYING, Plan.Status.UNVERIFIED):
        raise DecisionError(f"Plan v{plan.version} is {plan.get_status_display().lower()}; it asks no question. "
                            "Nothing was changed.")
    plan.clarification_answer = answer[:2000]
    plan.status = Plan.Status.ACTIVE
    who = "operator" if user is not None else actor_label
    plan.replan_reason = f"{who} answered '{plan.clarification_question[:200]}': {answer[:500]}"
    plan.save(update_fields=["clarification_answer", "status", "replan_reason", "updated_at"])
    agent_waiting_set(agent_id=plan.agent_id, reason="")
    return event_record(plan=plan, kind=PlanEvent.Kind.CLARIFIED, actor=user, actor_label=actor_label,
                        reason=answer[:4000], detail={"question": plan.clarification_question, "answer": answer})


@atomic_retried
def plan_accept_done(*, plan: Plan, user: User, note: str = "") -> PlanEvent:
    """A person takes a "Done, not verified" plan as done: the plan is "Accepted as done, not verified" and its
    goal is closed as that person's decision (Goal.Status.ACCEPTED, never "Completed": nothing was verified).
    `note`: optional, the person's words, kept in the event and beside the goal."""
    note = reason_clean(note, what="The note")
    plan = plan_lock(plan.pk)
    if plan.status != Plan.Status.UNVERIFIED:
        raise DecisionError(f"Plan v{plan.version} is {plan.get_status_display().lower()}, not done-but-not-verified; "
                            "only such a plan can be accepted as done. Nothing was changed.")
    who = actor_name(user)
    unverified = plan.failure_reason or "outcome not verified"
    said = f"Accepted as done by {who}, not verified ({unverified})" + (f". Note: {note}" if note else "")
    plan.status = Plan.Status.ACCEPTED
    plan.clarification_answer = said[:2000]
    plan.save(update_fields=["status", "clarification_answer", "updated_at"])
    agent_waiting_set(agent_id=plan.agent_id, reason="")
    if plan.goal_id:
        Goal.objects.filter(pk=plan.goal_id).active().update(status=Goal.Status.ACCEPTED,
                                                             milestone_explanation=said[:4000])
    return event_record(plan=plan, kind=PlanEvent.Kind.PLAN_ACCEPTED, actor=user, reason=said[:4000],
                        detail={"verified": False, "accepted_by": who, "note": note, "unverified": unverified})


# --- the runner's transitions -------------------------------------------------------------------------------


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


def plan_outcome(plan: Plan) -> Outcome:
    """A tool plan whose steps are all done, checked against its goal (planning/engine/goal_check.py
    outcome_check): each output file exists, is not empty and parses as its format; each folder exists; an answer
    the goal asks for is in a step's result. Verified only when nothing is wrong and something was checked."""
    workspace = plan.agent.workspace
    done = list(plan.steps.filter(status=PlanStep.Status.COMPLETED).order_by("position"))
    views = [StepView(step.position, step.tool, dict(step.tool_input or {})) for step in done]
    files, folder_names = outcome_targets(plan.goal_text, views, plan_feedback(plan))
    outputs = []
    for path in files:
        try:
            target = workspace_resolve(workspace, path)
        except ToolError:
            outputs.append(OutputFile(path, None))
            continue
        if not target.is_file():
            outputs.append(OutputFile(path, None))
            continue
        with target.open("rb") as handle:
            outputs.append(OutputFile(path, handle.read(MAX_FILE_BYTES).decode("utf-8", errors="replace")))
    folders = {}
    for name in folder_names:
        try:
            folders[name] = workspace_resolve(workspace, name).is_dir()
        except ToolError:
            folders[name] = False
    return outcome_check(plan.goal_text, outputs, [step.result for step in done], folders)


def plan_complete(*, plan: Plan, runner: str) -> None:
    """Every step of the plan is done (the runner, an operator's skip, an external agent's last result): the ONE
    place a plan completes. A tool plan completes, and completes its goal, only when its outcome is verified
    (plan_outcome); otherwise it is "Done, not verified" and its goal stays open (plan_unverified)."""
    checked: tuple[str, ...] = ()
    if plan.agent.kind == Agent.Kind.TOOL:
        outcome = plan_outcome(plan)
        if not outcome.verified:
            plan_unverified(plan=plan, runner=runner, problems=list(outcome.problems))
            return
        checked = outcome.checked
    plan.status = Plan.Status.COMPLETED
    plan.save(update_fields=["status", "updated_at"])
    if plan.goal_id:
        goal = Goal.objects.select_for_update(no_key=True).get(pk=plan.goal_id)
        goal.progress = clamp_unit(goal.progress + PLAN_COMPLETION_BONUS)
        if plan.agent.kind == Agent.Kind.TOOL:
            goal.progress = 1.0
            goal.status = Goal.Status.COMPLETED
        goal.save()
    tool = plan.agent.kind == Agent.Kind.TOOL
    event_record(plan=plan, kind=PlanEvent.Kind.PLAN_COMPLETED, actor_label=runner,
                 reason="all steps done" + (f", outcome verified: {'; '.join(checked)}"[:1000] if tool else ""),
                 detail={"verified": True, "checked": list(checked)} if tool else {})


def plan_unverified(*, plan: Plan, runner: str, problems: list[str]) -> None:
    """Every step ran but the outcome is not verified: the plan is "Done, not verified", its goal stays open, and
    the operator is asked what next (an inbox question: the answer plans the goal again, Cancel drops it)."""
    headline = f"done, outcome not verified: {'; '.join(problems)}"[:2000]
    plan.status = Plan.Status.UNVERIFIED
    plan.failure_reason = headline
    plan.clarification_question = (f"Every step ran, but the outcome is not verified: {'; '.join(problems)}. "
                                   "What should the agent do now? Your answer plans the goal again; cancel the plan "
                                   "to drop the goal.")[:2000]
    plan.clarification_answer = ""
    plan.save(update_fields=["status", "failure_reason", "clarification_question", "clarification_answer",
                             "updated_at"])
    agent_waiting_set(agent_id=plan.agent_id, reason=f"plan v{plan.version} {headline[:200]}")
    event_record(plan=plan, kind=PlanEvent.Kind.PLAN_UNVERIFIED, actor_label=runner, reason=headline,
                 detail={"verified": False, "problems": problems})


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


# --- plans closed with their goals (a persona's cycle, a goal's milestone) ----------------------------------


PLAN_CLOSED = {"status": Plan.Status.CANCELLED, "replan_reason": ""}


def plans_steps_close(plans: Sequence[Plan], *, now: Any) -> dict[int, list[tuple[int, str, str, str]]]:
    """The unfinished steps of plans being closed (each plan locked by the caller) ended as the state machine says
    a closed plan's step ends (planning/engine/schedule.py CLOSED_AS: a step not started is skipped; a running
    one began, so it is cancelled, not skipped as if it never ran), each move checked by it
    (steps_transitions_refused). One read, locked in id order after the plans (the services' lock order), one
    UPDATE. By plan, in plan order: each step's id, key, the status it had and the one it has now.

    The one place a closed plan's steps change: an operator's cancel, an agent's withdrawal, an outside agent's
    task ended, and the plans of goals a cycle or a milestone finished."""
    if not plans:
        return {}
    found = list(PlanStep.objects.select_for_update(no_key=True)
                 .filter(plan__in=[plan.pk for plan in plans], status__in=list(CLOSED_AS)).order_by("pk")
                 .values_list("pk", "plan_id", "position", "key", "status"))
    refused = steps_transitions_refused([(status, [CLOSED_AS[status]]) for *_, status in found])
    moved = [row for row, problem in zip(found, refused, strict=True) if problem is None]
    if moved:
        PlanStep.objects.filter(pk__in=[pk for pk, *_ in moved]).update(
            status=Case(*[When(status=old, then=Value(new)) for old, new in CLOSED_AS.items()], default=F("status")),
            updated_at=now)
    steps: dict[int, list[tuple[int, str, str, str]]] = {}
    for pk, plan_id, _, key, status in sorted(moved, key=lambda row: (row[1], row[2])):
        steps.setdefault(plan_id, []).append((pk, key, status, CLOSED_AS[status]))
    return steps


def plan_closed_steps_said(plan: Plan, steps: Sequence[tuple[int, str, str, str]], *, reason: str, actor: User | None,
                           actor_label: str) -> tuple[str, dict[str, Any], list[PlanEvent]]:
    """What a closed plan's event says of its steps (plans_steps_close): the plan event's reason and detail
    (the steps skipped, and those cancelled while they ran), and an event for each step cancelled (unsaved)."""
    skipped = [key for _, key, _, new in steps if new == PlanStep.Status.SKIPPED]
    cancelled = [(pk, key) for pk, key, _, new in steps if new == PlanStep.Status.CANCELLED]
    detail: dict[str, Any] = {"skipped": skipped}
    if cancelled:
        detail["cancelled"] = [key for _, key in cancelled]
        reason = f"{reason}; " if reason else ""
        reason += f"step {', '.join(key for _, key in cancelled)} was running and is cancelled, its outcome not known"
    events = [PlanEvent(plan=plan, agent_id=plan.agent_id, step_id=pk, kind=PlanEvent.Kind.STEP_CANCELLED,
                        actor=actor, actor_label=actor_label or (actor_name(actor) if actor else "system"),
                        reason=f"step {key} was running when its plan was closed: cancelled, its outcome not known",
                        detail={"was": PlanStep.Status.RUNNING}) for pk, key in cancelled]
    return reason, detail, events


def plans_closed_steps(closed: Sequence[tuple[Plan, str]], *, runner: str, now: Any) -> list[PlanEvent]:
    """The rest of closing plans once their rows say closed: their unfinished steps ended (plans_steps_close),
    the plan's event and one for each step cancelled while it ran (unsaved)."""
    rows = plans_steps_close([plan for plan, _ in closed], now=now)
    events = []
    for plan, reason in closed:
        plan.status, plan.replan_reason = PLAN_CLOSED["status"], PLAN_CLOSED["replan_reason"]
        reason, detail, step_events = plan_closed_steps_said(plan, rows.get(plan.pk, []), reason=reason, actor=None,
                                                             actor_label=runner)
        detail["goal_finished"] = True
        # A request that waited for an operator leaves the inbox with nobody's decision on it: the audit and the
        # plan page say so, and why.
        withdrawn = [key for _, key, status, _ in rows.get(plan.pk, []) if status == PlanStep.Status.AWAITING_APPROVAL]
        if withdrawn:
            detail["withdrawn"] = withdrawn
            reason = f"{reason}; step {', '.join(withdrawn)} left the inbox with nobody's decision"
        events += step_events
        events.append(PlanEvent(plan=plan, agent_id=plan.agent_id, kind=PlanEvent.Kind.PLAN_CANCELLED,
                                actor_label=runner, reason=reason[:2000], detail=detail))
    return events


@transaction.atomic
def goals_plans_close(closing: Sequence[tuple[Goal, str]], *, runner: str) -> None:
    """Close every open plan of goals that just finished, each with its reason, in one transaction."""
    plans = goals_open_plans_locked([goal.pk for goal, _ in closing])
    events_traced(PlanEvent.objects.bulk_create(goals_plans_closed(closing, plans, runner=runner)))


def goals_open_plans_locked(goal_ids: Sequence[int]) -> list[Plan]:
    """The open plans of these goals, locked in id order (plans first: the services' lock order)."""
    return list(Plan.objects.select_for_update().filter(goal_id__in=goal_ids).open().order_by("pk")) if goal_ids else []


def goals_plans_closed(closing: Sequence[tuple[Goal, str]], plans: Sequence[Plan], *, runner: str,
                       completed: bool = False) -> list[PlanEvent]:
    """The open plans of goals that just finished (`plans`, locked by the caller: those of other goals are left
    alone) closed, each with its goal's reason; their events (unsaved), pushed after commit. `completed`: the
    milestone check said yes just now, which the agent's timeline records as "Goal completed" with its
    explanation."""
    reasons = {goal.pk: reason for goal, reason in closing}
    plans = [plan for plan in plans if plan.goal_id in reasons]
    now = timezone.now()
    if plans:
        Plan.objects.filter(pk__in=[p.pk for p in plans]).update(**PLAN_CLOSED, updated_at=now)
    events = plans_closed_steps([(plan, reasons[plan.goal_id or 0]) for plan in plans], runner=runner, now=now)
    if completed:
        events += [PlanEvent(agent_id=goal.agent_id, kind=PlanEvent.Kind.GOAL_COMPLETED, actor_label=runner,
                             reason=f"{goal.description}: {goal.milestone_explanation}"[:2000],
                             detail={"goal": goal.pk, "milestone": True}) for goal, _ in closing]
        for agent_id in sorted({goal.agent_id for goal, _ in closing}):
            publish_changed_on_commit(agent_id=agent_id, kind="goal_completed")
    for plan in plans:
        publish_changed_on_commit(agent_id=plan.agent_id, plan_id=plan.pk, kind="plan_closed")
    return events
