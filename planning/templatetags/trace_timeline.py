"""The plan page's span timeline (planning/trace_spans.py): where the lineage's time went, drawn server-side."""

from __future__ import annotations

from html import escape
from typing import Any

from django import template
from django.utils.safestring import SafeString, mark_safe

from planning.trace_spans import Bar, plan_timeline

register = template.Library()

TIMELINE_MAX_BARS = 150
ROW, LABEL_W, BAR_W = 20, 330, 520
KIND_CLASS = {"agent": "t-agent", "plan": "t-plan", "chat": "t-chat", "wait": "t-wait", "tool": "t-tool"}


def duration(seconds: float) -> str:
    if seconds < 1:
        return f"{seconds * 1000:.0f} ms"
    if seconds < 120:
        return f"{seconds:.1f} s"
    if seconds < 7200:
        return f"{seconds / 60:.1f} min"
    return f"{seconds / 3600:.1f} h"


def timeline_svg(bars: list[Bar]) -> str:
    """The bars as one SVG (attributes only, no inline style); every text escaped."""
    h = ROW * len(bars) + 4
    w = LABEL_W + BAR_W + 170
    parts = [f'<svg class="spans" role="img" aria-label="The plan\'s spans over time" width="{w}" height="{h}" '
             f'viewBox="0 0 {w} {h}">']
    for i, bar in enumerate(bars):
        y = i * ROW + 2
        cls = KIND_CLASS.get(bar.kind, "t-agent") + (" t-open" if bar.open else "") + (" t-error" if bar.error else "")
        x = LABEL_W + bar.left / 100 * BAR_W
        width = max(bar.width / 100 * BAR_W, 2)
        said = f"{duration(bar.seconds)}{' so far' if bar.open else ''} · {bar.detail}"
        parts.append(
            f'<g class="{cls}"><title>{escape(bar.label)}: {escape(said)}</title>'
            f'<text x="{4 + bar.depth * 12}" y="{y + 13}">{escape(bar.label[:48])}</text>'
            f'<rect x="{x:.1f}" y="{y + 3}" width="{width:.1f}" height="{ROW - 6}"/>'
            f'<text class="t-said" x="{LABEL_W + BAR_W + 6}" y="{y + 13}">{escape(said[:40])}</text></g>')
    parts.append("</svg>")
    return "".join(parts)


@register.simple_tag
def plan_spans(plan: Any) -> SafeString:
    """The section: the lineage's spans as bars, its total, and the link to the trace (TRACE_URL_TEMPLATE)."""
    data = plan_timeline(plan)
    bars = data["bars"]
    parts = ['<section id="plan-spans" class="card steer" aria-labelledby="plan-spans-heading">'
             '<h2 id="plan-spans-heading">Where the time went</h2>']
    if data["trace_url"]:
        parts.append(f'<p class="small">Trace <a id="plan-trace-link" href="{escape(data["trace_url"])}" '
                     f'rel="noopener">{escape(data["trace_id"])}</a></p>')
    elif data["trace_id"]:
        parts.append(f'<p class="small muted">Trace id <code id="plan-trace-id">{escape(data["trace_id"])}</code></p>')
    if len(bars) <= 1:
        parts.append('<p class="empty">Nothing recorded yet.</p>')
    else:
        parts.append(f'<p class="small muted">All versions of this plan, {duration(data["seconds"])} from the first '
                     'version: planning, model calls, waits for a person and steps.</p>')
        shown = bars[:TIMELINE_MAX_BARS]
        parts.append(f'<div class="table-wrap">{timeline_svg(shown)}</div>')
        if len(bars) > len(shown):
            parts.append(f'<p class="small muted">The first {len(shown)} of {len(bars)} spans are drawn.</p>')
    parts.append("</section>")
    return mark_safe("".join(parts))  # noqa: S308 (every text above is escaped)
