"""`{% step_row step %}`: a plan's step row, rendered from its template's partial (the same partial the live
pushes render)."""

from __future__ import annotations

from django import template
from django.template.loader import get_template
from django.utils.safestring import SafeString, mark_safe

from agents.persona import MAX_OVERRIDES
from planning.models import PlanStep
from planning.selectors import step_rollback_possible

register = template.Library()


@register.simple_tag(takes_context=True)
def step_row(context: template.Context, step: PlanStep) -> SafeString:
    plan = context.get("plan")
    can_decide = bool(context.get("can_decide"))
    rollback = can_decide and plan is not None and step_rollback_possible(step, agent_id=plan.agent_id)
    # The policy's approval an operator may undo (planning.selectors.policy_approvals_undoable), if any.
    policy_undo = (context.get("policy_undo") or {}).get(step.pk) if can_decide else None
    html = get_template("planning/plan_detail.html#step").render(
        {"step": step, "plan": plan, "can_decide": can_decide, "rollback": rollback, "policy_undo": policy_undo})
    return mark_safe(html)  # noqa: S308 (rendered by a template, autoescaped there)


@register.simple_tag
def overrides_limit() -> int:
    """Seed 000: this many overrides of a persona's step in a row replan its plan."""
    return MAX_OVERRIDES
