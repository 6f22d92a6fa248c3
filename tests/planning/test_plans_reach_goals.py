"""Issue 50 for tool agents: "Approved" and "Completed" mean what they say.

A plan is checked against its goal before anyone can approve it (offline rules, a real model through the test
server, the one-step shortcut); a goal the tools cannot reach ends as a stated "cannot", a vague one as a
question, both before approval; a finished plan completes its goal only when its outcome is verified, else it is
"Done, not verified" everywhere the operator looks; an approval is bound to the steps the operator saw."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
from django.test import Client
from django.urls import reverse

from agents.models import Agent
from goals.models import Goal
from planning import services
from planning.models import Plan, PlanEvent, PlanStep
from planning.planner import plan_generate
from runtime.cycle import agent_cycle
from tests.factories import AgentFactory, GoalFactory
from tests.llm_server import LLMTestServer, answer

pytestmark = pytest.mark.django_db

DATA = "name,city\nAda,London\nGrace,Arlington\n"


def tool_agent(name: str = "Archivist") -> Agent:
    agent = AgentFactory(name=name, kind=Agent.Kind.TOOL)
    agent.workspace.mkdir(parents=True, exist_ok=True)
    (agent.workspace / "data.csv").write_text(DATA)
    (agent.workspace / "notes.txt").write_text("Rain today. The roof leaks. Call the roofer on Monday.\n")
    return agent


def writes(plan: Plan) -> list[tuple[str, dict[str, Any]]]:
    return [(s.tool, s.tool_input) for s in plan.steps.order_by("position") if s.risk == PlanStep.Risk.RISKY]


# --- 1. checked against the goal before approval ---------------------------------------------------------


@pytest.mark.parametrize("goal", ["Make a backup copy of data.csv called data_backup.csv",
                                  "pls back up data.csv as data_backup.csv", "copy data.csv to data_backup.csv"])
def test_offline_backup_goals_plan_a_copy(goal: str) -> None:
    plan = plan_generate(agent=tool_agent(), goal_text=goal)
    assert plan.status == Plan.Status.AWAITING_APPROVAL
    assert writes(plan) == [("file.copy", {"path": "data.csv", "to": "data_backup.csv"})]


@pytest.mark.parametrize("goal", ["Turn data.csv into a Markdown table in data.md",
                                  "I need a markdown version of data.csv in data.md"])
def test_offline_markdown_goals_write_the_markdown_file(goal: str) -> None:
    plan = plan_generate(agent=tool_agent(), goal_text=goal)
    assert plan.status == Plan.Status.AWAITING_APPROVAL
    assert writes(plan) == [("file.convert", {"path": "data.csv", "to": "md", "output": "data.md"})]


@pytest.mark.parametrize(("goal", "said"), [
    ("delete everything in the workspace", "cannot be done with this agent's tools: no tool deletes files"),
    ("wipe the workspace", "cannot be done with this agent's tools: no tool deletes files"),
    ("send this to my boss by email", "cannot be done with this agent's tools: no tool sends e-mail"),
    ("email the summary of notes.txt to my boss", "cannot be done with this agent's tools: no tool sends e-mail"),
    ("read /etc/passwd", "refused: /etc/passwd is outside this agent's workspace"),
    ("Read ../other-agent/secrets.txt", "refused: ../other-agent/secrets.txt is outside this agent's workspace"),
])
def test_goals_the_tools_cannot_reach_end_before_approval_as_cannot(goal: str, said: str) -> None:
    agent = tool_agent()
    plan = plan_generate(agent=agent, goal_text=goal)
    assert plan.status == Plan.Status.FAILED and plan.failure_reason.startswith(said)
    assert not plan.steps.exists() and plan.retry_at is None  # nothing to approve, no pointless retry
    event = plan.events.get(kind=PlanEvent.Kind.PLAN_FAILED)
    assert event.reason == said or event.reason.startswith(said)
    agent.refresh_from_db()
    assert said in agent.waiting_reason
    assert (agent.workspace / "data.csv").read_text() == DATA  # nothing destroyed


@pytest.mark.parametrize("goal", ["tidy this up", "hmm, sort it out", "do the thing", "Do the thing"])
def test_vague_goals_become_a_question_in_the_inbox(goal: str, operator_client: Client) -> None:
    agent = tool_agent()
    GoalFactory(agent=agent, description=goal, source_needs=[])
    agent_cycle(agent_id=agent.pk, runner="runner-test")
    plan = Plan.objects.get(agent=agent)
    assert plan.status == Plan.Status.CLARIFYING and not plan.steps.exists()
    assert plan.clarification_question.startswith(f'What should I do for "{goal}"')
    html = operator_client.get(reverse("inbox")).content.decode()
    assert "Planner asks a question" in html and "Name the files and the result you want" in html


READS = {"goal": "Make a backup copy of data.csv called data_backup.csv", "thinking_summary": "Look first.",
         "confidence": 0.8, "risks": [], "steps": [
             {"id": "1", "tool": "file.list", "intent": "remove_empty_files", "input": {"path": "."},
              "requiresPermission": False},
             {"id": "2", "tool": "file.read", "intent": "Read data.csv", "input": {"path": "data.csv"},
              "requiresPermission": False, "dependsOn": ["1"]},
             {"id": "3", "tool": "file.read", "intent": "Read the backup", "input": {"path": "data_backup.csv"},
              "requiresPermission": False, "dependsOn": ["2"]}]}


def test_a_real_models_plan_of_reads_never_reaches_approval(settings: Any, llm_server: LLMTestServer) -> None:
    settings.LLM_MODELS = {"planner": ["big-model"], "fast": ["fast-model"]}
    hints = '<json>{"hints": ["Use file.copy"]}</json>'
    llm_server.script("fast-model", *[answer(hints)] * 8)
    llm_server.script("big-model", *[answer(f"<json>{json.dumps(READS)}</json>")] * 6)
    plan = plan_generate(agent=tool_agent(), goal_text=READS["goal"])
    assert plan.status == Plan.Status.CLARIFYING and not plan.steps.exists()
    rejected = plan.events.filter(kind=PlanEvent.Kind.ATTEMPT_REJECTED)
    assert rejected.exists() and all("no step writes it" in e.reason for e in rejected)
    assert "use file.copy" in plan.clarification_question and "How should it be done" in plan.clarification_question
    # The question on the timeline says who asked it, as every planning event does.
    assert plan.events.get(kind=PlanEvent.Kind.CLARIFICATION_ASKED).actor_label == "runner"
    # The planner's retry saw the reason: its prompt names the tool that copies.
    assert "use file.copy" in json.dumps(llm_server.requests_for("big-model")[1].messages)


def test_a_real_model_that_corrects_itself_gets_its_copy_approved(settings: Any, llm_server: LLMTestServer) -> None:
    settings.LLM_MODELS = {"planner": ["big-model"], "fast": ["fast-model"]}
    copy = dict(READS, steps=[{"id": "a", "tool": "file.copy", "intent": "Copy", "requiresPermission": False,
                               "input": {"path": "data.csv", "to": "data_backup.csv"}}])
    llm_server.script("fast-model", *[answer('<json>{"hints": ["Use file.copy"]}</json>')] * 4)
    llm_server.script("big-model", answer(f"<json>{json.dumps(READS)}</json>"), answer(f"<json>{json.dumps(copy)}</json>"))
    plan = plan_generate(agent=tool_agent(), goal_text=READS["goal"])
    assert plan.status == Plan.Status.AWAITING_APPROVAL and plan.model == "big-model"
    # The flag the operator reads names the step by the key the page shows, with no field name of the JSON.
    flags = plan.events.get(kind=PlanEvent.Kind.VALIDATED).detail["flags"]
    assert "step a: file.copy writes files, so it now needs permission (the plan said it did not)" in flags
    assert not any("requiresPermission" in f or "step 1:" in f for f in flags)


# --- 2. completed means verified -----------------------------------------------------------------------------


def run_approved(agent: Agent, plan: Plan, operator: Any, limit: int = 12) -> Plan:
    services.plan_approve(plan=plan, user=operator, mode="all")
    for _ in range(limit):
        agent_cycle(agent_id=agent.pk, runner="runner-test")
        plan.refresh_from_db()
        if plan.status not in Plan.OPEN_STATUSES:
            break
    return plan


@pytest.mark.parametrize(("goal", "output", "check"), [
    ("pls back up data.csv as data_backup.csv", "data_backup.csv", lambda text: text == DATA),
    ("Turn data.csv into a Markdown table in data.md", "data.md",
     lambda text: text.startswith("| name | city |\n| --- | --- |\n| Ada | London |")),
])
def test_a_verified_outcome_completes_the_plan_and_its_goal(goal: str, output: str, check: Any,
                                                           operator: Any) -> None:
    agent = tool_agent()
    GoalFactory(agent=agent, description=goal, source_needs=[])
    agent_cycle(agent_id=agent.pk, runner="runner-test")
    plan = run_approved(agent, Plan.objects.get(agent=agent), operator)
    assert plan.status == Plan.Status.COMPLETED
    assert check((agent.workspace / output).read_text())
    assert (agent.workspace / "data.csv").read_text() == DATA
    assert Goal.objects.get(agent=agent).status == Goal.Status.COMPLETED
    completed = plan.events.get(kind=PlanEvent.Kind.PLAN_COMPLETED)
    assert completed.detail["verified"] is True
    assert any(item.startswith(output) for item in completed.detail["checked"])
    assert f"outcome verified: {output}" in completed.reason  # the timeline says what was checked


def unverifiable(goal: str, steps: list[dict[str, Any]]) -> tuple[Agent, Plan, Goal]:
    agent = tool_agent()
    goal_row = GoalFactory(agent=agent, description=goal, source_needs=[])
    plan = Plan.objects.create(agent=agent, goal=goal_row, goal_text=goal, status=Plan.Status.AWAITING_APPROVAL,
                               model="big-model")
    for position, spec in enumerate(steps, start=1):
        PlanStep.objects.create(plan=plan, position=position, key=str(position), **spec)
    return agent, plan, goal_row


def test_a_plan_whose_output_was_not_written_is_done_not_verified_everywhere(
        operator: Any, operator_client: Client) -> None:
    agent, plan, goal = unverifiable("Summarize notes.txt into summary.md", [
        {"description": "Read notes", "tool": "file.read", "tool_input": {"path": "notes.txt"}}])
    plan = run_approved(agent, plan, operator)
    assert plan.status == Plan.Status.UNVERIFIED and plan.get_status_display() == "Done, not verified"
    assert plan.failure_reason == "done, outcome not verified: summary.md was not written"
    goal.refresh_from_db()
    assert goal.status == Goal.Status.ACTIVE  # the goal stays open
    event = plan.events.get(kind=PlanEvent.Kind.PLAN_UNVERIFIED)
    assert event.detail == {"verified": False, "problems": ["summary.md was not written"]}
    assert not plan.events.filter(kind=PlanEvent.Kind.PLAN_COMPLETED).exists()
    inbox = operator_client.get(reverse("inbox")).content.decode()
    assert "Done, not verified" in inbox and "summary.md was not written" in inbox and "Cancel plan" in inbox
    page = operator_client.get(plan.get_absolute_url()).content.decode()
    assert "Done, not verified" in page and "Answer and plan again" in page
    assert "Done, not verified" in operator_client.get(reverse("dashboard")).content.decode()
    audit = operator_client.get(reverse("audit")).content.decode()
    assert "Done, not verified" in audit
    # The agent does not plan the goal again by itself meanwhile; the operator's answer plans it again.
    agent_cycle(agent_id=agent.pk, runner="runner-test")
    assert Plan.objects.filter(agent=agent).count() == 1
    services.plan_clarify(plan=plan, user=operator, answer="write the summary to summary.md")
    plan.refresh_from_db()
    assert plan.status == Plan.Status.ACTIVE and plan.replan_reason
    agent_cycle(agent_id=agent.pk, runner="runner-test")
    new = Plan.objects.get(previous=plan)
    assert new.status == Plan.Status.AWAITING_APPROVAL
    assert any(s.tool_input.get("output") == "summary.md" for s in new.steps.all())


@pytest.mark.parametrize(("goal", "steps"), [
    # What SmolLM2 planned for a video: a folder and a JSON conversion, neither of which is a video.
    ("Make a 30 second video of the demo", [
        {"description": "Make a folder", "tool": "dir.create", "tool_input": {"path": "clips"}},
        {"description": "Convert", "tool": "file.convert", "tool_input": {"path": "data.csv", "to": "json"}}]),
    ("put together a slideshow for friday's all-hands", [
        {"description": "Write slides", "tool": "file.write", "tool_input": {"path": "s.txt", "content": "1. Hi"}}]),
    ("get the team excited about the launch!!", [
        {"description": "Cheer", "tool": "file.write", "tool_input": {"path": "cheer.txt", "content": "Yay"}}]),
    ("make the homepage look nicer", [
        {"description": "Read notes", "tool": "file.read", "tool_input": {"path": "notes.txt"}}]),
])
def test_a_goal_nothing_in_it_can_check_is_done_not_verified(goal: str, steps: list[dict[str, Any]],
                                                              operator: Any, operator_client: Client) -> None:
    agent, plan, goal_row = unverifiable(goal, [
        spec | ({"risk": "risky", "requires_permission": True} if spec["tool"] != "file.read" else {})
        for spec in steps])
    plan = run_approved(agent, plan, operator)
    assert plan.status == Plan.Status.UNVERIFIED, plan.failure_reason
    assert "nothing the goal asks for can be checked here" in plan.failure_reason
    goal_row.refresh_from_db()
    assert goal_row.status == Goal.Status.ACTIVE
    assert not plan.events.filter(kind=PlanEvent.Kind.PLAN_COMPLETED).exists()
    inbox = operator_client.get(reverse("inbox")).content.decode()
    assert "Done, not verified" in inbox and "nothing the goal asks for can be checked here" in inbox


@pytest.mark.parametrize(("goal", "steps", "checked"), [
    # The goal names its output by what it is: report.md is the report.
    ("Write a report from the notes", [
        {"description": "Write", "tool": "report.write", "tool_input": {"paths": ["notes.txt"], "output": "report.md"}}],
     "report.md exists and is not empty"),
    # A copy that names no copy: whatever the copy step wrote is read.
    ("make a backup copy of data.csv", [
        {"description": "Folder", "tool": "dir.create", "tool_input": {"path": "backup"}},
        {"description": "Copy", "tool": "file.copy", "tool_input": {"path": "data.csv", "to": "backup/"}}],
     "backup/data.csv has rows"),
    ("what's in notes.txt?", [
        {"description": "Read notes", "tool": "file.read", "tool_input": {"path": "notes.txt"}}],
     "a step's result answers it"),
])
def test_a_goal_that_names_its_output_by_what_it_is_completes_saying_what_was_checked(
        goal: str, steps: list[dict[str, Any]], checked: str, operator: Any) -> None:
    agent, plan, goal_row = unverifiable(goal, [
        spec | ({"risk": "risky", "requires_permission": True} if spec["tool"] != "file.read" else {})
        for spec in steps])
    plan = run_approved(agent, plan, operator)
    assert plan.status == Plan.Status.COMPLETED, plan.failure_reason
    assert checked in plan.events.get(kind=PlanEvent.Kind.PLAN_COMPLETED).detail["checked"]
    goal_row.refresh_from_db()
    assert goal_row.status == Goal.Status.COMPLETED


@pytest.mark.parametrize("feedback", ["no, write it to data_old.csv instead",
                                      "use data_old.csv, not data_backup.csv", "call it data_old.csv",
                                      "Save the copy as data_old.csv please."])
def test_an_output_the_operator_redirected_is_the_one_checked(feedback: str, operator: Any) -> None:
    agent = tool_agent()
    GoalFactory(agent=agent, description="pls back up data.csv as data_backup.csv", source_needs=[])
    agent_cycle(agent_id=agent.pk, runner="runner-test")
    v1 = Plan.objects.get(agent=agent)
    services.plan_replan_request(plan=v1, user=operator, reason=feedback)  # "Decline with feedback" on the plan
    agent_cycle(agent_id=agent.pk, runner="runner-test")
    v2 = Plan.objects.get(previous=v1)
    assert writes(v2) == [("file.copy", {"path": "data.csv", "to": "data_old.csv"})]
    v2 = run_approved(agent, v2, operator)
    assert v2.status == Plan.Status.COMPLETED, v2.failure_reason
    assert "data_old.csv has rows" in v2.events.get(kind=PlanEvent.Kind.PLAN_COMPLETED).detail["checked"]
    assert not (agent.workspace / "data_backup.csv").exists()


def test_feedback_that_redirects_nothing_still_needs_the_goals_output(operator: Any) -> None:
    agent, plan, goal_row = unverifiable("pls back up data.csv as data_backup.csv", [
        {"description": "Copy", "tool": "file.copy", "tool_input": {"path": "data.csv", "to": "elsewhere.csv"},
         "risk": "risky", "requires_permission": True}])
    PlanEvent.objects.create(plan=plan, kind=PlanEvent.Kind.REPLAN_REQUESTED, actor_label="olga",
                             reason="be quicker about it")
    plan = run_approved(agent, plan, operator)
    assert plan.status == Plan.Status.UNVERIFIED
    assert plan.failure_reason == "done, outcome not verified: data_backup.csv was not written"


def test_a_converted_file_that_does_not_parse_is_not_verified(operator: Any) -> None:
    agent, plan, goal = unverifiable("Convert data.csv to JSON in data.json", [
        {"description": "Write it", "tool": "file.write", "tool_input": {"path": "data.json", "content": "[{oops"},
         "risk": "risky", "requires_permission": True}])
    plan = run_approved(agent, plan, operator)
    assert plan.status == Plan.Status.UNVERIFIED and "data.json is not valid JSON" in plan.failure_reason
    goal.refresh_from_db()
    assert goal.status == Goal.Status.ACTIVE


def test_the_unverified_plan_notifies_as_such(operator: Any) -> None:
    from notifications.selectors import event_candidate

    agent, plan, _ = unverifiable("Summarize notes.txt into summary.md", [
        {"description": "Read notes", "tool": "file.read", "tool_input": {"path": "notes.txt"}}])
    plan = run_approved(agent, plan, operator)
    candidate = event_candidate(plan.events.get(kind=PlanEvent.Kind.PLAN_UNVERIFIED), set())
    assert candidate is not None and "is done, outcome not verified" in candidate.title
    assert "summary.md was not written" in candidate.text


# --- 3. approve what you see ------------------------------------------------------------------------------


def fingerprint_in(html: str, form_url: str) -> str:
    at = html.index(f'hx-post="{form_url}"')
    found = re.search(r'name="seen_steps" value="([0-9a-f]+)"', html[at:at + 600])
    assert found, "the approve form carries the fingerprint of the steps shown"
    return found.group(1)


def test_inbox_card_shows_tools_inputs_and_planner_and_binds_the_approval(operator: Any,
                                                                          operator_client: Client) -> None:
    agent = tool_agent()
    plan = plan_generate(agent=agent, goal_text="pls back up data.csv as data_backup.csv")
    html = operator_client.get(reverse("inbox")).content.decode()
    assert "tool <code>file.copy</code> input <code>path=&quot;data.csv&quot;, to=&quot;data_backup.csv&quot;</code>" in html
    assert "planned by: <span class=\"planned-by\">offline-rules</span>" in html
    url = reverse("inbox-plan-approve", args=[plan.pk])
    seen = fingerprint_in(html, url)
    step = plan.steps.get(tool="file.copy")
    services.step_edit(step=step, user=operator, changes={"tool_input": {"path": "data.csv", "to": "notes-old.txt"}})
    refused = operator_client.post(url, {"version": plan.version, "mode": "all", "seen_steps": seen},
                                   HTTP_HX_REQUEST="true")
    assert refused.status_code == 409
    assert "The plan changed since you opened it. Nothing was changed." in refused.content.decode()
    plan.refresh_from_db()
    assert plan.status == Plan.Status.AWAITING_APPROVAL
    fresh = fingerprint_in(operator_client.get(reverse("inbox")).content.decode(), url)
    assert fresh != seen
    assert operator_client.post(url, {"version": plan.version, "mode": "all", "seen_steps": fresh},
                                HTTP_HX_REQUEST="true").status_code == 200
    plan.refresh_from_db()
    assert plan.status == Plan.Status.ACTIVE


def test_plan_page_shows_planned_by_rules_and_refuses_a_stale_approval(operator: Any, operator_client: Client) -> None:
    agent = tool_agent()
    plan = plan_generate(agent=agent, goal_text="Read data.csv")  # the one-step rule shortcut: no model
    assert plan.planned_by == "rules" and plan.status == Plan.Status.AWAITING_APPROVAL
    page = operator_client.get(plan.get_absolute_url()).content.decode()
    assert "planned by: <code>rules</code>" in page
    assert "tool <code>file.read</code> input <code>path=&quot;data.csv&quot;</code>" in page
    url = reverse("plan-approve", args=[plan.pk])
    seen = fingerprint_in(page, url)
    services.step_edit(step=plan.steps.get(), user=operator, changes={"tool_input": {"path": "notes.txt"}})
    refused = operator_client.post(url, {"mode": "step", "seen_steps": seen}, HTTP_HX_REQUEST="true")
    assert refused.status_code == 409 and "The plan changed since you opened it. Nothing was changed." in \
        refused.content.decode()
    plan.refresh_from_db()
    assert plan.status == Plan.Status.AWAITING_APPROVAL


def test_written_content_is_previewed_escaped_and_cut(operator_client: Client) -> None:
    agent = tool_agent()
    hostile = "<script>alert(1)</script>" + "y" * 400
    plan = Plan.objects.create(agent=agent, goal_text="Write notes2.txt", status=Plan.Status.AWAITING_APPROVAL)
    PlanStep.objects.create(plan=plan, position=1, key="1", description="Write", tool="file.write",
                            tool_input={"path": "notes2.txt", "content": hostile}, risk="risky",
                            requires_permission=True)
    for html in (operator_client.get(reverse("inbox")).content.decode(),
                 operator_client.get(plan.get_absolute_url()).content.decode()):
        assert "<script>alert(1)" not in html
        assert "path=&quot;notes2.txt&quot;, content=&quot;&lt;script&gt;alert(1)&lt;/script&gt;yyy" in html
        assert "(425 characters)" in html and "y" * 200 not in html


def test_an_external_agents_plan_is_checked_as_far_as_its_declared_tools_tell() -> None:
    from planning.services.reported import PlanInvalid, plan_submit
    from tests.api.conftest import PLAN, TOOLS, step

    agent = Agent.objects.create(name="Mailer", kind=Agent.Kind.EXTERNAL, declared_tools=TOOLS)
    reads = {"goal": "Mail the Q3 figures to Dana", "steps": [step("1", query="q3 figures")]}
    # An outside agent may send in a later plan of its own: the operator approving this one is told what it
    # leaves undone, on the plan's validation.
    plan = plan_submit(agent=agent, data=reads)
    validated = plan.events.get(kind=PlanEvent.Kind.VALIDATED)
    assert "not in this plan: the goal asks to send something, but no step does; use send_email" in validated.reason
    with pytest.raises(PlanInvalid):
        plan_submit(agent=agent, data={"goal": "Mail the Q3 figures to Dana", "steps": []})
    # Its tools tell nothing of summaries: a plan that sends what it found is not refused for that.
    assert plan_submit(agent=agent, data=PLAN).status == Plan.Status.AWAITING_APPROVAL


def test_a_models_plan_that_writes_over_an_input_the_goal_does_not_name_never_reaches_approval(
        settings: Any, llm_server: LLMTestServer) -> None:
    """A small model asked for something vague writes over notes.txt: the plan is rejected with why, and after its
    retries the operator is asked how, with notes.txt untouched and nothing to approve."""
    settings.LLM_MODELS = {"planner": ["big-model"], "fast": ["fast-model"]}
    clobber = {"goal": "write a friendly greeting for the team", "thinking_summary": "Write something.", "confidence": 0.9,
               "risks": [], "steps": [
                   {"id": "1", "tool": "file.write", "intent": "Write the file",
                    "input": {"path": "notes.txt", "content": "The file is fresh now."}, "requiresPermission": True}]}
    llm_server.script("fast-model", *[answer('<json>{"hints": ["Write a new file"]}</json>')] * 8)
    llm_server.script("big-model", *[answer(f"<json>{json.dumps(clobber)}</json>")] * 6)
    agent = tool_agent()
    plan = plan_generate(agent=agent, goal_text="write a friendly greeting for the team")
    assert plan.status == Plan.Status.CLARIFYING and not plan.steps.exists()
    assert "changes notes.txt, a file the goal does not name" in plan.clarification_question
    assert (agent.workspace / "notes.txt").read_text().startswith("Rain today.")


@pytest.mark.parametrize("goal", ["Summarize notes.txt into summary.md",
                                  "pls write a short summary of notes.txt to summary.md",
                                  "Summarise notes.txt into summary.md please"])
def test_the_offline_summary_of_a_file_into_another_reads_only_the_source(goal: str, operator: Any) -> None:
    agent = tool_agent()
    GoalFactory(agent=agent, description=goal, source_needs=[])
    agent_cycle(agent_id=agent.pk, runner="runner-test")
    plan = run_approved(agent, Plan.objects.get(agent=agent), operator)
    assert all(s.tool_input.get("path") != "summary.md" for s in plan.steps.filter(tool="text.summarize"))
    assert plan.status == Plan.Status.COMPLETED, plan.failure_reason
    assert "roof" in (agent.workspace / "summary.md").read_text().lower()
