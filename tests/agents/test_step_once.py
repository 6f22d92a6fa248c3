"""A tool step with effects starts once (docs/runtime-guarantees.md): a step a runner left "running" is never run
again blindly by the runner that takes its agent over. Its tool's mark says whether it began; a step that began
is completed when its effect is found in the workspace, or waits for an operator ("outcome unknown"), whose yes
alone runs it again. A runner whose lease ran out starts no tool."""

from __future__ import annotations

from pathlib import Path

import pytest

from agents.fencing import Fence, FenceLost, fenced
from agents.models import Agent
from agents.tools import tool_began_mark, tool_run, undo_dir_for, undo_keep
from planning import services
from planning.models import Plan, PlanEvent, PlanStep
from runtime.cycle import agent_cycle
from tests.factories import AgentFactory, GoalFactory, UserFactory

pytestmark = pytest.mark.django_db


def append_plan(content: str = "line 1\n", *, before: str | None = None) -> tuple[Agent, Plan, PlanStep]:
    """A tool agent whose approved plan has one step appending `content` to log.txt (holding `before`)."""
    agent = AgentFactory(kind=Agent.Kind.TOOL)
    agent.workspace.mkdir(parents=True)
    if before is not None:
        (agent.workspace / "log.txt").write_text(before)
    goal = GoalFactory(agent=agent, description="Write the log", source_needs=[])
    plan = Plan.objects.create(agent=agent, goal=goal, goal_text=goal.description, status=Plan.Status.ACTIVE,
                               approval_mode=Plan.ApprovalMode.ALL)
    step = PlanStep.objects.create(plan=plan, key="1", position=1, description="Append a line", tool="file.append",
                                   tool_input={"path": "log.txt", "content": content})
    return agent, plan, step


def started_by_a_runner_that_stopped(step: PlanStep, *, tool_ran: bool, tool_began: bool = True) -> None:
    """What a runner cut off mid-step leaves: the step claimed ("running"), its tool's mark, and maybe its effect."""
    claimed = services.step_start(step=step, runner="runner B")
    assert claimed is not None
    workspace = step.plan.agent.workspace
    if tool_began:
        tool_began_mark(undo_dir_for(workspace, str(step.pk)), claimed.actual_cycles)
    if tool_ran:
        tool_run(step.tool, step.tool_input, workspace=workspace, undo_dir=undo_dir_for(workspace, str(step.pk)))


def log_lines(agent: Agent) -> list[str]:
    path = agent.workspace / "log.txt"
    return path.read_text().splitlines() if path.exists() else []


def test_a_takeover_completes_a_step_whose_effect_is_found_without_running_it_again() -> None:
    agent, plan, step = append_plan(before="line 0\n")
    started_by_a_runner_that_stopped(step, tool_ran=True)
    agent_cycle(agent_id=agent.pk, runner="runner A")
    step.refresh_from_db()
    assert step.status == PlanStep.Status.COMPLETED
    assert "not run again" in step.result
    assert log_lines(agent) == ["line 0", "line 1"]  # appended once, by runner B
    assert plan.events.filter(kind=PlanEvent.Kind.STEP_STARTED).count() == 1


@pytest.mark.parametrize("before", [None, "line 1\n"])
def test_a_takeover_never_reruns_a_step_that_began_but_shows_no_effect(before: str | None) -> None:
    """Runner B began the tool and may still finish it (it is cut off, not dead): the step waits for a person.
    A file that already held the same text is no proof either: the undo copy says what it held before."""
    agent, plan, step = append_plan(before=before)
    started_by_a_runner_that_stopped(step, tool_ran=False)
    for _ in range(3):
        agent_cycle(agent_id=agent.pk, runner="runner A")
    step.refresh_from_db()
    assert step.status == PlanStep.Status.AWAITING_APPROVAL
    assert step.error.startswith("outcome unknown, interrupted")
    assert log_lines(agent) == ([] if before is None else ["line 1"])  # not run by runner A
    assert plan.events.filter(kind=PlanEvent.Kind.STEP_STARTED).count() == 1
    agent.refresh_from_db()
    assert "outcome unknown" in agent.waiting_reason
    # The operator's yes runs it again, once.
    services.step_approve(step=step, user=UserFactory(username="olga", role="operators"))
    agent_cycle(agent_id=agent.pk, runner="runner A")
    step.refresh_from_db()
    assert step.status == PlanStep.Status.COMPLETED
    assert log_lines(agent).count("line 1") == 1 + (before is not None)


def test_a_step_claimed_but_whose_tool_never_began_is_retried() -> None:
    agent, plan, step = append_plan()
    started_by_a_runner_that_stopped(step, tool_ran=False, tool_began=False)
    agent_cycle(agent_id=agent.pk, runner="runner A")
    step.refresh_from_db()
    assert step.status == PlanStep.Status.COMPLETED and step.retries == 1
    assert log_lines(agent) == ["line 1"]
    assert plan.events.filter(kind=PlanEvent.Kind.STEP_RETRIED, reason__contains="before its tool began").exists()


def test_an_earlier_tries_mark_does_not_count_for_this_one() -> None:
    """Try 1 began and failed (retried); try 2 was claimed and cut off before its tool began: retried, not held."""
    agent, plan, step = append_plan()
    started_by_a_runner_that_stopped(step, tool_ran=False)
    services.step_finish(step=step, runner="runner B", succeeded=False, error="disk full")
    started_by_a_runner_that_stopped(step, tool_ran=False, tool_began=False)
    agent_cycle(agent_id=agent.pk, runner="runner A")
    step.refresh_from_db()
    assert step.status == PlanStep.Status.COMPLETED
    assert log_lines(agent) == ["line 1"]


def test_a_runner_whose_lease_ran_out_starts_no_tool_and_records_nothing(tmp_path: Path) -> None:
    agent, plan, step = append_plan()
    lease_out = Fence(job_id=1, worker_id=None, lease_valid=lambda: False)
    with fenced(lease_out), pytest.raises(FenceLost, match="lease ran out"):
        agent_cycle(agent_id=agent.pk, runner="runner B")
    step.refresh_from_db()
    assert step.status == PlanStep.Status.PENDING  # not even claimed: the claim is refused too
    assert log_lines(agent) == []
    agent.refresh_from_db()
    assert agent.cycle_count == 0


# Every side-effect tool's effect is checked the same way: found after a cut, the step completes; began but not
# found, it waits for a person. (file.write / file.append above; web.fetch and loops: below.)
EFFECTS = {
    "write": ("file.write", {"path": "out/hello.txt", "content": "hello\n"}),
    "mkdir": ("dir.create", {"path": "reports/2026"}),
    "copy to a name": ("file.copy", {"path": "data.csv", "to": "copy.csv"}),
    "copy into a folder": ("file.copy", {"path": "data.csv", "to": "backup/"}),
    "move to a name": ("file.move", {"path": "data.csv", "to": "moved.csv"}),
    "move into a folder": ("file.move", {"path": "data.csv", "to": "archive"}),
    "move a folder": ("file.move", {"path": "archive", "to": "old"}),
    "convert": ("file.convert", {"path": "data.csv", "to": "json"}),
    "convert to a table": ("file.convert", {"path": "data.csv", "to": "md", "output": "table.md"}),
    "count": ("file.count", {"path": "data.csv", "output": "count.txt"}),
    "report": ("report.write", {"paths": ["notes.txt", "data.csv"], "output": "report.md"}),
}


def tool_plan(tool: str, tool_input: dict[str, object], *, loop: dict[str, object] | None = None
              ) -> tuple[Agent, Plan, PlanStep]:
    """A tool agent whose approved plan has one step of `tool`, in a workspace with a CSV, notes and a folder."""
    agent = AgentFactory(kind=Agent.Kind.TOOL)
    (agent.workspace / "archive").mkdir(parents=True)
    (agent.workspace / "backup").mkdir()
    (agent.workspace / "data.csv").write_text("name,qty\napples,3\npears,5\n")
    (agent.workspace / "notes.txt").write_text("Pears sell well. Apples less so. Order more pears.\n")
    goal = GoalFactory(agent=agent, description="Tidy the files", source_needs=[])
    plan = Plan.objects.create(agent=agent, goal=goal, goal_text=goal.description, status=Plan.Status.ACTIVE,
                               approval_mode=Plan.ApprovalMode.ALL)
    step = PlanStep.objects.create(plan=plan, key="1", position=1, description=f"Run {tool}", tool=tool,
                                   tool_input=tool_input, loop=loop or {})
    return agent, plan, step


def workspace_state(agent: Agent) -> dict[str, bytes | None]:
    """Every file and folder of the workspace (a folder as None), by path."""
    root = agent.workspace
    return {p.relative_to(root).as_posix(): (p.read_bytes() if p.is_file() else None) for p in sorted(root.rglob("*"))}


@pytest.mark.parametrize("case", EFFECTS)
def test_a_takeover_completes_any_side_effect_step_whose_effect_is_found(case: str) -> None:
    tool, tool_input = EFFECTS[case]
    agent, plan, step = tool_plan(tool, tool_input)
    started_by_a_runner_that_stopped(step, tool_ran=True)
    after_one_run = workspace_state(agent)
    agent_cycle(agent_id=agent.pk, runner="runner A")
    step.refresh_from_db()
    assert step.status == PlanStep.Status.COMPLETED, step.error
    assert "not run again" in step.result
    assert workspace_state(agent) == after_one_run
    assert plan.events.filter(kind=PlanEvent.Kind.STEP_STARTED).count() == 1


@pytest.mark.parametrize("case", EFFECTS)
def test_a_takeover_never_reruns_any_side_effect_step_that_began_but_shows_no_effect(case: str) -> None:
    """The runner cut off kept its undo copies and began, but its tool has not done its work (yet): whatever the
    tool, the step waits for an operator, and the workspace is untouched by the takeover."""
    tool, tool_input = EFFECTS[case]
    agent, plan, step = tool_plan(tool, tool_input)
    claimed = services.step_start(step=step, runner="runner B")
    assert claimed is not None
    undo_dir = undo_dir_for(agent.workspace, str(step.pk))
    tool_began_mark(undo_dir, claimed.actual_cycles)
    undo_keep(tool, [dict(tool_input)], agent.workspace, undo_dir)
    before = workspace_state(agent)
    agent_cycle(agent_id=agent.pk, runner="runner A")
    step.refresh_from_db()
    assert step.status == PlanStep.Status.AWAITING_APPROVAL
    assert step.error.startswith("outcome unknown, interrupted")
    assert workspace_state(agent) == before


@pytest.mark.parametrize(("tool", "tool_input", "loop"), [
    ("web.fetch", {"url": "https://example.com/prices"}, None),  # a network call leaves nothing to check
    ("file.append", {"path": "log.txt", "content": "run {index}\n"}, {"repeat": 3}),  # a loop: each run's effect
])
def test_a_takeover_puts_a_step_it_cannot_check_to_the_operator(tool: str, tool_input: dict[str, object],
                                                                 loop: dict[str, object] | None) -> None:
    agent, plan, step = tool_plan(tool, tool_input, loop=loop)
    claimed = services.step_start(step=step, runner="runner B")
    assert claimed is not None
    undo_dir = undo_dir_for(agent.workspace, str(step.pk))
    tool_began_mark(undo_dir, claimed.actual_cycles)
    if loop:
        tool_run(tool, tool_input, workspace=agent.workspace, loop=loop, undo_dir=undo_dir)
    agent_cycle(agent_id=agent.pk, runner="runner A")
    step.refresh_from_db()
    assert step.status == PlanStep.Status.AWAITING_APPROVAL
    assert step.error.startswith("outcome unknown, interrupted")
