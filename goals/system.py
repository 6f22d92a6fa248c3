"""The goal system's arithmetic (seed 001), as plain functions over plain values."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace

# Confidence lost per simulated hour, by horizon: short-term goals die fast if not pursued.
DECAY_PER_HOUR = {"short_term": 0.03, "mid_term": 0.008, "long_term": 0.002}
# Below this confidence a goal is abandoned.
ABANDON_BELOW = {"short_term": 0.1, "mid_term": 0.05, "long_term": 0.05}
MAX_GOALS = 10  # across all horizons
# Seed 001's mix of active goals: ~3 short-term, ~4 mid-term, ~3 long-term (MAX_GOALS in all).
HORIZON_MIX = {"short_term": 3, "mid_term": 4, "long_term": 3}
# Where a generated goal goes when its own horizon has its share: the nearest horizon with room.
HORIZON_NEAREST = {"short_term": ("mid_term", "long_term"), "mid_term": ("short_term", "long_term"),
                   "long_term": ("mid_term", "short_term")}
GENERATION_INTERVAL = 5  # experiences between goal re-evaluations
GOALS_PER_GENERATION = 3  # the model proposes up to this many new goals
MILESTONE_CHECK_THRESHOLD = 0.85  # progress that asks the model whether the goal is achieved
PLAN_COMPLETION_BONUS = 0.3  # seed 000: a completed plan advances its goal
PLAN_ABANDON_PENALTY = 0.2  # seed 000: an abandoned plan costs its goal confidence
MILESTONE_SETBACK = 0.3  # progress taken back when the milestone check says "not yet": one plan's worth
# A need below this, served by no active goal, is room for a new goal (the re-evaluation asks the model
# only then). The offline model proposes goals for needs below the same line.
GOAL_NEED_BELOW = 0.5
RECUR_SHORT_BELOW = 0.3  # a goal that recurs for a need this low is short-term (planned first), else mid-term
# Priority of horizons: short-term first, then mid, then long (seed 000's get_current_step).
HORIZON_ORDER = {"short_term": 0, "mid_term": 1, "long_term": 2}


def clamp_unit(value: float) -> float:
    return max(0.0, min(1.0, value))


def confidence_lost(*, horizon: str, hours: float) -> float:
    """The confidence a goal of this horizon loses in `hours` (before the floor at 0)."""
    return DECAY_PER_HOUR[horizon] * max(hours, 0.0)


def goal_decay(*, confidence: float, horizon: str, hours: float) -> tuple[float, bool]:
    """Confidence after `hours`, and whether the goal is now abandoned (below its horizon's threshold)."""
    new = clamp_unit(confidence - confidence_lost(horizon=horizon, hours=hours))
    return new, new < ABANDON_BELOW[horizon]


def goal_progress_delta(*, source_needs: Iterable[str], need_deltas: Mapping[str, float]) -> float:
    """How much an experience moved a goal: the sum of its source needs' satisfaction deltas."""
    return sum(float(need_deltas.get(name, 0.0)) for name in source_needs)


def goal_priority(*, horizon: str, confidence: float) -> tuple[int, float]:
    """Sort key: short-term first, then mid, then long; more confident first."""
    return HORIZON_ORDER.get(horizon, len(HORIZON_ORDER)), -confidence


@dataclass(frozen=True)
class GoalState:
    """A goal as plain values: what an experience changes."""

    progress: float
    confidence: float
    times_advanced: int = 0
    times_regressed: int = 0
    abandoned: bool = False
    progressed: bool = False  # progress moved, so last_progressed is now
    crossed_milestone: bool = False  # progress rose to the milestone threshold in this experience
    # What the experience applied, before clamping to 0..1: the change written as a relative update
    # (agents/services.py goals_write), so that an operator's edit made meanwhile is moved, not overwritten.
    progress_delta: float = 0.0
    confidence_decay: float = 0.0


def goal_after_experience(*, state: GoalState, horizon: str, source_needs: Iterable[str],
                          need_deltas: Mapping[str, float], hours: float, bonus: float = 0.0,
                          waiting: bool = False) -> GoalState:
    """Seed 001's update_progress and decay_all_goals for one experience.

    Progress moves by the source needs' deltas from the action (positive advances, negative regresses; the
    passive decay of needs is no regression) plus `bonus` (a plan of this goal completed); confidence decays
    by the simulated hours that passed, for every goal, also one that advanced; below its horizon's
    threshold the goal is abandoned. A goal whose plan waits for a person (`waiting`) is being pursued: it
    is held as it is, neither decayed toward abandonment nor completed, until the person answers."""
    if waiting:
        return replace(state, abandoned=False, progressed=False, crossed_milestone=False, progress_delta=0.0,
                       confidence_decay=0.0)
    delta = goal_progress_delta(source_needs=source_needs, need_deltas=need_deltas) + bonus
    progress = clamp_unit(state.progress + delta)
    decay = confidence_lost(horizon=horizon, hours=hours)
    confidence, abandoned = goal_decay(confidence=state.confidence, horizon=horizon, hours=hours)
    return GoalState(
        progress=progress,
        confidence=confidence,
        times_advanced=state.times_advanced + (1 if delta > 0 else 0),
        times_regressed=state.times_regressed + (1 if delta < 0 else 0),
        abandoned=abandoned,
        progressed=delta != 0,
        crossed_milestone=state.progress < MILESTONE_CHECK_THRESHOLD <= progress and not abandoned,
        progress_delta=delta,
        confidence_decay=decay,
    )


def goals_room(*, needs: Mapping[str, float], served: Iterable[str], active: int) -> list[str]:
    """Needs that call for a new goal: below GOAL_NEED_BELOW and served by no active goal, lowest first,
    while there are fewer than MAX_GOALS active goals. Empty: the re-evaluation has nothing to ask."""
    if active >= MAX_GOALS:
        return []
    taken = set(served)
    low = sorted((value, name) for name, value in needs.items() if value < GOAL_NEED_BELOW and name not in taken)
    return [name for _, name in low]


def goals_reevaluation_due(experiences: int) -> bool:
    """Seed 001: goals are re-evaluated every GENERATION_INTERVAL experiences (and before the first)."""
    return experiences % GENERATION_INTERVAL == 0


def milestone_after(*, progress: float, achieved: bool, needs_level: float | None = None) -> tuple[float, bool]:
    """The milestone check's verdict applied: (progress, completed). "Not yet" takes MILESTONE_SETBACK back,
    and at least down to where the source needs really are (`needs_level`, their mean satisfaction): progress
    counts what the actions did, and a "not yet" says that was not enough."""
    if achieved:
        return 1.0, True
    back = progress - MILESTONE_SETBACK
    return clamp_unit(back if needs_level is None else min(back, needs_level)), False


def goal_horizon_placed(*, horizon: str, active: Mapping[str, int]) -> str | None:
    """Seed 001's horizon mix for a generated goal: its own horizon while that holds fewer active goals than its
    share of HORIZON_MIX, else the nearest horizon with room; None when every horizon has its share."""
    for candidate in (horizon, *HORIZON_NEAREST.get(horizon, ())):
        if active.get(candidate, 0) < HORIZON_MIX.get(candidate, 0):
            return candidate
    return None


@dataclass(frozen=True)
class GoalStats:
    """Seed 001's get_goal_stats: how a person's goals stand."""

    active: int
    completed: int
    abandoned: int
    active_by_horizon: dict[str, int]
    mean_progress: float  # of the active goals
    times_advanced: int  # over all goals
    times_regressed: int


def goal_stats(goals: Iterable[tuple[str, str, float, int, int]]) -> GoalStats:
    """Stats from (status, horizon, progress, times_advanced, times_regressed) of every goal."""
    rows = list(goals)
    active = [(horizon, progress) for status, horizon, progress, _, _ in rows if status == "active"]
    return GoalStats(
        active=len(active),
        completed=sum(1 for row in rows if row[0] == "completed"),
        abandoned=sum(1 for row in rows if row[0] == "abandoned"),
        active_by_horizon={h: sum(1 for horizon, _ in active if horizon == h) for h in HORIZON_ORDER},
        mean_progress=round(sum(p for _, p in active) / len(active), 4) if active else 0.0,
        times_advanced=sum(row[3] for row in rows),
        times_regressed=sum(row[4] for row in rows),
    )
