"""`{% step_row step %}`: a plan's step row, the one HTML of a step on the plan page and in its live pushes
(`step_row_html`, which planning/live/renderers.py calls for the rows it pushes). The row is the template
templates/planning/step_row.html; what it shows beyond the step's own fields is worked out here."""

from __future__ import annotations

from typing import Any

from django import template
from django.template.loader import render_to_string
from django.utils import timezone
from django.utils.safestring import SafeString

from agents.persona import MAX_OVERRIDES
from planning.models import Plan, PlanStep, steps_shown_fingerprint
from planning.selectors import step_rollback_possible

register = template.Library()

ASKING = (PlanStep.Status.PENDING, PlanStep.Status.AWAITING_APPROVAL)


def step_row_context(step: PlanStep, *, plan: Plan | None, can_decide: bool, rollback: bool,
                     policy_undo: int | None = None) -> dict[str, Any]:
    """What the row shows: its key, status and words, the tags that warn, what it does and its counters, its result
    or failure, and the forms of an operator (`can_decide`) when its plan is active. `rollback`: whether "Roll
    back" has something to undo (step_rollback_possible); `policy_undo`: the event of a policy's approval an
    operator may undo."""
    awaiting = step.status == PlanStep.Status.AWAITING_APPROVAL
    decide = can_decide and plan is not None and plan.status == Plan.Status.ACTIVE
    tools = step.tools_needed or []
    return {
        "step": step, "can_decide": can_decide, "rollback": rollback, "policy_undo": policy_undo,
        "max_overrides": MAX_OVERRIDES, "risky": step.risk == PlanStep.Risk.RISKY, "awaiting": awaiting,
        "asking": step.status in ASKING, "decide": decide,
        "loop": step.loop if isinstance(step.loop, dict) else {},
        "tools_shown": len(tools) > 1 or bool(tools and not step.tool),
        "held": (step.start_after is not None and step.status == PlanStep.Status.PENDING
                 and step.start_after > timezone.now()),
        "seen_steps": steps_shown_fingerprint([step]) if decide and awaiting else "",
    }


def step_row_html(step: PlanStep, *, plan: Plan | None, can_decide: bool, rollback: bool,
                  policy_undo: int | None = None) -> SafeString:
    """The step's row (step_row_context says what it shows), rendered by its template."""
    return render_to_string("planning/step_row.html", step_row_context(
        step, plan=plan, can_decide=can_decide, rollback=rollback, policy_undo=policy_undo))


@register.filter
def shown_fingerprint(steps: list[PlanStep]) -> str:
    """`{{ steps|shown_fingerprint }}`: the fingerprint an approve form carries (planning/engine/shown.py)."""
    return steps_shown_fingerprint(steps)


@register.inclusion_tag("planning/step_row.html", takes_context=True)
def step_row(context: template.Context, step: PlanStep) -> dict[str, Any]:
    """The page's row of a step: whether it may be rolled back, and the policy's approval an operator may undo
    (planning.selectors.policy_approvals_undoable), from the page's context."""
    plan = context.get("plan")
    can_decide = bool(context.get("can_decide"))
    rollback = can_decide and plan is not None and step_rollback_possible(step, agent_id=plan.agent_id)
    policy_undo = (context.get("policy_undo") or {}).get(step.pk) if can_decide else None
    return step_row_context(step, plan=plan, can_decide=can_decide, rollback=rollback, policy_undo=policy_undo)
