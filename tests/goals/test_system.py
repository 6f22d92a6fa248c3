"""Seed 001's numbers and rules, one test each, on the goal system's plain functions."""

from __future__ import annotations

import pytest

from agents.persona import (
    MAX_ACTIVE_PLANS,
    MAX_OVERRIDES,
    PLAN_NEEDS_BELOW,
    STUCK_MULTIPLIER,
    goal_plannable,
    step_evaluate,
)
from goals.system import (
    ABANDON_BELOW,
    DECAY_PER_HOUR,
    GENERATION_INTERVAL,
    GOAL_NEED_BELOW,
    HORIZON_MIX,
    MAX_GOALS,
    MILESTONE_CHECK_THRESHOLD,
    MILESTONE_SETBACK,
    PLAN_ABANDON_PENALTY,
    PLAN_COMPLETION_BONUS,
    GoalState,
    goal_after_experience,
    goal_decay,
    goal_horizon_placed,
    goal_priority,
    goal_stats,
    goals_reevaluation_due,
    goals_room,
    milestone_after,
)


def test_seed_numbers_are_the_seeds() -> None:
    assert DECAY_PER_HOUR == {"short_term": 0.03, "mid_term": 0.008, "long_term": 0.002}
    assert ABANDON_BELOW == {"short_term": 0.1, "mid_term": 0.05, "long_term": 0.05}
    assert (MAX_GOALS, GENERATION_INTERVAL, MILESTONE_CHECK_THRESHOLD) == (10, 5, 0.85)
    assert (PLAN_COMPLETION_BONUS, PLAN_ABANDON_PENALTY) == (0.3, 0.2)
    assert (MAX_ACTIVE_PLANS, STUCK_MULTIPLIER, MAX_OVERRIDES, PLAN_NEEDS_BELOW) == (3, 2.0, 3, 0.5)


@pytest.mark.parametrize(("horizon", "per_hour"), [("short_term", 0.03), ("mid_term", 0.008), ("long_term", 0.002)])
def test_confidence_decays_by_horizon_rate_times_hours(horizon: str, per_hour: float) -> None:
    confidence, abandoned = goal_decay(confidence=0.9, horizon=horizon, hours=5)
    assert confidence == pytest.approx(0.9 - 5 * per_hour)
    assert not abandoned


@pytest.mark.parametrize(("horizon", "threshold"), [("short_term", 0.1), ("mid_term", 0.05), ("long_term", 0.05)])
def test_goal_is_abandoned_just_below_its_horizon_threshold(horizon: str, threshold: float) -> None:
    hour = DECAY_PER_HOUR[horizon]
    _, above = goal_decay(confidence=threshold + hour + 1e-6, horizon=horizon, hours=1)
    _, below = goal_decay(confidence=threshold + hour - 1e-6, horizon=horizon, hours=1)
    assert (above, below) == (False, True)


def test_short_term_goal_dies_fast_if_not_pursued() -> None:
    short, _ = goal_decay(confidence=1.0, horizon="short_term", hours=24)
    long, _ = goal_decay(confidence=1.0, horizon="long_term", hours=24)
    assert short < 0.3 < 0.9 < long


def test_positive_delta_on_a_source_need_advances_and_counts() -> None:
    after = goal_after_experience(state=GoalState(progress=0.2, confidence=0.8), horizon="mid_term",
                                  source_needs=["social"], need_deltas={"social": 0.25, "hunger": -0.5}, hours=1)
    assert after.progress == pytest.approx(0.45)
    assert (after.times_advanced, after.times_regressed, after.progressed) == (1, 0, True)


def test_negative_delta_on_a_source_need_regresses_and_counts() -> None:
    after = goal_after_experience(state=GoalState(progress=0.5, confidence=0.8, times_advanced=2), horizon="mid_term",
                                  source_needs=["money"], need_deltas={"money": -0.15}, hours=1)
    assert after.progress == pytest.approx(0.35)
    assert (after.times_advanced, after.times_regressed) == (2, 1)


def test_delta_on_other_needs_leaves_progress_and_counters_alone() -> None:
    after = goal_after_experience(state=GoalState(progress=0.5, confidence=0.8), horizon="mid_term",
                                  source_needs=["money"], need_deltas={"hunger": 0.5}, hours=1)
    assert (after.progress, after.times_advanced, after.times_regressed, after.progressed) == (0.5, 0, 0, False)


def test_a_goal_that_advanced_still_decays_by_the_hours_that_passed() -> None:
    after = goal_after_experience(state=GoalState(progress=0.1, confidence=0.9), horizon="short_term",
                                  source_needs=["energy"], need_deltas={"energy": 0.2}, hours=2)
    assert after.progress == pytest.approx(0.3)
    assert after.confidence == pytest.approx(0.9 - 2 * 0.03)


def test_plan_completion_bonus_adds_to_progress() -> None:
    after = goal_after_experience(state=GoalState(progress=0.2, confidence=0.9), horizon="short_term",
                                  source_needs=["hunger"], need_deltas={}, hours=1, bonus=PLAN_COMPLETION_BONUS)
    assert after.progress == pytest.approx(0.5) and after.times_advanced == 1


def test_progress_stays_within_zero_and_one() -> None:
    up = goal_after_experience(state=GoalState(progress=0.9, confidence=0.9), horizon="short_term",
                               source_needs=["hunger"], need_deltas={"hunger": 0.5}, hours=1)
    down = goal_after_experience(state=GoalState(progress=0.1, confidence=0.9), horizon="short_term",
                                 source_needs=["hunger"], need_deltas={"hunger": -0.5}, hours=1)
    assert (up.progress, down.progress) == (1.0, 0.0)


def test_milestone_is_crossed_only_when_progress_rises_through_the_threshold() -> None:
    def crossed(before: float, delta: float) -> bool:
        return goal_after_experience(state=GoalState(progress=before, confidence=0.9), horizon="long_term",
                                     source_needs=["fun"], need_deltas={"fun": delta}, hours=1).crossed_milestone

    assert crossed(0.8, 0.05)  # 0.80 -> 0.85: the check is asked
    assert not crossed(0.7, 0.1)  # 0.80: not yet
    assert not crossed(0.9, 0.05)  # already above: not asked again every cycle
    assert not crossed(0.9, -0.1)


def test_milestone_yes_completes_and_no_takes_progress_back() -> None:
    assert milestone_after(progress=0.9, achieved=True) == (1.0, True)
    progress, completed = milestone_after(progress=0.9, achieved=False)
    assert progress == pytest.approx(0.9 - MILESTONE_SETBACK) and not completed
    assert progress < MILESTONE_CHECK_THRESHOLD  # it must be crossed again before the next check


def test_milestone_not_yet_takes_progress_back_to_where_the_source_needs_are() -> None:
    assert milestone_after(progress=0.9, achieved=False, needs_level=0.4) == (pytest.approx(0.4), False)
    assert milestone_after(progress=0.9, achieved=False, needs_level=0.8) == (pytest.approx(0.6), False)


def test_a_goal_waiting_for_a_person_is_held_as_it_is() -> None:
    before = GoalState(progress=0.84, confidence=0.11, times_advanced=2, times_regressed=1)
    held = goal_after_experience(state=before, horizon="short_term", source_needs=["fun"], need_deltas={"fun": 0.2},
                                 hours=8, bonus=0.3, waiting=True)
    assert held == before  # not abandoned (0.11 - 8 x 0.03), not advanced, no milestone asked
    moved = goal_after_experience(state=before, horizon="short_term", source_needs=["fun"], need_deltas={"fun": 0.2},
                                  hours=8)
    assert moved.abandoned and moved.crossed_milestone is False and moved.times_advanced == 3


def test_goals_are_re_evaluated_every_fifth_experience() -> None:
    assert [n for n in range(16) if goals_reevaluation_due(n)] == [0, 5, 10, 15]


def test_room_is_a_low_need_no_active_goal_serves() -> None:
    needs = {"hunger": 0.2, "social": 0.4, "energy": 0.9}
    assert goals_room(needs=needs, served=[], active=0) == ["hunger", "social"]
    assert goals_room(needs=needs, served=["hunger"], active=1) == ["social"]
    assert goals_room(needs={"energy": GOAL_NEED_BELOW}, served=[], active=0) == []


def test_no_room_at_max_goals() -> None:
    assert goals_room(needs={"hunger": 0.1}, served=[], active=MAX_GOALS) == []
    assert goals_room(needs={"hunger": 0.1}, served=[], active=MAX_GOALS - 1) == ["hunger"]


def test_priority_is_short_then_mid_then_long_then_confidence() -> None:
    goals = [("long_term", 0.9), ("short_term", 0.2), ("mid_term", 0.5), ("short_term", 0.8)]
    ordered = sorted(goals, key=lambda g: goal_priority(horizon=g[0], confidence=g[1]))
    assert ordered == [("short_term", 0.8), ("short_term", 0.2), ("mid_term", 0.5), ("long_term", 0.9)]


def test_a_goal_of_a_horizon_the_seeds_do_not_name_comes_after_every_known_one() -> None:
    """A horizon outside the three (an old row, a value typed in the database) still sorts, last."""
    goals = [("someday", 0.99), ("long_term", 0.1), ("short_term", 0.5)]
    ordered = sorted(goals, key=lambda g: goal_priority(horizon=g[0], confidence=g[1]))
    assert ordered == [("short_term", 0.5), ("long_term", 0.1), ("someday", 0.99)]


def test_short_term_goals_are_planned_at_once_mid_and_long_below_half() -> None:
    needs = {"social": 0.6, "energy": 0.45}
    assert goal_plannable(horizon="short_term", source_needs=["social"], needs=needs)
    assert not goal_plannable(horizon="mid_term", source_needs=["social"], needs=needs)
    assert not goal_plannable(horizon="long_term", source_needs=["social"], needs={"social": PLAN_NEEDS_BELOW})
    assert goal_plannable(horizon="long_term", source_needs=["social", "energy"], needs=needs)
    assert goal_plannable(horizon="mid_term", source_needs=[], needs=needs)  # an operator's goal waits for nothing


def test_step_followed_and_succeeded_completes_after_its_estimate() -> None:
    one = step_evaluate(key="1", actual_cycles=0, estimated_cycles=1, overrides=0, followed=True, succeeded=True, improved=True)
    assert one.completed and one.actual_cycles == 1
    first = step_evaluate(key="2", actual_cycles=0, estimated_cycles=2, overrides=0, followed=True, succeeded=True, improved=True)
    assert not first.completed and not first.replan
    second = step_evaluate(key="2", actual_cycles=1, estimated_cycles=2, overrides=0, followed=True, succeeded=True, improved=True)
    assert second.completed and second.actual_cycles == 2


def test_step_whose_action_improved_no_need_does_not_complete() -> None:
    verdict = step_evaluate(key="1", actual_cycles=0, estimated_cycles=1, overrides=0, followed=True, succeeded=True,
                            improved=False)
    assert not verdict.completed and not verdict.replan and verdict.actual_cycles == 1


def test_step_that_failed_its_action_does_not_complete() -> None:
    verdict = step_evaluate(key="1", actual_cycles=0, estimated_cycles=1, overrides=0, followed=True, succeeded=False, improved=True)
    assert not verdict.completed and verdict.actual_cycles == 1


def test_step_stuck_beyond_twice_its_estimate_is_replanned() -> None:
    at_limit = step_evaluate(key="1", actual_cycles=3, estimated_cycles=2, overrides=0, followed=True, succeeded=False, improved=True)
    assert not at_limit.replan  # 4 cycles = 2 x 2: not yet
    beyond = step_evaluate(key="1", actual_cycles=4, estimated_cycles=2, overrides=0, followed=True, succeeded=False, improved=True)
    assert beyond.replan and "stuck: 5 cycles, estimate 2" in beyond.failure


def test_three_overrides_in_a_row_replan_and_following_resets_the_count() -> None:
    second = step_evaluate(key="1", actual_cycles=1, estimated_cycles=9, overrides=1, followed=False, succeeded=True, improved=True,
                           override_reason="energy is urgent")
    assert second.overrides == 2 and not second.replan
    third = step_evaluate(key="1", actual_cycles=2, estimated_cycles=9, overrides=2, followed=False, succeeded=True, improved=True,
                          override_reason="energy is urgent")
    assert third.replan and "overridden 3 cycles in a row: energy is urgent" in third.failure
    reset = step_evaluate(key="1", actual_cycles=2, estimated_cycles=9, overrides=2, followed=True, succeeded=False, improved=True)
    assert reset.overrides == 0 and not reset.replan


def test_horizon_mix_is_three_short_four_mid_three_long_of_max_goals() -> None:
    assert HORIZON_MIX == {"short_term": 3, "mid_term": 4, "long_term": 3}
    assert sum(HORIZON_MIX.values()) == MAX_GOALS


def test_a_generated_goal_goes_to_the_nearest_horizon_with_room() -> None:
    assert goal_horizon_placed(horizon="short_term", active={"short_term": 2}) == "short_term"
    assert goal_horizon_placed(horizon="short_term", active={"short_term": 3}) == "mid_term"
    assert goal_horizon_placed(horizon="long_term", active={"long_term": 3, "mid_term": 4}) == "short_term"
    assert goal_horizon_placed(horizon="mid_term", active={"mid_term": 4, "short_term": 3}) == "long_term"
    assert goal_horizon_placed(horizon="mid_term", active=HORIZON_MIX) is None


def test_goal_stats_count_by_status_and_horizon_with_mean_progress() -> None:
    stats = goal_stats([("active", "short_term", 0.2, 3, 1), ("active", "long_term", 0.6, 0, 2),
                        ("completed", "short_term", 1.0, 5, 0), ("abandoned", "mid_term", 0.1, 0, 4)])
    assert (stats.active, stats.completed, stats.abandoned) == (2, 1, 1)
    assert stats.active_by_horizon == {"short_term": 1, "mid_term": 0, "long_term": 1}
    assert stats.mean_progress == pytest.approx(0.4)
    assert (stats.times_advanced, stats.times_regressed) == (8, 7)
    assert goal_stats([]).mean_progress == 0.0
