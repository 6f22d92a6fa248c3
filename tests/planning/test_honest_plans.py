"""Plans that mean what the goal says, and failures that name their true reason (issue 19).

The planner against tests/llm_server.py: prose is "no JSON plan in the answer", a cut-off answer is truncated,
the prompt's example and placeholders are refused, a plan that writes to the goal's input or ignores its file
never reaches approval, and a failing planning can be cancelled from its page."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from django.test import Client

from agents.llm.structured import formats_forget
from agents.models import Agent, LLMCall
from agents.tools import TOOLS
from goals.prompts import AnswerUnreadable, goal_proposals, milestone_verdict
from planning.engine.complexity import tool_single_step
from planning.engine.meaning import goal_files
from planning.engine.validate import plan_validate
from planning.models import Plan, PlanEvent
from planning.planner import plan_generate
from tests.factories import AgentFactory
from tests.llm_server import LLMTestServer, answer

pytestmark = pytest.mark.django_db

GOAL = "Count the rows in data.csv and write the count to count.txt"
RESTATE = ('<json>{"who": "Archivist", "what": "count the rows", "when": "now", "where": "data.csv", '
           '"why": "to know"}</json>')


def step(tool: str, tool_input: dict[str, Any], key: str = "1", intent: str = "Do it") -> dict[str, Any]:
    return {"id": key, "tool": tool, "intent": intent, "input": tool_input, "requiresPermission": True}


def plan_text(*steps: dict[str, Any], goal: str = GOAL) -> str:
    return "<json>" + json.dumps({"goal": goal, "steps": list(steps)}) + "</json>"


GOOD = plan_text(step("file.count", {"path": "data.csv", "output": "count.txt", "unit": "rows"}))


@pytest.fixture(autouse=True)
def fresh_formats() -> Iterator[None]:
    formats_forget()
    yield
    formats_forget()


@pytest.fixture
def models(settings: Any, llm_server: LLMTestServer) -> LLMTestServer:
    settings.LLM_MODELS = {"planner": ["planner-model"], "fast": ["fast-model"]}
    settings.PLAN_ONE_STEP_SHORTCUT = "off"
    return llm_server


def tool_agent() -> Agent:
    agent = AgentFactory(name="Archivist", kind=Agent.Kind.TOOL)
    agent.workspace.mkdir(parents=True, exist_ok=True)
    (agent.workspace / "data.csv").write_text("a,b\n1,2\n3,4\n")
    return agent


def rejections(plan: Plan) -> list[list[str]]:
    return [e.detail["reasons"] for e in plan.events.filter(kind=PlanEvent.Kind.ATTEMPT_REJECTED).order_by("pk")]


# -- honest failures -------------------------------------------------------------------------------------------


def test_prose_is_rejected_as_no_json_plan_never_as_tool_steps_and_costs_no_reflection(models: LLMTestServer) -> None:
    essay = "Sure! To count rows you can:\n1. Open the file\n2. Count the lines\n- write the number down"
    models.script("fast-model", answer(RESTATE))
    models.script("planner-model", answer(essay), answer(GOOD))
    plan = plan_generate(agent=tool_agent(), goal_text=GOAL)
    assert plan.status == Plan.Status.AWAITING_APPROVAL
    assert rejections(plan) == [["no JSON plan in the answer"]]
    assert not LLMCall.objects.filter(plan=plan, purpose="reflect").exists()
    # The retry tells the model the true reason.
    retry = models.requests_for("planner-model")[1].messages[-1]["content"]
    assert "no JSON plan in the answer" in retry and "missing 'id'" not in retry


def test_a_cut_off_answer_is_rejected_as_truncated_and_shown_so(models: LLMTestServer, operator: Any) -> None:
    models.script("fast-model", answer(RESTATE))
    models.script("planner-model", answer(GOOD[:60], finish_reason="length"), answer(GOOD))
    plan = plan_generate(agent=tool_agent(), goal_text=GOAL)
    assert plan.status == Plan.Status.AWAITING_APPROVAL
    assert "cut off at the token limit" in rejections(plan)[0][0]
    assert LLMCall.objects.get(plan=plan, purpose="plan", finish_reason="length")
    client = Client()
    client.force_login(operator)
    page = client.get(plan.get_absolute_url()).content.decode()
    assert "truncated: cut off at the token limit" in page
    assert "Planning this version: 3 model calls" in page  # restate + two plan calls


def test_a_copy_of_the_prompts_worked_example_is_refused(models: LLMTestServer) -> None:
    from planning.engine.prompts import _TOOL_TEMPLATE

    models.script("fast-model", answer(RESTATE))
    models.script("planner-model", answer(_TOOL_TEMPLATE), answer(GOOD))
    plan = plan_generate(agent=tool_agent(), goal_text=GOAL)
    reasons = rejections(plan)[0]
    assert any("the prompt's example" in r for r in reasons)
    assert any("is not the goal given" in r for r in reasons)
    assert plan.status == Plan.Status.AWAITING_APPROVAL


def test_a_placeholder_restatement_is_not_stored(models: LLMTestServer) -> None:
    placeholders = '<json>{"who": "...", "what": "...", "when": "...", "where": "...", "why": "..."}</json>'
    models.script("fast-model", answer(placeholders))
    models.script("planner-model", answer(GOOD))
    plan = plan_generate(agent=tool_agent(), goal_text=GOAL)
    assert (plan.who, plan.what, plan.why) == ("", "", "")


def test_placeholder_milestones_and_prose_goals_are_refused() -> None:
    with pytest.raises(AnswerUnreadable, match="placeholder"):
        milestone_verdict('<json>{"achieved": true, "explanation": "..."}</json>')
    assert milestone_verdict('{"achieved": true, "explanation": "Ate a full meal at 12:00"}') == (
        True, "Ate a full meal at 12:00")
    prose = ("A new dream that you have is to take your favorite meal out of the kitchen and share it with "
             "everyone you know, because food brings people together")
    with pytest.raises(AnswerUnreadable):
        goal_proposals(json.dumps([{"description": prose}, {"description": "Sure, here is some ```python```"}]))
    kept = goal_proposals(json.dumps([{"description": "..."}, {"description": "Cook a warm dinner"}]))
    assert [g["description"] for g in kept] == ["Cook a warm dinner"]


# -- meaning -----------------------------------------------------------------------------------------------------


def test_goal_files_tell_inputs_from_outputs() -> None:
    files = goal_files(GOAL)
    assert (files.inputs, files.outputs, files.changes_inputs) == (("data.csv",), ("count.txt",), False)
    assert goal_files("Append the line done to log.txt").changes_inputs


@pytest.mark.parametrize(("steps", "reason"), [
    ([step("file.append", {"path": "data.csv", "content": "rows: 2"})],
     "writes to data.csv, which the goal names only as its input"),
    ([step("file.write", {"path": "count.txt", "content": "2"})], "the plan never uses data.csv"),
    ([step("file.count", {"path": "data.csv", "output": "rows.txt"})], "the plan never uses count.txt"),
])
def test_the_validator_rejects_a_plan_that_does_not_mean_the_goal(steps: list[dict[str, Any]], reason: str) -> None:
    result = plan_validate({"goal": GOAL, "steps": steps}, kind="tool", goal_text=GOAL)
    assert result.plan is None
    assert any(reason in p for p in result.problems), result.problems


def test_the_validator_rejects_another_goal_and_accepts_the_goal_in_other_words() -> None:
    count = [step("file.count", {"path": "data.csv", "output": "count.txt"})]
    other = plan_validate({"goal": "Put the first line of chapter7.md into titles.txt", "steps": count},
                          kind="tool", goal_text=GOAL)
    assert any("is not the goal given" in p for p in other.problems)
    same = plan_validate({"goal": "count rows of data.csv into count.txt", "steps": count}, kind="tool",
                         goal_text=GOAL)
    assert same.ok, same.problems


def test_a_plan_writing_to_the_goals_input_never_reaches_approval(models: LLMTestServer) -> None:
    bad = plan_text(step("file.append", {"path": "data.csv", "content": "3"}))
    models.script("fast-model", answer(RESTATE), answer('{"hints": ["write count.txt"]}'))
    models.script("planner-model", answer(bad), answer(bad), answer(bad), answer(bad))
    plan = plan_generate(agent=tool_agent(), goal_text=GOAL)
    assert plan.status == Plan.Status.FAILED and not plan.steps.exists()
    assert "writes to data.csv, which the goal names only as its input" in plan.failure_reason


def test_persona_prose_steps_are_refused() -> None:
    data = {"steps": [{"description": "Sure, you can implement this in your code: ```python print(1)```",
                       "action_hint": "work"}, {"description": "Eat", "action_hint": "eat"}]}
    result = plan_validate(data, kind="persona", allowed_actions=["work", "eat"], goal_text="Get something to eat")
    assert any("not a step" in p for p in result.problems)


# -- small models --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("goal", "tool", "tool_input"), [
    ("Convert data.csv to JSON", "file.convert", {"path": "data.csv", "to": "json"}),
    (GOAL, "file.count", {"path": "data.csv", "output": "count.txt", "unit": "rows"}),
    ("List the workspace", "file.list", {}),
    ("Copy notes.txt to backup/", "file.copy", {"path": "notes.txt", "to": "backup/"}),
])
def test_the_everyday_shortcut_covers_convert_count_list_copy(goal: str, tool: str, tool_input: dict[str, Any]) -> None:
    assert tool_single_step(goal) is None  # a strong model plans these, with a check of the result
    found = tool_single_step(goal, everyday=True)
    assert found is not None and (found["tool"], found["input"]) == (tool, tool_input)


def test_a_small_planner_model_gets_the_shortcut_and_a_strong_one_plans(settings: Any, llm_server: LLMTestServer) -> None:
    settings.LLM_MODELS = {"planner": ["tiny-planner"], "fast": ["tiny-planner"]}
    settings.LLM_MODEL_SETTINGS = {"tiny-planner": {"small": True}}
    plan = plan_generate(agent=tool_agent(), goal_text=GOAL)
    assert plan.status == Plan.Status.AWAITING_APPROVAL
    assert [(s.tool, s.requires_permission) for s in plan.steps.all()] == [("file.count", True)]
    assert not llm_server.requests  # no model call at all


def test_a_small_model_gets_the_compact_prompt_a_narrow_schema_and_no_reflection(
        settings: Any, llm_server: LLMTestServer) -> None:
    settings.LLM_MODELS = {"planner": ["tiny-planner"], "fast": ["tiny-planner"]}
    settings.LLM_MODEL_SETTINGS = {"tiny-planner": {"small": True, "format": "json_object"}}
    settings.PLAN_ONE_STEP_SHORTCUT = "off"
    llm_server.script("tiny-planner", answer("I would count them."), answer(GOOD))
    plan = plan_generate(agent=tool_agent(), goal_text=GOAL)
    assert plan.status == Plan.Status.AWAITING_APPROVAL
    requests = llm_server.requests_for("tiny-planner")
    assert len(requests) == 2  # no restatement, no reflection: two plan calls
    plan_schema, ask, cannot = requests[0].body["response_format"]["schema"]["anyOf"]  # or a question, or why not
    assert ask["required"] == ["ask"] and cannot["required"] == ["cannot"]
    lengths = plan_schema["properties"]["steps"]["anyOf"]  # one, two or three steps, each in its place
    assert [len(one["prefixItems"]) for one in lengths] == [1, 2, 3]
    second = lengths[1]["prefixItems"][1]["anyOf"]
    # Every tool (issue 52: a goal's words do not say which tools it needs), each with its paths narrowed.
    assert [c["properties"]["tool"]["const"] for c in second] == list(TOOLS)
    count = next(c for c in second if c["properties"]["tool"]["const"] == "file.count")
    assert count["properties"]["id"] == {"type": "string", "const": "2"}
    assert count["properties"]["dependsOn"]["items"]["enum"] == ["1"]
    count_input = count["properties"]["input"]["properties"]
    # file.count works from the goal's input and writes the file the goal names.
    assert count_input["path"]["enum"] == ["data.csv"] and count_input["output"]["enum"] == ["count.txt"]
    prompt = requests[0].messages[-1]["content"]
    assert "TEMPLATE" not in prompt and "- file.count" in prompt and "- file.write" in prompt
    assert "no JSON plan in the answer" in requests[1].messages[-1]["content"]


def test_retry_prompts_are_trimmed_to_the_models_context_rejected_output_first(
        settings: Any, llm_server: LLMTestServer) -> None:
    settings.LLM_MODELS = {"planner": ["short-context"], "fast": ["fast-model"]}
    settings.LLM_MODEL_SETTINGS = {"short-context": {"context": 2048}}
    settings.PLAN_ONE_STEP_SHORTCUT = "off"
    long_bad = plan_text(step("file.append", {"path": "data.csv", "content": "x" * 1400}))
    llm_server.script("fast-model", answer(RESTATE), answer('{"hints": ["write to count.txt instead"]}'))
    llm_server.script("short-context", answer(long_bad), answer(GOOD))
    plan_generate(agent=tool_agent(), goal_text=GOAL)
    retry = llm_server.requests_for("short-context")[1]
    text = retry.messages[-1]["content"]
    assert "YOUR PREVIOUS ATTEMPT WAS REJECTED BECAUSE" in text  # the reasons stay
    assert "x" * 400 not in text  # the rejected output went first
    assert retry.body["max_tokens"] >= 64


# -- cancel ------------------------------------------------------------------------------------------------------


def test_cancel_on_a_failed_planning_stops_its_automatic_retries(models: LLMTestServer, operator: Any) -> None:
    models.script("fast-model", answer(RESTATE))
    models.script("planner-model", *[answer("no idea") for _ in range(4)])
    agent = tool_agent()
    plan = plan_generate(agent=agent, goal_text=GOAL)
    agent.refresh_from_db()
    assert plan.status == Plan.Status.FAILED and plan.retry_at is not None and agent.plan_retry_at is not None
    client = Client()
    client.force_login(operator)
    page = client.get(plan.get_absolute_url()).content.decode()
    assert "stop retries" in page
    response = client.post(f"/plans/{plan.pk}/cancel/", {"seen_status": "failed"}, HTTP_HX_REQUEST="true")
    assert response.status_code in (200, 204, 302), response.content
    plan.refresh_from_db()
    agent.refresh_from_db()
    assert plan.status == Plan.Status.CANCELLED and plan.retry_at is None and agent.plan_retry_at is None
    assert plan.events.filter(kind=PlanEvent.Kind.PLAN_CANCELLED).exists()


def test_a_planning_under_way_can_be_stopped_from_its_page(operator: Any) -> None:
    from planning.services import PlanNoLongerValidating, attempt_reject, plan_start

    agent = tool_agent()
    plan = plan_start(agent=agent, goal_text=GOAL, goal=None, previous=None, reason="", actor_label="runner")
    client = Client()
    client.force_login(operator)
    assert "Stop planning" in client.get(plan.get_absolute_url()).content.decode()
    client.post(f"/plans/{plan.pk}/cancel/", {"seen_status": "validating"}, HTTP_HX_REQUEST="true")
    plan.refresh_from_db()
    assert plan.status == Plan.Status.CANCELLED
    # The planner's next write (its next rejected attempt) finds the plan cancelled and stops there.
    with pytest.raises(PlanNoLongerValidating):
        attempt_reject(plan=plan, model="m", reasons=["no JSON plan in the answer"], output="", hints=[],
                       actor_label="runner")
