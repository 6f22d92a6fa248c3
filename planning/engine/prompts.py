"""Strict prompt builders for every LLM purpose (seeds 000-003).

Each builder returns chat messages. The last user message ends with a `CONTEXT: {...}` line holding the
structured inputs as one-line JSON: real models may use it, and the offline rules model answers from it
alone, so its keys are a contract (see `agents.llm.context`).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from typing import Any

from agents.llm.context import CONTEXT_PREFIX, bullets, context_line, needs_text, prompt_context
from agents.llm.placeholders import examples_register
from agents.tools import ToolSpec

REJECTED_OUTPUT_CHARS = 1500  # seed 002: the last rejected output, truncated
RESTATE_KEYS = ("who", "what", "when", "where", "why")

Messages = list[dict[str, str]]


def _truncate(text: str, limit: int = REJECTED_OUTPUT_CHARS) -> str:
    return text if len(text) <= limit else text[:limit] + f"\n[... {len(text) - limit} more characters cut]"


def _identity(agent_name: str, backstory: str) -> str:
    return f"You are {agent_name}." + (f" {backstory.strip()}" if backstory.strip() else "")


def plan_step_directive(*, goal: str, number: int, total: int, description: str, action_hint: str) -> str:
    """Seed 000's directive for the action decision prompt, for the current plan step."""
    return (
        "Current Plan Step (follow this unless urgent needs override): "
        f"Goal: {goal}. Step {number} of {total}: {description}. Suggested action: {action_hint}."
    )


_SUGGESTED = re.compile(r"Suggested action:\s*(.+?)\.?\s*$", re.MULTILINE)


def prompt_restate(*, goal: str, agent_name: str, backstory: str) -> Messages:
    """Seed 002 step 1: a fast restatement of the goal as WHO/WHAT/WHEN/WHERE/WHY."""
    context = {"purpose": "restate", "goal": goal, "agent_name": agent_name}
    user = (
        f"GOAL: {goal}\n\n"
        "Restate this goal as WHO / WHAT / WHEN / WHERE / WHY, one short line each, without adding "
        "anything the goal does not say. Answer with JSON inside <json>...</json>:\n"
        '<json>{"who": "<who acts>", "what": "<what is done>", "when": "<when>", "where": "<where>", '
        '"why": "<why>"}</json>\n'
        + context_line(context)
    )
    system = _identity(agent_name, backstory) + " You restate goals precisely. You never plan or act."
    return [{"role": "system", "content": system}, {"role": "user", "content": user}]


# The worked examples are deliberately not everyday goals: a model that copies one is caught (its values are
# refused as placeholders, see agents/llm/placeholders.py) rather than passing for an answer.
_TOOL_TEMPLATE = """<json>
{"goal": "Put the first line of chapter7.md into titles.txt",
 "thinking_summary": "Read the chapter, write its first line to the new file, then check it.",
 "steps": [
  {"id": "1", "tool": "file.read", "intent": "Read the chapter", "input": {"path": "chapter7.md"},
   "requiresPermission": false, "dependsOn": [], "expects": "the chapter starts with its title"},
  {"id": "2", "tool": "file.write", "intent": "Write the first line to titles.txt",
   "input": {"path": "titles.txt", "content": "Chapter 7: The Harbour"},
   "requiresPermission": true, "dependsOn": ["1"], "expects": "titles.txt holds the title"},
  {"id": "3", "tool": "file.read", "intent": "Check titles.txt", "input": {"path": "titles.txt"},
   "requiresPermission": false, "dependsOn": ["2"], "expects": "the title is there"}
 ]}
</json>"""

_PERSONA_TEMPLATE = """<json>
{"goal": "Cheer up after a long week",
 "thinking_summary": "Company first, then some rest.",
 "steps": [
  {"description": "Phone an old school friend", "action_hint": "call a friend",
   "expected_outcome": "feel less alone", "estimated_cycles": 1},
  {"description": "Spend a quiet evening with a book", "action_hint": "relax",
   "expected_outcome": "rested and calmer", "estimated_cycles": 2}
 ]}
</json>"""


def _template_values(template: str) -> list[str]:
    data = json.loads(template.removeprefix("<json>").removesuffix("</json>"))
    values: list[str] = [data["goal"], data["thinking_summary"]]
    for step in data["steps"]:
        values += [str(v) for k, v in step.items() if isinstance(v, str) and k not in ("id", "tool", "action_hint")]
        values += [str(v) for v in (step.get("input") or {}).values()]
    return values


# The examples' own values: an answer holding one (for a goal that does not) copied the example.
EXAMPLE_VALUES = tuple(dict.fromkeys(_template_values(_TOOL_TEMPLATE) + _template_values(_PERSONA_TEMPLATE)))
examples_register(*EXAMPLE_VALUES)


def _tool_lines(tools: Sequence[ToolSpec]) -> str:
    lines = []
    for spec in tools:
        risk = "safe, read-only" if not spec.risky else f"RISKY ({spec.risk_class}): requiresPermission must be true"
        lines.append(f"- {spec.name} {spec.schema_text()}: {spec.description} [{risk}]")
    return "\n".join(lines) or "(no tools)"


def _rules(kind: str, max_steps: int) -> str:
    if kind == "tool":
        return (
            "RULES:\n"
            "- Answer with valid JSON inside <json>...</json>; no other JSON in the answer.\n"
            "- Top-level keys allowed: goal (the GOAL above, word for word), thinking_summary, confidence (0..1), "
            "risks, steps. Nothing else.\n"
            "- Each step has only: id, tool, intent, input, requiresPermission, dependsOn, expects.\n"
            '- ids are unique short strings ("1", "2", ...); dependsOn lists ids of steps that must finish first; '
            "no cycles.\n"
            "- Use only the tools listed; input keys and types must match the tool's schema exactly.\n"
            "- intent is one line. Paths are relative to the workspace: never absolute, never '..'.\n"
            "- Content for file.write / file.append is the real, final text: never TODO, '...', or <placeholders>.\n"
            "- Never write to a file the goal names as input; use every file the goal names.\n"
            "- requiresPermission is true for every RISKY tool; read-only steps come first.\n"
            "- No shell commands. Nothing is executed while planning.\n"
            "- After a step that writes, add a file.read step that checks the result (verification).\n"
            '- toolsNeeded (optional) lists the tools a step needs.\n'
            '- To repeat a step for every file an earlier file.list step found, give it "forEach": "<that step\'s id>" '
            "and use {item} (the file's full path from the workspace root) in its input. To repeat it n times, give "
            '"repeat": n and use {index} (zero-based; {index:03d} pads it). Never dir.create inside a loop.\n'
            '- If the goal is too ambiguous to plan, answer <json>{"ask": "your question"}</json> instead.\n'
            '- If the goal cannot (or must not) be done with these tools, answer <json>{"cannot": "why"}</json> '
            "instead: never a plan that only looks like it.\n"
            f"- At most {max_steps} steps."
        )
    return (
        "RULES:\n"
        "- Answer with valid JSON inside <json>...</json>; no other JSON in the answer.\n"
        "- Top-level keys allowed: goal (the GOAL above, word for word), thinking_summary, confidence (0..1), "
        "steps. Nothing else.\n"
        "- Give 2-6 ordered steps. Each step has only: description, action_hint, expected_outcome, "
        "estimated_cycles.\n"
        "- action_hint is exactly one of the allowed actions. estimated_cycles is a whole number from 1 to 20.\n"
        "- Every string is a single line.\n"
        f"- At most {max_steps} steps."
    )


def _plan_context(
    purpose: str,
    *,
    kind: str,
    goal: str,
    agent_name: str,
    tools: Sequence[ToolSpec] | None,
    allowed_actions: Sequence[str],
    needs: Mapping[str, float],
    feedback: Sequence[str],
    max_steps: int,
    workspace_files: Sequence[str],
) -> dict[str, Any]:
    return {
        "purpose": purpose,
        "kind": kind,
        "goal": goal,
        "agent_name": agent_name,
        "tools": [spec.name for spec in tools or ()],
        # A tool agent has no persona actions nor needs: its context line does not repeat them.
        "allowed_actions": list(allowed_actions) if kind != "tool" else [],
        "needs": {name: round(float(value), 4) for name, value in needs.items()} if kind != "tool" else {},
        "feedback": [str(f) for f in feedback],
        "max_steps": max_steps,
        "workspace_files": list(workspace_files),
    }


def _situation(
    *,
    kind: str,
    goal: str,
    tools: Sequence[ToolSpec] | None,
    allowed_actions: Sequence[str],
    needs: Mapping[str, float],
    workspace_files: Sequence[str],
) -> list[str]:
    parts = [f"GOAL: {goal}"]
    if kind == "tool":
        parts.append("TOOLS (the only ones you may use):\n" + _tool_lines(tools or ()))
        if workspace_files:
            parts.append("WORKSPACE FILES:\n" + bullets(list(workspace_files)))
    else:
        parts.append(f"CURRENT NEEDS (satisfaction, lowest first): {needs_text(needs)}")
        parts.append("ALLOWED ACTIONS: " + (", ".join(allowed_actions) or "(any)"))
    return parts


def prompt_plan(
    *,
    kind: str,
    goal: str,
    restatement: Mapping[str, str] | None,
    agent_name: str,
    backstory: str,
    tools: Sequence[ToolSpec] | None,
    allowed_actions: Sequence[str],
    needs: Mapping[str, float],
    rejection_reasons: Sequence[str],
    last_rejected_output: str,
    feedback: Sequence[str],
    retry_hints: Sequence[str],
    max_steps: int,
    workspace_files: Sequence[str] = (),
    simple: bool = False,
    compact: bool = False,
) -> Messages:
    """The planner prompt: a strict JSON template, the tools or actions, and what went wrong before.

    Operator feedback and the planner's own rejected attempts are labelled apart: one is what a person
    wants, the other what the validator refused. `simple` is seed 003's fallback to a simpler request.
    `compact` is the prompt for a small model under structured output: the schema gives the shape, so the
    prompt is the goal, the files, the tools and three rules (a fifth of the tokens, no worked example)."""
    if compact:
        return _prompt_compact(
            kind=kind, goal=goal, agent_name=agent_name, tools=tools, allowed_actions=allowed_actions, needs=needs,
            rejection_reasons=rejection_reasons, last_rejected_output=last_rejected_output, feedback=feedback,
            max_steps=max_steps, workspace_files=workspace_files)
    if kind == "tool":
        system = (
            _identity(agent_name, backstory) + "\nYou MUST:\n- Produce a step-by-step plan\n- Declare tool usage\n"
            "- Mark risky steps\n- Never execute actions"
        )
    else:
        system = (
            _identity(agent_name, backstory) + "\nYou decompose your goal into 2-6 ordered steps, each with an "
            "action you can take. You never act while planning."
        )
    parts = _situation(
        kind=kind, goal=goal, tools=tools, allowed_actions=allowed_actions, needs=needs, workspace_files=workspace_files
    )
    if restatement:
        parts.insert(1, "RESTATED GOAL: " + "; ".join(f"{k.upper()}: {restatement.get(k, '')}" for k in RESTATE_KEYS))
    if feedback:
        parts.append("OPERATOR FEEDBACK (must be taken into account):\n" + bullets(feedback))
    if rejection_reasons:
        parts.append("YOUR PREVIOUS ATTEMPT WAS REJECTED BECAUSE:\n" + bullets(rejection_reasons))
    if last_rejected_output.strip():
        parts.append("LAST REJECTED OUTPUT (truncated):\n" + _truncate(last_rejected_output))
    if retry_hints:
        parts.append("RETRY_HINTS (from a review of your rejected attempt):\n" + bullets(retry_hints))
    if simple:
        parts.append(
            "SIMPLER REQUEST: the full plan was rejected repeatedly. Give the smallest plan that does only the "
            "first useful part of the goal: at most 3 steps, the plainest tools, nothing optional."
        )
    parts.append(_rules(kind, max_steps))
    parts.append("TEMPLATE:\n" + (_TOOL_TEMPLATE if kind == "tool" else _PERSONA_TEMPLATE))
    context = _plan_context(
        "plan", kind=kind, goal=goal, agent_name=agent_name, tools=tools, allowed_actions=allowed_actions,
        needs=needs, feedback=feedback, max_steps=max_steps, workspace_files=workspace_files,
    )
    context |= {
        "restatement": dict(restatement or {}),
        "reasons": [str(r) for r in rejection_reasons],
        "retry_hints": [str(h) for h in retry_hints],
        "simple": simple,
    }
    user = "\n\n".join(parts) + "\n" + context_line(context)
    return [{"role": "system", "content": system}, {"role": "user", "content": user}]


COMPACT_TOOL_SYSTEM = "You plan tool calls for a goal as JSON. You never execute anything."
COMPACT_TOOL_RULES = (
    "Answer with the JSON plan for the GOAL: goal is the GOAL word for word; steps are the tool calls in order, "
    "each with its tool's input keys. Use every file the GOAL names; write only to files the GOAL asks to create "
    "or change, never to the file it reads. As few steps as the GOAL needs, each once. "
    'Only if the GOAL is unclear: answer {"ask": ...} with the one question about the GOAL you need answered. '
    'Only if these tools cannot do it: answer {"cannot": ...} saying what is missing.')


def compact_tool_lines(tools: Sequence[ToolSpec]) -> str:
    """All the tools, one short line each: name, input keys, what it does, and whether it changes anything."""
    return "\n".join(f"- {t.name} {t.schema_text()}: {t.description}{'' if t.risky else ' (read-only)'}"
                     for t in tools) or "(no tools)"


def _prompt_compact(*, kind: str, goal: str, agent_name: str, tools: Sequence[ToolSpec] | None,
                    allowed_actions: Sequence[str], needs: Mapping[str, float], rejection_reasons: Sequence[str],
                    last_rejected_output: str, feedback: Sequence[str], max_steps: int,
                    workspace_files: Sequence[str]) -> Messages:
    """What stays the same from goal to goal comes first (a server's prompt cache then reuses it): the rules,
    the tools, the files; the goal and what went wrong last come at the end. No CONTEXT line: a small model
    is a real one, and every token of its prompt costs time."""
    if kind == "tool":
        system = COMPACT_TOOL_SYSTEM
        # Every tool, one short line each: a goal's words do not say which tools it needs. The tools are the same
        # for every tool agent, the files its own: the tools first, so one agent's prompt shares the longest start
        # with another's (llama.cpp then evaluates only the rest: most of a small model's time on a CPU).
        parts = [COMPACT_TOOL_RULES, "TOOLS:\n" + compact_tool_lines(tools or ())]
        if workspace_files:
            parts.append("FILES: " + ", ".join(workspace_files[:30]))
    else:
        system = f"You are {agent_name}. You plan 2-6 steps towards a goal as JSON. You never act while planning."
        parts = ["Answer with the JSON plan for the GOAL: goal is the GOAL word for word; 2-6 steps, each a short "
                 "line with one of the ACTIONS.", "ACTIONS: " + ", ".join(allowed_actions),
                 f"NEEDS (lowest first): {needs_text(needs)}"]
    if feedback:
        parts.append("OPERATOR FEEDBACK:\n" + bullets(feedback))
    parts.append(f"GOAL: {goal}")
    if last_rejected_output.strip():
        parts.append("YOUR LAST ANSWER:\n" + _truncate(last_rejected_output, 400))
    if rejection_reasons:
        parts.append("IT WAS REJECTED BECAUSE:\n" + bullets(rejection_reasons))
    return [{"role": "system", "content": system}, {"role": "user", "content": "\n\n".join(parts)}]


def _step_record(step: Mapping[str, Any]) -> dict[str, Any]:
    """The JSON-safe parts of a step mapping (a StepSpec.as_dict(), perhaps with a reason)."""
    key = step.get("key", step.get("id", ""))
    return {
        "key": str(key),
        "description": str(step.get("description", "")),
        "tool": str(step.get("tool", "") or ""),
        "input": dict(step["input"]) if isinstance(step.get("input"), Mapping) else {},
        "action_hint": str(step.get("action_hint", "") or ""),
        "expected_outcome": str(step.get("expected_outcome", "") or ""),
        "estimated_cycles": step.get("estimated_cycles", 1),
        "depends_on": [str(d) for d in step.get("depends_on") or []],
        "requires_permission": bool(step.get("requires_permission", False)),
        "failure_reason": str(step.get("failure_reason", "") or step.get("error", "") or ""),
    }


def prompt_replan(
    *,
    kind: str,
    goal: str,
    agent_name: str,
    backstory: str,
    tools: Sequence[ToolSpec] | None,
    allowed_actions: Sequence[str],
    needs: Mapping[str, float],
    completed_steps: Sequence[Mapping[str, Any]],
    failed_step: Mapping[str, Any] | None,
    reason: str,
    feedback: Sequence[str],
    max_steps: int,
    workspace_files: Sequence[str] = (),
    restatement: Mapping[str, str] | None = None,
    rejection_reasons: Sequence[str] = (),
    last_rejected_output: str = "",
    retry_hints: Sequence[str] = (),
    simple: bool = False,
    declined_steps: Sequence[Mapping[str, Any]] = (),
    compact: bool = False,
) -> Messages:
    """Seed 000/004 replanning: keep what is done, replace what failed, in the light of the feedback.

    `declined_steps` are the steps the operator declined in this version and every earlier one, each with
    its "feedback": none may come back unchanged (the planner rejects an answer that repeats one).

    The restatement and the retry context (rejection reasons, the last rejected output, the hints) are
    the same as for a first plan: a replan's own rejected attempts teach it as much."""
    messages = prompt_plan(
        kind=kind, goal=goal, restatement=restatement, agent_name=agent_name, backstory=backstory, tools=tools,
        allowed_actions=allowed_actions, needs=needs, rejection_reasons=rejection_reasons,
        last_rejected_output=last_rejected_output, feedback=feedback, retry_hints=retry_hints, max_steps=max_steps,
        workspace_files=workspace_files, simple=simple, compact=compact,
    )
    completed = [_step_record(s) for s in completed_steps]
    failed = _step_record(failed_step) if failed_step else None
    lines = ["REPLAN. The current plan cannot continue as it is."]
    if completed:
        done = [
            f"id {s['key']}: {s['description']}" + (f" [{s['tool']} {json.dumps(s['input'])}]" if s["tool"] else "")
            for s in completed
        ]
        lines.append(
            "COMPLETED STEPS (keep completed steps as they are: repeat them first, unchanged, with the same ids):\n"
            + bullets(done)
        )
    if failed:
        why_failed = f" (failed: {failed['failure_reason']})" if failed["failure_reason"] else ""
        lines.append(f"FAILED STEP: id {failed['key']}: {failed['description']}{why_failed}")
    if reason.strip():
        lines.append(f"WHY: {' '.join(reason.split())}")
    declined = [_step_record(s) | {"feedback": " ".join(str(s.get("feedback", "")).split())} for s in declined_steps]
    if declined:
        lines.append(
            "DECLINED BY THE OPERATOR (never propose these again unchanged; do what the operator said):\n"
            + bullets([
                f"{s['description']}" + (f" [{s['tool']} {json.dumps(s['input'])}]" if s["tool"] else "")
                + (f" [action: {s['action_hint']}]" if s["action_hint"] else "") + f" - operator: {s['feedback']}"
                for s in declined
            ])
        )
    lines.append(
        "Keep completed steps as they are; give the remaining steps. Do not repeat the failed step unchanged: "
        "change it, replace it or leave it out."
    )
    context = prompt_context(messages)
    context |= {"purpose": "replan", "completed_steps": completed, "failed_step": failed, "reason": reason,
                "declined_steps": declined}
    body, _, last = messages[-1]["content"].rpartition("\n")
    if not last.startswith(CONTEXT_PREFIX):  # a compact prompt has no CONTEXT line to replace
        body = messages[-1]["content"]
    messages[-1]["content"] = "\n\n".join(lines) + "\n\n" + body + "\n" + context_line(context)
    return messages


def prompt_reflect(*, output: str, reasons: Sequence[str]) -> Messages:
    """Seed 002 6a: a fast diagnosis of a rejected plan, as concrete RETRY_HINTS."""
    context = {"purpose": "reflect", "reasons": [str(r) for r in reasons]}
    user = (
        "A planner's output was rejected.\n\nREASONS:\n" + bullets(reasons) + "\n\nOUTPUT (truncated):\n"
        + _truncate(output) + "\n\nGive at most 5 short, concrete hints that would fix it. "
        'Answer with JSON inside <json>...</json>: <json>{"hints": ["<one concrete fix>"]}</json>\n'
        + context_line(context)
    )
    system = "You review rejected plans and say precisely how to fix them. You never write the plan yourself."
    return [{"role": "system", "content": system}, {"role": "user", "content": user}]


def prompt_decide_action(
    *,
    agent_name: str,
    needs: Mapping[str, float],
    current_step: str,
    goals: Sequence[str],
    lessons: Sequence[str],
    actions: Sequence[str],
) -> Messages:
    """Seed 000 action decision: the current plan step sits above goals and lessons (highest priority)."""
    suggested = _SUGGESTED.search(current_step)
    context = {
        "purpose": "decide",
        "agent_name": agent_name,
        "needs": {name: round(float(value), 4) for name, value in needs.items()},
        "suggested_action": suggested.group(1).strip() if suggested else "",
        "goals": [str(g) for g in goals],
        "actions": list(actions),
    }
    parts = [f"CURRENT NEEDS (satisfaction, lowest first): {needs_text(needs)}"]
    if current_step.strip():
        parts.append(" ".join(current_step.split()))
    parts.append("CURRENT GOALS:\n" + bullets(goals))
    parts.append("LEARNED LESSONS:\n" + bullets(lessons))
    parts.append("AVAILABLE ACTIONS: " + ", ".join(actions))
    parts.append(
        "Choose exactly one available action. Answer with JSON inside <json>...</json>:\n"
        '<json>{"action": "<one of the available actions>", "reason": "<why, in one line>"}</json>'
    )
    user = "\n\n".join(parts) + "\n" + context_line(context)
    system = _identity(agent_name, "") + " You decide what to do next, one action at a time."
    return [{"role": "system", "content": system}, {"role": "user", "content": user}]
