"""The goal system over the database (seed 001): generated goals keep the horizon mix; the goal stats."""

from __future__ import annotations

import pytest

from goals.models import Goal
from goals.selectors import agent_goal_stats
from goals.services import goals_create
from tests.factories import AgentFactory, GoalFactory

pytestmark = pytest.mark.django_db


def test_generated_goals_keep_the_horizon_mix() -> None:
    agent = AgentFactory(kind="persona")
    for n in range(3):
        GoalFactory(agent=agent, horizon="short_term", description=f"Short {n}")
    created = goals_create(agent=agent, needs={"hunger": 0.1}, lessons=[], proposals=[
        {"description": "Eat now", "horizon": "short_term", "source_needs": ["hunger"]},
        {"description": "Eat well this month", "horizon": "long_term", "source_needs": ["hunger"]},
    ])
    assert [(g.description, g.horizon) for g in created] == [("Eat now", "mid_term"), ("Eat well this month", "long_term")]
    assert agent.goals.filter(status=Goal.Status.ACTIVE, horizon="short_term").count() == 3


def test_agent_goal_stats_read_every_goal_of_the_agent() -> None:
    agent = AgentFactory(kind="persona")
    GoalFactory(agent=agent, horizon="mid_term", progress=0.5, times_advanced=2, times_regressed=1)
    GoalFactory(agent=agent, status=Goal.Status.COMPLETED, progress=1.0, times_advanced=4)
    GoalFactory(horizon="mid_term")  # another agent's
    stats = agent_goal_stats(agent=agent)
    assert (stats.active, stats.completed, stats.abandoned) == (1, 1, 0)
    assert stats.active_by_horizon["mid_term"] == 1 and stats.mean_progress == 0.5
    assert (stats.times_advanced, stats.times_regressed) == (6, 1)
