"""One reader of the operators' words for a replan (planning/selectors.py plan_feedback): the built-in planner
and agents outside (the API, MCP) hear the same feedback, from the plan and every earlier version of it."""

from __future__ import annotations

import pytest

from planning.models import Plan, PlanEvent
from planning.selectors import plan_feedback
from planning.services.reported import replan_feedback
from tests.factories import PlanEventFactory, PlanFactory

pytestmark = pytest.mark.django_db


def test_a_replan_hears_every_versions_feedback_in_order_each_once() -> None:
    v1 = PlanFactory(status=Plan.Status.REPLANNED)
    PlanEventFactory(plan=v1, kind=PlanEvent.Kind.STEP_DECLINED, reason="Not from the shared drive")
    v2 = PlanFactory(agent=v1.agent, goal=v1.goal, previous=v1, version=2, replan_reason="Ask finance first")
    PlanEventFactory(plan=v2, kind=PlanEvent.Kind.STEP_DECLINED, reason="Not from the shared drive")  # said again
    PlanEventFactory(plan=v2, kind=PlanEvent.Kind.REPLAN_REQUESTED, reason="Ask finance first")
    PlanEventFactory(plan=v2, kind=PlanEvent.Kind.STEP_COMPLETED, reason="read the file")  # not an operator's word
    assert plan_feedback(v2) == ["Not from the shared drive", "Ask finance first"]
    # An agent outside gets the same words as one line, newest first.
    assert replan_feedback(v2) == "Ask finance first; Not from the shared drive"


def test_with_no_words_an_agent_outside_hears_the_replans_reason() -> None:
    plan = PlanFactory(replan_reason="step 2 failed: the file is gone")
    assert plan_feedback(plan) == []
    assert replan_feedback(plan) == "step 2 failed: the file is gone"
