"""Policies and notifications together, as an operator away from the screen lives them: a routine step a policy
approved at once never pages anyone; a step a policy escalates does, as an escalation."""

from __future__ import annotations

from typing import Any

import pytest

from notifications.models import Trigger
from notifications.services import deliveries_send_due, notifications_dispatch
from planning.models import PlanStep
from tests.notifications.conftest import Receiver, subscribed
from tests.policies.test_decisions import hungry_persona, policy_with, until_buy_food_asked

pytestmark = pytest.mark.django_db


def delivered_kinds(receiver: Receiver) -> list[str]:
    notifications_dispatch()
    deliveries_send_due()
    return [r.json()["kind"] for r in receiver.received]


def test_a_step_a_policy_approved_at_once_pages_nobody(operator: Any, receiver: Receiver) -> None:
    subscribed(receiver)
    policy_with(operator, {"action": "approve", "tools": "buy food", "approve_risky": True, "approve_permission": True})
    step = until_buy_food_asked(hungry_persona())
    assert step.status == PlanStep.Status.PENDING
    assert Trigger.WAITING not in delivered_kinds(receiver)


def test_without_a_policy_the_same_step_pages_the_operator(operator: Any, receiver: Receiver) -> None:
    subscribed(receiver)
    step = until_buy_food_asked(hungry_persona())
    assert step.status == PlanStep.Status.AWAITING_APPROVAL
    assert Trigger.WAITING in delivered_kinds(receiver)


def test_a_step_a_policy_escalates_pages_the_operator_as_an_escalation(operator: Any, receiver: Receiver) -> None:
    subscribed(receiver, kinds=[Trigger.ESCALATED])
    policy_with(operator, {"action": "escalate", "requires_permission": "yes", "reason": "money: look now"})
    step = until_buy_food_asked(hungry_persona())
    assert step.status == PlanStep.Status.AWAITING_APPROVAL
    assert delivered_kinds(receiver) == [Trigger.ESCALATED]
    body = receiver.received[0].json()
    assert body["step"]["id"] == step.pk and body["event"]["reason"] == "money: look now"
