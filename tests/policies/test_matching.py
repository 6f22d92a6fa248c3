"""Which rule decides an item: conditions, order, time windows and the safe defaults (pure, no database)."""

from __future__ import annotations

from datetime import time

import pytest

from policies.engine import Item, ordered, rule_matches, rule_problems, rules_decide, time_within
from policies.models import Policy, Rule


def item(**kwargs: object) -> Item:
    values: dict[str, object] = {"kind": "step", "agent_id": 1, "tools": ("file.read",), "risky": False,
                                 "requires_permission": False, "estimated_cycles": 1, "at": time(10, 0)}
    values.update(kwargs)
    return Item(**values)  # type: ignore[arg-type]


def rule(position: int = 1, policy: Policy | None = None, **kwargs: object) -> Rule:
    values: dict[str, object] = {"action": Rule.Action.APPROVE}
    values.update(kwargs)
    return Rule(policy=policy or Policy(name="Routine", position=1), position=position, **values)


def test_a_rule_with_no_condition_approves_a_safe_step() -> None:
    assert rule_matches(rule(), item())


@pytest.mark.parametrize(("conditions", "matching", "other"), [
    ({"agent_id": 7}, {"agent_id": 7}, {"agent_id": 8}),
    ({"tools": "file.read, file.list"}, {"tools": ("file.list",)}, {"tools": ("file.write",)}),
    ({"risk": Rule.Risk.SAFE, "action": Rule.Action.ESCALATE}, {"risky": False}, {"risky": True}),
    ({"risk": Rule.Risk.RISKY, "action": Rule.Action.ESCALATE}, {"risky": True}, {"risky": False}),
    ({"requires_permission": Rule.Permission.NO}, {"requires_permission": False}, {"requires_permission": True}),
    ({"max_estimated_cycles": 3}, {"estimated_cycles": 3}, {"estimated_cycles": 4}),
    ({"active_from": time(9), "active_until": time(17)}, {"at": time(16, 59)}, {"at": time(17, 0)}),
    ({"applies_to": Rule.Applies.PLANS}, {"kind": "plan"}, {"kind": "step"}),
])
def test_each_condition_admits_what_it_names_and_nothing_else(conditions: dict[str, object],
                                                               matching: dict[str, object],
                                                               other: dict[str, object]) -> None:
    assert rule_matches(rule(**conditions), item(**matching))
    assert not rule_matches(rule(**conditions), item(**other))


def test_a_plan_matches_tools_only_when_every_step_uses_one_of_them() -> None:
    both = rule(applies_to=Rule.Applies.BOTH, tools="file.read,file.list")
    assert rule_matches(both, item(kind="plan", tools=("file.read", "file.list")))
    assert not rule_matches(both, item(kind="plan", tools=("file.read", "file.delete")))
    assert not rule_matches(both, item(kind="plan", tools=()))


def test_a_time_window_past_midnight_wraps() -> None:
    assert time_within(time(23, 30), time(22), time(6))
    assert time_within(time(5, 59), time(22), time(6))
    assert not time_within(time(12), time(22), time(6))
    assert time_within(time(12), None, None)
    assert time_within(time(12), time(9), None) and not time_within(time(8), time(9), None)


def test_the_first_matching_rule_wins_across_rules_and_policies() -> None:
    first, second = Policy(name="A first", position=1), Policy(name="B second", position=2)
    rules = ordered([
        rule(1, second, action=Rule.Action.APPROVE),
        rule(2, first, action=Rule.Action.ESCALATE),
        rule(1, first, action=Rule.Action.DECLINE, reason="not on weekdays", tools="file.write"),
    ])
    assert [(r.policy.name, r.position) for r in rules] == [("A first", 1), ("A first", 2), ("B second", 1)]
    match = rules_decide(rules, item(tools=("file.read",)))
    assert match is not None and match.action == "escalate" and match.label == "policy: A first, rule 2"
    match = rules_decide(rules, item(tools=("file.write",)))
    assert match is not None and match.action == "decline"
    assert rules_decide([], item()) is None


def test_safe_defaults_never_approve_risky_or_permission_steps_unless_the_rule_names_them() -> None:
    risky, permission = item(risky=True), item(requires_permission=True, risky=True)
    assert not rule_matches(rule(), risky)
    assert not rule_matches(rule(), permission)
    assert not rule_matches(rule(approve_risky=True), permission)  # needs permission too: not named
    assert rule_matches(rule(approve_risky=True), risky)
    assert rule_matches(rule(approve_risky=True, approve_permission=True), permission)
    # Declining or escalating a risky step needs nothing named: it only makes a person's decision safer.
    assert rule_matches(rule(action=Rule.Action.ESCALATE), permission)
    assert rule_matches(rule(action=Rule.Action.DECLINE, reason="no"), permission)
    # A later rule may still decide what an approving rule passed over.
    match = rules_decide([rule(1), rule(2, action=Rule.Action.ESCALATE)], permission)
    assert match is not None and match.rule.position == 2


def test_a_plan_with_permission_steps_may_be_approved_its_risky_steps_only_when_named() -> None:
    assert rule_matches(rule(applies_to=Rule.Applies.PLANS), item(kind="plan", requires_permission=True))
    assert not rule_matches(rule(applies_to=Rule.Applies.PLANS), item(kind="plan", risky=True))


def test_contradictory_rules_are_explained() -> None:
    assert rule_problems(rule(action=Rule.Action.DECLINE)) == [
        "A decline needs a reason: the agent replans with it as feedback."]
    assert "never approve anything" in rule_problems(rule(risk=Rule.Risk.RISKY))[0]
    assert "never approve anything" in rule_problems(rule(requires_permission=Rule.Permission.YES))[0]
    assert "never apply" in rule_problems(rule(active_from=time(9), active_until=time(9)))[0]
    assert rule_problems(rule(risk=Rule.Risk.RISKY, approve_risky=True)) == []
