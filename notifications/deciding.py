"""A decision made from outside the web page (a Slack button, an e-mail's confirmation page), through the same
planning services as the page's buttons: the same events, audit, pushes, policies and budgets."""

from __future__ import annotations

import hashlib
import json
from datetime import UTC

from django.contrib.auth.models import User
from django.db.models import Q

from planner_site.roles import user_can_decide
from planning import services as planning
from planning.models import Plan, PlanEvent, PlanStep

# The decisions that close a message, and what each one says.
STEP_OUTCOMES: dict[str, str] = {PlanEvent.Kind.STEP_APPROVED: "Approved", PlanEvent.Kind.STEP_DECLINED: "Declined",
                 PlanEvent.Kind.STEP_SKIPPED: "Skipped", PlanEvent.Kind.STEP_EDITED: "Edited"}
PLAN_OUTCOMES: dict[str, str] = {PlanEvent.Kind.PLAN_APPROVED: "Approved", PlanEvent.Kind.PLAN_CANCELLED: "Cancelled",
                 PlanEvent.Kind.REPLAN_REQUESTED: "Sent back to be replanned", PlanEvent.Kind.CLARIFIED: "Answered",
                 PlanEvent.Kind.PLAN_EDITED: "Edited"}
CLOSING_KINDS = frozenset(STEP_OUTCOMES) | frozenset(PLAN_OUTCOMES)


def item_fingerprint(plan: Plan, step: PlanStep | None) -> str:
    """What a message (an e-mail, a Slack message) showed: the plan's version and its steps (or the one step) with tools and exact inputs."""
    steps = [step] if step is not None else list(plan.steps.all())
    shown = {"plan": plan.pk, "version": plan.version,
             "steps": [[s.pk, s.key, s.description, s.tool, s.tool_input, s.requires_permission, s.risk]
                       for s in steps]}
    return hashlib.sha256(json.dumps(shown, sort_keys=True, default=str).encode()).hexdigest()[:32]


def item_waiting(kind: str, plan: Plan, step: PlanStep | None) -> bool:
    """Whether the item (kind: step, plan or question) still waits for a person."""
    if kind == "question":
        return plan.status == Plan.Status.CLARIFYING
    if step is not None:
        return step.status == PlanStep.Status.AWAITING_APPROVAL and plan.status == Plan.Status.ACTIVE
    return plan.status == Plan.Status.AWAITING_APPROVAL


def item_decide(*, kind: str, plan: Plan, step: PlanStep | None, user: User, action: str, text: str = "",
                via: str) -> None:
    """Approve, decline (with feedback) or answer; a refusal raises planning's DecisionError, whose message says
    why and that nothing was changed. A plan approved from outside is approved with all its steps (the message
    showed every step with its exact input); declined, it goes back to the agent with the feedback."""
    if not user_can_decide(user):
        raise planning.DecisionError(f"Your account {user.get_username()} may only view; it cannot decide. "
                                     "Nothing was changed.")
    detail = {"via": via}
    if kind == "question":
        planning.plan_clarify(plan=plan, user=user, answer=text)
    elif step is not None and action == "approve":
        planning.step_approve(step=step, user=user, detail=detail)
    elif step is not None:
        planning.step_decline(step=step, user=user, feedback=text, detail=detail)
    else:
        plan.refresh_from_db(fields=["status"])
        if plan.status != Plan.Status.AWAITING_APPROVAL:
            raise planning.PlanNotAwaitingApproval(plan)
        if action == "approve":
            planning.plan_approve(plan=plan, user=user, mode=Plan.ApprovalMode.ALL, detail=detail)
        else:
            if not text.strip():
                raise planning.DecisionError("Feedback is required to decline. Nothing was changed.")
            planning.plan_replan_request(plan=plan, user=user, reason=text, detail=detail, once=True)


def item_outcome(kind: str, plan_id: int, step_id: int | None) -> str:
    """Who decided an item and when ("Approved by nadia at 07:02 UTC, 7 Dec 2026."), or "" while it waits."""
    plan = Plan.objects.select_related("agent").get(pk=plan_id)
    step = PlanStep.objects.filter(pk=step_id).first() if step_id else None
    if item_waiting(kind, plan, step):
        return ""
    events = PlanEvent.objects.filter(plan_id=plan_id).select_related("actor")
    if step is not None:
        events = events.filter(Q(step_id=step.pk, kind__in=list(STEP_OUTCOMES))
                               | Q(kind__in=[PlanEvent.Kind.PLAN_CANCELLED, PlanEvent.Kind.REPLAN_REQUESTED]))
    else:
        events = events.filter(kind__in=list(PLAN_OUTCOMES))
    event = events.order_by("-pk").first()
    if event is None:
        what = step.get_status_display().lower() if step else plan.get_status_display().lower()
        return f"No longer waiting: it is {what}."
    return event_outcome(event, step_message=step is not None)


def event_outcome(event: PlanEvent, *, step_message: bool) -> str:
    verb = (STEP_OUTCOMES.get(event.kind) if step_message and event.step_id else None) \
        or PLAN_OUTCOMES.get(event.kind) or STEP_OUTCOMES.get(event.kind, "Decided")
    if step_message and event.kind == PlanEvent.Kind.PLAN_CANCELLED:
        verb = "Plan cancelled"
    who = event.actor_label or (event.actor.get_username() if event.actor else "the system")
    at = event.created_at.astimezone(UTC).strftime("%H:%M UTC, %-d %b %Y")
    via = {"slack": " in Slack", "email": " from an e-mail"}.get((event.detail or {}).get("via", ""), "")
    return f"{verb} by {who}{via} at {at}."
