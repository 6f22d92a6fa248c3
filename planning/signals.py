"""What the planning services tell the apps above them, which they never import (tests/test_layers.py): the
approval policies (policies/apps.py) connect here.

Both are sent with `send`, not after the commit: inside the transaction that wrote the waiting state, with the
rows locked, so that a receiver decides the item the moment it waits, in the same transaction. A receiver's error
rolls that transaction back, as a call would.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import cast

from django.dispatch import Signal

from planning.models import Plan, PlanStep

# Steps have just been put up for approval (steps_request_approval). Sent with `steps`, the steps that now wait,
# each with its plan (locked) and the plan's agent.
steps_await_approval = Signal()

# Plans have just been validated and await approval (plans_accept). Sent with `plans` (locked), once for the plans
# a call accepted together. A receiver returns the pks of the plans it decided at once (the others wait for a person).
plans_await_approval = Signal()


def steps_await_approval_send(steps: Sequence[PlanStep]) -> None:
    """Tell the receivers that `steps` wait for approval now (they decide them in this transaction)."""
    steps_await_approval.send(sender=PlanStep, steps=steps)


def plans_await_approval_send(plans: Sequence[Plan]) -> set[int]:
    """Tell the receivers that `plans` await approval now; the pks of those a receiver decided at once."""
    decided: set[int] = set()
    for _, pks in plans_await_approval.send(sender=Plan, plans=plans):
        decided.update(cast("Iterable[int]", pks or ()))  # what the receivers return (django-stubs types it str)
    return decided
