"""Shared by the bench modules: one shape for a figure, measured beside its baseline in the same run."""

from __future__ import annotations

from typing import Any


def figure(name: str, value: float, unit: str, *, baseline: float | None, goal: str, passed: bool,
           baseline_name: str = "", note: str = "") -> dict[str, Any]:
    """A figure as `var/bench.json` stores it; `ratio` is value / baseline when there is a baseline."""
    ratio = round(value / baseline, 2) if baseline else None
    return {"name": name, "value": round(value, 3), "unit": unit, "baseline": None if baseline is None else round(baseline, 3),
            "baseline_name": baseline_name, "ratio": ratio, "goal": goal, "pass": bool(passed), "note": note}
