"""Chart geometry: values in, coordinates out. Pure (no database, no templates): the pages draw what this
returns through template partials (templates/charts/), so every label is escaped by the template engine.

- `downsample_indices` keeps at most `limit` samples of one or more series sharing a time axis: the first, the
  last, and in each stretch the lowest and the highest value of every series, so a dip towards a threshold is
  never smoothed away.
- `line_chart` lays out a chart of curves in 0..1 over simulated hours: the y axis from 0 to 100% with
  gridlines, time ticks (simulated hours before the latest sample, and the wall clock of the sample nearest each
  tick), threshold lines with their labels, each curve labelled at its end by name and value, a hover target
  with its values for every sample (a few of them reachable by keyboard), and the rows of a data table.
- `sparkline` is the small curve of one value with its threshold (the dashboard's glance).
- `bar_strip` lays out counts per time bucket as bars, one row per series (the dashboard's fleet strip).

How to read the charts: docs/charts.md.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass, field

POINTS_LIMIT = 100  # samples drawn per chart, whatever the length of the history
KEYBOARD_STOPS = 12  # samples of a chart reachable with Tab (every sample shows its values on hover)
GRID = (0.0, 0.25, 0.5, 0.75, 1.0)
HOUR_STEPS = (0.5, 1, 2, 3, 6, 12, 24, 48, 96, 168, 336, 720)  # tick spacing in simulated hours
TICKS_MAX = 5
TICK_SPACING = 75.0  # the least distance between two time ticks, in the chart's units
CLOCK_LABEL_WIDTH = 50.0  # "14:05:03" at 11 px
LABEL_GAP = 12.0  # the least vertical distance between two end labels (the font is 11 px)


def percent(value: float) -> str:
    """0.423 -> "42%" (rounded as the pages round)."""
    return f"{round(max(0.0, min(1.0, value)) * 100)}%"


def hours_label(hours: float) -> str:
    """A duration in simulated hours, short: "0 h", "1.5 h", "36 h"."""
    return f"{hours:.1f} h".replace(".0 h", " h") if hours < 10 else f"{hours:.0f} h"


# --- downsampling ----------------------------------------------------------------------------------------------


def downsample_indices(series: Sequence[Sequence[float | None]], *, limit: int = POINTS_LIMIT) -> list[int]:
    """The indices of the samples to draw (ascending): all of them when they fit in `limit`; else the first, the
    last, and for each of equal stretches between them the index of the lowest and of the highest value of every
    series (missing values ignored). Never more than `limit` (at least 2)."""
    count = max((len(s) for s in series), default=0)
    limit = max(limit, 2)
    if count <= limit:
        return list(range(count))
    per_stretch = 2 * max(len(series), 1)
    stretches = max(1, (limit - 2) // per_stretch)
    kept = {0, count - 1}
    inner = count - 2
    for b in range(stretches):
        start = 1 + b * inner // stretches
        end = 1 + (b + 1) * inner // stretches
        for values in series:
            present = [i for i in range(start, min(end, len(values))) if values[i] is not None]
            if present:
                kept.add(min(present, key=lambda i: (values[i], i)))  # type: ignore[arg-type,return-value]
                kept.add(max(present, key=lambda i: (values[i], -i)))  # type: ignore[arg-type,return-value]
    return sorted(kept)


# --- the line chart -------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Sample:
    """One point in time: simulated hours (any origin, increasing), the wall clock as shown, a value per series."""

    hours: float
    clock: str
    values: tuple[float | None, ...]


@dataclass(frozen=True)
class Series:
    name: str  # shown at the curve's end, in the hover text and as the table's column
    key: str  # the CSS class that colours it


@dataclass(frozen=True)
class Threshold:
    label: str  # e.g. "abandoned below 10%"
    value: float
    key: str


@dataclass
class GridLine:
    y: float
    label: str


@dataclass
class Tick:
    x: float
    hours: str  # "-12 h", "latest"
    clock: str  # the wall clock of the sample nearest the tick
    anchor: str = "middle"  # the labels' text-anchor: the first and last keep inside the chart


@dataclass
class Rule:
    y: float
    label: str
    key: str
    label_y: float


@dataclass
class Curve:
    name: str
    key: str
    points: str  # an SVG polyline's points
    end_x: float
    end_y: float
    label_y: float
    label: str  # "progress 42%"
    value: str  # "42%"


@dataclass
class Hit:
    x: float
    width: float
    title: str
    focusable: bool


@dataclass
class Row:
    hours: str
    clock: str
    values: list[str]


@dataclass
class LineChart:
    title: str
    desc: str
    width: int
    height: int
    left: float
    top: float
    right: float
    bottom: float
    grid: list[GridLine] = field(default_factory=list)
    ticks: list[Tick] = field(default_factory=list)
    rules: list[Rule] = field(default_factory=list)
    curves: list[Curve] = field(default_factory=list)
    hits: list[Hit] = field(default_factory=list)
    columns: list[str] = field(default_factory=list)
    rows: list[Row] = field(default_factory=list)
    shown: int = 0  # samples drawn
    total: int = 0  # samples in the history
    drawn: dict[str, str] = field(default_factory=dict, repr=False)  # its HTML by element id ({% line_chart %})

    @property
    def plot_width(self) -> float:
        return self.right - self.left

    @property
    def plot_height(self) -> float:
        return self.bottom - self.top


def labels_spread(ys: list[float], *, top: float, bottom: float, gap: float = LABEL_GAP) -> list[float]:
    """Label positions near `ys` (same order) at least `gap` apart and within top..bottom: end labels of curves
    ending at the same value stay readable."""
    order = sorted(range(len(ys)), key=lambda i: (ys[i], i))
    placed: dict[int, float] = {}
    last = -math.inf
    for i in order:
        y = max(ys[i], last + gap, top)
        placed[i] = y
        last = y
    overflow = (last - bottom) if order else 0.0
    if overflow > 0:  # pushed out at the bottom: shift the stack up, keeping the gaps
        for i in order:
            placed[i] = max(top, placed[i] - overflow)
    return [placed[i] for i in range(len(ys))]


def ticks_anchor(ticks: list[Tick], *, left: float, right: float) -> None:
    """A label at either edge of the plot is anchored inwards, so it is not cut off."""
    for tick in ticks:
        tick.anchor = "start" if tick.x <= left + 12 else "end" if tick.x >= right - 12 else "middle"


def ticks_thinned(ticks: list[Tick], *, label_width: float = CLOCK_LABEL_WIDTH) -> list[Tick]:
    """The ticks whose labels do not overlap (anchored as ticks_anchor says), the latest (rightmost) kept first."""
    kept: list[Tick] = []
    for tick in reversed(ticks):
        shift = {"start": 0.0, "end": -label_width}.get(tick.anchor, -label_width / 2)
        right = tick.x + shift + label_width
        if kept:
            other = kept[-1]
            other_left = other.x + {"start": 0.0, "end": -label_width}.get(other.anchor, -label_width / 2)
            if right > other_left - 4:
                continue
        kept.append(tick)
    return list(reversed(kept))


def hour_step(span: float, intervals: int = TICKS_MAX - 1) -> float:
    """The tick spacing for a span of simulated hours: the smallest of HOUR_STEPS giving at most `intervals`."""
    for step in HOUR_STEPS:
        if span / step <= intervals:
            return float(step)
    return float(math.ceil(span / intervals))


def line_chart(*, title: str, samples: Sequence[Sample], series: Sequence[Series],
               thresholds: Sequence[Threshold] = (), width: int = 420, height: int = 200,
               limit: int = POINTS_LIMIT, keyboard_stops: int = KEYBOARD_STOPS) -> LineChart:
    """A chart of curves in 0..1 over simulated hours, its samples downsampled to `limit` (see the module)."""
    chart = LineChart(title=title, desc="", width=width, height=height,
                      left=36.0, top=8.0, right=width - 104.0, bottom=height - 32.0, total=len(samples))
    keep = downsample_indices([[s.values[j] for s in samples] for j in range(len(series))], limit=limit)
    kept = [samples[i] for i in keep]
    chart.shown = len(kept)

    def y_of(value: float) -> float:
        return round(chart.bottom - max(0.0, min(1.0, value)) * chart.plot_height, 1)

    chart.grid = [GridLine(y=y_of(v), label=percent(v)) for v in GRID]
    rule_ys = [y_of(t.value) for t in thresholds]
    chart.rules = [Rule(y=y, label=t.label, key=t.key, label_y=round(y - 3, 1)) for t, y in zip(thresholds, rule_ys, strict=True)]
    chart.columns = [s.name for s in series]
    if not kept:
        chart.desc = f"{title}: no samples yet."
        return chart

    first, latest = kept[0].hours, kept[-1].hours
    span = latest - first

    def x_of(hours: float) -> float:
        if span <= 0:
            return round(chart.right, 1)
        return round(chart.left + (hours - first) / span * chart.plot_width, 1)

    # Ticks back from the latest sample: "latest", "-6 h", "-12 h"... with the clock of the nearest sample.
    intervals = max(1, min(TICKS_MAX - 1, int(chart.plot_width // TICK_SPACING)))
    step = hour_step(span, intervals) if span > 0 else 1.0
    back = 0.0
    while back <= span + 1e-9 and len(chart.ticks) < TICKS_MAX + 1:
        at = latest - back
        nearest = min(kept, key=lambda s: abs(s.hours - at))
        chart.ticks.append(Tick(x=x_of(at), hours="latest" if back == 0 else f"-{hours_label(back)}", clock=nearest.clock))
        back += step
    chart.ticks.reverse()
    ticks_anchor(chart.ticks, left=chart.left, right=chart.right)
    chart.ticks = ticks_thinned(chart.ticks)

    ends: list[tuple[Series, float, float, float]] = []
    for j, s in enumerate(series):
        coords = [(x_of(p.hours), y_of(v)) for p in kept if (v := p.values[j]) is not None]
        last_value = next((p.values[j] for p in reversed(kept) if p.values[j] is not None), None)
        if not coords or last_value is None:
            continue
        chart.curves.append(Curve(name=s.name, key=s.key, points=" ".join(f"{x},{y}" for x, y in coords),
                                  end_x=coords[-1][0], end_y=coords[-1][1], label_y=0.0,
                                  label=f"{s.name} {percent(last_value)}", value=percent(last_value)))
        ends.append((s, coords[-1][0], coords[-1][1], last_value))
    for curve, y in zip(chart.curves, labels_spread([c.end_y + 3.5 for c in chart.curves], top=chart.top + 4,
                                                     bottom=chart.bottom + 3.5), strict=True):
        curve.label_y = round(y, 1)

    # Hover targets: a column around each sample, from halfway to the previous one to halfway to the next.
    xs = [x_of(p.hours) for p in kept]
    stops = {round(k * (len(kept) - 1) / max(keyboard_stops - 1, 1)) for k in range(keyboard_stops)}
    for i, p in enumerate(kept):
        lo = chart.left if i == 0 else (xs[i - 1] + xs[i]) / 2
        hi = chart.right if i == len(kept) - 1 else (xs[i] + xs[i + 1]) / 2
        if span <= 0:
            lo, hi = chart.left, chart.right
        values = ", ".join(f"{s.name} {percent(v)}" for s, v in zip(series, p.values, strict=True) if v is not None)
        when = "latest" if p.hours == latest else f"{hours_label(latest - p.hours)} before the latest"
        chart.hits.append(Hit(x=round(lo, 1), width=round(max(hi - lo, 1.0), 1), focusable=i in stops,
                              title=f"{values} ({when}, {p.clock})"))
        chart.rows.append(Row(hours="latest" if p.hours == latest else f"-{hours_label(latest - p.hours)}",
                              clock=p.clock, values=[percent(v) if v is not None else "" for v in p.values]))
    now = "; ".join(c.label for c in chart.curves)
    lines = "; ".join(t.label for t in thresholds)
    chart.desc = (f"{title}. Now: {now}." + (f" Lines: {lines}." if lines else "")
                  + f" {chart.shown} of {chart.total} samples over {hours_label(span)} simulated.")
    return chart


@functools.lru_cache(maxsize=256)
def line_chart_kept(*, title: str, samples: tuple[Sample, ...], series: tuple[Series, ...],
                    thresholds: tuple[Threshold, ...] = (), width: int = 420) -> LineChart:
    """line_chart for the same values returns the same chart, with the HTML its partial drew (`drawn`): a live
    push redraws only the charts whose values changed (a finished goal's chart, or one a cycle did not move, is
    drawn once). Its samples' hours should start at 0, so that the same curve has the same values."""
    return line_chart(title=title, samples=samples, series=series, thresholds=thresholds, width=width)


# --- the sparkline ----------------------------------------------------------------------------------------------


@dataclass
class Sparkline:
    width: int
    height: int
    points: str
    end_x: float
    end_y: float
    threshold_y: float
    title: str


def sparkline(values: Sequence[float], *, threshold: float, title: str, width: int = 120, height: int = 32,
              limit: int = 40) -> Sparkline:
    """A small curve of values in 0..1 (oldest first) with a dashed line at `threshold`."""
    keep = downsample_indices([list(values)], limit=limit)
    kept = [values[i] for i in keep]
    pad = 2.0

    def y_of(value: float) -> float:
        return round(height - pad - max(0.0, min(1.0, value)) * (height - 2 * pad), 1)

    n = len(kept)
    xs = [round(pad + (i * (width - 2 * pad - 4) / (n - 1) if n > 1 else width - 2 * pad - 4), 1) for i in range(n)]
    points = " ".join(f"{x},{y_of(v)}" for x, v in zip(xs, kept, strict=True))
    return Sparkline(width=width, height=height, points=points, end_x=xs[-1] if xs else 0.0,
                     end_y=y_of(kept[-1]) if kept else 0.0, threshold_y=y_of(threshold), title=title)


# --- the bar strip ------------------------------------------------------------------------------------------------


@dataclass
class Bar:
    x: float
    y: float
    width: float
    height: float
    count: int
    title: str
    usable: float  # the height of the row's bars at their peak (the hover target spans it)


@dataclass
class BarRow:
    name: str
    key: str
    top: float
    base: float
    total: int
    peak: int
    bars: list[Bar] = field(default_factory=list)


@dataclass
class BarStrip:
    title: str
    desc: str
    width: int
    height: int
    left: float
    right: float
    rows: list[BarRow] = field(default_factory=list)
    ticks: list[Tick] = field(default_factory=list)
    table: list[tuple[str, list[int]]] = field(default_factory=list)  # (bucket, count per series)


def bar_strip(*, title: str, buckets: Sequence[str], series: Sequence[tuple[Series, Sequence[int]]],
              width: int = 420, row_height: float = 30.0, ticks: Sequence[tuple[int, str, str]] = ()) -> BarStrip:
    """Counts per time bucket (`buckets` are their labels, oldest first), one row of bars per series, each row
    scaled to its own peak and labelled with its total. `ticks`: (bucket index, label, clock) for the time axis."""
    left, right = 4.0, width - 150.0
    n = max(len(buckets), 1)
    slot = (right - left) / n
    strip = BarStrip(title=title, desc="", width=width, height=int(len(series) * row_height + 26),
                     left=left, right=right)
    for r, (s, counts) in enumerate(series):
        top = r * row_height + 4
        peak = max(counts, default=0)
        usable = row_height - 8
        row = BarRow(name=s.name, key=s.key, top=top, base=top + usable, total=sum(counts), peak=peak)
        for i, count in enumerate(counts):
            h = round(usable * count / peak, 1) if peak else 0.0
            h = max(h, 1.0) if count else 0.0
            row.bars.append(Bar(x=round(left + i * slot + 1, 1), y=round(top + usable - h, 1),
                                width=round(max(slot - 2, 1.0), 1), height=h, count=count, usable=usable,
                                title=f"{s.name}: {count} ({buckets[i]})"))
        strip.rows.append(row)
    axis = len(series) * row_height + 4
    strip.ticks = [Tick(x=round(left + i * slot, 1), hours=label, clock=clock) for i, label, clock in ticks]
    ticks_anchor(strip.ticks, left=left, right=right)
    strip.table = [(label, [c[i] for _, c in series]) for i, label in enumerate(buckets)]
    strip.desc = f"{title}: " + "; ".join(f"{row.name} {row.total} in all" for row in strip.rows) + "."
    strip.height = int(axis + 24)
    return strip
