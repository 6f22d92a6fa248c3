"""Step states and dependency scheduling: nothing runs before what it waits for, nothing waits forever unseen."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from planning.engine.schedule import (
    CLOSED_AS,
    STATUSES,
    TERMINAL,
    IllegalTransition,
    step_transition_check,
    steps_blocked,
    steps_runnable,
)


@pytest.mark.parametrize(
    ("old", "new"),
    [
        ("pending", "running"),
        ("pending", "awaiting_approval"),
        ("awaiting_approval", "running"),
        ("awaiting_approval", "pending"),
        ("awaiting_approval", "declined"),
        ("running", "completed"),
        ("running", "failed"),
        ("running", "pending"),
        ("running", "awaiting_approval"),  # interrupted while its tool ran: a person decides (issue 53)
        ("pending", "skipped"),
        ("running", "cancelled"),  # its plan was closed while it ran
    ],
)
def test_step_transition_check_allows(old: str, new: str) -> None:
    step_transition_check(old, new)


@pytest.mark.parametrize(
    ("old", "new", "message"),
    [
        ("completed", "running", "a completed step cannot become running: completed is final"),
        ("declined", "pending", "declined is final"),
        ("pending", "completed", "a step cannot go from pending to completed"),
        ("running", "skipped", "from running to skipped"),
        ("pending", "cancelled", "from pending to cancelled"),
        ("cancelled", "running", "cancelled is final"),
        ("running", "running", "step is already running"),
        ("pending", "paused", "unknown step status 'paused'"),
    ],
)
def test_step_transition_check_refuses(old: str, new: str, message: str) -> None:
    with pytest.raises(IllegalTransition, match=message):
        step_transition_check(old, new)


def test_terminal_statuses_have_no_way_out_but_an_operator_rollback() -> None:
    for old in TERMINAL:
        for new in STATUSES:
            if (old, new) == ("completed", "rolled_back"):
                step_transition_check(old, new)  # seed 003: an operator undoes a completed step
                continue
            with pytest.raises(IllegalTransition):
                step_transition_check(old, new)


def test_a_closed_plans_steps_end_as_they_stood_never_a_running_one_skipped() -> None:
    assert CLOSED_AS == {"pending": "skipped", "awaiting_approval": "skipped", "running": "cancelled"}
    assert set(CLOSED_AS) == set(STATUSES) - TERMINAL  # every unfinished step ends, and only those
    for old, new in CLOSED_AS.items():
        step_transition_check(old, new)


def test_steps_runnable_waits_for_dependencies() -> None:
    steps = [("1", "completed", []), ("2", "pending", ["1"]), ("3", "pending", ["2"]), ("4", "pending", [])]
    assert steps_runnable(steps, limit=5) == ["2", "4"]
    assert steps_runnable(steps) == ["2"]  # one at a time, in plan order


def test_steps_runnable_counts_running_steps_against_the_limit() -> None:
    steps = [("1", "running", []), ("2", "pending", []), ("3", "pending", [])]
    assert steps_runnable(steps, limit=1) == []
    assert steps_runnable(steps, limit=2) == ["2"]


def test_steps_runnable_skipped_dependency_does_not_hold_back() -> None:
    assert steps_runnable([("1", "skipped", []), ("2", "pending", ["1"])]) == ["2"]


@pytest.mark.parametrize("status", ["failed", "declined", "awaiting_approval", "pending", "running"])
def test_steps_runnable_unfinished_dependency_holds_back(status: str) -> None:
    assert steps_runnable([("1", status, []), ("2", "pending", ["1"])], limit=3) == (["1"] if status == "pending" else [])


def test_steps_runnable_missing_or_self_dependency_never_runs() -> None:
    assert steps_runnable([("1", "pending", ["9"]), ("2", "pending", ["2"])], limit=2) == []


def test_steps_blocked_follows_failures_through_the_chain() -> None:
    steps = [
        ("1", "failed", []),
        ("2", "pending", ["1"]),
        ("3", "pending", ["2"]),
        ("4", "pending", []),
        ("5", "declined", []),
        ("6", "pending", ["5", "4"]),
        ("7", "pending", ["8"]),
        ("9", "pending", ["10"]),
        ("10", "pending", ["9"]),
        ("11", "pending", ["4"]),
    ]
    assert steps_blocked(steps) == ["2", "3", "6", "7", "9", "10"]


def test_steps_blocked_is_empty_while_work_can_go_on() -> None:
    steps = [("1", "running", []), ("2", "pending", ["1"]), ("3", "awaiting_approval", []), ("4", "pending", ["3"])]
    assert steps_blocked(steps) == []


@st.composite
def step_tables(draw: st.DrawFn) -> list[tuple[str, str, list[str]]]:
    count = draw(st.integers(min_value=0, max_value=8))
    keys = [str(i) for i in range(1, count + 1)]
    return [
        (key, draw(st.sampled_from(STATUSES)), draw(st.lists(st.sampled_from([*keys, "ghost"]), max_size=3)))
        for key in keys
    ]


@settings(max_examples=300, deadline=None)
@given(step_tables(), st.integers(min_value=0, max_value=4))
def test_steps_runnable_never_releases_a_step_early(steps: list[tuple[str, str, list[str]]], limit: int) -> None:
    status = {key: state for key, state, _ in steps}
    runnable = steps_runnable(steps, limit=limit)
    running = sum(1 for _, state, _ in steps if state == "running")
    assert len(runnable) <= max(limit - running, 0)
    blocked = steps_blocked(steps)
    for key, state, depends_on in steps:
        if key in runnable:
            assert state == "pending"
            assert all(status.get(dep) in ("completed", "skipped") for dep in depends_on)
            assert key not in blocked


def test_a_list_of_moves_is_checked_step_by_step_along_each_path() -> None:
    from planning.engine.schedule import steps_transitions_refused

    refused = steps_transitions_refused([("pending", ["running", "completed"]), ("pending", ["completed"]),
                                         ("completed", ["running"]), ("running", []), ("awaiting_approval", ["pending"])])
    assert [str(r) if r else None for r in refused] == [
        None, "a step cannot go from pending to completed", "a completed step cannot become running: completed is final",
        None, None]
