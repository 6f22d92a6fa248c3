"""The chart geometry (planning/charts.py): pure, values in and coordinates out."""

from __future__ import annotations

from typing import Any

from django.template.loader import render_to_string

from planning.charts import (
    Sample,
    Series,
    Threshold,
    bar_strip,
    downsample_indices,
    labels_spread,
    line_chart,
    line_chart_kept,
    sparkline,
)

GOAL_SERIES = [Series(name="progress", key="progress"), Series(name="confidence", key="confidence")]


def samples(values: list[tuple[float, float]], *, hours: float = 1.0) -> list[Sample]:
    return [Sample(hours=i * hours, clock=f"10:{i % 60:02d}:00", values=v) for i, v in enumerate(values)]


def test_downsample_keeps_everything_that_fits() -> None:
    assert downsample_indices([[0.1, 0.2, 0.3]], limit=100) == [0, 1, 2]
    assert downsample_indices([], limit=100) == []


def test_downsample_keeps_first_last_and_extremes_within_the_limit() -> None:
    values: list[float | None] = [0.5 + 0.001 * (i % 7) for i in range(5000)]
    values[1234], values[4321], values[77] = 0.02, 0.99, None  # a dip to abandonment, a spike, a gap
    kept = downsample_indices([values], limit=100)
    assert len(kept) <= 100 and kept == sorted(kept)
    assert kept[0] == 0 and kept[-1] == 4999
    assert 1234 in kept and 4321 in kept and 77 not in kept


def test_downsample_keeps_each_series_extremes() -> None:
    progress: list[float | None] = [i / 1000 for i in range(1000)]
    confidence: list[float | None] = [1 - i / 2000 for i in range(1000)]
    confidence[500] = 0.01
    kept = downsample_indices([progress, confidence], limit=100)
    assert len(kept) <= 100 and {0, 999, 500} <= set(kept)


def test_thresholds_are_drawn_at_their_height_with_their_label() -> None:
    chart = line_chart(title="t", samples=samples([(0.2, 0.9), (0.4, 0.5)]), series=GOAL_SERIES,
                       thresholds=[Threshold(label="abandoned below 10% confidence", value=0.1, key="abandon"),
                                   Threshold(label="milestone check at 85% progress", value=0.85, key="milestone")])
    height = chart.bottom - chart.top
    abandon, milestone = chart.rules
    assert abandon.y == round(chart.bottom - 0.1 * height, 1) and milestone.y == round(chart.bottom - 0.85 * height, 1)
    assert abandon.label == "abandoned below 10% confidence"
    assert [g.label for g in chart.grid] == ["0%", "25%", "50%", "75%", "100%"]
    assert chart.grid[0].y == chart.bottom and chart.grid[-1].y == chart.top


def test_curves_are_labelled_at_their_end_by_name_and_value() -> None:
    chart = line_chart(title="t", samples=samples([(0.2, 0.9), (0.4, 0.5), (0.42, 0.47)]), series=GOAL_SERIES)
    assert [c.label for c in chart.curves] == ["progress 42%", "confidence 47%"]
    progress, confidence = chart.curves
    assert progress.end_x == chart.right and confidence.end_x == chart.right
    assert abs(progress.label_y - confidence.label_y) >= 12  # close values: labels pushed apart, both readable
    assert chart.desc.startswith("t. Now: progress 42%; confidence 47%.")


def test_time_runs_left_to_right_with_simulated_hours_and_clock_ticks() -> None:
    chart = line_chart(title="t", samples=samples([(0.1, 0.9)] * 25), series=GOAL_SERIES)  # 24 simulated hours
    assert chart.ticks[-1].hours == "latest" and chart.ticks[-1].x == chart.right
    assert [t.hours for t in chart.ticks] == ["-24 h", "-12 h", "latest"]  # ticks 140 units apart in 280
    assert chart.ticks[0].x == chart.left and chart.ticks[0].clock == "10:00:00" and chart.ticks[-1].clock == "10:24:00"


def test_tick_labels_never_overlap_in_a_narrow_chart() -> None:
    chart = line_chart(title="t", samples=samples([(0.1, 0.9)] * 4), series=GOAL_SERIES, width=360)  # 3 h, 220 px
    assert chart.ticks[-1].hours == "latest" and len(chart.ticks) < 4
    edges = [(t.x - {"start": 0, "end": 50}.get(t.anchor, 25)) for t in chart.ticks]
    assert all(b - a >= 54 for a, b in zip(edges, edges[1:], strict=False))


def test_every_sample_has_its_values_on_hover_and_some_on_keyboard_focus() -> None:
    chart = line_chart(title="t", samples=samples([(i / 300, 1 - i / 300) for i in range(300)]), series=GOAL_SERIES)
    assert len(chart.hits) == chart.shown <= 100 and chart.total == 300
    assert chart.hits[-1].title == "progress 100%, confidence 0% (latest, 10:59:00)"
    assert chart.hits[0].focusable and chart.hits[-1].focusable and sum(h.focusable for h in chart.hits) == 12
    assert len(chart.rows) == chart.shown and chart.rows[-1].values == ["100%", "0%"]


def test_the_whole_history_is_spread_over_the_width() -> None:
    chart = line_chart(title="t", samples=samples([(0.0, 1.0)] * 1000), series=GOAL_SERIES)
    xs = [float(p.split(",")[0]) for p in chart.curves[0].points.split()]
    assert xs[0] == chart.left and xs[-1] == chart.right and len(xs) <= 100


def test_a_single_sample_is_drawn_at_the_latest_end() -> None:
    chart = line_chart(title="t", samples=samples([(0.3, 0.6)]), series=GOAL_SERIES)
    assert chart.curves[0].points == f"{chart.right},{round(chart.bottom - 0.3 * (chart.bottom - chart.top), 1)}"


def test_labels_spread_keeps_order_gap_and_box() -> None:
    assert labels_spread([50.0, 50.0, 51.0], top=0, bottom=100) == [50.0, 62.0, 74.0]
    ys = labels_spread([99.0, 99.0, 99.0], top=0, bottom=100)
    assert max(ys) <= 100 and sorted(ys) == ys and min(b - a for a, b in zip(ys, ys[1:], strict=False)) >= 12


def test_chart_partial_escapes_labels_and_offers_a_data_table() -> None:
    hostile = '<script>alert("x")</script>'
    chart = line_chart(title=f"Progress of {hostile}", samples=samples([(0.2, 0.9), (0.3, 0.8)]),
                       series=[Series(name=hostile, key="progress"), Series(name="confidence", key="confidence")],
                       thresholds=[Threshold(label=hostile, value=0.1, key="abandon")])
    html = render_to_string("charts/line_chart.html", {"chart": chart, "chart_id": "c1"})
    assert "<script>" not in html and "&lt;script&gt;" in html
    assert '<title id="c1-title">Progress of &lt;script&gt;' in html and '<desc id="c1-desc">' in html
    assert 'tabindex="0"><title>&lt;script&gt;alert(&quot;x&quot;)&lt;/script&gt; 30%, confidence 80% (latest' in html
    assert "<details" in html and "<th scope=\"col\">confidence</th>" in html and "<td>80%</td>" in html
    assert 'class="end-label progress"' in html and "confidence 80%</text>" in html


def test_sparkline_draws_the_threshold_and_ends_at_the_last_value() -> None:
    spark = sparkline([0.9, 0.6, 0.3], threshold=0.1, title="confidence 30%")
    assert spark.threshold_y == round(32 - 2 - 0.1 * 28, 1) and spark.end_y == round(32 - 2 - 0.3 * 28, 1)
    assert len(spark.points.split()) == 3
    html = render_to_string("charts/sparkline.html", {"spark": sparkline([0.5], threshold=0.1, title="<b>")})
    assert "<title>&lt;b&gt;</title>" in html


def test_bar_strip_scales_each_row_to_its_peak_and_totals_it() -> None:
    plans = Series(name="plans made", key="plans")
    strip = bar_strip(title="Fleet", buckets=["a", "b", "c"], series=[(plans, [0, 2, 4])], ticks=[(0, "-15 min", "10:00")])
    row = strip.rows[0]
    assert (row.total, row.peak) == (6, 4)
    assert row.bars[0].height == 0 and row.bars[2].height == 2 * row.bars[1].height
    assert row.bars[1].title == "plans made: 2 (b)" and strip.table == [("a", [0]), ("b", [2]), ("c", [4])]
    html = render_to_string("charts/bar_strip.html", {"strip": strip, "strip_id": "s"})
    assert "plans made: 4 (c)" in html and "6 in the hour, peak 4" in html


def test_the_same_values_give_the_same_chart_drawn_once() -> None:
    def chart(confidence: float) -> Any:
        return line_chart_kept(title="t", samples=tuple(samples([(0.2, 0.9), (0.3, confidence)])), series=tuple(GOAL_SERIES))

    first = chart(0.8)
    html = render_to_string("planning/agent_detail.html#needs", {"needs_chart": first})
    assert chart(0.8) is first and first.drawn["needs-chart"] in html  # a push that changed nothing draws nothing
    assert chart(0.7) is not first
