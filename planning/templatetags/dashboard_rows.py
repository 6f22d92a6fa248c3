"""`{% agent_row row %}`: one dashboard row; `{% needs_mini row.needs %}`: a row's needs, one span each.

A row is built here (every value escaped) rather than by a template: the row template resolved ~25 variables
and ran three filters per row, 50 rows a page, and was more than half of the dashboard's CPU, the larger part
of its p90 under the 1,000-agent load (`make bench`, scale_*_dashboard_p90). The HTML is the template's."""

from __future__ import annotations

from collections.abc import Iterable
from html import escape as e

from django import template
from django.urls import get_script_prefix, get_urlconf, reverse
from django.utils.safestring import SafeString, mark_safe
from django.utils.text import Truncator

from agents.models import Agent
from planning.models import Plan, PlanStep
from planning.selectors import AgentRow, NeedLevel

register = template.Library()

ROW = """
<tr id="agent-row-{pk}" class="agent-row status-{status}">
  <td><a href="{agent_url}">{name}</a> <span class="tag">{kind}</span></td>
  <td><span class="badge {status}">{status_label}</span>
      {waiting}</td>
  <td>{plan}</td>
  <td class="step-cell">{step}</td>
  <td><div class="bar" role="progressbar" aria-valuenow="{percent}" aria-valuemin="0" aria-valuemax="100"><span style="width: {percent}%"></span></div>
      <span class="muted small nowrap">{done}/{total} steps</span></td>
  <td class="needs-mini">{needs}</td>
  <td>{cycles}</td>
</tr>
"""
NO_PLAN = '<span class="muted">no plan</span>'
NO_STEP = '<span class="muted">—</span>'
AGENT_STATUS, AGENT_KIND = dict(Agent.Status.choices), dict(Agent.Kind.choices)
PLAN_STATUS, STEP_STATUS = dict(Plan.Status.choices), dict(PlanStep.Status.choices)
TRUNCATE = 60  # characters of a goal or step shown in a row, as the template's truncatechars:60


PK_MARK = 987654321  # stands for a row's pk in a route reversed once (url_for)
_routes: dict[tuple[str, str, str | None], tuple[str, str, str]] = {}


def url_for(name: str, pk: int) -> str:
    """reverse(name, args=[pk]), the URL the model's get_absolute_url gives, with the route reversed once for
    each script prefix and URLconf (all that reverse's answer depends on): the 75 reverses of a page of 50 rows,
    ~20 us each, were ~1.5 ms of its CPU (`make bench`, dashboard_1000: 1.50x its bare template). The pk takes
    the mark's place (its last occurrence)."""
    key = (name, get_script_prefix(), get_urlconf())
    if key not in _routes:
        _routes[key] = reverse(name, args=[PK_MARK]).rpartition(str(PK_MARK))
    head, _, tail = _routes[key]
    return f"{head}{int(pk)}{tail}"


def short(text: str, length: int = TRUNCATE) -> str:
    """truncatechars:60, or `length` (a text this short is itself: most are)."""
    return text if len(text) <= length else Truncator(text).chars(length)


def label(choices: dict[str, str], value: str) -> str:
    """A choice's label, as get_FOO_display gives it (the value itself when it is no choice)."""
    return choices.get(value, value)


@register.simple_tag
def needs_mini(needs: Iterable[NeedLevel]) -> SafeString:
    """One escaped span per need ("sleep 42%", its level as a class)."""
    return mark_safe("".join(  # noqa: S308 - each value escaped
        f'<span class="mini {e(n.level)}">{e(n.name)} {n.percent}%</span>' for n in needs))


@register.simple_tag
def agent_row(row: AgentRow) -> SafeString:
    """The agent's row: name and kind, status and what it waits on, the plan it shows, the current step,
    progress, needs and cycles. Every value from the database is escaped (`e`, the escaping Django's own
    `escape` does, without its lazy-string wrapper: called ~25 times a row)."""
    agent, plan, step = row.agent, row.plan, row.step
    plan_url = e(url_for("plan-detail", plan.pk)) if plan else ""
    waiting = ""
    if agent.waiting_reason:
        reason = e(agent.waiting_reason)
        waiting = (f'<div class="waiting">Waiting: <a href="{plan_url}">{reason}</a></div>' if plan
                   else f'<div class="waiting">Waiting: {reason}</div>')
    plan_cell = (f'<a href="{plan_url}">{e(short(plan.goal_text))}</a>\n      <span class="muted">v{plan.version}</span> '
                 f'<span class="badge {e(plan.status)}">{e(label(PLAN_STATUS, plan.status))}</span>') if plan else NO_PLAN
    step_cell = (f'<span class="badge {e(step.status)}">{e(label(STEP_STATUS, step.status))}</span> '
                 f'{e(short(step.description))}') if step else NO_STEP
    return mark_safe(ROW.format(  # noqa: S308 - each value escaped
        pk=int(agent.pk), status=e(agent.status), agent_url=e(url_for("agent-detail", agent.pk)), name=e(agent.name),
        kind=e(label(AGENT_KIND, agent.kind)), status_label=e(label(AGENT_STATUS, agent.status)), waiting=waiting,
        plan=plan_cell, step=step_cell, percent=int(row.percent), done=int(row.done), total=int(row.total),
        needs=needs_mini(row.needs), cycles=int(agent.cycle_count),
    ))
