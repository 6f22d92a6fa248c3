"""The goal system's arithmetic (seed 001), as plain functions over plain values."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

# Confidence lost per hour, by horizon: short-term goals die fast if not pursued.
DECAY_PER_HOUR = {"short_term": 0.03, "mid_term": 0.008, "long_term": 0.002}
# Below this confidence a goal is abandoned.
ABANDON_BELOW = {"short_term": 0.1, "mid_term": 0.05, "long_term": 0.05}
MAX_GOALS = 10
GENERATION_INTERVAL = 5  # experiences between goal re-evaluations
MILESTONE_CHECK_THRESHOLD = 0.85
PLAN_COMPLETION_BONUS = 0.3  # seed 000: a completed plan advances its goal
PLAN_ABANDON_PENALTY = 0.2  # seed 000: an abandoned plan costs its goal confidence
MILESTONE_SETBACK = 0.1  # progress taken back when the milestone check says "not yet"


def clamp_unit(value: float) -> float:
    return max(0.0, min(1.0, value))


def goal_decay(*, confidence: float, horizon: str, hours: float) -> tuple[float, bool]:
    """Confidence after `hours` without pursuit, and whether the goal is now abandoned."""
    new = clamp_unit(confidence - DECAY_PER_HOUR[horizon] * max(hours, 0.0))
    return new, new < ABANDON_BELOW[horizon]


def goal_progress_delta(*, source_needs: Iterable[str], need_deltas: Mapping[str, float]) -> float:
    """How much an experience moved a goal: the sum of its source needs' satisfaction deltas."""
    return sum(float(need_deltas.get(name, 0.0)) for name in source_needs)


def goal_priority(*, horizon: str, confidence: float) -> tuple[int, float]:
    """Sort key: short-term first, then mid, then long; more confident first."""
    order = {"short_term": 0, "mid_term": 1, "long_term": 2}
    return order.get(horizon, 3), -confidence
