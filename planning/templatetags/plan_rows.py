"""`{% step_row step %}`, `{% agent_row row %}`: rows rendered once per state of what they show, kept in memory.

A plan of 1,000 steps re-renders only the rows that changed since the last time this process drew them.
The key: the step's `updated_at` (every save through the services moves it) and the columns a bulk
`update()` may change without it, whether the viewer may decide, and the plan's status (which decides
the buttons). Bounded: least recently used first out.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from typing import Any

from django import template
from django.template.loader import get_template
from django.utils.safestring import SafeString, mark_safe

from agents.persona import MAX_OVERRIDES
from planner_site.kept import Kept
from planning.models import PlanStep
from planning.selectors import step_rollback_possible

register = template.Library()

ROWS_KEPT = 5000


class Drawn(Kept[str]):
    """Rendered HTML by a key of everything it shows (see planner_site/kept.py)."""

    def get(self, key: Hashable, draw: Callable[[], str]) -> SafeString:  # type: ignore[override]
        return mark_safe(super().get(key, draw))  # noqa: S308 (drawn by a template, autoescaped there)


_rows = Drawn(ROWS_KEPT)


def row_key(step: PlanStep, can_decide: bool, plan_status: str, rollback: bool = False) -> tuple[Any, ...]:
    return (step.pk, step.updated_at, step.status, step.actual_cycles, step.retries, step.overrides,
            step.approved_by_id, step.description, can_decide, plan_status, rollback)


@register.simple_tag(takes_context=True)
def step_row(context: template.Context, step: PlanStep) -> SafeString:
    plan = context.get("plan")
    can_decide = bool(context.get("can_decide"))
    rollback = can_decide and plan is not None and step_rollback_possible(step, agent_id=plan.agent_id)
    # Drawn from the key's values only, so the kept row depends on nothing else on the page.
    return _rows.get(row_key(step, can_decide, getattr(plan, "status", ""), rollback),
                     lambda: get_template("planning/plan_detail.html#step").render(
                         {"step": step, "plan": plan, "can_decide": can_decide, "rollback": rollback}))


@register.simple_tag
def overrides_limit() -> int:
    """Seed 000: this many overrides of a persona's step in a row replan its plan."""
    return MAX_OVERRIDES


def agent_row_key(row: Any) -> tuple[Any, ...]:
    """Everything a dashboard row shows."""
    agent, plan, step = row.agent, row.plan, row.step
    return (
        "agent", agent.pk, agent.name, agent.kind, agent.status, agent.waiting_reason, agent.cycle_count,
        (plan.pk, plan.goal_text, plan.version, plan.status) if plan else None,
        (step.status, step.description) if step else None,
        row.done, row.total, tuple((n.name, n.satisfaction) for n in row.needs),
    )


@register.simple_tag
def agent_row(row: Any) -> SafeString:
    """A dashboard row, rendered once per state of the agent (see step_row)."""
    return _rows.get(agent_row_key(row), lambda: get_template("planning/dashboard.html#row").render({"row": row}))
