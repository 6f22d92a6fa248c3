"""`{% agent_row row %}`: one dashboard row; `{% needs_mini row.needs %}`: a row's needs, one span each.

A row is built here with `format_html` (every value escaped) rather than by a template: the row template
resolved ~25 variables and ran three filters per row, 50 rows a page, and was 55 % of the dashboard's CPU
(in-process at 1,000 agents: the table's partial 41 ms against 6 ms this way), the larger part of its p90
under the 1,000-agent load (`make bench`, scale_*_dashboard_p90). The HTML is the partial's, unchanged."""

from __future__ import annotations

from collections.abc import Iterable

from django import template
from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString, mark_safe
from django.utils.text import Truncator

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
NO_PLAN = mark_safe('<span class="muted">no plan</span>')  # noqa: S308 - a constant
NO_STEP = mark_safe('<span class="muted">—</span>')  # noqa: S308 - a constant


@register.simple_tag
def needs_mini(needs: Iterable[NeedLevel]) -> SafeString:
    """One escaped span per need ("sleep 42%", its level as a class)."""
    return format_html_join("", '<span class="mini {}">{} {}%</span>', ((n.level, n.name, n.percent) for n in needs))


@register.simple_tag
def agent_row(row: AgentRow) -> SafeString:
    """The agent's row: name and kind, status and what it waits on, the plan it shows, the current step,
    progress, needs and cycles."""
    agent, plan, step = row.agent, row.plan, row.step
    plan_url = plan.get_absolute_url() if plan else ""
    waiting: SafeString | str = ""
    if agent.waiting_reason:
        waiting = (format_html('<div class="waiting">Waiting: <a href="{}">{}</a></div>', plan_url, agent.waiting_reason)
                   if plan else format_html('<div class="waiting">Waiting: {}</div>', agent.waiting_reason))
    plan_cell = format_html(
        '<a href="{}">{}</a>\n      <span class="muted">v{}</span> <span class="badge {}">{}</span>',
        plan_url, Truncator(plan.goal_text).chars(60), plan.version, plan.status, plan.get_status_display(),
    ) if plan else NO_PLAN
    step_cell = format_html('<span class="badge {}">{}</span> {}', step.status, step.get_status_display(),
                            Truncator(step.description).chars(60)) if step else NO_STEP
    return format_html(
        ROW, pk=agent.pk, status=agent.status, agent_url=agent.get_absolute_url(), name=agent.name,
        kind=agent.get_kind_display(), status_label=agent.get_status_display(), waiting=waiting, plan=plan_cell,
        step=step_cell, percent=row.percent, done=row.done, total=row.total, needs=needs_mini(row.needs),
        cycles=agent.cycle_count,
    )
