"""Issue 50, "smaller truths": each shown value says what is true, worded for a person."""

from __future__ import annotations

import json
from typing import Any

import pytest
from django.conf import settings as django_settings
from django.test import Client
from django.urls import reverse

from agents.llm.context import prompt_context
from agents.management.commands.serve import base_url_follow
from agents.models import Agent, LLMCall
from agents.offline_model import offline_complete
from notifications.selectors import event_candidate
from planning.engine.prompts import prompt_restate
from planning.engine.validate import StepSpec
from planning.models import Plan, PlanEvent, PlanStep
from planning.services import plan_edit_save, step_approve, step_decline
from policies import services as policies
from tests.factories import AgentFactory, PlanEventFactory, PlanFactory, PlanStepFactory, UserFactory
from tests.operator_pages.test_editor import tool_plan

pytestmark = pytest.mark.django_db


def test_a_decline_rule_without_a_reason_says_why_in_words_not_the_constraints_name(operator_client: Client,
                                                                                   operator: Any) -> None:
    policy = policies.policy_save(user=operator, policy=None, name="Routine")
    response = operator_client.post(reverse("rule-add", args=[policy.pk]),
                                    {"new-action": "decline", "new-applies_to": "steps", "new-risk": "any",
                                     "new-requires_permission": "any", "new-reason": ""}, follow=True)
    html = response.content.decode()
    assert "rule_decline_has_reason" not in html
    assert "A decline needs a reason" in html and "Nothing was changed." in html
    assert not policy.rules.exists()


def test_a_webhooks_event_reason_carries_no_planner_repair_note() -> None:
    plan = PlanFactory(status=Plan.Status.AWAITING_APPROVAL, agent__kind=Agent.Kind.TOOL)
    PlanStepFactory(plan=plan, tool="file.read", tool_input={"path": "a.txt"}, action_hint="")
    flags = ["repaired: closed 1 unclosed bracket", "parsed from balanced", "step 2 overwrites data.json"]
    event = PlanEventFactory(plan=plan, kind=PlanEvent.Kind.VALIDATED, reason="; ".join(flags), detail={"flags": flags})
    candidate = event_candidate(event, set())
    assert candidate is not None
    reason = candidate.payload()["event"]["reason"]
    assert reason == "step 2 overwrites data.json"
    event.detail = {"flags": flags[:2]}
    assert "repaired" not in event_candidate(event, set()).payload()["event"]["reason"]  # type: ignore[union-attr]


def test_the_persona_page_shows_model_answers_read_out_not_raw_json(viewer_client: Client) -> None:
    agent = AgentFactory(name="Jenbina", kind=Agent.Kind.PERSONA)
    answer = '<json>{"goals": [{"description": "Get something to eat", "horizon": "short"}]}</json>'
    LLMCall.objects.create(agent=agent, purpose=LLMCall.Purpose.GOALS, model="offline-rules", response=answer,
                           prompt=[])
    html = viewer_client.get(agent.get_absolute_url()).content.decode()
    assert "&lt;json&gt;" not in html and "<json>" not in html
    assert "Get something to eat (short)" in html


@pytest.mark.parametrize("goal", ["Convert data.csv to JSON", "Summarize notes.txt into summary.md",
                                  "tidy up the files"])
def test_a_restated_tool_goal_claims_no_operator_asked_for_it(goal: str) -> None:
    answer = offline_complete("restate", prompt_restate(goal=goal, agent_name="Archivist", backstory=""))
    assert "operator asked" not in answer
    assert prompt_context(prompt_restate(goal=goal, agent_name="Archivist", backstory=""))["goal"] == goal


def test_a_restated_goal_keeps_the_reason_it_gives() -> None:
    goal = "Convert data.csv to JSON because the dashboard reads JSON"
    answer = offline_complete("restate", prompt_restate(goal=goal, agent_name="Archivist", backstory=""))
    assert "because the dashboard reads JSON" in answer


def test_after_an_operators_edit_the_earlier_version_says_edited_by_them(operator: Any,
                                                                        operator_client: Client) -> None:
    plan = tool_plan()
    v2 = plan_edit_save(plan=plan, user=operator, seen_version=1, steps=[
        StepSpec(key="1", description="Read the CSV", tool="file.read", input={"path": "data.csv"})])
    html = operator_client.get(plan.get_absolute_url()).content.decode()
    assert "Edited by olga (v2)" in html
    assert 'id="plan-status">Replanned<' not in html
    assert "Edited by olga (v2)" in operator_client.get(v2.get_absolute_url()).content.decode()


def test_serve_port_sets_the_notification_links_base_url(monkeypatch: pytest.MonkeyPatch, settings: Any) -> None:
    monkeypatch.setenv("PLANNER_BASE_URL", "")  # recorded, so that the value serve sets is undone after the test
    monkeypatch.delenv("PLANNER_BASE_URL")
    assert base_url_follow("127.0.0.1", 8765) == "http://127.0.0.1:8765"
    assert django_settings.PLANNER_BASE_URL == "http://127.0.0.1:8765"
    monkeypatch.delenv("PLANNER_BASE_URL")
    assert base_url_follow("0.0.0.0", 9000) == "http://127.0.0.1:9000"  # noqa: S104
    monkeypatch.setenv("PLANNER_BASE_URL", "https://planner.example.org")
    settings.PLANNER_BASE_URL = "https://planner.example.org"
    assert base_url_follow("127.0.0.1", 8765) == "https://planner.example.org"


def test_a_lost_race_says_who_decided_first_and_with_what_feedback(operator: Any) -> None:
    from planning.services import DecisionError

    plan = PlanFactory(status=Plan.Status.ACTIVE, agent__kind=Agent.Kind.TOOL, approval_mode="step")
    step = PlanStepFactory(plan=plan, key="3", tool="file.write", tool_input={"path": "b.txt", "content": "x"},
                           action_hint="", status=PlanStep.Status.AWAITING_APPROVAL)
    step_decline(step=step, user=operator, feedback="Too risky, write to draft.txt instead")
    marco = UserFactory(username="marco", role="operators")
    with pytest.raises(DecisionError) as refused:
        step_approve(step=step, user=marco)
    message = str(refused.value)
    assert "someone else may have" not in message
    assert "olga declined it at" in message and "“Too risky, write to draft.txt instead”" in message
    assert message.endswith("Nothing was changed.")
    assert json.dumps(message)
