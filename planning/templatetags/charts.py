"""`{% line_chart chart chart_id %}`: a chart laid out by planning/charts.py, drawn by its partial
(templates/charts/line_chart.html). A chart shows no buttons, so a live push that renders the page once per
audience (planning/live/renderers.py) draws each chart once: the HTML is kept on the chart for the next render."""

from __future__ import annotations

from django import template
from django.template.loader import render_to_string
from django.utils.safestring import SafeString

from planning.charts import LineChart

register = template.Library()


@register.simple_tag
def line_chart(chart: LineChart, chart_id: str) -> SafeString:
    drawn = chart.drawn.get(chart_id)
    if drawn is None:
        drawn = chart.drawn[chart_id] = render_to_string("charts/line_chart.html", {"chart": chart, "chart_id": chart_id})
    return drawn  # type: ignore[return-value]  # render_to_string's text is the template's, escaped there
