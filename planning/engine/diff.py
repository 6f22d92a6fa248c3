"""What changed between two versions of a plan (seed 002: plan diffs are logged and shown)."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

COMPARED_FIELDS = (
    "description",
    "tool",
    "input",
    "action_hint",
    "expected_outcome",
    "estimated_cycles",
    "depends_on",
    "requires_permission",
    "risk",
)


def _step_key(step: Mapping[str, Any], position: int) -> str:
    key = step.get("key", step.get("id"))
    return str(key) if key is not None else str(position)


def _comparable(field: str, value: Any) -> Any:
    if field == "depends_on" and isinstance(value, list | tuple):
        return sorted(str(v) for v in value)  # the order of dependencies means nothing
    return value


# What makes a step the same step when the planner renumbered it: what it does, not where it sits.
IDENTITY_FIELDS = ("description", "tool", "input", "action_hint")


def _same_work(before: Mapping[str, Any], after: Mapping[str, Any]) -> bool:
    return all(_comparable(name, before.get(name)) == _comparable(name, after.get(name)) for name in IDENTITY_FIELDS)


def _changes(before: Mapping[str, Any], after: Mapping[str, Any]) -> dict[str, list[Any]]:
    return {
        name: [before.get(name), after.get(name)]
        for name in COMPARED_FIELDS
        if (name in before or name in after)
        and _comparable(name, before.get(name)) != _comparable(name, after.get(name))
    }


def plan_diff(old: Sequence[Mapping[str, Any]], new: Sequence[Mapping[str, Any]]) -> dict[str, list[Any]]:
    """Steps added, removed, changed (field -> [old, new]) and kept, matched by step key.

    A step the planner renumbered (the same work under another key, while its old key now names other work) is
    matched to itself, with its key change shown (`"key": [old, new]`), not shown as rewritten and added again.
    A field counts only if either version has it, so a step dict without `tool` (a persona step)
    does not show a spurious change.
    """
    old_steps: dict[str, Mapping[str, Any]] = {}
    for position, step in enumerate(old, start=1):
        old_steps.setdefault(_step_key(step, position), step)
    new_steps: dict[str, Mapping[str, Any]] = {}
    for position, step in enumerate(new, start=1):
        new_steps.setdefault(_step_key(step, position), step)
    # Pairs (old key -> new key): the same key doing the same work; then the same work under another key;
    # then what is left under the same key (changed in place).
    pairs: dict[str, str] = {k: k for k, step in new_steps.items() if k in old_steps and _same_work(old_steps[k], step)}
    for key, step in new_steps.items():
        if key in pairs.values():
            continue
        moved = next((k for k, before in old_steps.items() if k not in pairs and _same_work(before, step)), None)
        if moved is not None:
            pairs[moved] = key
    for key in new_steps:
        if key not in pairs.values() and key in old_steps and key not in pairs:
            pairs[key] = key
    matched = {new_key: old_key for old_key, new_key in pairs.items()}
    added: list[dict[str, Any]] = []
    changed: list[dict[str, Any]] = []
    kept: list[str] = []
    for key, step in new_steps.items():
        old_key = matched.get(key)
        if old_key is None:
            added.append(dict(step))
            continue
        fields = _changes(old_steps[old_key], step)
        if old_key != key:
            fields = {"key": [old_key, key]} | fields
        if fields:
            changed.append({"key": key, "fields": fields})
        else:
            kept.append(key)
    removed = [dict(step) for key, step in old_steps.items() if key not in pairs]
    return {"added": added, "removed": removed, "changed": changed, "kept": kept}


# How a page names each field of a step (never the raw attribute name).
FIELD_LABELS = {
    "key": "Step id",
    "description": "Description",
    "tool": "Tool",
    "input": "Input",
    "action_hint": "Action",
    "expected_outcome": "Expected outcome",
    "estimated_cycles": "Estimated cycles",
    "depends_on": "Depends on",
    "requires_permission": "Requires permission",
    "risk": "Risk",
}


def field_value_shown(name: str, value: Any) -> str:
    """A field's value in words: yes/no, a list of step ids, JSON for a tool's input; "none" when empty."""
    if isinstance(value, bool):
        return "yes" if value else "no"
    if value is None or value == "" or value == [] or value == {}:
        return "none"
    if name == "depends_on" and isinstance(value, list | tuple):
        return ", ".join(str(v) for v in value)
    if isinstance(value, dict | list | tuple):
        return json.dumps(value, ensure_ascii=False, sort_keys=True)
    return str(value)


def field_changes_shown(fields: Mapping[str, Sequence[Any]]) -> list[tuple[str, str, str]]:
    """A changed step's fields as (label, before, after) in words: ("Requires permission", "yes", "no")."""
    return [(FIELD_LABELS.get(name, name.replace("_", " ").capitalize()), field_value_shown(name, pair[0]),
             field_value_shown(name, pair[1])) for name, pair in fields.items()]


def plan_diff_summary(diff: Mapping[str, Sequence[Any]]) -> str:
    """One line for the timeline: "2 added, 1 removed, 1 changed, 3 kept"."""
    parts = [f"{len(diff.get(name, []))} {name}" for name in ("added", "removed", "changed", "kept")]
    return ", ".join(parts)
