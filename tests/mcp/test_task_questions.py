"""A planner's question on an MCP agent's plan (seed 003: the built-in planner asks rather than guesses) reaches a
2026-07-28 client that declares the tasks extension as a task in "input_required", the question a form elicitation
in its inputRequests; the client's answer (tasks/update) is recorded as an operator's answer would be, and the task
goes on. A 2025-11-25 client waits for an operator's answer as before. Spoken with the official mcp SDK's client."""

from __future__ import annotations

from typing import Any, Literal

import pytest
from mcp import ClientSession
from mcp.shared.exceptions import MCPError
from mcp_types import GetTaskRequest, GetTaskRequestParams, Request, RequestParams

from agents.models import AgentToken, token_hash
from planning import services
from planning.models import Plan, PlanEvent
from planning.services import reported
from tests.factories import UserFactory
from tests.mcp.test_server import db, ok, rate_counters_cleared, setup
from tests.mcp.test_tasks import TaskHandle, TaskState, legacy_session, modern_session, task_get

pytestmark = pytest.mark.django_db(transaction=True)
__all__ = ["rate_counters_cleared"]


class UpdateTaskParams(RequestParams):
    task_id: str
    input_responses: dict[str, Any] | None = None


class UpdateTaskRequest(Request[UpdateTaskParams, Literal["tasks/update"]]):
    method: Literal["tasks/update"] = "tasks/update"
    params: UpdateTaskParams


class AskingState(TaskState):
    """tasks/get's answer, with the input requests of a task in input_required."""

    input_requests: dict[str, Any] | None = None


async def task_update(session: ClientSession, task_id: str, responses: dict[str, Any]) -> TaskState:
    return await session.send_request(UpdateTaskRequest(params=UpdateTaskParams(task_id=task_id,
                                                                                input_responses=responses)),
                                      TaskState)


async def task_asking(session: ClientSession, task_id: str) -> AskingState:
    return await session.send_request(GetTaskRequest(params=GetTaskRequestParams(task_id=task_id)), AskingState)


@db
def planner_asks(raw: str, goal: str) -> int:
    """The agent lets the built-in planner plan a vague goal (POST /api/v1/goals does this): it asks instead."""
    token = AgentToken.objects.select_related("agent").get(key_hash=token_hash(raw))
    plan = reported.goal_plan(agent=token.agent, goal=goal)
    assert plan.status == Plan.Status.CLARIFYING, (plan.status, plan.failure_reason)
    return plan.pk


@db
def plan_row(plan_id: int) -> Plan:
    return Plan.objects.get(pk=plan_id)


@db
def clarified_events(plan_id: int) -> list[tuple[str, str]]:
    return list(PlanEvent.objects.filter(plan_id=plan_id, kind=PlanEvent.Kind.CLARIFIED)
                .values_list("actor_label", "reason"))


@db
def operator_answers(plan_id: int, answer: str) -> None:
    services.plan_clarify(plan=Plan.objects.get(pk=plan_id), user=UserFactory(username="omar", role="operators"),
                          answer=answer)


@pytest.mark.parametrize("answer", ["Summarise notes.txt into summary.md", "the q3 thing, mail it to dana pls"])
async def test_the_planners_question_is_input_required_and_the_clients_answer_goes_back(answer: str) -> None:
    raw = await db(setup)()
    plan_id = await planner_asks(raw, "do the thing")
    question = (await plan_row(plan_id)).clarification_question
    async with modern_session(raw) as session:
        handle = await session.call_tool("wait_for_decision", {"plan_id": plan_id, "timeout_seconds": 30},
                                         allow_claimed=True)
        assert isinstance(handle, TaskHandle) and handle.status == "input_required"
        asking = await task_asking(session, handle.task_id)
        assert asking.status == "input_required" and asking.status_message == f"The planner asks: {question}"
        asked = (asking.input_requests or {})["answer"]
        assert asked["method"] == "elicitation/create" and asked["params"]["message"] == question
        assert asked["params"]["requestedSchema"]["required"] == ["answer"]
        state = await task_update(session, handle.task_id, {"answer": {"action": "accept",
                                                                       "content": {"answer": answer}}})
        # Answered as an operator's answer would be: the plan goes on, and the task completes with what now.
        assert state.status == "completed" and state.result is not None
        decision = state.result["structuredContent"]["decision"]
        assert decision["action"] == "replan" and answer in decision["reason"]
        # Once: a second answer is refused, nothing changed.
        with pytest.raises(MCPError, match="asks no question"):
            await task_update(session, handle.task_id, {"answer": {"action": "accept", "content": {"answer": "x"}}})
    plan = await plan_row(plan_id)
    assert plan.status == Plan.Status.ACTIVE and plan.clarification_answer == " ".join(answer.split())
    assert await clarified_events(plan_id) == [("MCP bot (MCP)", " ".join(answer.split()))]


@pytest.mark.parametrize("responses", [{}, {"answer": {"action": "decline"}}, {"answer": {"action": "cancel"}},
                                       {"answer": {"action": "accept", "content": {"answer": "   "}}},
                                       {"other": {"action": "accept", "content": {"answer": "x"}}}])
async def test_no_answer_changes_nothing_and_the_question_still_waits(responses: dict[str, Any]) -> None:
    raw = await db(setup)()
    plan_id = await planner_asks(raw, "do the thing")
    async with modern_session(raw) as session:
        handle = await session.call_tool("wait_for_decision", {"plan_id": plan_id}, allow_claimed=True)
        assert isinstance(handle, TaskHandle)
        with pytest.raises(MCPError, match="Nothing was changed"):
            await task_update(session, handle.task_id, responses)
        assert (await task_get(session, handle.task_id)).status == "input_required"
    assert (await plan_row(plan_id)).status == Plan.Status.CLARIFYING and await clarified_events(plan_id) == []


async def test_another_agents_task_cannot_be_answered() -> None:
    raw = await db(setup)()
    other = await db(setup)(name="Other bot")
    plan_id = await planner_asks(raw, "do the thing")
    async with modern_session(raw) as session:
        handle = await session.call_tool("wait_for_decision", {"plan_id": plan_id}, allow_claimed=True)
        assert isinstance(handle, TaskHandle)
    async with modern_session(other) as session:
        with pytest.raises(MCPError, match="Unknown task id"):
            await task_update(session, handle.task_id, {"answer": {"action": "accept", "content": {"answer": "x"}}})
    assert (await plan_row(plan_id)).status == Plan.Status.CLARIFYING


async def test_an_operators_answer_completes_the_task_too() -> None:
    raw = await db(setup)()
    plan_id = await planner_asks(raw, "do the thing")
    async with modern_session(raw) as session:
        handle = await session.call_tool("wait_for_decision", {"plan_id": plan_id}, allow_claimed=True)
        assert isinstance(handle, TaskHandle)
        await operator_answers(plan_id, "summarise notes.txt")
        state = await task_get(session, handle.task_id)
    assert state.status == "completed" and state.result is not None
    assert state.result["structuredContent"]["decision"]["action"] == "replan"


async def test_a_2025_client_waits_for_the_operators_answer_as_before() -> None:
    raw = await db(setup)()
    plan_id = await planner_asks(raw, "do the thing")
    async with legacy_session(raw) as session:
        waiting = ok(await session.call_tool("wait_for_decision", {"plan_id": plan_id, "timeout_seconds": 0}))
        assert waiting["action"] == "wait" and "needs clarification" in waiting["reason"]
        with pytest.raises(MCPError):
            await task_update(session, "anything", {})
        await operator_answers(plan_id, "summarise notes.txt")
        decided = ok(await session.call_tool("wait_for_decision", {"plan_id": plan_id, "timeout_seconds": 0}))
    assert decided["action"] == "replan"
