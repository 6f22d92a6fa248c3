"""Remote A2A agents whose card offers push notifications (docs/a2a-agents.md): the dashboard asks the agent to
POST its task's updates to the dashboard's webhook with a token of that task, records each as a read would be,
and reads the task itself only at a safety interval. Against the tests' a2a-sdk agent on loopback, whose SDK
sender POSTs to the dashboard served by pytest-django's live server."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from a2a.types import Message, Part, Role, StreamResponse, Task, TaskState, TaskStatus, TaskStatusUpdateEvent
from django.test import Client
from django.urls import reverse
from django.utils import timezone
from google.protobuf.json_format import MessageToDict

from agents.models import Agent
from goals.models import Goal
from planning.models import A2ATask, Plan, PlanEvent, PlanStep
from planning.services.a2a import push_token_hash
from runtime.cycle import agent_cycle
from tests.a2a import a2a_agent
from tests.a2a.a2a_agent import QUESTION


@pytest.fixture(autouse=True)
def loopback(settings: Any) -> Iterator[None]:
    settings.OUTBOUND_ALLOWED_NETWORKS = ["127.0.0.0/8"]
    for recorded in (a2a_agent.METHODS, a2a_agent.ANSWERS, a2a_agent.PUSHED):
        recorded.clear()
    a2a_agent.THINK_SECONDS, a2a_agent.WRITE_SECONDS = 1.5, 1.0  # so that what follows the start is pushed
    yield
    a2a_agent.THINK_SECONDS, a2a_agent.WRITE_SECONDS = 0.0, 0.0


def goal_given(client: Client, base: str, goal: str = "Summarise the notes in my folder") -> Agent:
    assert client.post(reverse("agent-a2a-new"), {"url": base}).status_code == 302
    agent = Agent.objects.get(kind=Agent.Kind.A2A)
    assert client.post(reverse("agent-goal", args=[agent.pk]),
                       {"description": goal, "horizon": "short_term"}).status_code == 302
    return agent


def until(check: Callable[[], Any], *, seconds: float = 10.0) -> Any:
    """Wait, running no cycle, until `check` is true: what changes meanwhile came by a push notification."""
    deadline = time.monotonic() + seconds
    while not (value := check()):
        assert time.monotonic() < deadline, "nothing came by push notification"
        time.sleep(0.05)
    return value


def steps_of(plan: Plan) -> list[str]:
    return list(plan.steps.order_by("position").values_list("description", flat=True))


@pytest.mark.django_db(transaction=True)
def test_a_pushing_agent_brings_its_question_and_its_end_to_the_dashboard(
        operator_client: Client, live_server: Any, settings: Any) -> None:
    settings.A2A_PUSH_BASE_URL = live_server.url
    with a2a_agent.served(push=True) as base:
        agent = goal_given(operator_client, base)
        assert "followed by the push notifications it sends (read every 30 s besides)" in (
            operator_client.get(agent.get_absolute_url()).content.decode())
        outcome = agent_cycle(agent_id=agent.pk, runner="test runner")
        assert outcome.endswith("(followed by push notifications)")
        assert a2a_agent.METHODS == ["SendMessage", "CreateTaskPushNotificationConfig", "GetTask"]
        # The agent is not read again before the safety interval: its next cycle comes about 30 s later.
        left = (Agent.objects.get(pk=agent.pk).next_cycle_at - timezone.now()).total_seconds()
        assert 25 < left <= 30
        assert agent_cycle(agent_id=agent.pk, runner="test runner").endswith("(followed by push notifications)")
        assert a2a_agent.METHODS.count("GetTask") == 1

        # The question comes by the agent's push, with no cycle run: it is in the inbox.
        plan = until(lambda: Plan.objects.filter(agent=agent, status=Plan.Status.CLARIFYING).first())
        assert plan.clarification_question == QUESTION
        assert QUESTION in operator_client.get(reverse("inbox")).content.decode()
        assert ("statusUpdate", 200) in a2a_agent.PUSHED
        assert a2a_agent.METHODS.count("GetTask") == 1

        response = operator_client.post(reverse("inbox-plan-clarify", args=[plan.pk]), {"answer": "Markdown"},
                                        headers={"HX-Request": "true"})
        assert response.status_code == 200
        assert agent_cycle(agent_id=agent.pk, runner="test runner").startswith("task ")
        assert until(lambda: a2a_agent.ANSWERS) == ["Markdown"]
        # The rest comes by push too: the summary written, the task completed, the plan and its goal with it.
        plan = until(lambda: Plan.objects.filter(pk=plan.pk, status=Plan.Status.COMPLETED).first())
    assert steps_of(plan) == ["Planned 3 steps: read notes.txt, outline the summary, write summary.md",
                              "Artifact plan", "Writing summary.md as Markdown", "Artifact summary.md"]
    assert Goal.objects.get(pk=plan.goal_id).status == Goal.Status.COMPLETED
    assert a2a_agent.METHODS.count("GetTask") == 1
    states = [e.detail["diff"]["state"] for e in plan.events.filter(kind=PlanEvent.Kind.TASK_STATE).order_by("pk")]
    assert states[-1] == ["working", "completed"] and ["working", "input-required"] in states
    assert plan.events.filter(kind=PlanEvent.Kind.CLARIFICATION_ASKED).count() == 1
    assert all(status == 200 for _, status in a2a_agent.PUSHED)


@pytest.mark.django_db
def test_a_lost_push_is_caught_by_the_safety_read(operator_client: Client, settings: Any) -> None:
    settings.A2A_PUSH_BASE_URL = "http://127.0.0.1:9"  # nothing listens: every notification is lost
    settings.A2A_PUSH_POLL_SECONDS = 0.3
    with a2a_agent.served(push=True) as base:
        agent = goal_given(operator_client, base)
        agent_cycle(agent_id=agent.pk, runner="test runner")
        assert "CreateTaskPushNotificationConfig" in a2a_agent.METHODS
        deadline = time.monotonic() + 10
        while (plan := Plan.objects.get(agent=agent)).status != Plan.Status.CLARIFYING:
            assert time.monotonic() < deadline
            agent_cycle(agent_id=agent.pk, runner="test runner")
            time.sleep(0.1)
    assert plan.clarification_question == QUESTION
    assert a2a_agent.PUSHED == []  # none reached the dashboard; the safety read found the question
    assert a2a_agent.METHODS.count("GetTask") >= 2


@pytest.mark.django_db
def test_an_agent_that_refuses_the_push_config_is_polled(operator_client: Client, settings: Any) -> None:
    settings.A2A_PUSH_BASE_URL = "https://dashboard.example.com"
    a2a_agent.THINK_SECONDS = 0.0
    with a2a_agent.served(push=True, push_refused=True) as base:
        agent = goal_given(operator_client, base)
        outcome = agent_cycle(agent_id=agent.pk, runner="test runner")
        assert "push" not in outcome
        assert a2a_agent.METHODS[:2] == ["SendMessage", "CreateTaskPushNotificationConfig"]
        task = A2ATask.objects.get(plan__agent=agent)
        assert task.push_token_hash == ""  # no notification is taken for it
        deadline = time.monotonic() + 10
        while (plan := Plan.objects.get(agent=agent)).status != Plan.Status.CLARIFYING:
            assert time.monotonic() < deadline
            agent_cycle(agent_id=agent.pk, runner="test runner")
            time.sleep(0.05)
    assert plan.clarification_question == QUESTION and "GetTask" in a2a_agent.METHODS


# --- the webhook, called as an agent would ------------------------------------------------------------------

TOKEN = "the-task-token-only-the-agent-knows"


def working_task(task_id: str = "task-1") -> Task:
    said = Message(message_id="m-1", role=Role.ROLE_AGENT, parts=[Part(text="Reading notes.txt")])
    goal = Message(message_id="m-0", role=Role.ROLE_USER, parts=[Part(text="Summarise my notes")])
    return Task(id=task_id, context_id="ctx-1", history=[goal, said],
                status=TaskStatus(state=TaskState.TASK_STATE_WORKING, message=said))


@pytest.fixture
def pushed_task(db: None) -> A2ATask:
    """A remote agent's task under way, whose updates the agent pushes with TOKEN."""
    agent = Agent.objects.create(name="Summary writer", kind=Agent.Kind.A2A, a2a_url="http://127.0.0.1:1/",
                                 a2a_card={"name": "Summary writer", "capabilities": {"pushNotifications": True}})
    goal = Goal.objects.create(agent=agent, description="Summarise my notes", horizon=Goal.Horizon.SHORT)
    plan = Plan.objects.create(agent=agent, goal=goal, goal_text=goal.description, status=Plan.Status.ACTIVE)
    PlanStep.objects.create(plan=plan, key="m2", position=1, description="Reading notes.txt",
                            status=PlanStep.Status.COMPLETED)
    return A2ATask.objects.create(plan=plan, task_id="task-1", context_id="ctx-1", state="working",
                                  messages_seen=2, message_ids_seen=["m-0", "m-1"],
                                  snapshot=MessageToDict(working_task()), push_token_hash=push_token_hash(TOKEN))


def question(task_id: str = "task-1") -> bytes:
    asked = Message(message_id="m-2", role=Role.ROLE_AGENT, parts=[Part(text=QUESTION)])
    update = TaskStatusUpdateEvent(task_id=task_id, context_id="ctx-1",
                                   status=TaskStatus(state=TaskState.TASK_STATE_INPUT_REQUIRED, message=asked))
    return json.dumps(MessageToDict(StreamResponse(status_update=update))).encode()


def push(task: A2ATask, body: bytes, *, token: str | None = TOKEN, client: Client | None = None) -> Any:
    headers = {"X-A2A-Notification-Token": token} if token is not None else {}
    return (client or Client()).post(reverse("a2a-push", args=[task.pk]), body, content_type="application/json",
                                     headers=headers)


def recorded(task: A2ATask) -> tuple[Any, ...]:
    """What an operator would see change: the plan's status and question, its steps, its events, the task."""
    plan = Plan.objects.get(pk=task.plan_id)
    row = A2ATask.objects.get(pk=task.pk)
    return (plan.status, plan.clarification_question, steps_of(plan),
            list(PlanEvent.objects.filter(plan=plan).values_list("kind", flat=True)), row.state, row.snapshot)


def test_a_pushed_question_is_recorded_once_however_often_it_is_posted(pushed_task: A2ATask) -> None:
    # An agent's POST needs no login and no CSRF token: the task's token authenticates it.
    response = push(pushed_task, question(), client=Client(enforce_csrf_checks=True))
    assert response.status_code == 200 and response.json() == {"recorded": True, "state": "input-required"}
    plan = Plan.objects.get(pk=pushed_task.plan_id)
    assert plan.status == Plan.Status.CLARIFYING and plan.clarification_question == QUESTION
    assert Agent.objects.get(pk=plan.agent_id).waiting_reason.endswith(QUESTION)
    before = recorded(pushed_task)
    again = push(pushed_task, question())
    assert again.status_code == 200 and again.json() == {"recorded": False, "state": "input-required"}
    assert recorded(pushed_task) == before
    assert plan.events.filter(kind=PlanEvent.Kind.CLARIFICATION_ASKED).count() == 1


def test_the_whole_task_pushed_is_recorded_as_a_read_would_be(pushed_task: A2ATask) -> None:
    task = working_task()
    task.artifacts.add(artifact_id="art-1", name="summary.md", parts=[Part(text="# Summary")])
    task.status.CopyFrom(TaskStatus(state=TaskState.TASK_STATE_COMPLETED))
    body = json.dumps(MessageToDict(StreamResponse(task=task))).encode()
    assert push(pushed_task, body).json() == {"recorded": True, "state": "completed"}
    plan = Plan.objects.get(pk=pushed_task.plan_id)
    assert plan.status == Plan.Status.COMPLETED and steps_of(plan) == ["Reading notes.txt", "Artifact summary.md"]
    before = recorded(pushed_task)
    assert push(pushed_task, body).json()["recorded"] is False
    assert recorded(pushed_task) == before


@pytest.mark.parametrize(("token", "status"), [(None, 401), ("", 401), ("the-task-token-only-the-agent-know", 401),
                                               (TOKEN + "x", 401)])
def test_a_push_without_the_tasks_token_is_refused(pushed_task: A2ATask, token: str | None, status: int) -> None:
    before = recorded(pushed_task)
    response = push(pushed_task, question(), token=token)
    assert response.status_code == status and "Nothing was changed." in response.json()["error"]
    assert recorded(pushed_task) == before


@pytest.mark.parametrize("body", [b"not json", b"[1, 2]", b'{"kind": "status-update"}', b"{}",
                                  b'{"statusUpdate": {"taskId": "task-1", "status": {"state": "NO_SUCH_STATE"}}}',
                                  b"\xff\xfe"])
def test_a_malformed_push_is_refused(pushed_task: A2ATask, body: bytes) -> None:
    before = recorded(pushed_task)
    response = push(pushed_task, body)
    assert response.status_code == 400 and "Nothing was changed." in response.json()["error"]
    assert recorded(pushed_task) == before


def test_a_push_about_another_task_or_to_an_unknown_one_is_refused(pushed_task: A2ATask) -> None:
    before = recorded(pushed_task)
    other = push(pushed_task, question(task_id="someone-elses-task"))
    assert other.status_code == 400 and "another task" in other.json()["error"]
    unknown = Client().post(reverse("a2a-push", args=[pushed_task.pk + 1000]), question(),
                            content_type="application/json", headers={"X-A2A-Notification-Token": TOKEN})
    assert unknown.status_code == 404
    # A task whose agent was never asked to push takes no notification, whatever token is sent.
    A2ATask.objects.filter(pk=pushed_task.pk).update(push_token_hash="")
    assert push(pushed_task, question()).status_code == 404
    assert Client().get(reverse("a2a-push", args=[pushed_task.pk])).status_code == 405
    assert recorded(pushed_task)[:5] == before[:5]


def test_only_the_webhook_goes_without_a_csrf_token(operator: Any, pushed_task: A2ATask) -> None:
    client = Client(enforce_csrf_checks=True)
    client.force_login(operator)
    refused = client.post(reverse("agent-goal", args=[pushed_task.plan.agent_id]), {"description": "x"})
    assert refused.status_code == 403
    assert push(pushed_task, question(), client=client).status_code == 200


def test_a_push_too_large_is_refused(pushed_task: A2ATask) -> None:
    before = recorded(pushed_task)
    response = push(pushed_task, b'{"message": "' + b"x" * (1024 * 1024) + b'"}')
    assert response.status_code == 413 and "too large" in response.json()["error"]
    assert recorded(pushed_task) == before
