"""The rows drawn by the thousand, one HTML each for a page and its live pushes:

- `{% step_rows steps %}`: a plan's step rows (`step_rows_html`, which planning/live/renderers.py calls for the
  rows it pushes), templates/jinja2/planning/step_rows.html;
- `{% agent_rows rows %}`: the dashboard's agent rows, templates/jinja2/planning/agent_rows.html.

They are Jinja2 templates (docs/architecture.md "Templates" says why)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from django import template
from django.template import engines
from django.utils import timezone
from django.utils.safestring import SafeString

from agents.models import Agent
from agents.persona import MAX_OVERRIDES
from planning.models import Plan, PlanStep, steps_shown_fingerprint
from planning.selectors import AgentRow, step_rollback_possible

register = template.Library()

ASKING = (PlanStep.Status.PENDING, PlanStep.Status.AWAITING_APPROVAL)
# What get_FOO_display shows (a value not among the choices as it is), read once, not once a row.
STATUS_LABELS = dict(PlanStep.Status.choices)
AGENT_LABELS = {"kinds": dict(Agent.Kind.choices), "agent_statuses": dict(Agent.Status.choices),
                "plan_statuses": dict(Plan.Status.choices), "step_statuses": STATUS_LABELS}


def step_rows_html(steps: Sequence[PlanStep], *, plan: Plan | None, can_decide: bool, rollback: Iterable[int] = (),
                   policy_undo: Mapping[int, int] | None = None) -> SafeString:
    """The steps' rows. `can_decide`: the reader is an operator (the forms show while the plan is active);
    `rollback`: the pks of the steps "Roll back" can undo (step_rollback_possible); `policy_undo`: step pk → the
    event of a policy's approval an operator may undo (planning.selectors.policy_approvals_undoable)."""
    return rows_html("planning/step_rows.html", {
        "steps": steps, "plan": plan, "can_decide": can_decide, "rollback": set(rollback) if can_decide else set(),
        "policy_undo": (policy_undo or {}) if can_decide else {}, "now": timezone.now(),
        "max_overrides": MAX_OVERRIDES, "asking": ASKING, "shown_fingerprint": steps_shown_fingerprint,
        "Status": PlanStep.Status, "PlanStatus": Plan.Status, "Risk": PlanStep.Risk, "labels": STATUS_LABELS,
    })


def rows_html(name: str, context: dict[str, object]) -> SafeString:
    """The Jinja2 template `name` (templates/jinja2/) rendered: HTML whose every value the template escaped
    (planner_site/jinja_env.py `escaped`)."""
    return SafeString(engines["jinja2"].get_template(name).render(context))


def steps_rollback_possible(steps: Iterable[PlanStep], *, agent_id: int) -> set[int]:
    """The pks of the steps whose "Roll back" has something to undo."""
    return {s.pk for s in steps if step_rollback_possible(s, agent_id=agent_id)}


@register.filter
def shown_fingerprint(steps: list[PlanStep]) -> str:
    """`{{ steps|shown_fingerprint }}`: the fingerprint an approve form carries (planning/engine/shown.py)."""
    return steps_shown_fingerprint(steps)


@register.simple_tag(takes_context=True)
def step_rows(context: template.Context, steps: Sequence[PlanStep]) -> SafeString:
    """The page's rows of its steps: which may be rolled back, and the policy approvals an operator may undo
    (planning.selectors.policy_approvals_undoable), from the page's context."""
    plan = context.get("plan")
    can_decide = bool(context.get("can_decide"))
    rollback = steps_rollback_possible(steps, agent_id=plan.agent_id) if can_decide and plan is not None else set()
    return step_rows_html(steps, plan=plan, can_decide=can_decide, rollback=rollback,
                          policy_undo=context.get("policy_undo"))


@register.simple_tag
def agent_rows(rows: Sequence[AgentRow]) -> SafeString:
    """The dashboard's rows of its agents (planning.selectors.dashboard_rows)."""
    return rows_html("planning/agent_rows.html", {"rows": rows, **AGENT_LABELS})
