"""Small models see every tool the goal may need, and may answer "ask" or "cannot" (issue 52).

A goal's words do not say which tools it needs ("write a short summary of notes.txt into summary.md" needs file.write
as much as text.summarize): the compact prompt lists every tool in a line each and the narrow schema offers them all.
A model that finds the goal unclear asks the operator (the plan waits for an answer); one that finds it impossible
says why, and the plan fails with that reason and no automatic retry."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from typing import Any

import pytest

from agents.llm.structured import formats_forget
from agents.models import Agent
from agents.tools import TOOLS
from planning.models import Plan, PlanEvent
from planning.planner import plan_generate
from tests.factories import AgentFactory
from tests.llm_server import LLMTestServer, answer

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def small_model(settings: Any, llm_server: LLMTestServer) -> Iterator[LLMTestServer]:
    formats_forget()
    settings.LLM_MODELS = {"planner": ["tiny"], "fast": ["tiny"]}
    settings.LLM_MODEL_SETTINGS = {"tiny": {"small": True, "format": "json_object"}}
    settings.PLAN_ONE_STEP_SHORTCUT = "off"
    yield llm_server
    formats_forget()


def tool_agent() -> Agent:
    agent = AgentFactory(name="Clerk", kind=Agent.Kind.TOOL)
    agent.workspace.mkdir(parents=True, exist_ok=True)
    (agent.workspace / "notes.txt").write_text("Met the supplier. Prices rise in May. Order before April.\n")
    (agent.workspace / "data.csv").write_text("a,b\n1,2\n")
    return agent


def offered_tools(schema: dict[str, Any]) -> set[str]:
    plan = schema["anyOf"][0]
    return {choice["properties"]["tool"]["const"] for length in plan["properties"]["steps"]["anyOf"]
            for position in length["prefixItems"] for choice in position["anyOf"]}


@pytest.mark.parametrize("goal", [
    "write a short summary of notes.txt into summary.md",
    "make a json copy of data.csv",
    "can you tidy up notes.txt pls",
])
def test_every_tool_is_in_the_prompt_and_the_schema_whatever_the_goals_words(
        small_model: LLMTestServer, goal: str) -> None:
    small_model.script("tiny", answer('{"ask": "Which part matters most?"}'))
    plan_generate(agent=tool_agent(), goal_text=goal)
    request = small_model.requests_for("tiny")[0]
    prompt = request.messages[-1]["content"]
    for name in TOOLS:
        assert f"- {name} " in prompt
    assert offered_tools(request.body["response_format"]["schema"]) == set(TOOLS)
    assert '{"ask"' in prompt and '{"cannot"' in prompt


def test_the_summary_goal_can_now_be_planned_with_file_write(small_model: LLMTestServer) -> None:
    goal = "write a short summary of notes.txt into summary.md"
    steps = [{"id": "1", "tool": "file.read", "intent": "Read the notes", "input": {"path": "notes.txt"},
              "requiresPermission": False, "dependsOn": []},
             {"id": "2", "tool": "file.write", "intent": "Write the summary",
              "input": {"path": "summary.md", "content": "Prices rise in May: order before April."},
              "requiresPermission": True, "dependsOn": ["1"]}]
    small_model.script("tiny", answer(json.dumps({"goal": goal, "steps": steps})))
    plan = plan_generate(agent=tool_agent(), goal_text=goal)
    assert plan.status == Plan.Status.AWAITING_APPROVAL, plan.failure_reason
    assert [s.tool for s in plan.steps.order_by("position")] == ["file.read", "file.write"]


@pytest.mark.parametrize("question", ["Which file do you mean by 'the report'?", "Should the old backup be kept?"])
def test_a_model_that_asks_puts_the_question_to_the_operator(small_model: LLMTestServer, question: str) -> None:
    small_model.script("tiny", answer(json.dumps({"ask": question})))
    plan = plan_generate(agent=tool_agent(), goal_text="clean up the report")
    assert plan.status == Plan.Status.CLARIFYING
    assert plan.clarification_question == question
    assert plan.events.filter(kind=PlanEvent.Kind.CLARIFICATION_ASKED).exists()


@pytest.mark.parametrize(("goal", "why"), [
    # Goals the rules before any model let through (an e-mail or a delete is refused before the model is asked:
    # tests/planning/test_plans_reach_goals.py); the model itself sees what its tools cannot do.
    ("convert report.pdf into data.json", "No tool reads PDF files."),
    ("count the words in notes.txt and draw them as a bar chart in chart.png", "No tool draws charts."),
])
def test_a_model_that_says_it_cannot_fails_the_plan_with_its_reason_and_no_retry(
        small_model: LLMTestServer, goal: str, why: str) -> None:
    small_model.script("tiny", answer(json.dumps({"cannot": why})))
    agent = tool_agent()
    plan = plan_generate(agent=agent, goal_text=goal)
    assert plan.status == Plan.Status.FAILED
    assert plan.failure_reason.splitlines()[0] == f"the planner says it cannot be done: {why}"
    assert plan.retry_at is None  # asking again would say it again: the operator decides
    assert len(small_model.requests_for("tiny")) == 1
    agent.refresh_from_db()
    assert "waiting for an operator" in agent.waiting_reason


def test_a_placeholder_reason_is_no_answer(small_model: LLMTestServer) -> None:
    small_model.script("tiny", answer('{"cannot": "<why>"}'), answer('{"cannot": "..."}'),
                       answer('{"cannot": "<why>"}'), answer('{"cannot": "<why>"}'))
    plan = plan_generate(agent=tool_agent(), goal_text="convert report.pdf into data.json")
    assert plan.status == Plan.Status.FAILED
    assert "cannot be done" not in plan.failure_reason.splitlines()[0]
    assert "placeholder" in plan.failure_reason


def test_two_agents_prompts_share_everything_up_to_their_files(small_model: LLMTestServer) -> None:
    """A one-slot llama.cpp server evaluates only what a prompt does not share with the one before it: the rules
    and every tool come before an agent's own files and goal, so a second agent's plan costs only its tail."""
    small_model.script("tiny", answer('{"ask": "Which part?"}'), answer('{"ask": "Which part?"}'))
    plan_generate(agent=tool_agent(), goal_text="sum up notes.txt for me")
    other = AgentFactory(name="Filer", kind=Agent.Kind.TOOL)
    other.workspace.mkdir(parents=True, exist_ok=True)
    (other.workspace / "budget.csv").write_text("item,cost\ntea,3\n")
    plan_generate(agent=other, goal_text="how much did we spend (budget.csv)")
    first, second = (r.messages[-1]["content"] for r in small_model.requests_for("tiny"))
    shared = len(os.path.commonprefix([first, second]))
    assert first.index("FILES:") == second.index("FILES:") <= shared  # the files are the first thing that differs
    assert all(f"- {name} " in first[:shared] for name in TOOLS)


def test_a_large_planner_with_a_small_reflecting_model_asks_no_reflection(
        small_model: LLMTestServer, settings: Any) -> None:
    """The demo's Intern plans with its own (large, offline) chain; the fast model is SmolLM2: a rejected answer is
    not sent to the small model for hints (they do not help, and cost a busy one-slot server a minute)."""
    settings.LLM_MODELS = {"planner": ["big-planner"], "fast": ["SmolLM2-135M-Instruct"]}
    settings.LLM_MODEL_SETTINGS = {"big-planner": {"format": "json_object"}}
    agent = tool_agent()
    good = {"goal": "Read notes.txt", "steps": [{"id": "1", "tool": "file.read", "intent": "Read the notes",
                                                   "input": {"path": "notes.txt"}, "requiresPermission": False}]}
    bad = {"goal": "Read notes.txt", "steps": [{"id": "1", "tool": "file.open", "intent": "Open the notes",
                                                  "input": {"path": "notes.txt"}, "requiresPermission": False}]}
    small_model.script("big-planner", answer(json.dumps(bad)), answer(json.dumps(good)))
    small_model.script("SmolLM2-135M-Instruct", answer('{"who": "a", "what": "b", "when": "c", "where": "d", '
                                                       '"why": "e"}'))
    plan = plan_generate(agent=agent, goal_text="Read notes.txt")
    assert plan.status == "awaiting_approval", plan.failure_reason
    assert not [r for r in small_model.requests_for("SmolLM2-135M-Instruct")
                if "hints" in json.dumps(r.body.get("response_format", {}))]


@pytest.mark.parametrize("said", ['{"ask": "10"}', '{"ask": "3 + 4"}', '{"cannot": "x 2"}'])
def test_a_question_or_reason_without_words_never_reaches_the_operator(small_model: LLMTestServer, said: str) -> None:
    """SmolLM2 asked "10" of "how many fruit rows does data.csv have?": refused with the reason, never put in the
    inbox as a question nobody can answer; the model's next answer (a plan) is taken."""
    plan_json = {"goal": "Read notes.txt", "steps": [{"id": "1", "tool": "file.read", "intent": "Read the notes",
                                                        "input": {"path": "notes.txt"}, "requiresPermission": False}]}
    small_model.script("tiny", answer(said), answer(json.dumps(plan_json)))
    plan = plan_generate(agent=tool_agent(), goal_text="Read notes.txt")
    assert plan.status == Plan.Status.AWAITING_APPROVAL, plan.failure_reason
    assert plan.clarification_question == ""
    rejected = PlanEvent.objects.filter(plan=plan, kind=PlanEvent.Kind.ATTEMPT_REJECTED).first()
    assert rejected is not None and "says nothing" in rejected.reason + json.dumps(rejected.detail)
