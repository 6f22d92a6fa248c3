"""Step states and dependency scheduling (seed 004): which steps may run now, which never will.

Plain values in, plain values out: steps are `(key, status, depends_on)` tuples in plan order.
"""

from __future__ import annotations

from collections.abc import Sequence

STATUSES = ("pending", "awaiting_approval", "running", "completed", "failed", "skipped", "declined", "rolled_back",
            "cancelled")
TERMINAL = {"completed", "skipped", "failed", "declined", "rolled_back", "cancelled"}
DONE = {"completed", "skipped"}  # a skipped dependency does not hold its dependents back

# Terminal states have no way out: a retry or a replan makes new work instead of reviving a step.
TRANSITIONS: dict[str, frozenset[str]] = {
    "pending": frozenset({"awaiting_approval", "running", "skipped", "failed", "declined"}),
    "awaiting_approval": frozenset({"pending", "running", "declined", "skipped"}),
    # running -> pending is a retry; running -> awaiting_approval a step interrupted while its tool ran, whose
    # outcome is unknown: a person decides whether it runs again (runtime/cycle.py steps_interrupted);
    # running -> cancelled its plan closed while it ran (CLOSED_AS)
    "running": frozenset({"completed", "failed", "pending", "awaiting_approval", "cancelled"}),
    "completed": frozenset({"rolled_back"}),  # an operator undid its changes (seed 003 rollback)
    "failed": frozenset(),
    "skipped": frozenset(),
    "declined": frozenset(),
    "rolled_back": frozenset(),
    "cancelled": frozenset(),
}

# What an unfinished step becomes when its plan is closed (cancelled by an operator or its agent, or closed
# because its goal finished): a step that never started is skipped; a running step began, so it is not
# skipped as if it never ran: it is cancelled, its outcome neither completed nor failed.
CLOSED_AS: dict[str, str] = {"pending": "skipped", "awaiting_approval": "skipped", "running": "cancelled"}

StepState = tuple[str, str, Sequence[str]]


class IllegalTransition(ValueError):
    """A step cannot go from one status to the other; the message names both."""


def step_transition_check(old: str, new: str) -> None:
    """Raise IllegalTransition unless a step may go from `old` to `new` (staying put is not a move)."""
    for status in (old, new):
        if status not in TRANSITIONS:
            raise IllegalTransition(f"unknown step status '{status}'")
    if old == new:
        raise IllegalTransition(f"step is already {old}")
    if new not in TRANSITIONS[old]:
        if old in TERMINAL:
            raise IllegalTransition(f"a {old} step cannot become {new}: {old} is final")
        raise IllegalTransition(f"a step cannot go from {old} to {new}")


def steps_transitions_refused(moves: Sequence[tuple[str, Sequence[str]]]) -> list[IllegalTransition | None]:
    """The one state machine for many steps at once (a pass's writes): each move is a step's status and the
    statuses it goes through in order (a pending step a cycle completes starts on the way: running, then
    completed), each checked by step_transition_check. For each move, in order, why it is refused (None: it may
    be made); a refused move is not made at all, its step left as it was."""
    refused: list[IllegalTransition | None] = []
    for old, path in moves:
        problem = None
        for new in path:
            try:
                step_transition_check(old, new)
            except IllegalTransition as exc:
                problem = exc
                break
            old = new
        refused.append(problem)
    return refused


def steps_runnable(steps: Sequence[StepState], *, limit: int = 1) -> list[str]:
    """Keys of pending steps whose dependencies are all completed or skipped, in plan order.

    At most `limit` steps run at once, so steps already running take up slots.
    """
    statuses: dict[str, set[str]] = {}
    for key, state, _ in steps:
        statuses.setdefault(key, set()).add(state)
    # A dependency is met only when every step with that key is done (keys should be unique anyway).
    done = {key for key, states in statuses.items() if states <= DONE}
    slots = limit - sum(1 for _, state, _ in steps if state == "running")
    runnable: list[str] = []
    for key, state, depends_on in steps:
        if len(runnable) >= slots:
            break
        if state == "pending" and key not in depends_on and all(dep in done for dep in depends_on):
            runnable.append(key)
    return runnable


def steps_blocked(steps: Sequence[StepState]) -> list[str]:
    """Pending steps that can never run: a dependency failed, was declined, is missing, or is in a cycle."""
    may_finish = {key for key, state, _ in steps if state in DONE | {"running", "awaiting_approval"}}
    pending = [(key, list(depends_on)) for key, state, depends_on in steps if state == "pending"]
    changed = True
    while changed:  # grow the set of steps that could still finish until nothing changes
        changed = False
        for key, depends_on in pending:
            if key not in may_finish and all(dep in may_finish for dep in depends_on):
                may_finish.add(key)
                changed = True
    return [key for key, _ in pending if key not in may_finish]
