"""Seed 001 over the database: generated goals keep the horizon mix, the goal stats, what goal generation asks
the model, what it keeps of the answer, and what the milestone check shows the model."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

import pytest

import goals.services as goal_services
from agents.llm.context import prompt_context
from agents.llm.gateway import LLMResult
from goals.models import Goal
from goals.selectors import agent_goal_stats
from goals.services import goal_milestone_check, goals_create, goals_generate
from tests.factories import AgentFactory, ExperienceFactory, GoalFactory, LessonFactory

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


class ScriptedModel:
    """Stands in for the gateway: records the messages it was sent and answers with the given JSON."""

    def __init__(self, answer: Any) -> None:
        self.answer = answer
        self.sent: list[Sequence[Mapping[str, str]]] = []

    def __call__(self, *, purpose: str, messages: Sequence[Mapping[str, str]], **kwargs: Any) -> LLMResult:
        self.sent.append(messages)
        return LLMResult(text=f"<json>{json.dumps(self.answer)}</json>", model="scripted", call_id=0)


def proposal(description: str, need: str = "hunger") -> dict[str, Any]:
    return {"description": description, "horizon": "short_term", "source_needs": [need],
            "recommended_actions": ["eat"], "reasoning": f"{need} is low"}


def test_goals_generate_sends_needs_personality_emotions_lessons_and_active_goals(monkeypatch: pytest.MonkeyPatch) -> None:
    agent = AgentFactory(personality={"curiosity": 0.8}, emotions={"anxious": 0.4})
    LessonFactory(agent=agent, description="Cooking at home saves money")
    GoalFactory(agent=agent, description="Make a friend")
    GoalFactory(agent=agent, description="Old abandoned goal", status=Goal.Status.ABANDONED)
    model = ScriptedModel([])
    monkeypatch.setattr(goal_services, "llm_complete", model)
    goals_generate(agent=agent, needs={"hunger": 0.12, "social": 0.6})
    context = prompt_context(model.sent[0])
    assert context["needs"] == {"hunger": 0.12, "social": 0.6}
    assert context["personality"] == {"curiosity": 0.8}
    assert context["emotions"] == {"anxious": 0.4}
    assert context["lessons"] == ["Cooking at home saves money"]
    assert context["existing"] == ["Make a friend"]  # the active goals, not to be duplicated


def test_goals_generate_keeps_at_most_three_of_the_proposed_goals(monkeypatch: pytest.MonkeyPatch) -> None:
    agent = AgentFactory()
    monkeypatch.setattr(goal_services, "llm_complete", ScriptedModel([proposal(f"Goal {i}") for i in range(1, 6)]))
    created = goals_generate(agent=agent, needs={"hunger": 0.1})
    assert [g.description for g in created] == ["Goal 1", "Goal 2", "Goal 3"]
    assert Goal.objects.filter(agent=agent).count() == 3


def test_goals_create_never_duplicates_an_active_goal() -> None:
    agent = AgentFactory()
    GoalFactory(agent=agent, description="Get something to eat")
    GoalFactory(agent=agent, description="Make a friend", status=Goal.Status.COMPLETED)
    created = goals_create(agent=agent, needs={"hunger": 0.1, "social": 0.2}, lessons=[], proposals=[
        proposal("get  something to EAT"), proposal("Make a friend", "social"), proposal("Make a friend", "social")])
    assert [g.description for g in created] == ["Make a friend"]  # a completed goal may come back, once
    assert Goal.objects.filter(agent=agent, status=Goal.Status.ACTIVE).count() == 2


def test_generated_goals_keep_the_lessons_that_informed_them(monkeypatch: pytest.MonkeyPatch) -> None:
    agent = AgentFactory()
    for text in ("Lesson one", "Lesson two", "Lesson three", "Lesson four"):
        LessonFactory(agent=agent, description=text)
    monkeypatch.setattr(goal_services, "llm_complete", ScriptedModel([proposal("Get something to eat")]))
    [goal] = goals_generate(agent=agent, needs={"hunger": 0.1})
    goal.refresh_from_db()
    lessons = list(agent.lessons.values_list("description", flat=True))  # newest first
    assert goal.source_lessons == lessons[:3]


def test_milestone_check_shows_the_recent_experiences_and_the_goals_source_needs(monkeypatch: pytest.MonkeyPatch) -> None:
    agent = AgentFactory()
    agent.needs.create(name="social", satisfaction=0.75)
    agent.needs.create(name="hunger", satisfaction=0.2)
    for cycle in range(1, 8):
        ExperienceFactory(agent=agent, cycle=cycle, action=f"call friend {cycle}", outcome="talked",
                          need_deltas={"social": 0.1})
    goal = GoalFactory(agent=agent, description="Make a friend", source_needs=["social"], progress=0.9)
    model = ScriptedModel({"achieved": True, "explanation": "Friendship rose to 75%"})
    monkeypatch.setattr(goal_services, "llm_complete", model)
    assert goal_milestone_check(goal=goal) is True
    context = prompt_context(model.sent[0])
    assert context["goal"] == "Make a friend"
    assert context["experiences"] == [f"call friend {c}: talked" for c in range(3, 8)]  # the latest, oldest first
    assert context["needs"] == {"social": 0.75}  # its source needs only
    goal.refresh_from_db()
    assert (goal.status, goal.milestone_explanation) == (Goal.Status.COMPLETED, "Friendship rose to 75%")
