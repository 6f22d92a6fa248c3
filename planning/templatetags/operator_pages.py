"""Template helpers of the steering pages: the inbox count in every page's navigation, waiting times."""

from __future__ import annotations

import json
from collections.abc import Sequence
from html import escape as e
from typing import Any

from django import template
from django.utils.safestring import SafeString, mark_safe

from planning.engine.diff import field_changes_shown
from planning.operator_selectors import PlanGraph, plan_graph
from planning.operator_selectors import inbox_count as inbox_count_query
from planning.templatetags.dashboard_rows import STEP_STATUS, label, short

register = template.Library()


@register.simple_tag(takes_context=True)
def inbox_count(context: template.Context) -> int:
    """How many things wait for a person; one query, only on pages that show the navigation, none on a page
    that counted them already (the dashboard's `counts.inbox`: one query fewer for the page under load)."""
    counts = context.get("counts")
    if isinstance(counts, dict) and "inbox" in counts:
        return int(counts["inbox"])
    return inbox_count_query()


@register.filter
def waited(seconds: int) -> str:
    """A waiting time as people say it: "40 s", "12 min", "3 h 5 min", "2 d 4 h"."""
    seconds = int(seconds)
    if seconds < 60:
        return f"{seconds} s"
    minutes = seconds // 60
    if minutes < 60:
        return f"{minutes} min"
    hours, minutes = divmod(minutes, 60)
    if hours < 24:
        return f"{hours} h {minutes} min" if minutes else f"{hours} h"
    days, hours = divmod(hours, 24)
    return f"{days} d {hours} h" if hours else f"{days} d"


# What the graph shows of each step, in order: its layout follows the steps' order and dependencies.
GRAPH_FIELDS = ("key", "status", "description", "depends_on", "requires_permission")


@register.simple_tag
def plan_graph_svg(plan: Any, steps: Sequence[Any], oob: bool = False) -> SafeString:
    """The plan's steps and dependencies as an SVG graph laid out by depth (from the page's steps: no query)."""
    return graph_svg(plan_graph(list(steps)), oob=oob)


GRAPH_DEFS = (
    '<defs><marker id="arrow" viewBox="0 0 10 10" refX="10" refY="5" markerWidth="7" markerHeight="7" '
    'orient="auto-start-reverse"><path d="M 0 0 L 10 5 L 0 10 z" fill="#94a3b8"/></marker></defs>')


def graph_svg(graph: PlanGraph, *, oob: bool) -> SafeString:
    """The graph's section, built in Python rather than by a template: its per-node loop was most of a live
    push's render, on every status change. Every text from a step (key, status,
    description) is escaped; the rest are numbers and constants."""
    parts = [f'<section id="plan-graph" class="card steer"{' hx-swap-oob="true"' if oob else ""} '
             'aria-labelledby="plan-graph-heading"><h2 id="plan-graph-heading">Graph</h2>']
    if not graph.nodes:
        parts.append('<p class="empty">The plan has no steps to draw yet.</p>')
    else:
        w, h = graph.width, graph.height
        parts.append(f'<div class="table-wrap"><svg class="graph" role="img" aria-label="Steps and their '
                     f'dependencies, laid out by depth" width="{w}" height="{h}" viewBox="0 0 {w} {h}">{GRAPH_DEFS}')
        parts += [f'<path class="edge" d="M {g.x1} {g.y1} C {g.x1 + 30} {g.y1}, {g.x2 - 30} {g.y2}, {g.x2} {g.y2}"/>'
                  for g in graph.edges]
        # html.escape (what Django's escape does, without its lazy-string wrapper) and a truncation only of
        # the texts that need one: five calls a node, and a long plan's page draws a node for each of its steps.
        for n in graph.nodes:
            description = n.step.description
            key, status, text = e(n.step.key), e(n.step.status), e(description)
            status_label = e(label(STEP_STATUS, n.step.status))
            brief = e(short(description, 22))
            permission = " · permission" if n.step.requires_permission else ""
            parts.append(
                f'\n<a href="#step-{key}" class="n-{status}" aria-label="Step {key}: {text} ({status_label})">'
                f'<title>{key}. {text} — {status_label}</title>'
                f'<rect x="{n.x}" y="{n.y}" width="{graph.node_width}" height="{graph.node_height}" rx="6"/>'
                f'<text x="{n.x + 8}" y="{n.y + 16}"><tspan font-weight="700">{key}</tspan> {brief}</text>'
                f'<text x="{n.x + 8}" y="{n.y + 32}" class="small">{status_label}{permission}</text></a>')
        parts.append("</svg></div>")
    parts.append("</section>")
    return mark_safe("".join(parts))  # noqa: S308  # built above: every step's text escaped


@register.filter
def as_json(value: Any) -> str:
    """Objects and lists as the JSON the planner writes; text as it is."""
    if isinstance(value, dict | list):
        return json.dumps(value, ensure_ascii=False)
    return "" if value is None else str(value)


@register.filter
def field_changes(fields: Any) -> list[tuple[str, str, str]]:
    """A changed step's fields as (label, before, after), in words (see planning/engine/diff.py)."""
    return field_changes_shown(fields) if isinstance(fields, dict) else []


def answer_value_readable(value: Any) -> str:
    """A model's JSON answer as words: a goal by its description (and horizon), a list joined, a mapping as
    "key: value" pairs."""
    if isinstance(value, dict):
        if isinstance(value.get("description"), str):
            horizon = value.get("horizon")
            return value["description"] + (f" ({horizon})" if isinstance(horizon, str) and horizon else "")
        return "; ".join(f"{key}: {answer_value_readable(item)}" for key, item in value.items())
    if isinstance(value, list):
        return ", ".join(answer_value_readable(item) for item in value) or "none"
    if isinstance(value, bool):
        return "yes" if value else "no"
    return str(value)


@register.filter
def answer_readable(text: str) -> str:
    """A model's answer as the persona page shows it: its JSON read out in words, never the raw
    `<json>{...}</json>`; an answer with no JSON in it as it is."""
    from agents.llm.extract import ExtractError, json_extract

    try:
        value = json_extract(str(text)).value
    except (ExtractError, ValueError):
        return str(text)
    return answer_value_readable(value)
