"""A plan's versions.

The planner's writes: a new version started, an attempt rejected, a plan accepted (and started at once by an
external agent's approval policy), a question asked, planning failed, a failed planning retried. Each is one
short transaction that records its PlanEvent and pushes after commit (via `event_record`); planning/planner.py
only asks the models and decides which to call.

Steering writes: a whole plan edited as version n+1, and decisions refused when made on a stale version.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.contrib.auth.models import User
from django.db import IntegrityError, transaction
from django.db.models import Exists
from django.utils import timezone

from agents.declared_tools import agent_plan_terms
from agents.models import Agent
from agents.persona import routine_keeps
from agents.services import rows_write
from agents.signals import events_may_notify_on_commit, operator_acted_on_commit
from agents.world import ACTIONS, action_needs_permission
from goals.models import Goal
from planner_site.events import publish_changed_on_commit
from planner_site.validators import text_problem
from planning.engine.diff import plan_diff
from planning.engine.prompts import RESTATE_KEYS
from planning.engine.validate import PlanSpec, StepSpec, plan_validate, step_plan_data
from planning.goal_terms import goal_plan_check
from planning.models import Plan, PlanEvent, PlanStep
from planning.services.agents import agent_retry_sync, agent_waiting_set, agents_waiting_refresh
from planning.services.errors import (
    DecisionError,
    GoalAlreadyPlanned,
    PlanAlreadyReplanned,
    PlanEditInvalid,
    PlanNoLongerValidating,
    StaleVersion,
)
from planning.services.events import actor_name, event_record
from planning.signals import plans_await_approval_send
from planning.trace_spans import events_traced

REJECTED_OUTPUT_SHOWN = 4000  # characters of a rejected output kept in the event
EDITABLE_PLAN_STATUSES = (Plan.Status.AWAITING_APPROVAL, Plan.Status.ACTIVE)
# Steps that stay as they were in the next version: done work is never redone or undone.


# --- the planner's writes ----------------------------------------------------------------------------------


def plan_locked_validating(plan: Plan) -> Plan:
    """The plan row, locked (not its agent's or previous version's), with both; PlanNoLongerValidating when
    someone else ended its planning meanwhile. Every write of a planning cycle starts here. A first version
    has no previous one to join (round_100_agents: a fifth of this read's CPU)."""
    related = ("agent", "previous") if plan.previous_id is not None else ("agent",)
    locked = Plan.objects.select_for_update(of=("self",)).select_related(*related).get(pk=plan.pk)
    if locked.status != Plan.Status.VALIDATING:
        raise PlanNoLongerValidating(locked)
    return locked


@transaction.atomic
def plan_start(*, agent: Agent, goal_text: str, goal: Goal | None, previous: Plan | None, reason: str,
               actor_label: str, exclusive: bool = False) -> Plan:
    """Create the new version in status "validating"; refuse a second next version of the same plan.
    `exclusive` (a tool agent's first plan of a goal: its cycle and a start pass may meet, runtime/tasks.py):
    the agent's row is locked first, as plans_first_start locks it, and a goal some plan holds by then is refused
    (GoalAlreadyPlanned), nothing written."""
    retry = 0
    planned = False
    if exclusive and previous is None and goal is not None:
        # The agent's row locked and the goal's plans looked at, in one statement.
        held = Exists(Plan.objects.filter(goal=goal).held())
        if Agent.objects.select_for_update(of=("self",)).filter(pk=agent.pk).values_list(held, flat=True).first():
            raise GoalAlreadyPlanned(goal)
    if previous is not None:
        previous = Plan.objects.select_for_update().get(pk=previous.pk)
        if Plan.objects.filter(previous=previous).exists():
            raise PlanAlreadyReplanned(previous)
        # A version that failed while planning has no steps: trying it again is a retry, not a replan;
        # an answered question is neither (nothing failed).
        planned = previous.steps.exists()
        retry = 0 if planned else previous.planning_retry + (0 if previous.clarification_answer else 1)
    plan = Plan(agent=agent, goal=goal, goal_text=goal_text[:500], status=Plan.Status.VALIDATING,
                version=previous.version + 1 if previous else 1, previous=previous,
                times_replanned=previous.times_replanned + (1 if planned else 0) if previous else 0,
                planning_retry=retry, **(previous.trace_ids() if previous is not None else {}),
                # The restatement is the goal's, not the version's: a replan keeps it (and its call).
                **({k: getattr(previous, k) for k in RESTATE_KEYS} if previous is not None else {}))
    try:
        # Only a next version can collide (`previous` is one-to-one): a first version needs no savepoint.
        with transaction.atomic() if previous is not None else contextlib.nullcontext():
            (plan,) = plans_create([(plan, reason)], actor_label=actor_label)
    except IntegrityError as exc:
        raise PlanAlreadyReplanned(previous) from exc
    if previous is not None:
        previous.status = Plan.Status.REPLANNED
        previous.replan_reason = ""
        previous.retry_at = None
        previous.save(update_fields=["status", "replan_reason", "retry_at", "updated_at"])
        event_record(plan=previous, kind=PlanEvent.Kind.REPLANNED, actor_label=actor_label, reason=reason,
                     detail={"next_plan": plan.pk, "next_version": plan.version})
    # A first version leaves the agent's failed plans as they were, and so its earliest retry.
    agent_waiting_set(agent_id=agent.pk, reason="", retry_sync=previous is not None)
    return plan


def plans_create(created: Sequence[tuple[Plan, str]], *, actor_label: str = "", actor: User | None = None,
                 details: Sequence[Mapping[str, Any]] | None = None) -> list[Plan]:
    """New plans (unsaved rows, each with the reason its event gives: first versions, a next version, routines
    repeated, an AG-UI agent's run) in one INSERT, with their CREATED events in one INSERT (each naming its
    version and the version before, with `details` added), pushed after commit; an operator's (`actor`) brings
    the agents' next cycles forward then, as event_record's. The one place a plan is created; the caller holds the
    transaction and has checked what it must (a goal not planned twice, a version not replanned twice)."""
    plans = Plan.objects.bulk_create([plan for plan, _ in created])
    events_traced(PlanEvent.objects.bulk_create([
        PlanEvent(plan=plan, agent_id=plan.agent_id, kind=PlanEvent.Kind.CREATED, actor=actor,
                  actor_label=actor_label or (actor_name(actor) if actor else "system"), reason=reason,
                  detail={"version": plan.version, "previous": plan.previous_id} | dict(extra))
        for (plan, (_, reason)), extra in zip(zip(plans, created, strict=True), details or [{}] * len(plans),
                                              strict=True)]))
    for plan in plans:
        publish_changed_on_commit(agent_id=plan.agent_id, plan_id=plan.pk, kind=PlanEvent.Kind.CREATED)
    if actor is not None:
        for agent_id in sorted({plan.agent_id for plan in plans}):
            operator_acted_on_commit(agent_id)
    return plans


def plan_restatement_save(*, plan: Plan, restatement: Mapping[str, str]) -> None:
    """Keep the fast model's WHO/WHAT/WHEN/WHERE/WHY on the plan; its page's header shows it at once.

    No event of its own: the restatement is part of the planning that the next event (an attempt, the
    plan validated or failed) records. One statement, atomic on its own: no transaction around it."""
    values = {k: restatement.get(k, "") for k in RESTATE_KEYS}
    Plan.objects.filter(pk=plan.pk).update(**values)
    for key, value in values.items():  # the caller's plan says so too (plan_accept writes no restatement)
        setattr(plan, key, value)
    publish_changed_on_commit(agent_id=plan.agent_id, plan_id=plan.pk, kind="restated")


@transaction.atomic
def attempt_reject(*, plan: Plan, model: str, reasons: list[str], output: str, hints: list[str], actor_label: str) -> None:
    """One model answer (or model error) rejected, with the reasons, the fix hints and the output shown."""
    plan_locked_validating(plan)
    Plan.objects.filter(pk=plan.pk).update(retry_hints=hints)
    event_record(plan=plan, kind=PlanEvent.Kind.ATTEMPT_REJECTED, actor_label=actor_label,
                 reason="; ".join(reasons)[:4000],
                 detail={"model": model, "reasons": reasons, "hints": hints, "output": output[:REJECTED_OUTPUT_SHOWN],
                         "output_chars": len(output)})


def steps_permission_raise(*, plan: Plan, spec: PlanSpec, kept_keys: set[str], flags: list[str]) -> None:
    """Spending real money is the persona world's risky act: an operator says yes first."""
    if plan.agent.kind != Agent.Kind.PERSONA:
        return
    for step in spec.steps:  # named by its key, as the plan page and the inbox show it
        if step.key not in kept_keys and action_needs_permission(step.action_hint) and not step.requires_permission:
            step.requires_permission = True
            step.risk = "risky"
            flags.append(f"step {step.key}: '{step.action_hint}' spends money, so it now needs permission")


def plan_steps_build(*, plan: Plan, spec: PlanSpec, kept: Sequence[PlanStep]) -> list[PlanStep]:
    """The validated steps as rows, in order; a step completed in an earlier version keeps its outcome."""
    kept_by_key = {s.key: s for s in kept}
    rows = []
    for position, step in enumerate(spec.steps, start=1):
        carried = kept_by_key.get(step.key)
        rows.append(PlanStep(
            plan=plan, key=step.key, position=position, description=step.description[:500],
            action_hint=step.action_hint[:200], tool=step.tool, tool_input=step.input,
            expected_outcome=step.expected_outcome[:500], estimated_cycles=max(1, step.estimated_cycles),
            depends_on=list(step.depends_on), requires_permission=step.requires_permission, risk=step.risk,
            tools_needed=list(step.tools_needed), loop=dict(step.loop),
            status=carried.status if carried else PlanStep.Status.PENDING,
            result=carried.result if carried else "", actual_cycles=carried.actual_cycles if carried else 0,
            elapsed_ms=carried.elapsed_ms if carried else None,
            carried_over=carried is not None, approved_by=carried.approved_by if carried else None,
        ))
    return rows


@dataclass
class Acceptance:
    """A validated plan to accept: its spec, flags and model, the steps an earlier version completed (kept as
    they are), and the restatement to store with it (None: the one stored already stays)."""

    plan: Plan
    spec: PlanSpec
    flags: list[str]
    model: str
    kept: Sequence[PlanStep] = ()
    restatement: Mapping[str, str] | None = None


def plan_accept(*, plan: Plan, spec: PlanSpec, flags: list[str], model: str, kept: list[PlanStep],
                actor_label: str) -> Plan:
    """plans_accept for one plan; PlanNoLongerValidating (nothing written) when someone ended its planning
    meanwhile. The plan as it is now (a policy may have decided it at once)."""
    accepted = plans_accept([Acceptance(plan=plan, spec=spec, flags=flags, model=model, kept=kept)],
                            actor_label=actor_label)
    if plan.pk not in accepted:
        raise PlanNoLongerValidating(plan)
    return accepted[plan.pk][0]


ACCEPTED_FIELDS = ["status", "approval_mode", "thinking_summary", "confidence", "risks", "model", "updated_at"]


def plan_accepted(*, plan: Plan, spec: PlanSpec, flags: list[str], model: str,
                  kept: Sequence[PlanStep]) -> tuple[list[PlanStep], dict[str, Any]]:
    """A validated plan accepted, without writing: its fields set (ACCEPTED_FIELDS: a persona's plan starts at
    once, a tool plan waits for the operator), its steps as rows, and its VALIDATED event's detail (the diff
    against the previous version)."""
    persona = plan.agent.kind == Agent.Kind.PERSONA
    steps_permission_raise(plan=plan, spec=spec, kept_keys={s.key for s in kept}, flags=flags)
    steps = plan_steps_build(plan=plan, spec=spec, kept=kept)
    plan.status = Plan.Status.ACTIVE if persona else Plan.Status.AWAITING_APPROVAL
    plan.approval_mode = Plan.ApprovalMode.ALL if persona else Plan.ApprovalMode.PENDING
    plan.thinking_summary = spec.thinking_summary[:4000]
    plan.confidence = max(0.0, min(1.0, spec.confidence))
    plan.risks = list(spec.risks)
    plan.model = model
    plan.updated_at = timezone.now()
    detail: dict[str, Any] = {"model": model, "flags": flags, "steps": len(spec.steps)}
    if plan.previous is not None:
        detail["diff"] = plan_diff([s.diff_values() for s in plan.previous.steps.all()], [s.diff_values() for s in steps])
    return steps, detail


@transaction.atomic
def plans_first_start(wanted: Sequence[tuple[Agent, Goal]], *, actor_label: str,
                      exclusive: bool = False) -> list[Plan | None]:
    """plan_start for the first versions of many agents' goals at once (a runner's pass): one INSERT of the
    plans ("validating"), one of their CREATED events, pushed after commit. An agent whose row said something
    waits has it say what still waits (agents_waiting_refresh), as plan_start does. The plans, in order.

    `exclusive` (tool agents, whose start pass may meet a cycle of the same agent, runtime/tasks.py): the
    agents' rows are locked first, as plan_start(exclusive=True) locks its agent's, and a goal that some plan
    holds by then (GoalAlreadyPlanned) gets no plan: None in its place."""
    held: set[int] = set()
    if exclusive and wanted:
        list(Agent.objects.select_for_update().filter(pk__in=sorted({a.pk for a, _ in wanted})).order_by("pk")
             .values_list("pk", flat=True))
        held = set(Plan.objects.filter(goal_id__in=[g.pk for _, g in wanted]).held().values_list("goal_id", flat=True))
    starting = [(agent, goal) for agent, goal in wanted if goal.pk not in held]
    plans = plans_create([(Plan(agent=agent, goal=goal, goal_text=goal.description[:500],
                                status=Plan.Status.VALIDATING, version=1), "") for agent, goal in starting],
                         actor_label=actor_label)
    agents_waiting_refresh(sorted({agent.pk for agent, _ in starting if agent.waiting_reason}))
    started = iter(plans)
    return [None if goal.pk in held else next(started) for _, goal in wanted]


@transaction.atomic
def plans_accept(acceptances: Sequence[Acceptance], *, actor_label: str) -> dict[int, tuple[Plan, list[PlanStep]]]:
    """Validated plans accepted (a runner's pass, or one plan as a list of one), by plan_accepted's rules: the
    plans still "validating" locked, one INSERT of their steps, one statement writing the plans (with the
    restatements that came with them), one INSERT of their VALIDATED events, pushed after commit, the
    notifications' dispatch woken (bulk events send no post_save). A persona's plan starts at once; another
    agent's awaits approval, its row says so (one UPDATE for each version number), and the approval policies
    decide it, plan by plan, told by planning.signals in this transaction. A plan someone ended meanwhile is left
    as it is and left out. The plans accepted, as they are now, with their steps as stored, by plan id."""
    validating = set(Plan.objects.select_for_update().filter(
        pk__in=[a.plan.pk for a in acceptances], status=Plan.Status.VALIDATING).order_by("pk")
        .values_list("pk", flat=True)) if acceptances else set()
    plans: list[Plan] = []
    restated: list[Plan] = []
    steps: list[PlanStep] = []
    events: list[PlanEvent] = []
    done: dict[int, tuple[Plan, list[PlanStep]]] = {}
    for acceptance in acceptances:
        plan = acceptance.plan
        if plan.pk not in validating or plan.pk in done:
            continue
        if acceptance.restatement is not None:
            for key in RESTATE_KEYS:
                setattr(plan, key, acceptance.restatement.get(key, ""))
            restated.append(plan)
        plan_steps, detail = plan_accepted(plan=plan, spec=acceptance.spec, flags=acceptance.flags,
                                           model=acceptance.model, kept=acceptance.kept)
        plans.append(plan)
        steps += plan_steps
        done[plan.pk] = (plan, plan_steps)
        events.append(PlanEvent(plan=plan, agent_id=plan.agent_id, kind=PlanEvent.Kind.VALIDATED,
                                actor_label=actor_label, reason="; ".join(acceptance.flags)[:4000], detail=detail))
    if not plans:
        return {}
    PlanStep.objects.bulk_create(steps)
    # Locked and checked above (bulk_update builds a CASE WHEN per row and field).
    rows_write(Plan, restated, [*ACCEPTED_FIELDS, *RESTATE_KEYS])
    restated_ids = {plan.pk for plan in restated}
    rows_write(Plan, [plan for plan in plans if plan.pk not in restated_ids], ACCEPTED_FIELDS)
    events_traced(PlanEvent.objects.bulk_create(events))
    events_may_notify_on_commit()
    for plan in plans:
        publish_changed_on_commit(agent_id=plan.agent_id, plan_id=plan.pk, kind=PlanEvent.Kind.VALIDATED)
    waiting = [plan for plan in plans if plan.status == Plan.Status.AWAITING_APPROVAL]
    if waiting:
        by_text: dict[str, list[int]] = {}
        for plan in waiting:
            by_text.setdefault(f"plan v{plan.version} awaits approval", []).append(plan.agent_id)
        for text, agent_ids in sorted(by_text.items()):  # a row that says so already is not written
            Agent.objects.filter(pk__in=agent_ids).exclude(waiting_reason=text).update(waiting_reason=text)
        decided = plans_await_approval_send(waiting)
        for plan in waiting:
            if plan.pk in decided:  # decided at once: the caller sees the plan as it is now
                plan.refresh_from_db(fields=["status", "approval_mode", "replan_reason", "updated_at"])
    return done


# A routine repeats a step that serves another need only while that need is below this (work while money is short).
ROUTINE_FINE_ABOVE = 0.8


@dataclass
class Routine:
    """A goal's routine to start: the completed plan it repeats, that plan's steps, the needs now."""

    goal: Goal
    source: Plan
    steps: Sequence[PlanStep]
    needs: Mapping[str, float]


def plan_repeat(*, goal: Goal, source: Plan, needs: Mapping[str, float],
                runner: str) -> tuple[Plan, list[PlanStep]] | None:
    """A goal whose plan (or a plan for the same goal in the same words) completed does the same again: a
    new plan with the completed plan's steps, made without a model call (the person's routine). Steps
    that only served needs that are fine now are left out; none left: None, the caller asks the model.
    Steps that spend money wait for an operator's yes again. Returns the plan and its steps, as created."""
    started = routines_start([Routine(goal=goal, source=source, steps=list(source.steps.all()), needs=needs)],
                             runner=runner)
    return started.get(goal.pk)


@transaction.atomic
def routines_start(routines: Sequence[Routine], *, runner: str) -> dict[int, tuple[Plan, list[PlanStep]]]:
    """plan_repeat for many goals at once (a batch of persona cycles): one INSERT for the plans and one for their
    events (plans_create), one for their steps, pushed after commit. By goal; a goal none of whose steps is kept
    is left out."""
    kept: list[tuple[Routine, list[PlanStep]]] = []
    for routine in routines:
        steps = [s for s in routine.steps if s.status == PlanStep.Status.COMPLETED and routine_keeps(
            effects=ACTIONS[s.action_hint].effects if s.action_hint in ACTIONS else {},
            source_needs=routine.goal.source_needs, needs=routine.needs, fine_above=ROUTINE_FINE_ABOVE)]
        if steps:
            kept.append((routine, steps))
    if not kept:
        return {}
    plans = plans_create([
        (Plan(agent_id=r.goal.agent_id, goal=r.goal, goal_text=r.source.goal_text, status=Plan.Status.ACTIVE,
              approval_mode=Plan.ApprovalMode.ALL, thinking_summary=r.source.thinking_summary,
              confidence=r.source.confidence, risks=list(r.source.risks), model=r.source.model),
         f"repeats plan #{r.source.pk}, which completed; no model call") for r, _ in kept],
        actor_label=runner, details=[{"repeats": r.source.pk} for r, _ in kept])
    made = PlanStep.objects.bulk_create([
        PlanStep(plan=plan, key=s.key, position=position, description=s.description, action_hint=s.action_hint,
                 expected_outcome=s.expected_outcome, estimated_cycles=s.estimated_cycles,
                 depends_on=[d for d in s.depends_on if d in {t.key for t in steps}],
                 requires_permission=s.requires_permission, risk=s.risk)
        for plan, (_, steps) in zip(plans, kept, strict=True) for position, s in enumerate(steps, start=1)])
    by_plan: dict[int, list[PlanStep]] = {}
    for step in made:
        by_plan.setdefault(step.plan_id, []).append(step)
    return {routine.goal.pk: (plan, by_plan[plan.pk]) for plan, (routine, _) in zip(plans, kept, strict=True)}


@transaction.atomic
def plan_start_by_policy(*, plan: Plan, actor_label: str) -> Plan:
    """An external agent whose approval policy is "permission" starts its accepted plan at once: only the
    steps that require permission wait for an operator."""
    plan.status = Plan.Status.ACTIVE
    plan.approval_mode = Plan.ApprovalMode.ALL
    plan.save(update_fields=["status", "approval_mode", "updated_at"])
    agent_waiting_set(agent_id=plan.agent_id, reason="")
    event_record(plan=plan, kind=PlanEvent.Kind.PLAN_APPROVED, actor_label=actor_label,
                 reason="started at once by the agent's approval policy; steps that require permission wait",
                 detail={"mode": Plan.ApprovalMode.ALL, "policy": Agent.ApprovalPolicy.PERMISSION})
    return plan


@transaction.atomic
def plan_ask(*, plan: Plan, question: str, model: str, actor_label: str) -> Plan:
    """Seed 003: the planner cannot plan without the operator's answer (an ambiguous goal, too many steps)."""
    plan = plan_locked_validating(plan)
    plan.status = Plan.Status.CLARIFYING
    plan.clarification_question = question
    plan.model = model
    plan.save(update_fields=["status", "clarification_question", "model", "updated_at"])
    agent_waiting_set(agent_id=plan.agent_id, reason=f"plan v{plan.version} asks: {question}")
    event_record(plan=plan, kind=PlanEvent.Kind.CLARIFICATION_ASKED, actor_label=actor_label, reason=question[:4000],
                 detail={"model": model, "question": question})
    return plan


def failure_reasons(plan: Plan) -> list[str]:
    """Every rejected attempt's reasons and every model error of this version, "model: reason", in order."""
    events = plan.events.filter(kind=PlanEvent.Kind.ATTEMPT_REJECTED).order_by("created_at", "pk")
    return [f"{e.detail.get('model', '?')}: {r}" for e in events for r in e.detail.get("reasons", [])]


@transaction.atomic
def plan_fail(*, plan: Plan, headline: str, actor_label: str, reasons: Sequence[str] = (), retry: bool = True) -> Plan:
    """Planning failed: the plan fails with a true headline and every reason; the agent's retry policy tries
    the goal again after a backoff, or the agent waits for an operator (Replan or Cancel). Without `retry` (a goal
    its agent's tools cannot reach: trying again changes nothing) it waits for an operator at once."""
    plan = plan_locked_validating(plan)
    agent = plan.agent
    reasons = [*reasons, *failure_reasons(plan)]
    plan.status = Plan.Status.FAILED
    plan.failure_reason = "\n".join([headline, *reasons])[:20000]
    if not retry:
        plan.retry_at = None
        waiting = f"{headline}; waiting for an operator"
    elif plan.planning_retry < agent.plan_retry_limit:
        # Backoff doubles with each retry: a server that is down is not hammered.
        plan.retry_at = timezone.now() + timedelta(seconds=agent.plan_retry_backoff * 2 ** plan.planning_retry)
        local = timezone.localtime(plan.retry_at)
        waiting = (f"planning failed ({headline}); next attempt at {local:%H:%M:%S} "
                   f"(retry {plan.planning_retry + 1} of {agent.plan_retry_limit})")
    else:
        plan.retry_at = None
        waiting = f"planning failed ({headline}); waiting for an operator to replan"
    plan.save(update_fields=["status", "failure_reason", "retry_at", "updated_at"])
    event_record(plan=plan, kind=PlanEvent.Kind.PLAN_FAILED, actor_label=actor_label,
                 reason=headline if not retry else f"planning failed: {headline}",
                 detail={"reasons": reasons, "retry_at": plan.retry_at.isoformat() if plan.retry_at else None}
                 | ({} if retry else {"cannot": headline}))
    agent_waiting_set(agent_id=agent.pk, reason=waiting)
    agent_retry_sync(agent_id=agent.pk)
    return plan


@transaction.atomic
def plan_retry_start(*, agent: Agent, runner: str) -> Plan | None:
    """The earliest failed planning whose automatic retry is due gets a replan request (PLAN_RETRIED), which
    the caller's cycle carries out; None when another runner or an operator took it meanwhile."""
    plan = (Plan.objects.select_for_update()
            .filter(agent=agent, status=Plan.Status.FAILED, retry_at__lte=timezone.now())
            .order_by("retry_at").first())
    if plan is None:
        agent_retry_sync(agent_id=agent.pk)
        return None
    headline = plan.failure_reason.split("\n", 1)[0]
    plan.status = Plan.Status.ACTIVE
    plan.retry_at = None
    plan.replan_reason = f"automatic retry {plan.planning_retry + 1} of {agent.plan_retry_limit} after: {headline}"
    plan.save(update_fields=["status", "retry_at", "replan_reason", "updated_at"])
    agent_retry_sync(agent_id=agent.pk)
    event_record(plan=plan, kind=PlanEvent.Kind.PLAN_RETRIED, actor_label=runner, reason=plan.replan_reason,
                 detail={"retry": plan.planning_retry + 1})
    return plan


# --- an operator's edit: version n+1, and decisions made on a stale version ------------------------------


def plan_latest(plan: Plan) -> Plan:
    """The newest version of this plan's lineage (itself when it has no next version)."""
    current = plan
    while True:
        nxt = Plan.objects.filter(previous=current).first()
        if nxt is None:
            return current
        current = nxt


def plan_check_seen(*, plan: Plan, seen_version: int | None) -> None:
    """Refuse a decision made on a version that has since been replaced; None: the client sent no version."""
    if seen_version is None:
        return
    if plan.version != seen_version or plan.status == Plan.Status.REPLANNED:
        current = plan_latest(plan)
        if current.pk != plan.pk or plan.version != seen_version:
            raise StaleVersion(seen_version, current)


@transaction.atomic
def plan_edit_save(*, plan: Plan, user: User, steps: list[StepSpec], seen_version: int, reason: str = "") -> Plan:
    """Save the operator's edit of a whole plan as version n+1: the planner's validator judges it first
    (invalid: PlanEditInvalid, nothing saved); completed and skipped steps carry over unchanged."""
    plan = Plan.objects.select_for_update().select_related("agent").get(pk=plan.pk)
    if plan.version != seen_version or Plan.objects.filter(previous=plan).exists():
        raise StaleVersion(seen_version, plan_latest(plan))
    if plan.status not in EDITABLE_PLAN_STATUSES:
        raise DecisionError(f"Plan v{plan.version} is {plan.get_status_display().lower()}; only plans awaiting "
                            "approval or active can be edited. Nothing was changed.")
    old_steps = list(plan.steps.select_for_update().order_by("position"))
    running = [s.key for s in old_steps if s.status == PlanStep.Status.RUNNING]
    if running:
        raise DecisionError(f"Step {', '.join(running)} is running; edit the plan once it has finished. "
                            "Nothing was changed.")
    agent = plan.agent
    kept = [s for s in old_steps if s.status in PlanStep.DONE_STATUSES]
    kept_keys = {s.key for s in kept}
    edited = [s for s in steps if s.key not in kept_keys]
    if not edited:
        raise PlanEditInvalid(["the plan has no steps left to do"])
    old_by_key = {s.key: s for s in old_steps}
    for step in edited:
        before = old_by_key.get(step.key)
        if before is not None and before.tool == step.tool:  # what the editor does not show is kept
            step.tools_needed, step.loop = list(before.tools_needed), dict(before.loop)
    kind, tools = agent_plan_terms(agent.kind, agent.declared_tools, agent.tools)  # external agents: their declared tools
    problems = [f"step {position}: '{name}' {problem}"
                for position, step in enumerate(edited, start=len(kept) + 1)
                for name in ("key", "description", "tool", "action_hint", "expected_outcome")
                if (problem := text_problem(getattr(step, name)))]
    if reason_problem := text_problem(reason, max_length=500):
        problems.append(f"the reason {reason_problem}")
    if problems:  # checked here too, so no caller stores what the forms refuse
        raise PlanEditInvalid(problems)
    # The edited steps as the operator left them in the editor, which shows a tool step's estimate too.
    rows = ([step_plan_data(s.spec(), kind) for s in kept]
            + [step_plan_data(s, kind) for s in edited])
    workspace = agent.workspace if agent.kind == Agent.Kind.TOOL else None
    if workspace is not None:
        workspace.mkdir(parents=True, exist_ok=True)
    result = plan_validate({"steps": rows}, kind=kind, workspace=workspace, max_steps=settings.PLAN_MAX_STEPS,
                           allowed_actions=list(ACTIONS), tools=tools)
    if not result.ok or result.plan is None:
        raise PlanEditInvalid(result.problems)
    flags = list(result.flags)
    # The same goal check as every planner's, but the person decides: what the edit leaves undone is a flag, not
    # a refusal.
    editor = user.get_username()
    undone = [f"planned by {editor}: {problem} (not refused: {editor} decides)"
              for problem in goal_plan_check(agent, plan.goal_text, result.plan.steps)]
    flags += undone
    asked = {s.key: s for s in edited}
    why = f"edited by {user.get_username()}" + (f": {reason}" if reason else "")
    (new,) = plans_create([(Plan(
        agent=agent, goal_id=plan.goal_id, goal_text=plan.goal_text, version=plan.version + 1, previous=plan,
        status=plan.status, approval_mode=plan.approval_mode, times_replanned=plan.times_replanned,
        who=plan.who, what=plan.what, when=plan.when, where=plan.where, why=plan.why,
        thinking_summary=plan.thinking_summary, confidence=plan.confidence, risks=list(plan.risks),
        model=plan.model, edited_by=user.get_username(), **plan.trace_ids(),
    ), why)], actor=user, details=[{"edited": True}])
    for position, spec in enumerate(result.plan.steps, start=1):
        carried = old_by_key.get(spec.key) if spec.key in kept_keys else None
        requires_permission, risk = spec.requires_permission, spec.risk
        if agent.kind == Agent.Kind.PERSONA and spec.key in asked:
            requires_permission = asked[spec.key].requires_permission
            if action_needs_permission(spec.action_hint) and not requires_permission:
                requires_permission, risk = True, PlanStep.Risk.RISKY
                flags.append(f"step {spec.key}: '{spec.action_hint}' spends money, so it now needs permission")
        before = old_by_key.get(spec.key)
        unchanged = before is not None and before.status == PlanStep.Status.PENDING and not plan_diff(
            [before.spec().as_dict()], [replace(
                before.spec(), description=spec.description, tool=spec.tool, input=spec.input,
                action_hint=spec.action_hint, expected_outcome=spec.expected_outcome, depends_on=spec.depends_on,
                requires_permission=requires_permission).as_dict()])["changed"]
        PlanStep.objects.create(
            plan=new, key=spec.key, position=position, description=spec.description[:500],
            action_hint=spec.action_hint[:200], tool=spec.tool, tool_input=spec.input,
            expected_outcome=spec.expected_outcome[:500], estimated_cycles=max(1, spec.estimated_cycles),
            depends_on=list(spec.depends_on), requires_permission=requires_permission, risk=risk,
            tools_needed=list(spec.tools_needed), loop=dict(spec.loop),
            status=carried.status if carried else PlanStep.Status.PENDING,
            result=carried.result if carried else "", actual_cycles=carried.actual_cycles if carried else 0,
            elapsed_ms=carried.elapsed_ms if carried else None, carried_over=carried is not None,
            # An approval given to a step carries over only when the operator left that step as it was.
            approved_by=carried.approved_by if carried else (before.approved_by if unchanged and before else None),
        )
    plan.status = Plan.Status.REPLANNED
    plan.replan_reason = ""
    plan.save(update_fields=["status", "replan_reason", "updated_at"])
    diff = plan_diff([s.diff_values() for s in old_steps], [s.diff_values() for s in new.steps.all()])
    event_record(plan=plan, kind=PlanEvent.Kind.PLAN_EDITED, actor=user, reason=why,
                 detail={"next_plan": new.pk, "next_version": new.version, "diff": diff})
    event_record(plan=new, kind=PlanEvent.Kind.VALIDATED, actor=user, reason="; ".join(flags)[:4000],
                 detail={"flags": flags, "steps": len(result.plan.steps), "diff": diff, "edited": True,
                         "goal_undone": undone})
    waiting = f"plan v{new.version} awaits approval" if new.status == Plan.Status.AWAITING_APPROVAL else ""
    agent_waiting_set(agent_id=agent.pk, reason=waiting)
    return new
