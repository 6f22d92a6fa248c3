"""What the planning services tell the apps above them, which they never import (tests/test_layers.py): the
approval policies (policies/apps.py) connect here.

Both are sent with `send`, not after the commit: inside the transaction that wrote the waiting state, with the
rows locked, so that a receiver decides the item the moment it waits, in the same transaction. A receiver's error
rolls that transaction back, as a call would.
"""

from __future__ import annotations

from collections.abc import Sequence

from django.dispatch import Signal

from planning.models import Plan, PlanStep

# Steps have just been put up for approval (steps_request_approval). Sent with `steps`, the steps that now wait,
# each with its plan (locked) and the plan's agent.
steps_await_approval = Signal()

# A plan has just been validated and awaits approval (plans_accept). Sent with `plan` (locked), once for each
# plan. A receiver returns what it decided, or None when the plan waits for a person.
plan_awaits_approval = Signal()


def steps_await_approval_send(steps: Sequence[PlanStep]) -> None:
    """Tell the receivers that `steps` wait for approval now (they decide them in this transaction)."""
    steps_await_approval.send(sender=PlanStep, steps=steps)


def plan_awaits_approval_send(plan: Plan) -> bool:
    """Tell the receivers that `plan` awaits approval now; whether one of them decided it at once."""
    return any(decided is not None for _, decided in plan_awaits_approval.send(sender=Plan, plan=plan))
