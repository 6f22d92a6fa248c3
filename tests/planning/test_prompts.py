"""The planner's prompts (seeds 002, 003, 004): who the planner is, the safety rules it is given, and what a
replan is told of the plan it replaces."""

from __future__ import annotations

import pytest

from agents.models import Agent, LLMCall
from agents.tools import TOOLS
from planning.engine.prompts import prompt_plan, prompt_replan
from planning.planner import plan_generate
from tests.factories import AgentFactory


@pytest.mark.django_db
def test_planner_prompt_names_the_agent_and_its_backstory() -> None:
    agent = AgentFactory(name="Archivist", backstory="Keeps the office files in order.", kind=Agent.Kind.TOOL)
    agent.workspace.mkdir(parents=True, exist_ok=True)
    (agent.workspace / "data.csv").write_text("a,b\n1,2\n")
    plan = plan_generate(agent=agent, goal_text="Convert data.csv to JSON")
    for purpose in ("restate", "plan"):
        call = LLMCall.objects.get(plan=plan, purpose=purpose)
        assert call.prompt[0]["content"].startswith("You are Archivist. Keeps the office files in order."), purpose


def tool_prompt() -> str:
    messages = prompt_plan(kind="tool", goal="Convert data.csv", restatement=None, agent_name="Acta", backstory="",
                           tools=list(TOOLS.values()), allowed_actions=(), needs={}, rejection_reasons=(),
                           last_rejected_output="", feedback=(), retry_hints=(), max_steps=20)
    return messages[-1]["content"]


def test_tool_planner_prompt_asks_for_read_only_steps_first_and_marks_risky_tools() -> None:
    prompt = tool_prompt()
    assert "read-only steps come first" in prompt
    assert "- file.read " in prompt and "[safe, read-only]" in prompt.split("- file.read ", 1)[1].split("\n", 1)[0]
    assert "[RISKY (write): requiresPermission must be true]" in prompt.split("- file.write ", 1)[1].split("\n", 1)[0]


def test_replan_prompt_lists_the_completed_steps_and_the_failed_step_with_its_reason() -> None:
    messages = prompt_replan(
        kind="tool", goal="Convert data.csv", agent_name="Acta", backstory="", tools=list(TOOLS.values()),
        allowed_actions=(), needs={}, feedback=(), max_steps=20, reason="step 2 failed after 2 retries",
        completed_steps=[{"key": "1", "description": "Read the CSV", "tool": "file.read", "input": {"path": "data.csv"}}],
        failed_step={"key": "2", "description": "Convert it", "tool": "file.convert", "failure_reason": "disk full"},
    )
    prompt = messages[-1]["content"]
    assert 'id 1: Read the CSV [file.read {"path": "data.csv"}]' in prompt.split("COMPLETED STEPS", 1)[1]
    assert "FAILED STEP: id 2: Convert it (failed: disk full)" in prompt
    assert "WHY: step 2 failed after 2 retries" in prompt


def test_persona_planner_prompt_asks_for_2_to_6_steps_with_action_hints_and_cycle_estimates() -> None:
    messages = prompt_plan(kind="persona", goal="Get something to eat", restatement=None, agent_name="Jenbina",
                           backstory="", tools=None, allowed_actions=["work", "buy food", "eat"], needs={"hunger": 0.2},
                           rejection_reasons=(), last_rejected_output="", feedback=(), retry_hints=(), max_steps=20)
    assert "You decompose your goal into 2-6 ordered steps" in messages[0]["content"]
    prompt = messages[-1]["content"]
    assert "- Give 2-6 ordered steps. Each step has only: description, action_hint, expected_outcome, " \
           "estimated_cycles." in prompt
    assert "hunger: 20%" in prompt


def test_persona_replan_prompt_carries_the_needs_as_they_are_now() -> None:
    messages = prompt_replan(
        kind="persona", goal="Get something to eat", agent_name="Jenbina", backstory="", tools=None,
        allowed_actions=["work", "buy food", "eat", "cook"], needs={"hunger": 0.15, "money": 0.05}, feedback=(),
        max_steps=20, reason="step 2 declined: cook at home",
        completed_steps=[{"key": "1", "description": "Work a shift", "action_hint": "work"}],
        failed_step={"key": "2", "description": "Buy food", "action_hint": "buy food"},
    )
    prompt = messages[-1]["content"]
    assert "id 1: Work a shift" in prompt and "FAILED STEP: id 2: Buy food" in prompt
    assert "CURRENT NEEDS (satisfaction, lowest first): money: 5%, hunger: 15%" in prompt
