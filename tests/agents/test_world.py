"""The persona world (seeds 000, 001): what actions do to needs, how long they take, when needs override."""

from __future__ import annotations

import pytest

from agents.world import (
    ACTIONS,
    RELIEVE_BELOW,
    URGENT_BELOW,
    action_apply,
    action_choose,
    action_hours,
    action_lesson,
    emotions_update,
    needs_changes,
    persona_situation,
    urgent_need,
)


def test_every_action_keeps_needs_within_zero_and_one() -> None:
    for name in ACTIONS:
        for level in (0.0, 0.05, 0.5, 0.95, 1.0):
            needs = dict.fromkeys(("hunger", "energy", "money", "social", "fun"), level)
            outcome = action_apply(name, needs)
            assert all(0.0 <= needs[k] + d <= 1.0 for k, d in outcome.need_deltas.items()), (name, level)


def test_action_with_an_unmet_requirement_fails_and_changes_nothing() -> None:
    outcome = action_apply("eat", {"hunger": 0.2, "money": 0.05})
    assert not outcome.succeeded and outcome.need_deltas == {} and "not enough money" in outcome.outcome


def test_actions_take_their_simulated_hours() -> None:
    assert action_hours("work") == 2.0 and action_hours("sleep") == 2.0 and action_hours("eat") == 1.0
    assert action_hours("no such action") == 1.0


def test_needs_change_by_the_effect_then_decay_over_the_hours() -> None:
    changes = needs_changes(needs={"energy": 0.5, "money": 0.5}, rates={"energy": 0.02, "money": 0.01},
                            deltas={"energy": 0.2}, hours=2)
    assert changes == {"energy": pytest.approx(0.2 - 0.04), "money": pytest.approx(-0.02)}


def test_a_need_without_a_decay_rate_does_not_decay() -> None:
    assert needs_changes(needs={"fun": 0.5}, rates={}, deltas={}, hours=3) == {"fun": 0.0}


def test_needs_never_decay_below_zero() -> None:
    assert needs_changes(needs={"fun": 0.01}, rates={"fun": 0.05}, deltas={}, hours=3) == {"fun": -0.01}


def test_an_urgent_need_overrides_a_step_that_does_not_relieve_it() -> None:
    needs = {"energy": URGENT_BELOW - 0.01, "hunger": 0.8, "money": 0.8}
    assert urgent_need(needs) == "energy"
    action, reason = action_choose(suggested="work", needs=needs)
    assert action == "sleep" and "energy is urgent" in reason


def test_an_urgent_need_overrides_a_step_whose_action_the_world_does_not_know() -> None:
    """A step's action hint written by hand (the admin edits everything) that names no action of the world relieves
    nothing: an urgent need overrides it as it would any other step."""
    needs = {"energy": URGENT_BELOW - 0.01, "hunger": 0.8, "money": 0.8}
    action, reason = action_choose(suggested="go dancing", needs=needs)
    assert action == "sleep" and "energy is urgent" in reason


def test_an_urgent_need_keeps_a_step_that_relieves_it() -> None:
    needs = {"hunger": URGENT_BELOW - 0.01, "money": 0.8}
    assert action_choose(suggested="eat", needs=needs) == ("eat", "")


def test_a_need_at_the_urgency_line_does_not_override() -> None:
    assert urgent_need({"energy": URGENT_BELOW}) is None
    assert action_choose(suggested="work", needs={"energy": URGENT_BELOW, "money": 0.5}) == ("work", "")


def test_money_is_never_urgent() -> None:
    assert urgent_need({"money": 0.0, "hunger": 0.9}) is None


def test_an_action_needing_a_need_the_person_does_not_have_is_not_held_back_by_it() -> None:
    """A person without a money need (removed in the admin) is not short of money: buying food works."""
    outcome = action_apply("buy food", {"hunger": 0.3})
    assert outcome.succeeded and outcome.need_deltas.get("hunger", 0) > 0


def test_urgent_hunger_without_money_cooks_instead_of_eating_out() -> None:
    action, _ = action_choose(suggested=None, needs={"hunger": 0.05, "money": 0.0})
    assert action == "cook" and action_apply(action, {"hunger": 0.05, "money": 0.0}).succeeded


def test_without_a_step_the_lowest_need_below_half_is_relieved_else_idle() -> None:
    assert action_choose(suggested=None, needs={"social": RELIEVE_BELOW - 0.1, "fun": 0.9})[0] == "call a friend"
    assert action_choose(suggested=None, needs={"social": RELIEVE_BELOW, "fun": 0.9}) == ("idle", "no plan step")


def test_a_failed_action_teaches_what_stood_in_the_way() -> None:
    assert action_lesson("eat", {"money": 0.0}) == "To eat I need money at 10% or more."
    assert action_lesson("eat", {"money": 0.5}) is None


def test_plan_prompt_situation_lines_carry_emotions_and_lessons() -> None:
    lines = persona_situation(emotions={"worry": 0.8, "hope": 0.25}, lessons=["Work before shopping."])
    assert lines == ["Emotions: hope 25%, worry 80%", "Lessons learned: Work before shopping."]
    assert persona_situation(emotions={}, lessons=[]) == []


def test_idle_lasts_until_the_first_need_decays_to_half_within_one_to_eight_hours() -> None:
    from agents.world import MAX_IDLE_HOURS, idle_hours

    assert idle_hours(needs={"hunger": 0.62, "fun": 0.9}, rates={"hunger": 0.03, "fun": 0.01}) == 5.0  # 47%
    assert idle_hours(needs={"hunger": 0.51}, rates={"hunger": 0.03}) == 1.0
    assert idle_hours(needs={"hunger": 0.58}, rates={"hunger": 0.03}) == 3.0  # below half after 2.7 h: whole hours
    assert idle_hours(needs={"hunger": 0.4}, rates={"hunger": 0.03}) == 1.0  # at least an hour
    assert idle_hours(needs={"hunger": 1.0}, rates={"hunger": 0.01}) == MAX_IDLE_HOURS == 8.0
    assert idle_hours(needs={"hunger": 0.9}, rates={}) == MAX_IDLE_HOURS  # nothing decays: wait the longest


def test_emotions_move_a_quarter_of_the_way_toward_what_needs_and_the_outcome_say() -> None:
    # The plan prompt quotes these moods (persona_situation): contentment follows the needs' mean, worry the
    # lowest need, hope rises only when a followed step worked, frustration when the action failed.
    calm = {"worry": 0.5, "contentment": 0.5, "frustration": 0.5, "hope": 0.5}
    worked = emotions_update(calm, needs={"hunger": 0.9, "energy": 0.1}, succeeded=True, followed_plan=True)
    assert worked == {"worry": 0.6, "contentment": 0.5, "frustration": 0.425, "hope": 0.55}
    content = emotions_update(calm, needs={"hunger": 1.0, "energy": 0.9}, succeeded=True, followed_plan=False)
    assert content["contentment"] == 0.613 and content["hope"] == 0.45
    failed = emotions_update(calm, needs={"hunger": 0.5}, succeeded=False, followed_plan=True)
    assert failed["frustration"] == 0.575 and failed["hope"] == 0.45
    nobody = emotions_update(calm, needs={}, succeeded=True, followed_plan=False)  # no needs: nothing to worry about
    assert nobody["worry"] == 0.375 and nobody["contentment"] == 0.625
