"""Remote AG-UI agents (docs/agui-agents.md): a small AG-UI agent served on loopback streams its run as SSE
built with ag-ui-protocol's EventEncoder; it plans a few file tool calls and ends the run with an interrupt that
asks approval for its write. An operator adds it by URL, gives it a goal, sees the steps, finds the interrupt in
the inbox, edits the write's arguments and approves: the run is resumed once with resume[] carrying the edit."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from ag_ui.core import (
    EventType,
)
from django.contrib.messages import get_messages
from django.urls import reverse

from agents.agui_models import AguiAgent, AguiInterrupt
from agents.agui_remote import AguiError, events_parse, resume_entry, sse_batches, sse_data, state_patched
from agents.models import Agent
from planning.models import Plan, PlanEvent, PlanStep
from runtime.cycle import agent_cycle
from tests.agui_agent import FileAgent, agui_agent_serving


@pytest.fixture
def file_agent(settings: Any) -> Iterator[tuple[FileAgent, str]]:
    settings.OUTBOUND_ALLOWED_NETWORKS = ["127.0.0.0/8"]
    agent = FileAgent()
    with agui_agent_serving(agent) as url:
        yield agent, url


def agui_added(client: Any, url: str, name: str = "Release helper") -> Agent:
    response = client.post(reverse("agui-agent-new"), {"name": name, "url": url})
    assert response.status_code == 302, response.content.decode()[:2000]
    return Agent.objects.get(name=name)


def cycle(agent: Agent) -> str:
    """The agent's next cycle, as a runner runs it: the run its goal or decision asked for, started and read."""
    return agent_cycle(agent_id=agent.pk, runner="test runner")


def goal_given(client: Any, agent: Agent, goal: str, *, run: bool = True) -> Plan:
    """The goal given on the agent's page; the request returns at once, the run is read by the agent's next
    cycle (`run`)."""
    response = client.post(reverse("agent-goal", args=[agent.pk]), {"description": goal, "horizon": "short_term"})
    assert response.status_code == 302
    assert Plan.objects.filter(agent=agent).exists(), [str(m) for m in get_messages(response.wsgi_request)]
    if run:
        cycle(agent)
    return Plan.objects.get(agent=agent)


@pytest.mark.django_db
def test_goal_runs_the_agent_steps_show_and_the_edited_approval_resumes_it_once(
        operator_client: Any, viewer_client: Any, file_agent: tuple[FileAgent, str]) -> None:
    remote, url = file_agent
    agent = agui_added(operator_client, url)
    assert agent.kind == Agent.Kind.AGUI
    page = operator_client.get(agent.get_absolute_url()).content.decode()
    assert "Remote (AG-UI)" in page and "Give goal" in page
    plan = goal_given(operator_client, agent, "sum up the release notes into a summary file, please")

    assert len(remote.runs) == 1
    first = remote.runs[0]
    assert first["messages"][0]["content"] == "sum up the release notes into a summary file, please"
    steps = list(plan.steps.order_by("position"))
    assert [(s.tool, s.tool_input, s.status) for s in steps] == [
        ("list_files", {"path": "."}, PlanStep.Status.COMPLETED),
        ("read_file", {"path": "notes.txt"}, PlanStep.Status.COMPLETED),
        ("write_file", {"path": "summary.txt", "content": "friday"}, PlanStep.Status.AWAITING_APPROVAL),
    ]
    assert steps[1].result == "ship on friday"
    kind = PlanEvent.Kind
    assert list(plan.events.filter(step__isnull=False).order_by("pk").values_list("step__key", "kind")) == [
        ("s1", kind.STEP_STARTED), ("s1", kind.AGENT_REPORTED), ("s1", kind.STEP_COMPLETED),
        ("s2", kind.STEP_STARTED), ("s2", kind.AGENT_REPORTED), ("s2", kind.STEP_COMPLETED),
        ("s3", kind.STEP_STARTED), ("s3", kind.AGENT_REPORTED), ("s3", kind.STEP_AWAITING)]
    # What the agent said and reported on the plan, once each, in the order it came.
    assert list(plan.events.filter(step__isnull=True, kind=kind.AGENT_REPORTED).order_by("pk").values_list(
        "reason", flat=True)) == ["state snapshot", "step survey started",
                                  "said: I will read the notes, then write a summary.", "state changed",
                                  "step survey finished"]
    created = plan.events.get(kind=kind.CREATED)  # the operator's goal, on the timeline as theirs
    assert created.actor is not None and created.detail["thread_id"] == first["threadId"]
    assert AguiAgent.objects.get(agent=agent).state == {"files": ["notes.txt"]}
    page = operator_client.get(reverse("plan-detail", args=[plan.pk])).content.decode()
    assert "write_file" in page and "read_file" in page and "I will read the notes, then write a summary." in page

    inbox = operator_client.get(reverse("inbox")).content.decode()
    assert "May I write summary.txt?" in inbox
    write = steps[2]

    # Skipping is no answer to the agent: refused, the interrupt still waits.
    skipped = operator_client.post(reverse("step-skip", args=[write.pk]), {"reason": "later"}, HTTP_HX_REQUEST="true")
    assert skipped.status_code == 409 and "approve it or decline it" in skipped.content.decode()

    # A viewer may not decide: refused, nothing sent to the agent.
    assert viewer_client.post(reverse("inbox-step-approve", args=[write.pk])).status_code == 403
    assert len(remote.runs) == 1

    # The operator edits the write's arguments in the step editor, then approves from the inbox.
    edited = {"path": "release-summary.txt", "content": "ship on friday"}
    response = operator_client.post(reverse("step-edit", args=[write.pk]), {
        "description": write.description, "action_hint": "", "tool": "write_file",
        "tool_input": json.dumps(edited), "expected_outcome": write.expected_outcome,
        "requires_permission": "on", "reason": "a clearer name"})
    assert response.status_code in (200, 302), response.content.decode()[:3000]
    write.refresh_from_db()
    assert write.tool_input == edited, response.content.decode()[:3000]
    response = operator_client.post(reverse("inbox-step-approve", args=[write.pk]))
    assert response.status_code == 200
    assert len(remote.runs) == 1  # the decision is recorded; the runner resumes the run
    assert cycle(agent).endswith(" read")
    assert cycle(agent) == "idle"  # resumed once

    assert len(remote.runs) == 2
    resumed = remote.runs[1]
    assert resumed["threadId"] == first["threadId"] and resumed["runId"] != first["runId"]
    assert resumed["resume"] == [{"interruptId": "i-write", "status": "resolved",
                                  "payload": {"approved": True, "arguments": edited}}]
    write.refresh_from_db()
    assert write.status == PlanStep.Status.COMPLETED and write.result == "wrote release-summary.txt"
    assert AguiAgent.objects.get(agent=agent).state == {"files": ["notes.txt", "release-summary.txt"]}
    plan.refresh_from_db()
    assert plan.status == Plan.Status.UNVERIFIED  # the agent says it finished; nothing here checked its files

    # A second decision is refused and nothing more reaches the agent.
    again = operator_client.post(reverse("step-approve", args=[write.pk]), HTTP_HX_REQUEST="true")
    assert again.status_code == 409
    assert len(remote.runs) == 2
    declined = operator_client.post(reverse("inbox-step-decline", args=[write.pk]), {"feedback": "no, stop"})
    assert declined.status_code == 409 and len(remote.runs) == 2
    assert PlanEvent.objects.filter(plan=plan, kind=PlanEvent.Kind.STEP_APPROVED).count() == 1


@pytest.mark.django_db
def test_declined_with_feedback_resumes_with_the_feedback(operator_client: Any,
                                                          file_agent: tuple[FileAgent, str]) -> None:
    remote, url = file_agent
    agent = agui_added(operator_client, url)
    plan = goal_given(operator_client, agent, "Summarise notes.")
    write = plan.steps.get(tool="write_file")
    response = operator_client.post(reverse("inbox-step-decline", args=[write.pk]),
                                    {"feedback": "Do not write files today"})
    assert response.status_code == 200
    cycle(agent)
    assert remote.runs[1]["resume"] == [{"interruptId": "i-write", "status": "resolved",
                                         "payload": {"approved": False, "feedback": "Do not write files today"}}]
    write.refresh_from_db()
    assert write.status == PlanStep.Status.DECLINED
    assert PlanEvent.objects.filter(plan=plan, reason__contains="Not writing: Do not write files today").exists()


@pytest.mark.django_db
def test_an_expired_interrupt_is_refused_and_nothing_is_sent(operator_client: Any,
                                                             file_agent: tuple[FileAgent, str]) -> None:
    remote, url = file_agent
    remote.expires_at = (datetime.now(UTC) - timedelta(minutes=1)).isoformat()
    agent = agui_added(operator_client, url)
    plan = goal_given(operator_client, agent, "summary of the notes")
    write = plan.steps.get(tool="write_file")
    response = operator_client.post(reverse("inbox-step-approve", args=[write.pk]))
    assert response.status_code == 409
    assert "expired" in response.content.decode() and "Nothing was changed." in response.content.decode()
    write.refresh_from_db()
    assert write.status == PlanStep.Status.AWAITING_APPROVAL and len(remote.runs) == 1
    assert AguiInterrupt.objects.get(step=write).decided_at is None


@pytest.mark.django_db
def test_adding_is_for_operators_and_the_address_is_guarded(operator_client: Any, viewer_client: Any,
                                                            settings: Any) -> None:
    settings.OUTBOUND_ALLOWED_NETWORKS = []
    assert viewer_client.post(reverse("agui-agent-new"), {"name": "X", "url": "http://93.184.215.14/"}).status_code == 403
    response = operator_client.post(reverse("agui-agent-new"), {"name": "Sneaky", "url": "http://127.0.0.1:9/agent"})
    assert response.status_code == 400
    assert "inside this network" in response.content.decode()
    response = operator_client.post(reverse("agui-agent-new"), {"name": "Ftp", "url": "ftp://agent.example.com/"})
    assert response.status_code == 400
    assert not Agent.objects.filter(kind=Agent.Kind.AGUI).exists()
    assert "Remote AG-UI agent" in operator_client.get(reverse("agent-new")).content.decode()


@pytest.mark.django_db
def test_an_unreachable_agent_fails_the_plan_with_the_reason(operator_client: Any, settings: Any) -> None:
    settings.OUTBOUND_ALLOWED_NETWORKS = ["127.0.0.0/8"]
    agent = agui_added(operator_client, "http://127.0.0.1:9/agent", name="Gone")
    plan = goal_given(operator_client, agent, "do anything at all")
    assert plan.status == Plan.Status.FAILED and "No answer from the agent" in plan.failure_reason


def test_sse_reader_and_events() -> None:
    stream = ["data: {\"type\":\"RUN_STARTED\",\"threadId\":\"t\",\"runId\":\"r\"}\n", "\n", ": comment\n",
              "data: {\"type\":\"STEP_STARTED\",", "data: \"stepName\":\"a\"}\n", "\n"]
    assert list(sse_data(stream))[1] == '{"type":"STEP_STARTED",\n"stepName":"a"}'
    events = list(events_parse(stream))
    assert [e.type for e in events] == [EventType.RUN_STARTED, EventType.STEP_STARTED]
    with pytest.raises(AguiError):
        list(events_parse(["data: {\"type\":\"NOT_AN_EVENT\"}\n", "\n"]))
    # Lines as they arrived: an event split between two arrivals is whole in the second's batch.
    assert list(sse_batches([stream[:4], stream[4:]])) == [['{"type":"RUN_STARTED","threadId":"t","runId":"r"}'],
                                                           ['{"type":"STEP_STARTED",\n"stepName":"a"}']]
    assert list(sse_batches([stream])) == [list(sse_data(stream))]


def test_state_patches_apply_without_touching_the_state_given() -> None:
    state = {"files": ["a"], "done": False}
    patched = state_patched(state, [{"op": "add", "path": "/files/-", "value": "b"},
                                    {"op": "replace", "path": "/done", "value": True},
                                    {"op": "remove", "path": "/files/0"}])
    assert patched == {"files": ["b"], "done": True}
    assert state == {"files": ["a"], "done": False}
    with pytest.raises(AguiError):
        state_patched(state, [{"op": "remove", "path": "/missing"}])


def test_resume_entry_carries_the_answer() -> None:
    assert resume_entry(interrupt_id="i", approved=True, arguments={"path": "x"}).model_dump(by_alias=True) == {
        "interruptId": "i", "status": "resolved", "payload": {"approved": True, "arguments": {"path": "x"}}}
    assert resume_entry(interrupt_id="i", approved=False, feedback="no").model_dump(by_alias=True)["payload"] == {
        "approved": False, "feedback": "no"}


@pytest.mark.django_db
def test_runners_drive_an_agui_agent(operator_client: Any, settings: Any) -> None:
    from runtime.cycles import agents_driven

    settings.OUTBOUND_ALLOWED_NETWORKS = ["127.0.0.0/8"]
    agent = agui_added(operator_client, "http://127.0.0.1:9/agent", name="Remote one")
    assert agent.status == Agent.Status.RUNNING
    assert agents_driven().filter(pk=agent.pk).exists()
    assert cycle(agent) == "idle"  # no goal: nothing sent


@pytest.mark.django_db
def test_the_goal_request_returns_at_once_and_the_runner_reads_the_run(operator_client: Any,
                                                                       file_agent: tuple[FileAgent, str]) -> None:
    remote, url = file_agent
    agent = agui_added(operator_client, url)
    response = operator_client.post(reverse("agent-goal", args=[agent.pk]),
                                    {"description": "notes -> summary, thx", "horizon": "short_term"}, follow=True)
    assert "run starts now and shows here as it streams" in response.content.decode()
    plan = Plan.objects.get(agent=agent)
    assert remote.runs == [] and plan.status == Plan.Status.ACTIVE and not plan.steps.exists()
    assert cycle(agent).endswith(" read")
    assert len(remote.runs) == 1 and plan.steps.count() == 3
    assert cycle(agent) == "idle"  # started once
    assert len(remote.runs) == 1


def goal_waiting(client: Any, file_agent: tuple[FileAgent, str]) -> tuple[FileAgent, Agent, Plan]:
    """The agent added and given a goal whose run no cycle has started yet."""
    remote, url = file_agent
    agent = agui_added(client, url)
    return remote, agent, goal_given(client, agent, "Summarise notes.", run=False)


@pytest.mark.django_db
def test_a_run_whose_plan_was_cancelled_before_it_started_is_not_sent(operator_client: Any,
                                                                      file_agent: tuple[FileAgent, str]) -> None:
    remote, agent, plan = goal_waiting(operator_client, file_agent)
    assert operator_client.post(reverse("plan-cancel", args=[plan.pk]), {"reason": "changed my mind"}).status_code == 302
    assert cycle(agent) == "run dropped"
    assert remote.runs == []
    assert plan.events.filter(kind=PlanEvent.Kind.TASK_STATE, reason__contains="run not started").count() == 1


@pytest.mark.django_db
def test_a_run_a_dead_cycle_was_reading_fails_its_plan(operator_client: Any,
                                                       file_agent: tuple[FileAgent, str]) -> None:
    _remote, agent, plan = goal_waiting(operator_client, file_agent)
    AguiAgent.objects.filter(agent=agent).update(run_reading="r-of-a-dead-runner", pending_run={})
    assert cycle(agent) == "run interrupted"
    plan.refresh_from_db()
    assert plan.status == Plan.Status.FAILED and "runner reading its stream stopped" in plan.failure_reason


@pytest.mark.django_db(transaction=True)
def test_cancel_closes_the_runs_stream(operator_client: Any, settings: Any) -> None:
    """A slow run read by the runner (in a thread here); the operator cancels the plan: the stream is closed at
    once (the agent sees the connection go), recorded on the plan, and no later event is applied."""
    import threading

    settings.OUTBOUND_ALLOWED_NETWORKS = ["127.0.0.0/8"]
    remote = FileAgent(pause_seconds=0.3)
    with agui_agent_serving(remote) as url:
        agent = agui_added(operator_client, url)
        plan = goal_given(operator_client, agent, "Summarise the notes, slowly", run=False)
        reader = threading.Thread(target=cycle, args=(agent,))
        reader.start()
        deadline = time.monotonic() + 10
        while not plan.events.filter(reason__contains="said:").exists():
            assert time.monotonic() < deadline, "the run never started"
            time.sleep(0.05)
        assert operator_client.post(reverse("plan-cancel", args=[plan.pk]), {"reason": "stop it"}).status_code == 302
        reader.join(5)
        assert not reader.is_alive()
        assert remote.disconnected.wait(5)
    plan.refresh_from_db()
    assert plan.status == Plan.Status.CANCELLED
    closed = plan.events.get(kind=PlanEvent.Kind.TASK_STATE)
    assert "the run's stream was closed" in closed.reason and closed.detail["diff"]["state"][1] == "stream closed"
    assert remote.events_sent < 20 and plan.steps.filter(tool="write_file").count() == 0
    assert AguiAgent.objects.get(agent=agent).run_reading == ""


@pytest.mark.django_db(transaction=True)
def test_each_event_of_a_run_reaches_the_open_pages_as_it_commits(operator_client: Any, settings: Any,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """The runtime's cycle gathers its changes into one push at its end; a run's events go out as they arrive (an
    agent that pauses between events: each on its own)."""
    from planner_site import events
    from runtime.cycles import cycle_run

    settings.OUTBOUND_ALLOWED_NETWORKS = ["127.0.0.0/8"]
    remote = FileAgent(pause_seconds=0.05)
    with agui_agent_serving(remote) as url:
        agent = agui_added(operator_client, url)
        plan = goal_given(operator_client, agent, "Summarise the notes", run=False)
        pushes: list[set[int]] = []
        monkeypatch.setattr(events.publisher, "publish", lambda *, agents, plans: pushes.append(set(plans)))
        cycle_run(agent.pk, "test runner")
    assert plan.steps.count() == 3
    assert len([p for p in pushes if plan.pk in p]) >= 10  # tool calls, results, text, state: each as it came


@pytest.mark.django_db
def test_what_arrived_together_is_written_together_once_and_in_order(operator_client: Any, settings: Any) -> None:
    """A batch of events the agent sent together: what it said and reported on the plan is one INSERT, each event
    once; a tool call among them keeps its place on the timeline."""
    from ag_ui.core import (
        StateDeltaEvent,
        StateSnapshotEvent,
        StepFinishedEvent,
        StepStartedEvent,
        TextMessageContentEvent,
        TextMessageEndEvent,
        TextMessageStartEvent,
        ToolCallStartEvent,
    )
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from planning.services.agui import agui_events_apply

    settings.OUTBOUND_ALLOWED_NETWORKS = ["127.0.0.0/8"]
    agent = agui_added(operator_client, "http://127.0.0.1:9/agent", name="Batched")
    plan = goal_given(operator_client, agent, "Report a few things at once", run=False)
    texts: dict[str, str] = {}
    said = [StateSnapshotEvent(snapshot={"files": []}), StepStartedEvent(step_name="survey"),
            TextMessageStartEvent(message_id="m1", role="assistant"),
            TextMessageContentEvent(message_id="m1", delta="Looking "),
            TextMessageContentEvent(message_id="m1", delta="around."), TextMessageEndEvent(message_id="m1"),
            StateDeltaEvent(delta=[{"op": "add", "path": "/files/-", "value": "a.txt"}]),
            StepFinishedEvent(step_name="survey")]
    with CaptureQueriesContext(connection) as queries:
        assert agui_events_apply(agent_id=agent.pk, events=said, texts=texts) is False
    inserts = [q["sql"] for q in queries.captured_queries if q["sql"].startswith('INSERT INTO "planning_planevent"')]
    assert len(inserts) == 1, inserts
    reported = PlanEvent.Kind.AGENT_REPORTED
    assert list(plan.events.filter(kind=reported).order_by("pk").values_list("reason", flat=True)) == [
        "state snapshot", "step survey started", "said: Looking around.", "state changed", "step survey finished"]
    assert AguiAgent.objects.get(agent=agent).state == {"files": ["a.txt"]}

    # A tool call between two things said: the step's event between theirs.
    mixed = [StepStartedEvent(step_name="write"), ToolCallStartEvent(tool_call_id="c1", tool_call_name="write_file"),
             StepFinishedEvent(step_name="write")]
    assert agui_events_apply(agent_id=agent.pk, events=mixed, texts=texts) is False
    assert list(plan.events.order_by("pk").values_list("reason", flat=True))[-3:] == [
        "step write started", "tool call write_file", "step write finished"]
    assert plan.steps.get().tool == "write_file"

    # A state change that does not apply fails the run: what came before it in the batch is kept, nothing after.
    broken = [StepStartedEvent(step_name="check"), StateDeltaEvent(delta=[{"op": "remove", "path": "/missing"}]),
              StepFinishedEvent(step_name="check")]
    assert agui_events_apply(agent_id=agent.pk, events=broken, texts=texts) is True
    plan.refresh_from_db()
    assert plan.status == Plan.Status.FAILED and "state change does not apply" in plan.failure_reason
    reasons = list(plan.events.filter(kind=reported).values_list("reason", flat=True))
    assert "step check started" in reasons and "step check finished" not in reasons
    assert AguiAgent.objects.get(agent=agent).state == {"files": ["a.txt"]}
