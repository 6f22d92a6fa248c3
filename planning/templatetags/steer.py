"""Template helpers of the steering pages: the inbox count in every page's navigation, waiting times."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from django import template
from django.template.loader import get_template
from django.utils.safestring import SafeString

from planning.steer_selectors import inbox_count as inbox_count_query
from planning.steer_selectors import plan_graph
from planning.templatetags.plan_rows import Drawn

register = template.Library()


@register.simple_tag
def inbox_count() -> int:
    """How many things wait for a person; one query, only on pages that show the navigation."""
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


GRAPHS_KEPT = 64
_graphs = Drawn(GRAPHS_KEPT)


# What the graph shows of each step, in order: its layout follows the steps' order and dependencies.
GRAPH_FIELDS = ("key", "status", "description", "depends_on", "requires_permission")


def graph_key(steps: Sequence[Any], oob: bool) -> tuple[Any, ...]:
    """Everything the graph shows (lists as their repr, so the key can be hashed)."""
    return (oob, *(tuple(repr(v) if isinstance(v, list) else v for v in (getattr(s, f) for f in GRAPH_FIELDS))
                   for s in steps))


@register.simple_tag
def plan_graph_svg(plan: Any, steps: Sequence[Any], oob: bool = False) -> SafeString:
    """The plan's steps and dependencies as an SVG graph laid out by depth (from the page's steps: no query).

    Drawn once per state of the steps: a plan of 1,000 steps makes a graph of 1,000 nodes, the page's
    largest part, which most views show unchanged.
    """
    steps = list(steps)
    return _graphs.get(graph_key(steps, oob), lambda: get_template("planning/plan_graph.html").render(
        {"plan": plan, "graph": plan_graph(steps), "oob": oob}))


@register.filter
def as_json(value: Any) -> str:
    """Objects and lists as the JSON the planner writes; text as it is."""
    if isinstance(value, dict | list):
        return json.dumps(value, ensure_ascii=False)
    return "" if value is None else str(value)
