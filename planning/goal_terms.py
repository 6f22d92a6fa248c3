"""A tool goal judged against the agent's tools, one reading for every planner: the built-in planner, an
external agent's submitted plan, and an operator's version written in the plan editor (planning/engine/
goal_check.py does the reading; this module gives it the agent's tools)."""

from __future__ import annotations

from collections.abc import Collection, Sequence
from typing import Any

from agents.declared_tools import agent_plan_terms
from agents.models import Agent
from agents.tools import TOOLS, tool_targets, workspace_listing
from planning.engine.goal_check import Reach, goal_reachable, plan_goal_problems, tool_verbs
from planning.engine.meaning import StepView


def goal_tools_verbs(agent: Agent) -> dict[str, frozenset[str]]:
    """What each of the agent's tools can do (planning/engine/goal_check.py tool_verbs)."""
    _, declared = agent_plan_terms(agent.kind, agent.declared_tools)
    return {name: tool_verbs(name, spec.verbs, spec.description) for name, spec in (declared or TOOLS).items()}


def goal_reach(agent: Agent, goal_text: str) -> Reach:
    """A tool agent's goal judged before planning (goal_reachable); a persona's is always planned."""
    if agent.kind != Agent.Kind.TOOL:
        return Reach()
    return goal_reachable(goal_text, goal_tools_verbs(agent))


def goal_plan_check(agent: Agent, goal_text: str, steps: Sequence[Any], *, steered: bool = False,
                    inputs_kept: Collection[str] | None = None) -> list[str]:
    """Why a tool plan's steps (StepSpecs, in the order the plan page numbers them) cannot reach the goal.
    An operator's feedback (`steered`) may move an output elsewhere, so only the actions are checked then.
    With `inputs_kept` (the keys of the steps already done, kept from earlier versions), a step may not change a
    file of the workspace the goal does not name (one the done steps made is the plan's own)."""
    if agent.kind == Agent.Kind.PERSONA or not goal_text:
        return []
    views = [StepView(position, step.tool, dict(step.input)) for position, step in enumerate(steps, start=1)]
    existing: list[str] = []
    if inputs_kept is not None and agent.kind == Agent.Kind.TOOL and not steered:
        made = {path for step in steps if step.key in inputs_kept for path in tool_targets(step.tool, dict(step.input))}
        existing = [path for path in workspace_listing(agent.workspace) if not path.endswith("/") and path not in made]
    problems = plan_goal_problems(goal_text, views, goal_tools_verbs(agent), existing)
    if agent.kind == Agent.Kind.EXTERNAL:
        # An external agent's tools tell only what their names and descriptions say, and nothing of the files
        # they write: its plan is refused only for an action one of its own tools can do and no step does, and
        # a version made after an operator's feedback (`steered`) follows that feedback instead.
        return [] if steered else [p for p in problems if "; use " in p]
    return [p for p in problems if not (steered and p.startswith("the goal asks for "))]
