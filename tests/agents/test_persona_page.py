"""The agent page shows what the persona cycle computes, goals short-term first, and live curves."""

from __future__ import annotations

import pytest
from django.test import Client
from django.urls import reverse

from agents.cycle import agent_cycle
from agents.models import Agent
from goals.models import Goal
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
    assert 'class="curve needs"' in html and html.count("<polyline") >= 3 + 2  # needs, progress and confidence


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
