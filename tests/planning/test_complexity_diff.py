"""Goal complexity (seed 004) and plan diffs between versions (seed 002)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from planning.engine.complexity import goal_complexity, should_plan, tool_single_step
from planning.engine.diff import plan_diff, plan_diff_summary


def test_goal_complexity_simple_goal_needs_no_plan() -> None:
    assert goal_complexity("eat") < 0.3
    assert not should_plan("eat")
    assert goal_complexity("") == 0.0


def test_goal_complexity_multi_part_goal_needs_a_plan() -> None:
    goal = "Read every CSV file, convert each to JSON, then summarize the notes and write a report."
    assert goal_complexity(goal) > goal_complexity("Convert data.csv to JSON")
    assert should_plan(goal)


def test_goal_complexity_structure_counts() -> None:
    flat = "read the notes and write a report"
    listed = "1. read the notes\n2. write a report\n3. send it"
    assert goal_complexity(listed) > goal_complexity(flat)


def test_should_plan_threshold_is_respected() -> None:
    goal = "Convert data.csv to JSON and write a summary"
    score = goal_complexity(goal)
    assert should_plan(goal, threshold=score)
    assert not should_plan(goal, threshold=score + 0.01)


@pytest.mark.parametrize(("goal", "expected"), [
    (" ".join(["lorem"] * 40), 0.25),  # length alone, saturated: 25%
    (" ".join(["lorem"] * 80), 0.25),  # twice as long weighs no more: length is saturated at 40 words
    ("read write sort count", 0.25 * 4 / 40 + 0.30),  # four action verbs: 30% (and a little length)
    ("x and then after", 0.25 * 4 / 40 + 0.30),  # three sequencing words: 30%
    ("x, y, z, w, v", 0.25 * 5 / 40 + 0.15),  # four commas of structure: 15%
])
def test_goal_complexity_weighs_length_25_verbs_30_multi_action_30_structure_15(goal: str, expected: float) -> None:
    assert goal_complexity(goal) == round(expected, 3)



@given(st.text(max_size=500))
def test_goal_complexity_is_between_0_and_1(goal: str) -> None:
    assert 0.0 <= goal_complexity(goal) <= 1.0


def test_plan_diff_added_removed_changed_kept() -> None:
    old = [
        {"key": "1", "description": "Read data.csv", "tool": "file.read", "input": {"path": "data.csv"}, "depends_on": []},
        {"key": "2", "description": "Convert", "tool": "file.convert", "input": {"path": "data.csv", "to": "json"},
         "depends_on": ["1"], "requires_permission": True},
        {"key": "3", "description": "Check", "tool": "file.read", "input": {"path": "data.json"}, "depends_on": ["2"]},
    ]
    new = [
        old[0],
        {**old[1], "input": {"path": "data.csv", "to": "json", "output": "out/data.json"}},
        {"key": "4", "description": "Check the output", "tool": "file.read", "input": {"path": "out/data.json"},
         "depends_on": ["2"]},
    ]
    diff = plan_diff(old, new)
    assert diff["kept"] == ["1"]
    assert diff["changed"] == [
        {"key": "2", "fields": {"input": [{"path": "data.csv", "to": "json"},
                                          {"path": "data.csv", "to": "json", "output": "out/data.json"}]}}
    ]
    assert [s["key"] for s in diff["added"]] == ["4"]
    assert [s["key"] for s in diff["removed"]] == ["3"]
    assert plan_diff_summary(diff) == "1 added, 1 removed, 1 changed, 1 kept"


def test_plan_diff_dependency_order_is_not_a_change() -> None:
    old = [{"key": "3", "description": "x", "depends_on": ["1", "2"]}]
    new = [{"key": "3", "description": "x", "depends_on": ["2", "1"]}]
    assert plan_diff(old, new) == {"added": [], "removed": [], "changed": [], "kept": ["3"]}


def test_plan_diff_matches_steps_by_id_when_there_is_no_key() -> None:
    diff = plan_diff([{"id": "a", "action_hint": "work"}], [{"id": "a", "action_hint": "look for work"}])
    assert diff["changed"] == [{"key": "a", "fields": {"action_hint": ["work", "look for work"]}}]


@pytest.mark.parametrize(
    ("goal", "step"),
    [
        ("Read notes.txt", ("file.read", "notes.txt")),
        ("Summarize docs/ideas.md.", ("text.summarize", "docs/ideas.md")),
        ("List the folder notes", ("file.list", "notes")),
    ],
)
def test_tool_single_step_for_one_read_on_a_named_file(goal: str, step: tuple[str, str]) -> None:
    found = tool_single_step(goal)
    assert found is not None and (found["tool"], found["input"]) == (step[0], {"path": step[1]})


@pytest.mark.parametrize("goal", ["List the workspace", "Read the notes", "Write notes.txt", "Read a.txt and b.txt"])
def test_tool_single_step_leaves_everything_else_to_the_model(goal: str) -> None:
    assert tool_single_step(goal) is None


def test_plan_diff_matches_steps_without_key_or_id_by_position() -> None:
    old = [{"description": "Read data.csv"}, {"description": "Write a report"}]
    new = [{"description": "Read data.csv"}, {"description": "Write a short report"}]
    assert plan_diff(old, new) == {
        "added": [], "removed": [], "kept": ["1"],
        "changed": [{"key": "2", "fields": {"description": ["Write a report", "Write a short report"]}}],
    }


def test_plan_diff_matches_a_renumbered_step_to_itself() -> None:
    old = [
        {"key": "1", "description": "Go to the store", "action_hint": "go to the store", "depends_on": []},
        {"key": "2", "description": "Buy some food", "action_hint": "buy food", "depends_on": ["1"]},
        {"key": "3", "description": "Eat a meal", "action_hint": "eat", "depends_on": ["2"]},
    ]
    new = [
        old[0],
        {"key": "2", "description": "Earn some money", "action_hint": "work", "depends_on": ["1"]},
        {**old[1], "key": "3", "depends_on": ["2"]},
        {**old[2], "key": "4", "depends_on": ["3"]},
    ]
    diff = plan_diff(old, new)
    assert [s["key"] for s in diff["added"]] == ["2"]  # the one new step, and only it
    assert diff["removed"] == []
    assert diff["changed"] == [
        {"key": "3", "fields": {"key": ["2", "3"], "depends_on": [["1"], ["2"]]}},
        {"key": "4", "fields": {"key": ["3", "4"], "depends_on": [["2"], ["3"]]}},
    ]
    assert diff["kept"] == ["1"]
