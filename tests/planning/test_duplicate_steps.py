"""Duplicate steps are refused (issue 52): the same tool with the same input twice, without a reason to repeat it, is
a rejection naming both steps, so the model's retry can leave the copy out; a check after a change is kept."""

from __future__ import annotations

from typing import Any

import pytest

from planning.engine.validate import plan_validate


def step(key: str, tool: str, tool_input: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {"id": key, "tool": tool, "intent": f"Use {tool}", "input": tool_input, "requiresPermission": True, **extra}


def test_a_copy_listed_three_times_is_refused_with_the_reason() -> None:
    """What SmolLM2 wrote for "back up data.csv into backup/": the third copy failed at run time before."""
    copy = {"path": "data.csv", "to": "backup/data.csv"}
    result = plan_validate({"steps": [step("1", "file.copy", copy), step("2", "file.copy", dict(copy)),
                                      step("3", "file.copy", dict(copy))]}, kind="tool")
    assert not result.ok and result.plan is None
    assert result.problems == [
        "step 2 repeats step 1 (file.copy with the same input as step 1): a change is made once; leave the copy out, "
        "or give the step 'repeat' if it must run more than once",
        "step 3 repeats step 2 (file.copy with the same input as step 2): a change is made once; leave the copy out, "
        "or give the step 'repeat' if it must run more than once",
    ]


@pytest.mark.parametrize(("first", "second"), [
    ({"path": "notes.txt"}, {"path": "./notes.txt"}),
    ({"path": "notes.txt"}, {"path": " notes.txt "}),
])
def test_the_same_input_written_another_way_is_the_same_step(first: dict[str, str], second: dict[str, str]) -> None:
    result = plan_validate({"steps": [step("1", "file.read", first, requiresPermission=False),
                                      step("2", "file.read", second, requiresPermission=False)]}, kind="tool")
    assert result.problems == ["step 2 repeats step 1 (file.read with the same input as step 1) with nothing changed "
                               "in between: leave the copy out"]


def test_reading_a_file_again_after_changing_it_is_a_check_and_kept() -> None:
    result = plan_validate({"steps": [
        step("1", "file.read", {"path": "log.txt"}, requiresPermission=False),
        step("2", "file.append", {"path": "log.txt", "content": "done"}, dependsOn=["1"]),
        step("3", "file.read", {"path": "log.txt"}, requiresPermission=False, dependsOn=["2"]),
    ]}, kind="tool")
    assert result.ok, result.problems


def test_the_same_tool_on_other_inputs_is_no_duplicate() -> None:
    result = plan_validate({"steps": [step("1", "file.copy", {"path": "a.txt", "to": "backup/a.txt"}),
                                      step("2", "file.copy", {"path": "b.txt", "to": "backup/b.txt"})]}, kind="tool")
    assert result.ok, result.problems


def test_a_persona_may_eat_twice() -> None:
    data = {"steps": [{"id": str(i), "description": d, "action_hint": a, "expected_outcome": "ok", "estimated_cycles": 1}
                      for i, (d, a) in enumerate([("Eat", "eat"), ("Work", "work"), ("Eat again", "eat")], 1)]}
    assert plan_validate(data, kind="persona", allowed_actions=["eat", "work"]).ok
