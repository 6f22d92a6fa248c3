"""The persona world model: what each action does to needs (seeds 000 and 001).

Plain values only. Each cycle is one action, which takes its own simulated hours (an hour unless said);
needs and goals decay by the hours that passed.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

SIM_HOURS_PER_CYCLE = 1.0  # the hours an action takes unless it says otherwise
URGENT_BELOW = 0.15  # a need this low overrides the plan's suggestion
RELIEVE_BELOW = 0.5  # without a plan step, the person relieves their lowest need once it drops below this
MAX_IDLE_HOURS = 8.0  # nothing to do: the person passes the time until a need calls, at most this long


@dataclass(frozen=True)
class Action:
    name: str
    effects: Mapping[str, float]
    requires: Mapping[str, float] = field(default_factory=dict)  # need -> minimum satisfaction to succeed
    outcome: str = ""
    permission: bool = False  # an operator must say yes before a plan step does this
    hours: float = SIM_HOURS_PER_CYCLE  # simulated time the action takes


ACTIONS: dict[str, Action] = {
    a.name: a
    for a in [
        Action("look for work", {"social": 0.02, "energy": -0.03}, outcome="found a job lead"),
        Action("work", {"money": 0.15, "energy": -0.06, "fun": -0.02}, requires={"energy": 0.1}, outcome="earned a wage",
               hours=2.0),
        # Seed 000 completes a step only when satisfaction improved: the trip out is a small pleasure.
        Action("go to the store", {"fun": 0.02, "energy": -0.03}, outcome="arrived at the store"),
        Action("buy food", {"money": -0.15, "hunger": 0.1}, requires={"money": 0.15}, outcome="bought groceries",
               permission=True),
        Action("eat", {"hunger": 0.2, "energy": 0.02, "money": -0.04}, requires={"money": 0.1}, outcome="had a meal"),
        Action("cook", {"hunger": 0.15, "fun": 0.03, "energy": -0.02}, outcome="cooked dinner"),
        Action("go home", {"energy": 0.02}, outcome="got home"),
        Action("sleep", {"energy": 0.2, "hunger": -0.02}, outcome="slept well", hours=2.0),
        Action("call a friend", {"social": 0.1, "fun": 0.02}, outcome="had a nice chat"),
        Action("meet friend", {"social": 0.2, "fun": 0.08, "money": -0.08}, requires={"money": 0.1},
               outcome="spent time with a friend", permission=True),
        Action("relax", {"fun": 0.12, "energy": 0.02}, outcome="relaxed"),
        Action("idle", {}, outcome="did nothing in particular"),
    ]
}

# What to do when a need is urgent, whatever the plan says.
# Money is not a bodily need: being broke never overrides a plan (the plan is how the person earns).
URGENT_ACTION = {"hunger": "eat", "energy": "sleep", "social": "call a friend", "fun": "relax"}
# When the urgent action cannot succeed now (eating out needs money), what relieves the need instead.
URGENT_FALLBACK = {"hunger": "cook"}


@dataclass(frozen=True)
class ActionOutcome:
    action: str
    succeeded: bool
    need_deltas: dict[str, float]
    outcome: str


def action_apply(action: str, needs: Mapping[str, float]) -> ActionOutcome:
    """What doing `action` with these needs changes; an action whose requirement is unmet fails and changes nothing."""
    spec = ACTIONS.get(action) or ACTIONS["idle"]
    missing = [n for n, minimum in spec.requires.items() if needs.get(n, 1.0) < minimum]
    if missing:
        return ActionOutcome(spec.name, False, {}, f"could not {spec.name}: not enough {', '.join(missing)}")
    deltas: dict[str, float] = {}
    for need, delta in spec.effects.items():
        if need in needs:
            new = max(0.0, min(1.0, needs[need] + delta))
            if new != needs[need]:
                deltas[need] = round(new - needs[need], 4)
    return ActionOutcome(spec.name, True, deltas, spec.outcome)


def action_needs_permission(action: str) -> bool:
    spec = ACTIONS.get(action)
    return spec is not None and spec.permission


def urgent_need(needs: Mapping[str, float]) -> str | None:
    """The most pressing need below the urgency line that some action can relieve, if any."""
    urgent = sorted((value, name) for name, value in needs.items() if value < URGENT_BELOW and name in URGENT_ACTION)
    return urgent[0][1] if urgent else None


def relief_action(need: str, needs: Mapping[str, float]) -> str:
    """What relieves a need now: its usual action, or the fallback when that one would fail."""
    action = URGENT_ACTION[need]
    fallback = URGENT_FALLBACK.get(need)
    if fallback is not None and not action_apply(action, needs).succeeded:
        return fallback
    return action


def action_choose(*, suggested: str | None, needs: Mapping[str, float]) -> tuple[str, str]:
    """The action for this cycle and, when it is not the plan's suggestion, why (seed 000: urgent needs override)."""
    need = urgent_need(needs)
    if need is not None and (suggested is None or ACTIONS.get(suggested, ACTIONS["idle"]).effects.get(need, 0) <= 0):
        return relief_action(need, needs), f"{need} is urgent ({needs[need]:.0%})"
    if suggested:
        return suggested, ""
    # No plan step: relieve the lowest need.
    lowest = min(needs.items(), key=lambda item: item[1], default=None)
    if lowest and lowest[0] in URGENT_ACTION and lowest[1] < RELIEVE_BELOW:
        return relief_action(lowest[0], needs), f"no plan step; {lowest[0]} is lowest"
    return "idle", "no plan step"


def action_hours(action: str) -> float:
    """The simulated hours an action takes."""
    return (ACTIONS.get(action) or ACTIONS["idle"]).hours


def idle_hours(*, needs: Mapping[str, float], rates: Mapping[str, float]) -> float:
    """How long a person with nothing to do (no plan step, no low need) passes the time: until the first need
    has decayed below RELIEVE_BELOW, in whole hours, at least an hour and at most MAX_IDLE_HOURS. One idle
    action, not one per hour: the next cycle comes when there is something to do."""
    waits = [(value - RELIEVE_BELOW) / rate for name, value in needs.items() if (rate := rates.get(name, 0.0)) > 0]
    hours = math.floor(round(min(waits), 6)) + 1 if waits else MAX_IDLE_HOURS
    return float(max(SIM_HOURS_PER_CYCLE, min(MAX_IDLE_HOURS, hours)))


def needs_changes(*, needs: Mapping[str, float], rates: Mapping[str, float], deltas: Mapping[str, float],
                  hours: float) -> dict[str, float]:
    """How much each need changes in one cycle: the action's effect, then decay over the hours it took,
    kept within 0..1. Returned as changes so they can be applied to the stored value in one UPDATE."""
    changes: dict[str, float] = {}
    for name, value in needs.items():
        after = max(0.0, min(1.0, value + deltas.get(name, 0.0)))
        after = max(0.0, after - rates.get(name, 0.0) * hours)
        changes[name] = round(after - value, 4)
    return changes


def action_lesson(action: str, needs: Mapping[str, float]) -> str | None:
    """What a failed action teaches (seed 000's lessons): which need stood in the way, and by how much."""
    spec = ACTIONS.get(action)
    if spec is None:
        return None
    missing = [(n, minimum) for n, minimum in spec.requires.items() if needs.get(n, 1.0) < minimum]
    if not missing:
        return None
    need, minimum = missing[0]
    return f"To {spec.name} I need {need} at {minimum:.0%} or more."


def persona_situation(*, emotions: Mapping[str, float], lessons: Sequence[str]) -> list[str]:
    """Seed 000's plan inputs beyond needs, as prompt lines: the person's emotions and learned lessons."""
    lines = []
    if emotions:
        lines.append("Emotions: " + ", ".join(f"{k} {float(v):.0%}" for k, v in sorted(emotions.items())))
    if lessons:
        lines.append("Lessons learned: " + " ".join(lessons))
    return lines


def emotions_update(emotions: Mapping[str, float], *, needs: Mapping[str, float], succeeded: bool,
                    followed_plan: bool) -> dict[str, float]:
    """Emotions drift toward what the needs and the last outcome say: low needs worry, success satisfies,
    following a plan that works gives hope. Each moves a quarter of the way per cycle, so moods linger."""
    lowest = min(needs.values(), default=1.0)
    mean = sum(needs.values()) / len(needs) if needs else 1.0
    targets = {
        "worry": 1.0 - lowest,
        "contentment": mean,
        "frustration": 0.2 if succeeded else 0.8,
        "hope": 0.7 if followed_plan and succeeded else 0.3,
    }
    moved = dict(emotions)
    for name, target in targets.items():
        current = float(emotions.get(name, 0.5))
        moved[name] = round(current + (target - current) * 0.25, 3)
    return moved
