"""Issue 50: a goal given to a tool agent while one of its plans waits for a person is planned at once (a tool agent
may have several plans waiting for a person, as personas do), by its own cycle and by a start pass alike; the plan
that can move on is followed meanwhile."""

from __future__ import annotations

from typing import Any

import pytest

from agents.models import Agent
from planning.models import Plan
from planning.services import agent_give_goal, plan_approve
from runtime.cycle import agent_cycle, tools_start
from tests.factories import AgentFactory

pytestmark = pytest.mark.django_db


def reporter() -> Agent:
    agent = AgentFactory(name="Reporter", kind=Agent.Kind.TOOL, status=Agent.Status.RUNNING)
    agent.workspace.mkdir(parents=True, exist_ok=True)
    (agent.workspace / "notes.txt").write_text("The deploy went out on time. Two alerts fired overnight.")
    (agent.workspace / "data.csv").write_text("name,age\nana,31\n")
    return agent


@pytest.mark.parametrize("second", ["Convert data.csv to JSON", "Do the thing"])
def test_a_goal_given_while_a_plan_awaits_approval_is_planned_at_once(operator: Any, second: str) -> None:
    agent = reporter()
    agent_give_goal(agent=agent, user=operator, description="Write a report from the notes")
    agent_cycle(agent_id=agent.pk, runner="runner-test")
    first = Plan.objects.get(agent=agent)
    assert first.status == Plan.Status.AWAITING_APPROVAL
    goal = agent_give_goal(agent=agent, user=operator, description=second)
    agent_cycle(agent_id=agent.pk, runner="runner-test")
    planned = Plan.objects.get(agent=agent, goal=goal)
    # A clear goal reaches the inbox as a plan; a vague one as the planner's question: never a silent queue.
    assert planned.status in (Plan.Status.AWAITING_APPROVAL, Plan.Status.CLARIFYING)
    first.refresh_from_db()
    assert first.status == Plan.Status.AWAITING_APPROVAL  # still the operator's to decide


def test_a_start_pass_plans_the_goal_of_an_agent_whose_plan_waits(operator: Any) -> None:
    agent = reporter()
    agent_give_goal(agent=agent, user=operator, description="Write a report from the notes")
    agent_cycle(agent_id=agent.pk, runner="runner-test")
    goal = agent_give_goal(agent=agent, user=operator, description="Convert data.csv to JSON")
    planned, _own = tools_start([agent.pk], runner="runner-test")
    assert planned == [agent.pk]
    assert Plan.objects.get(agent=agent, goal=goal).status == Plan.Status.AWAITING_APPROVAL


def test_the_approved_plan_runs_while_another_waits_for_a_person(operator: Any) -> None:
    agent = reporter()
    agent_give_goal(agent=agent, user=operator, description="Write a report from the notes")
    agent_cycle(agent_id=agent.pk, runner="runner-test")
    goal = agent_give_goal(agent=agent, user=operator, description="Convert data.csv to JSON")
    agent_cycle(agent_id=agent.pk, runner="runner-test")
    second = Plan.objects.get(agent=agent, goal=goal)
    plan_approve(plan=second, user=operator, mode=Plan.ApprovalMode.ALL)
    for _ in range(6):
        agent_cycle(agent_id=agent.pk, runner="runner-test")
    assert (agent.workspace / "data.json").exists()
