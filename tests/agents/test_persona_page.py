"""The agent page shows what the persona cycle computes, goals short-term first, and live curves."""

from __future__ import annotations

import pytest
from django.test import Client
from django.urls import reverse

from agents.models import Agent
from goals.models import Goal
from planning.live.renderers import AgentLivePage, PlanLivePage
from planning.models import Plan
from runtime.cycle import agent_cycle
from tests.factories import (
    AgentFactory,
    GoalFactory,
    LLMCallFactory,
    NeedFactory,
    PlanFactory,
    PlanStepFactory,
)

pytestmark = pytest.mark.django_db


def test_agent_page_shows_goals_short_mid_long_with_the_current_steps_goal_marked(viewer_client: Client) -> None:
    agent = AgentFactory(kind=Agent.Kind.PERSONA)
    for name in ("hunger", "energy", "social"):
        NeedFactory(agent=agent, name=name, satisfaction=0.7, decay_per_hour=0.01)
    long = GoalFactory(agent=agent, horizon="long_term", description="Save for a bike", confidence=1.0)
    mid = GoalFactory(agent=agent, horizon="mid_term", description="Make a new friend", confidence=1.0,
                      reasoning="Social is low at 30%", recommended_actions=["call a friend"],
                      source_lessons=["Calling works better than waiting"], milestone_explanation="social at 40%: not yet")
    short = GoalFactory(agent=agent, horizon="short_term", description="Have <b>lunch</b>", confidence=0.2)
    plan = PlanFactory(agent=agent, goal=mid, thinking_summary="First call, then meet.", retry_hints=["Use known actions"])
    PlanStepFactory(plan=plan, key="1", position=1, action_hint="call a friend", description="Call Sam", estimated_cycles=3)
    LLMCallFactory(agent=agent, purpose="milestone", response='{"achieved": false}')
    for _ in range(3):
        agent_cycle(agent_id=agent.pk, runner="runner-test")
    html = viewer_client.get(reverse("agent-detail", args=[agent.pk])).content.decode()
    assert html.index(f'id="goal-{short.pk}"') < html.index(f'id="goal-{mid.pk}"') < html.index(f'id="goal-{long.pk}"')
    assert f'class="goal status-active current" id="goal-{mid.pk}"' in html  # the goal of the step followed now
    assert html.count(" current\" id=\"goal-") == 1
    for shown in ("Social is low at 30%", "call a friend", "Calling works better than waiting",
                  "social at 40%: not yet", "First call, then meet.", "Use known actions", "Milestone check",
                  "Overrides in a row", "Following now: <b>Call Sam</b>"):
        assert shown in html, shown
    assert "Have &lt;b&gt;lunch&lt;/b&gt;" in html  # a model's or user's words are escaped
    # The needs chart (three needs, the urgency line) and each goal's chart (progress, confidence, its horizon's
    # abandonment line and the milestone line), each curve named at its end.
    needs = html[html.index('id="needs-chart"'):html.index("</figure>", html.index('id="needs-chart"'))]
    assert needs.count("<polyline") == 3 and "urgent below 15%" in needs and ">hunger " in needs
    for goal, abandon in ((short, "10%"), (mid, "5%"), (long, "5%")):
        block = goal_block(html, goal)
        assert f'id="chart-goal-{goal.pk}"' in block and block.count("<polyline") == 2, goal
        assert f"abandoned below {abandon} confidence" in block and "milestone check at 85% progress" in block
        assert ">progress " in block and ">confidence " in block


def test_agent_page_curves_follow_the_experiences(viewer_client: Client) -> None:
    agent = AgentFactory(kind=Agent.Kind.PERSONA)
    NeedFactory(agent=agent, name="energy", satisfaction=0.5, decay_per_hour=0.05)
    goal = GoalFactory(agent=agent, horizon="short_term", source_needs=["energy"], description="Rest")
    url = reverse("agent-detail", args=[agent.pk])
    for _ in range(2):
        agent_cycle(agent_id=agent.pk, runner="runner-test")
    before = viewer_client.get(url).content.decode()
    agent_cycle(agent_id=agent.pk, runner="runner-test")
    after = viewer_client.get(url).content.decode()
    assert before != after
    goal.refresh_from_db()
    assert goal.status == Goal.Status.ACTIVE


def person(**needs: float) -> Agent:
    agent = AgentFactory(kind=Agent.Kind.PERSONA)
    for name, value in ({"hunger": 0.7, "money": 0.7, "energy": 0.7, "social": 0.7, "fun": 0.7} | needs).items():
        NeedFactory(agent=agent, name=name, satisfaction=value, decay_per_hour=0.0)
    return agent


def goal_block(html: str, goal: Goal) -> str:
    """The goal's entry on the agent page, up to the next goal's."""
    start = html.index(f'id="goal-{goal.pk}"')
    end = html.find('id="goal-', start + 1)
    return html[start:] if end < 0 else html[start:end]


def test_agent_page_says_why_each_goal_waits_for_a_plan_and_its_place_in_line(viewer_client: Client) -> None:
    agent = person(hunger=0.64, social=0.3)
    lunch = GoalFactory(agent=agent, horizon="short_term", source_needs=["hunger"], description="Have lunch")
    cooking = GoalFactory(agent=agent, horizon="mid_term", source_needs=["hunger"], description="Cook at home")
    friends = GoalFactory(agent=agent, horizon="long_term", source_needs=["social"], description="Make friends")
    url = reverse("agent-detail", args=[agent.pk])
    html = viewer_client.get(url).content.decode()
    assert "Plan: to be planned next cycle; 1st in line" in goal_block(html, lunch)
    assert "Plan: waits: hunger 64% must drop below 50%; 2nd in line" in goal_block(html, cooking)
    assert "Plan: waits for the goals before it to be planned; 3rd in line" in goal_block(html, friends)

    live = AgentLivePage(f"agent-{agent.pk}", agent.pk)
    live.render_changes({agent.pk}, {"viewer"})
    agent_cycle(agent_id=agent.pk, runner="runner-test")  # what the page said: the first in line is planned
    assert Plan.objects.filter(goal=lunch).exists() and not Plan.objects.filter(goal__in=[cooking, friends]).exists()
    pushed = live.render_changes({agent.pk}, {"viewer"})["viewer"]
    assert "Plan:" not in goal_block(pushed, lunch)
    assert "1st in line" in goal_block(pushed, cooking) and "must drop below 50%" in goal_block(pushed, cooking)
    assert "Plan: to be planned next cycle; 2nd in line" in goal_block(pushed, friends)
    agent_cycle(agent_id=agent.pk, runner="runner-test")
    assert Plan.objects.filter(goal=friends).exists() and not Plan.objects.filter(goal=cooking).exists()


def test_agent_page_says_a_goal_waits_for_the_open_plan_of_its_horizon(viewer_client: Client) -> None:
    agent = person(hunger=0.2)
    planned = GoalFactory(agent=agent, horizon="mid_term", source_needs=["hunger"], description="Eat better")
    PlanStepFactory(plan=PlanFactory(agent=agent, goal=planned), action_hint="cook", estimated_cycles=5)
    waiting = GoalFactory(agent=agent, horizon="mid_term", source_needs=["hunger"], description="Cook at home")
    html = viewer_client.get(reverse("agent-detail", args=[agent.pk])).content.decode()
    assert "Plan:" not in goal_block(html, planned)
    assert "Plan: waits: the open mid term plan comes first (one plan per horizon); 1st in line" in goal_block(html, waiting)


def test_agent_page_says_a_goal_is_planned_next_while_its_horizons_plan_waits_for_the_operator(
        viewer_client: Client) -> None:
    agent = person(hunger=0.2)
    parked = GoalFactory(agent=agent, horizon="mid_term", source_needs=["hunger"], description="Eat better")
    PlanStepFactory(plan=PlanFactory(agent=agent, goal=parked), action_hint="buy food", requires_permission=True,
                    status="awaiting_approval")
    next_goal = GoalFactory(agent=agent, horizon="mid_term", source_needs=["hunger"], description="Cook at home")
    html = viewer_client.get(reverse("agent-detail", args=[agent.pk])).content.decode()
    assert "Plan: to be planned next cycle; 1st in line" in goal_block(html, next_goal)


def test_plan_page_shows_each_steps_override_counter_and_pushes_keep_it_current(viewer_client: Client) -> None:
    agent = person(energy=0.05)  # urgent: sleep overrides the step
    goal = GoalFactory(agent=agent, horizon="short_term", source_needs=["social"], description="See friends")
    plan = PlanFactory(agent=agent, goal=goal)
    step = PlanStepFactory(plan=plan, key="1", position=1, action_hint="call a friend", estimated_cycles=9)
    url = plan.get_absolute_url()
    assert "overrides in a row 0/3" in viewer_client.get(url).content.decode()
    live = PlanLivePage(f"plan-{plan.pk}", plan.pk)
    live.baseline()
    agent_cycle(agent_id=agent.pk, runner="runner-test")
    step.refresh_from_db()
    assert step.overrides == 1
    assert "overrides in a row 1/3" in live.render_changes({plan.pk}, {"viewer"})["viewer"]
    assert "overrides in a row 1/3" in viewer_client.get(url).content.decode()
