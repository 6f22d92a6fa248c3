"""plan_validate: precise reasons for rejected plans, safe-side corrections for accepted ones, never an exception."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from planning.engine.validate import PERSONA_STEP_FIELDS, TOOL_STEP_FIELDS, plan_validate

ACTIONS = ["look for work", "work", "go to the store", "buy food", "eat", "go home", "sleep"]


def tool_step(key: str, tool: str, tool_input: dict[str, Any], permission: bool, **extra: Any) -> dict[str, Any]:
    return {"id": key, "tool": tool, "intent": f"Use {tool}", "input": tool_input, "requiresPermission": permission, **extra}


def test_plan_validate_tool_plan_becomes_step_specs() -> None:
    data = {
        "goal": "Convert",
        "thinking_summary": "Read first.",
        "confidence": 0.9,
        "risks": ["Overwrites data.json"],
        "steps": [
            tool_step("1", "file.read", {"path": "data.csv"}, False, expects="a header row"),
            tool_step("2", "file.convert", {"path": "data.csv", "to": "json"}, True, dependsOn=["1"]),
        ],
    }
    result = plan_validate(data, kind="tool")
    assert result.ok and result.plan is not None
    assert result.flags == []
    first, second = result.plan.steps
    assert (first.key, first.tool, first.risk, first.requires_permission, first.expected_outcome) == (
        "1", "file.read", "safe", False, "a header row"
    )
    assert (second.risk, second.requires_permission, second.depends_on) == ("risky", True, ["1"])
    assert result.plan.risks == ["Overwrites data.json"]
    assert result.plan.confidence == 0.9


def test_plan_validate_raises_permission_of_risky_steps_and_says_so() -> None:
    data = {"steps": [tool_step("1", "dir.create", {"path": "out"}, False, risk="safe")]}
    result = plan_validate(data, kind="tool")
    assert result.ok and result.plan is not None
    assert result.plan.steps[0].requires_permission is True
    assert result.plan.steps[0].risk == "risky"
    # Operator-facing: no camelCase field name of the model's JSON (issue 50).
    assert result.flags == ["step 1: dir.create writes files, so it now needs permission and it is marked risky "
                            "(the plan said it did not)"]


def test_plan_validate_keeps_extra_caution_on_reads() -> None:
    result = plan_validate({"steps": [tool_step("1", "file.read", {"path": "a"}, True, risk="risky")]}, kind="tool")
    assert result.plan is not None
    assert (result.plan.steps[0].requires_permission, result.plan.steps[0].risk) == (True, "risky")


def test_plan_validate_rejection_has_no_plan_and_every_reason() -> None:
    data = {"steps": [tool_step("1", "file.nuke", {}, False), tool_step("1", "file.read", {"path": "../x"}, False)]}
    result = plan_validate(data, kind="tool")
    assert not result.ok and result.plan is None
    assert any("unknown tool 'file.nuke'" in p for p in result.problems)
    assert any("escapes the workspace" in p for p in result.problems)
    assert any("duplicate step id '1'" in p for p in result.problems)


def test_plan_validate_max_steps_is_configurable() -> None:
    steps = [tool_step(str(i), "file.list", {"path": f"folder{i}"}, False) for i in range(1, 5)]  # 4 distinct steps
    assert plan_validate({"steps": steps}, kind="tool", max_steps=4).ok
    assert plan_validate({"steps": steps}, kind="tool", max_steps=3).problems == ["too many steps: 4 > 3"]


def test_plan_validate_symlink_escape_in_real_workspace(tmp_path: Path) -> None:
    workspace, outside = tmp_path / "ws", tmp_path / "outside"
    workspace.mkdir()
    outside.mkdir()
    (outside / "secret.txt").write_text("secret")
    os.symlink(outside, workspace / "link")
    data = {"steps": [tool_step("1", "file.read", {"path": "link/secret.txt"}, False)]}
    lexically = plan_validate(data, kind="tool")
    assert lexically.ok  # without the workspace only the words can be judged
    result = plan_validate(data, kind="tool", workspace=workspace)
    assert result.problems == ["step 1: path 'link/secret.txt' leads outside the workspace (through a symbolic link)"]


def test_plan_validate_absolute_path_inside_workspace_is_allowed(tmp_path: Path) -> None:
    data = {"steps": [tool_step("1", "file.read", {"path": str(tmp_path / "a.txt")}, False)]}
    assert plan_validate(data, kind="tool", workspace=tmp_path).ok
    assert not plan_validate(data, kind="tool").ok


def test_plan_validate_persona_steps_wait_for_the_one_before() -> None:
    data = {
        "steps": [
            {"description": "Go home", "action_hint": "Go Home", "expected_outcome": "home", "estimated_cycles": 1},
            {"description": "Sleep", "action_hint": "sleep", "expected_outcome": "rested"},
            {"id": "x", "description": "Eat", "action_hint": "eat", "depends_on": []},
        ]
    }
    result = plan_validate(data, kind="persona", allowed_actions=ACTIONS)
    assert result.plan is not None
    steps = result.plan.steps
    assert [(s.key, s.action_hint, s.depends_on, s.estimated_cycles) for s in steps] == [
        ("1", "go home", [], 1),
        ("2", "sleep", ["1"], 1),
        ("x", "eat", [], 1),  # an explicit empty list is the model's choice
    ]
    assert all(s.tool == "" and s.risk == "safe" and not s.requires_permission for s in steps)


def test_plan_validate_persona_without_allowed_actions_takes_any_action() -> None:
    data = {"steps": [{"description": "Dance", "action_hint": "dance"}, {"description": "Rest", "action_hint": "rest"}]}
    assert plan_validate(data, kind="persona").ok


def test_plan_validate_unknown_kind_is_a_programming_error() -> None:
    with pytest.raises(ValueError, match="unknown plan kind"):
        plan_validate({"steps": []}, kind="robot")


# -- never raises --------------------------------------------------------------------------------

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=12),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=12,
)
STEP_KEYS = sorted({name for fields in (TOOL_STEP_FIELDS, PERSONA_STEP_FIELDS) for names in fields.values() for name in names})
step_values = st.one_of(
    json_values,
    st.sampled_from(["file.read", "file.write", "web.fetch", "1", "2", "../x", "/etc", "eat", "TODO", "rm -rf /"]),
    st.dictionaries(st.sampled_from(["path", "content", "to", "output", "paths", "url", "max_sentences"]), json_values),
)
plan_steps = st.lists(
    st.dictionaries(st.sampled_from([*STEP_KEYS, "extra"]), step_values, max_size=8) | json_values, max_size=6
)
plans = st.dictionaries(
    st.sampled_from(["goal", "steps", "plan", "risks", "confidence", "ready", "thinking_summary", "oops"]),
    st.one_of(json_values, plan_steps),
    max_size=6,
)


@settings(max_examples=200, deadline=None)
@given(st.one_of(plans, st.dictionaries(st.text(max_size=8), json_values)), st.sampled_from(["tool", "persona"]))
def test_plan_validate_never_raises(data: dict[str, Any], kind: str) -> None:
    result = plan_validate(data, kind=kind, allowed_actions=ACTIONS if kind == "persona" else ())
    assert (result.plan is None) == bool(result.problems)
    if result.plan is not None:
        keys = [s.key for s in result.plan.steps]
        assert len(keys) == len(set(keys))
        for step in result.plan.steps:
            assert set(step.depends_on) <= set(keys)
            if kind == "tool" and step.tool in ("file.write", "web.fetch"):
                assert step.requires_permission


def test_etc_passwd_in_a_path_is_judged_as_a_path_never_as_a_shell_command() -> None:
    def plan(path: str, intent: str = "Read it") -> dict[str, Any]:
        return {"steps": [{"id": "1", "tool": "file.read", "intent": intent, "input": {"path": path},
                           "requiresPermission": False}]}

    outside = plan_validate(plan("/etc/passwd"), kind="tool")
    assert outside.problems == ["step 1: absolute path '/etc/passwd' is not allowed; use a path relative to the workspace"]
    assert plan_validate(plan("backup/etc/passwd"), kind="tool").ok
    said = plan_validate(plan("notes.txt", intent="Then cat /etc/passwd"), kind="tool")
    assert said.problems == ["step 1: prohibited reference to a system file: '/etc/passwd'"]


@pytest.mark.parametrize("kind", ["tool", "persona"])
def test_a_step_has_one_type_from_parse_to_row_and_back(kind: str) -> None:
    """A validated StepSpec stored as a PlanStep comes back as the same StepSpec (`spec()`), and written out in
    the model's shape (`step_plan_data`) it validates again to the same StepSpec: loops and tools too."""
    from planning.engine.validate import step_plan_data
    from planning.models import PlanStep

    if kind == "tool":
        steps: list[dict[str, Any]] = [
            tool_step("1", "file.read", {"path": "notes.txt"}, False, repeat=2, toolsNeeded=["file.read"]),
            tool_step("2", "file.write", {"path": "out.txt", "content": "Summary of notes"}, True, dependsOn=["1"],
                      expects="a file"),
        ]
    else:
        steps = [{"id": "a", "description": "Find a job", "action_hint": "look for work", "estimated_cycles": 3,
                  "tools_needed": ["browser"]},
                 {"id": "b", "description": "Work a shift", "action_hint": "work", "expected_outcome": "paid"}]
    result = plan_validate({"steps": steps}, kind=kind, allowed_actions=ACTIONS)
    assert result.plan is not None, result.problems
    rows = [PlanStep(key=s.key, position=n, description=s.description, action_hint=s.action_hint, tool=s.tool,
                     tool_input=s.input, expected_outcome=s.expected_outcome, estimated_cycles=s.estimated_cycles,
                     depends_on=s.depends_on, requires_permission=s.requires_permission, risk=s.risk,
                     tools_needed=s.tools_needed, loop=s.loop) for n, s in enumerate(result.plan.steps, start=1)]
    specs = [row.spec() for row in rows]
    assert specs == result.plan.steps
    assert set(specs[0].as_dict()) == {"key", "description", "tool", "input", "action_hint", "expected_outcome",
                                       "estimated_cycles", "depends_on", "requires_permission", "risk",
                                       "tools_needed", "loop"}
    assert rows[0].diff_values() == specs[0].as_dict() | {"status": "pending"}
    again = plan_validate({"steps": [step_plan_data(s, kind) for s in specs]}, kind=kind, allowed_actions=ACTIONS)
    assert again.plan is not None and again.plan.steps == specs


def test_a_step_using_both_loop_marks_outside_a_loop_names_both() -> None:
    """The refusal names each mark the step uses, so the planner's retry (and the operator) knows what to fix."""
    step = tool_step("1", "file.write", {"path": "out/{index}.txt", "content": "{item}"}, True)
    result = plan_validate({"steps": [step]}, kind="tool")
    assert not result.ok
    assert any(p.endswith("{index}, {item} is only filled in inside a loop; add 'forEach' or 'repeat'")
               for p in result.problems), result.problems


@pytest.mark.parametrize("runs", [0, -2, 10_000, "3", 2.5, True])
def test_a_repeat_that_is_not_a_whole_number_in_range_is_refused_with_why(runs: object) -> None:
    """Seed 002's REPEAT runs a step 1 to MAX_LOOP_RUNS times: zero, too many, or not a whole number is a problem
    the model's retry can fix, never a crash and never a loop that runs no times."""
    from planning.engine.validate import MAX_LOOP_RUNS

    data = {"steps": [tool_step("1", "file.write", {"path": "part-{index}.txt", "content": "x"}, True, repeat=runs)]}
    result = plan_validate(data, kind="tool")
    assert not result.ok
    assert f"step 1: 'repeat' must be a whole number from 1 to {MAX_LOOP_RUNS}" in result.problems
