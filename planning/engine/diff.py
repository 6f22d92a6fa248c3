"""What changed between two versions of a plan (seed 002: plan diffs are logged and shown)."""

from __future__ import annotations

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


def plan_diff(old: Sequence[Mapping[str, Any]], new: Sequence[Mapping[str, Any]]) -> dict[str, list[Any]]:
    """Steps added, removed, changed (field -> [old, new]) and kept, matched by step key.

    A field counts only if either version has it, so a step dict without `tool` (a persona step)
    does not show a spurious change.
    """
    old_steps: dict[str, Mapping[str, Any]] = {}
    for position, step in enumerate(old, start=1):
        old_steps.setdefault(_step_key(step, position), step)
    new_keys: set[str] = set()
    added: list[dict[str, Any]] = []
    changed: list[dict[str, Any]] = []
    kept: list[str] = []
    for position, step in enumerate(new, start=1):
        key = _step_key(step, position)
        if key in new_keys:
            continue
        new_keys.add(key)
        before = old_steps.get(key)
        if before is None:
            added.append(dict(step))
            continue
        fields = {
            name: [before.get(name), step.get(name)]
            for name in COMPARED_FIELDS
            if (name in before or name in step)
            and _comparable(name, before.get(name)) != _comparable(name, step.get(name))
        }
        if fields:
            changed.append({"key": key, "fields": fields})
        else:
            kept.append(key)
    removed = [dict(step) for key, step in old_steps.items() if key not in new_keys]
    return {"added": added, "removed": removed, "changed": changed, "kept": kept}


def plan_diff_summary(diff: Mapping[str, Sequence[Any]]) -> str:
    """One line for the timeline: "2 added, 1 removed, 1 changed, 3 kept"."""
    parts = [f"{len(diff.get(name, []))} {name}" for name in ("added", "removed", "changed", "kept")]
    return ", ".join(parts)
