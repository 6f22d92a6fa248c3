"""Writes that once changed rows without a word: each is now an event in the audit log, naming who did it and
what changed (goals the planner generated, a milestone setback, declared tools, an admin delete, a revoked
token)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from django.test import Client
from django.urls import reverse

import goals.services as goal_services
from agents.llm.gateway import LLMResult
from agents.models import Agent, AgentToken
from goals.models import Goal
from goals.services import goal_milestone_check, goals_generate
from planning.models import PlanEvent
from tests.api.conftest import ApiClient
from tests.factories import AgentFactory, GoalFactory, PlanFactory, PlanStepFactory, UserFactory

pytestmark = pytest.mark.django_db


def answering(answer: Any) -> Any:
    def complete(**kwargs: Any) -> LLMResult:
        return LLMResult(text=f"<json>{json.dumps(answer)}</json>", model="scripted", call_id=0)
    return complete


def audit_rows(client: Client, agent: Agent) -> str:
    response = client.get(reverse("audit"), {"agent": agent.pk})
    assert response.status_code == 200
    return response.content.decode()


@pytest.fixture
def operator() -> Client:
    client = Client()
    client.force_login(UserFactory(username="root", is_staff=True, is_superuser=True))
    return client


def test_generated_goals_are_an_event_in_the_audit_log(monkeypatch: pytest.MonkeyPatch, operator: Client) -> None:
    agent = AgentFactory(kind="persona")
    monkeypatch.setattr(goal_services, "llm_complete", answering([
        {"description": "Cook a warm dinner", "horizon": "short_term", "source_needs": ["hunger"]}]))
    [goal] = goals_generate(agent=agent, needs={"hunger": 0.1})
    event = PlanEvent.objects.get(agent=agent, kind=PlanEvent.Kind.GOALS_GENERATED)
    assert event.actor_label == "goal generation"
    assert event.detail["goals"][0]["description"] == goal.description == "Cook a warm dinner"
    assert "Cook a warm dinner" in audit_rows(operator, agent)


def test_a_milestone_setback_is_an_event_with_the_progress_it_took_back(monkeypatch: pytest.MonkeyPatch) -> None:
    agent = AgentFactory()
    agent.needs.create(name="social", satisfaction=0.3)
    goal = GoalFactory(agent=agent, description="Make a friend", source_needs=["social"], progress=0.9)
    monkeypatch.setattr(goal_services, "llm_complete", answering({"achieved": False, "explanation": "Still alone"}))
    assert goal_milestone_check(goal=goal) is False
    goal.refresh_from_db()
    event = PlanEvent.objects.get(agent=agent, kind=PlanEvent.Kind.MILESTONE_CHECKED)
    assert goal.status == Goal.Status.ACTIVE and goal.progress < 0.9
    assert event.detail["achieved"] is False
    assert event.detail["diff"]["progress"] == [0.9, round(goal.progress, 3)]
    assert "Still alone" in event.reason


def test_declared_tools_are_an_event_with_the_tools_before_and_after(api: ApiClient, external_agent: Agent) -> None:
    tool = {"name": "echo", "description": "Says it back", "input_schema": {"type": "object"}}
    assert api.put("/api/v1/agent/tools", {"tools": [tool]})[0] == 200
    event = PlanEvent.objects.get(agent=external_agent, kind=PlanEvent.Kind.TOOLS_DECLARED)
    assert event.detail["diff"]["tools"] == [[], ["echo"]]
    assert event.actor_label == f"{external_agent.name} (API)"


def test_a_refused_tools_declaration_records_nothing(api: ApiClient, external_agent: Agent) -> None:
    status, _ = api.put("/api/v1/agent/tools", {"tools": [{"name": "bad name!"}]})
    assert status in (400, 422)
    assert not PlanEvent.objects.filter(agent=external_agent, kind=PlanEvent.Kind.TOOLS_DECLARED).exists()


def test_a_step_deleted_in_the_admin_is_an_event_naming_the_operator(operator: Client) -> None:
    plan = PlanFactory()
    step = PlanStepFactory(plan=plan, description="Write the weekly report")
    response = operator.post(reverse("admin:planning_planstep_delete", args=[step.pk]), {"post": "yes"})
    assert response.status_code == 302
    event = PlanEvent.objects.get(kind=PlanEvent.Kind.ADMIN_DELETE)
    assert (event.agent_id, event.plan_id, event.actor_label) == (plan.agent_id, plan.pk, "root")
    assert event.detail["deleted"]["description"] == "Write the weekly report"  # nothing is lost
    assert "Deleted in admin" in audit_rows(operator, plan.agent)


def test_goals_deleted_with_the_admins_bulk_action_are_each_recorded(operator: Client) -> None:
    agent = AgentFactory()
    goals = [GoalFactory(agent=agent, description=f"Goal {n}") for n in range(2)]
    response = operator.post(reverse("admin:goals_goal_changelist"), {
        "action": "delete_selected", "_selected_action": [g.pk for g in goals], "post": "yes"})
    assert response.status_code == 302
    assert not Goal.objects.filter(agent=agent).exists()
    reasons = sorted(PlanEvent.objects.filter(agent=agent, kind=PlanEvent.Kind.ADMIN_DELETE).values_list("reason", flat=True))
    assert len(reasons) == 2 and "Goal 0" in reasons[0] and "Goal 1" in reasons[1]


def test_a_revoked_token_is_an_event_naming_who_revoked_it(operator: Client) -> None:
    agent = Agent.objects.create(name="Bot", kind=Agent.Kind.EXTERNAL)
    token, _raw = AgentToken.issue(agent=agent, label="laptop")
    operator.post(reverse("admin:agents_agenttoken_changelist"), {"action": "revoke", "_selected_action": [token.pk]})
    token.refresh_from_db()
    assert token.revoked_at is not None
    event = PlanEvent.objects.get(agent=agent, kind=PlanEvent.Kind.TOKEN_REVOKED)
    assert (event.actor_label, event.detail["tokens"]) == ("root", ["laptop"])
    # Revoking again changes nothing and records nothing.
    operator.post(reverse("admin:agents_agenttoken_changelist"), {"action": "revoke", "_selected_action": [token.pk]})
    assert PlanEvent.objects.filter(agent=agent, kind=PlanEvent.Kind.TOKEN_REVOKED).count() == 1
