"""Seed 000's planning rules for persona agents, as plain functions over plain values.

Which goal gets a plan, which step is current, and what one experience does to the current step.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

MAX_ACTIVE_PLANS = 3  # one per horizon
STUCK_MULTIPLIER = 2.0  # replan when a step takes more than twice its estimate
MAX_OVERRIDES = 3  # replan when urgent needs override the step this many cycles in a row
PLAN_NEEDS_BELOW = 0.5  # mid- and long-term goals are planned once a source need drops below this


def goal_plan_waits_for(*, horizon: str, source_needs: Iterable[str], needs: Mapping[str, float]) -> dict[str, float]:
    """Seed 000: short-term goals are planned at once; mid- and long-term goals wait until one of their
    source needs drops below PLAN_NEEDS_BELOW. The source needs a goal waits for, with their levels (one of
    them must drop below the line); empty when it waits for nothing. A goal with no known source need (given
    by an operator) has nothing to wait for."""
    if horizon == "short_term":
        return {}
    levels = {name: needs[name] for name in source_needs if name in needs}
    return {} if not levels or min(levels.values()) < PLAN_NEEDS_BELOW else levels


def goal_plannable(*, horizon: str, source_needs: Iterable[str], needs: Mapping[str, float]) -> bool:
    """Whether the goal may be planned now (see goal_plan_waits_for)."""
    return not goal_plan_waits_for(horizon=horizon, source_needs=source_needs, needs=needs)


@dataclass(frozen=True)
class StepVerdict:
    """What one experience did to the current step."""

    actual_cycles: int
    overrides: int
    completed: bool = False
    failure: str = ""  # set: the step failed and its plan is replanned

    @property
    def replan(self) -> bool:
        return bool(self.failure)


def step_evaluate(*, key: str, actual_cycles: int, estimated_cycles: int, overrides: int, followed: bool,
                  succeeded: bool, improved: bool, override_reason: str = "", outcome: str = "") -> StepVerdict:
    """Seed 000's evaluate_step and check_for_replan for one experience.

    Every cycle the step is current counts in actual_cycles. Seed 000's completion: the action was the
    step's action_hint (`followed`), it worked (`succeeded`) and satisfaction improved (`improved`: the
    action raised some need), once the step has run for its estimated cycles (the estimate is how long the
    step takes: "work a shift, 3 cycles"). Otherwise an override adds to the consecutive-override counter
    (following resets it); MAX_OVERRIDES in a row, or more than STUCK_MULTIPLIER times the estimate, fails
    the step so the plan is replanned."""
    cycles = actual_cycles + 1
    in_a_row = 0 if followed else overrides + 1
    if followed and succeeded and improved and cycles >= estimated_cycles:
        return StepVerdict(actual_cycles=cycles, overrides=in_a_row, completed=True)
    if in_a_row >= MAX_OVERRIDES:
        why = f"step {key} overridden {in_a_row} cycles in a row" + (f": {override_reason}" if override_reason else "")
        return StepVerdict(actual_cycles=cycles, overrides=in_a_row, failure=why)
    if cycles > estimated_cycles * STUCK_MULTIPLIER:
        why = f"step {key} stuck: {cycles} cycles, estimate {estimated_cycles}" + (f"; last: {outcome}" if outcome else "")
        return StepVerdict(actual_cycles=cycles, overrides=in_a_row, failure=why)
    return StepVerdict(actual_cycles=cycles, overrides=in_a_row)


def routine_keeps(*, effects: Mapping[str, float], source_needs: Iterable[str], needs: Mapping[str, float],
                  fine_above: float) -> bool:
    """Whether a step of a completed plan is done again when the plan is repeated as a routine. A step whose
    action only helps needs that are not the goal's and are fine now (work, when money is plentiful) is
    left out; preparation with no effect of its own (going to the store) and steps for the goal's own
    needs are kept."""
    helped = [name for name, delta in effects.items() if delta > 0]
    own = set(source_needs)
    return not helped or any(name in own or needs.get(name, 1.0) < fine_above for name in helped)
