"""The planner's writes: a new version started, an attempt rejected, a plan accepted (and started at once
by an external agent's approval policy), a question asked, planning failed, a failed planning retried. Each is one short transaction that records its PlanEvent and
pushes after commit (via `event_record`); planning/planner.py only asks the models and decides which to call.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping, Sequence
from datetime import timedelta
from typing import Any

from django.db import IntegrityError, transaction
from django.db.models import Subquery
from django.utils import timezone

from agents.models import Agent
from agents.world import action_needs_permission
from goals.models import Goal
from planner_site.events import publish_changed_on_commit
from planning.engine.diff import plan_diff
from planning.engine.prompts import RESTATE_KEYS
from planning.engine.validate import PlanSpec
from planning.models import Plan, PlanEvent, PlanStep
from planning.services import event_record

REJECTED_OUTPUT_SHOWN = 4000  # characters of a rejected output kept in the event


class PlanAlreadyReplanned(Exception):
    """Another runner or operator already made the next version of this plan."""


class PlanNoLongerValidating(Exception):
    """The plan left "validating" while the planner worked (failed as interrupted, or cancelled)."""


def plan_locked_validating(plan: Plan) -> Plan:
    """The plan row, locked (not its agent's or previous version's), with both; PlanNoLongerValidating when
    someone else ended its planning meanwhile. Every write of a planning cycle starts here."""
    locked = Plan.objects.select_for_update(of=("self",)).select_related("agent", "previous").get(pk=plan.pk)
    if locked.status != Plan.Status.VALIDATING:
        raise PlanNoLongerValidating(locked)
    return locked


def agent_waiting_set(*, agent_id: int, reason: str, retry_sync: bool = False) -> None:
    """What the agent waits for, on its row (the dashboard's "waiting" filter); pushed with the caller's event.
    With retry_sync, the earliest automatic retry too, in the same statement (see agent_retry_sync)."""
    if not retry_sync:  # the common case, twice in every planning
        Agent.objects.filter(pk=agent_id).update(waiting_reason=reason[:300])
        return
    Agent.objects.filter(pk=agent_id).update(waiting_reason=reason[:300],
                                             plan_retry_at=agent_retry_earliest(agent_id=agent_id))


def agent_retry_earliest(*, agent_id: int) -> Subquery:
    """The earliest automatic retry of the agent's failed plans, as a subquery for an UPDATE of its row."""
    return Subquery(Plan.objects.filter(agent_id=agent_id, status=Plan.Status.FAILED, retry_at__isnull=False)
                    .order_by("retry_at").values("retry_at")[:1])


def agent_retry_sync(*, agent_id: int) -> None:
    """The agent row keeps the earliest automatic retry of its failed plans, so a cycle knows without a query."""
    Agent.objects.filter(pk=agent_id).update(plan_retry_at=agent_retry_earliest(agent_id=agent_id))


@transaction.atomic
def plan_start(*, agent: Agent, goal_text: str, goal: Goal | None, previous: Plan | None, reason: str,
               actor_label: str) -> Plan:
    """Create the new version in status "validating"; refuse a second next version of the same plan."""
    retry = 0
    planned = False
    if previous is not None:
        previous = Plan.objects.select_for_update().get(pk=previous.pk)
        if Plan.objects.filter(previous=previous).exists():
            raise PlanAlreadyReplanned(previous)
        # A version that failed while planning has no steps: trying it again is a retry, not a replan;
        # an answered question is neither (nothing failed).
        planned = previous.steps.exists()
        retry = 0 if planned else previous.planning_retry + (0 if previous.clarification_answer else 1)
    try:
        # Only a next version can collide (`previous` is one-to-one): a first version needs no savepoint.
        with transaction.atomic() if previous is not None else contextlib.nullcontext():
            plan = Plan.objects.create(
                agent=agent, goal=goal, goal_text=goal_text[:500], status=Plan.Status.VALIDATING,
                version=previous.version + 1 if previous else 1, previous=previous,
                times_replanned=previous.times_replanned + (1 if planned else 0) if previous else 0,
                planning_retry=retry,
                # The restatement is the goal's, not the version's: a replan keeps it (and its call).
                **({k: getattr(previous, k) for k in RESTATE_KEYS} if previous is not None else {}),
            )
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
    event_record(plan=plan, kind=PlanEvent.Kind.CREATED, actor_label=actor_label, reason=reason,
                 detail={"version": plan.version, "previous": previous.pk if previous else None})
    return plan


def plan_restatement_save(*, plan: Plan, restatement: Mapping[str, str]) -> None:
    """Keep the fast model's WHO/WHAT/WHEN/WHERE/WHY on the plan; its page's header shows it at once.

    No event of its own: the restatement is part of the planning that the next event (an attempt, the
    plan validated or failed) records."""
    with transaction.atomic():
        Plan.objects.filter(pk=plan.pk).update(**{k: restatement.get(k, "") for k in RESTATE_KEYS})
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
    for step in spec.steps:
        if step.key not in kept_keys and action_needs_permission(step.action_hint) and not step.requires_permission:
            step.requires_permission = True
            step.risk = "risky"
            flags.append(f"step {step.key}: '{step.action_hint}' spends money; requires permission raised to true")


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


@transaction.atomic
def plan_accept(*, plan: Plan, spec: PlanSpec, flags: list[str], model: str, kept: list[PlanStep],
                actor_label: str) -> Plan:
    """Store the validated steps (one INSERT); tool plans wait for the operator, persona plans start at once."""
    plan = plan_locked_validating(plan)
    persona = plan.agent.kind == Agent.Kind.PERSONA
    steps_permission_raise(plan=plan, spec=spec, kept_keys={s.key for s in kept}, flags=flags)
    steps = plan_steps_build(plan=plan, spec=spec, kept=kept)
    PlanStep.objects.bulk_create(steps)  # one INSERT
    plan.status = Plan.Status.ACTIVE if persona else Plan.Status.AWAITING_APPROVAL
    plan.approval_mode = Plan.ApprovalMode.ALL if persona else Plan.ApprovalMode.PENDING
    plan.thinking_summary = spec.thinking_summary[:4000]
    plan.confidence = max(0.0, min(1.0, spec.confidence))
    plan.risks = list(spec.risks)
    plan.model = model
    plan.save(update_fields=["status", "approval_mode", "thinking_summary", "confidence", "risks", "model",
                             "updated_at"])
    detail: dict[str, Any] = {"model": model, "flags": flags, "steps": len(spec.steps)}
    if plan.previous is not None:
        detail["diff"] = plan_diff([s.as_spec() for s in plan.previous.steps.all()], [s.as_spec() for s in steps])
    agent_waiting_set(agent_id=plan.agent_id, reason="" if persona else f"plan v{plan.version} awaits approval")
    event_record(plan=plan, kind=PlanEvent.Kind.VALIDATED, actor_label=actor_label, reason="; ".join(flags)[:4000],
                 detail=detail)
    if not persona:
        from policies.services import policies_plan_waiting  # noqa: PLC0415 (policies decide through the services)

        if policies_plan_waiting(plan=plan) is not None:  # decided at once: the caller sees the plan as it is now
            plan.refresh_from_db(fields=["status", "approval_mode", "replan_reason", "updated_at"])
    return plan


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
def plan_fail(*, plan: Plan, headline: str, actor_label: str, reasons: Sequence[str] = ()) -> Plan:
    """Planning failed: the plan fails with a true headline and every reason; the agent's retry policy tries
    the goal again after a backoff, or the agent waits for an operator (Replan or Cancel)."""
    plan = plan_locked_validating(plan)
    agent = plan.agent
    reasons = [*reasons, *failure_reasons(plan)]
    plan.status = Plan.Status.FAILED
    plan.failure_reason = "\n".join([headline, *reasons])[:20000]
    if plan.planning_retry < agent.plan_retry_limit:
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
                 reason=f"planning failed: {headline}",
                 detail={"reasons": reasons, "retry_at": plan.retry_at.isoformat() if plan.retry_at else None})
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
