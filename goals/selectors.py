"""Reads of the goal system (seed 001)."""

from __future__ import annotations

from agents.models import Agent
from goals.models import Goal
from goals.system import GoalStats, goal_stats


def agent_goal_stats(*, agent: Agent) -> GoalStats:
    """Seed 001's get_goal_stats for one agent: counts by status, active goals by horizon, mean progress of the
    active ones, advances and regressions over all goals (one query)."""
    return goal_stats(Goal.objects.filter(agent=agent).values_list(
        "status", "horizon", "progress", "times_advanced", "times_regressed"))
