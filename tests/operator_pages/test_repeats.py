"""Issue 50, "repeats say so": a persona's new plan of a goal it pursues again names itself ("3rd time today") on
the inbox card and the plan page, and the inbox keeps one goal's items together."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
import time_machine
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from agents.models import Agent
from planning.models import Plan, PlanStep
from planning.operator_selectors import inbox_items, repeat_label
from tests.factories import AgentFactory, PlanFactory, PlanStepFactory

pytestmark = pytest.mark.django_db

# "Today" is the operator's day: these tests make plans minutes apart and would straddle midnight if run just after
# it (CI once did, at 00:10 UTC). They run at an hour of their choosing, the clock still ticking.
NOON = datetime(2026, 12, 8, 12, 0, tzinfo=UTC)


def meeting(agent: Agent, minutes_ago: int, *, waiting: bool) -> Plan:
    plan = PlanFactory(agent=agent, goal_text="Meet the friend in person", status=Plan.Status.COMPLETED
                       if not waiting else Plan.Status.ACTIVE, approval_mode="all")
    Plan.objects.filter(pk=plan.pk).update(created_at=timezone.now() - timedelta(minutes=minutes_ago))
    PlanStepFactory(plan=plan, key="2", description="Meet the friend in person", action_hint="meet friend",
                    status=PlanStep.Status.AWAITING_APPROVAL if waiting else PlanStep.Status.COMPLETED,
                    requires_permission=True)
    plan.refresh_from_db()
    return plan


def test_labels_count_in_words() -> None:
    assert [repeat_label(n) for n in (0, 1, 2, 3, 4, 11, 21, 22)] == [
        "", "", "2nd time today", "3rd time today", "4th time today", "11th time today", "21st time today",
        "22nd time today"]


@time_machine.travel(NOON)
def test_a_repeat_says_so_in_the_inbox_and_on_the_plan_page_and_stands_with_its_goal(viewer_client: Client) -> None:
    marco = AgentFactory(name="Marco", kind=Agent.Kind.PERSONA)
    meeting(marco, 50, waiting=False)
    first_waiting = meeting(marco, 30, waiting=True)
    other = PlanFactory(agent__name="Reporter", agent__kind=Agent.Kind.TOOL, status=Plan.Status.ACTIVE,
                        approval_mode="step")
    PlanStepFactory(plan=other, key="1", tool="file.read", tool_input={"path": "a.txt"}, action_hint="",
                    status=PlanStep.Status.AWAITING_APPROVAL)
    third = meeting(marco, 1, waiting=True)
    items = inbox_items()
    by_plan = {i.plan.pk: i for i in items}
    assert by_plan[first_waiting.pk].repeat_label == "2nd time today"
    assert by_plan[third.pk].repeat_label == "3rd time today"
    assert by_plan[other.pk].repeat_label == ""
    order = [i.plan.pk for i in items]
    assert abs(order.index(first_waiting.pk) - order.index(third.pk)) == 1  # together, not split by Reporter's

    html = viewer_client.get(reverse("inbox")).content.decode()
    assert "repeat: 3rd time today" in html and "repeat: 2nd time today" in html
    page = viewer_client.get(third.get_absolute_url()).content.decode()
    assert 'id="plan-repeat"' in page and "repeat: 3rd time today" in page


@time_machine.travel(NOON)
def test_a_replan_is_no_repeat_and_yesterdays_plans_do_not_count(viewer_client: Client) -> None:
    marco = AgentFactory(name="Marco", kind=Agent.Kind.PERSONA)
    meeting(marco, 12 * 60 + 10, waiting=False)  # ten to midnight yesterday: twelve hours ago, another day
    v1 = meeting(marco, 20, waiting=False)
    v2 = meeting(marco, 1, waiting=True)
    Plan.objects.filter(pk=v2.pk).update(previous=v1, version=2)
    items = inbox_items()
    assert [i.repeat_label for i in items] == [""]
