"""The plan page's timeline bars: a pure function of the spans (planning/trace_spans.timeline_bars)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from planner_site.tracing import SpanFact
from planning.trace_spans import timeline_bars

T0 = datetime(2026, 12, 7, 9, 0, tzinfo=UTC)


def fact(key: str, start: float, end: float, *, parent: str = "", kind: str = "plan", **attributes: object) -> SpanFact:
    return SpanFact(key=key, name=key or "invoke_agent Ann", kind=kind, parent=parent,
                    start=T0 + timedelta(seconds=start), end=T0 + timedelta(seconds=end), attributes=dict(attributes))


def test_bars_place_each_span_on_the_roots_span_children_under_their_parent() -> None:
    bars = timeline_bars([
        fact("", 0, 1000, kind="agent"),
        fact("plan/1", 0, 100),
        fact("wait/1", 100, 700, kind="wait"),  # ten minutes for a person
        fact("chat/1", 10, 60, parent="plan/1", kind="chat", **{"gen_ai.usage.input_tokens": 12}),
        fact("tool/1", 700, 1000, kind="tool", **{"planner.outcome": "completed"}),
    ])
    assert [b.label for b in bars] == ["invoke_agent Ann", "plan/1", "chat/1", "wait/1", "tool/1"]
    assert [b.depth for b in bars] == [0, 1, 2, 1, 1]
    assert [(b.left, b.width) for b in bars] == [(0, 100), (0, 10), (1, 5), (10, 60), (70, 30)]
    assert bars[3].seconds == 600 and bars[3].detail == "moved on without a decision"
    assert bars[2].detail == "12 in / 0 out tokens" and bars[4].detail == "completed"


def test_an_instant_still_shows_and_nothing_runs_past_the_end() -> None:
    bars = timeline_bars([fact("", 0, 100, kind="agent"), fact("tool/1", 100, 100, kind="tool")])
    assert bars[1].width >= 0.4 and bars[1].left + bars[1].width <= 100
    assert timeline_bars([]) == []


def test_an_open_wait_says_so() -> None:
    bars = timeline_bars([fact("", 0, 50, kind="agent", **{"planner.open": True}),
                          fact("wait/1", 20, 50, kind="wait", **{"planner.open": True})])
    assert bars[1].open and bars[1].detail == "waiting"
