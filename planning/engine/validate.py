"""Judging parsed plan data before anyone acts on it (seeds 000, 002, 003).

A plan is rejected with precise reasons, fit to be fed back to the planner, or accepted, possibly with
flags: things the validator corrected on the safe side (a write the model called safe now needs
permission) that the operator should see. `plan_validate` never raises: models write anything.
"""

from __future__ import annotations

import difflib
import json
import math
import posixpath
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agents.llm.placeholders import junk_problem
from agents.tools import (
    LIST_TOOLS,
    LOOP_FORBIDDEN,
    MAX_LOOP_RUNS,
    TOOLS,
    ToolError,
    ToolSpec,
    path_problem,
    tool_input_problems,
    workspace_resolve,
)

if TYPE_CHECKING:
    from planning.models import PlanStep

KINDS = ("tool", "persona")
TOP_LEVEL_KEYS = (
    "goal", "thinking_summary", "reflection", "ready", "steps", "plan", "risks", "confidence", "clarification",
    "ask", "cannot",
)
# Field -> the names models use for it; the first is the one our prompts ask for.
TOOL_STEP_FIELDS: Mapping[str, tuple[str, ...]] = {
    "key": ("id", "step", "step_id"),
    "tool": ("tool",),
    "description": ("intent", "description"),
    "input": ("input",),
    "requires_permission": ("requiresPermission", "requires_permission"),
    "depends_on": ("dependsOn", "dependencies", "depends_on"),
    "expected_outcome": ("expects", "expected_outcome", "expectedOutcome"),
    "risk": ("risk",),
    "estimated_cycles": ("estimated_cycles", "estimatedCycles"),
    "tools_needed": ("toolsNeeded", "tools_needed"),
    "for_each": ("forEach", "for_each", "FOR_EACH"),
    "repeat": ("repeat", "REPEAT"),
}
PERSONA_STEP_FIELDS: Mapping[str, tuple[str, ...]] = {
    "key": ("id", "step", "step_id"),
    "description": ("description",),
    "action_hint": ("action_hint", "action"),
    "expected_outcome": ("expected_outcome", "expects"),
    "estimated_cycles": ("estimated_cycles",),
    "depends_on": ("depends_on", "dependencies", "dependsOn"),
    "tools_needed": ("tools_needed", "toolsNeeded"),
}
# Lengths of the PlanStep columns these values land in.
KEY_MAX = 32
DESCRIPTION_MAX = 500
ACTION_HINT_MAX = 200
OUTCOME_MAX = 500
SUMMARY_MAX = 4000
CYCLES_MAX = 20
PREFERRED_PERSONA_STEPS = (2, 6)  # seed 000: "2-6 ordered steps"
RISK_DOES = {"write": "writes files", "network": "uses the network", "system": "changes the system"}
RISK_WORDS = {"safe": "safe", "low": "safe", "none": "safe", "risky": "risky", "medium": "risky", "high": "risky"}

# (cheap lowercase triggers, pattern, category): the triggers spare us the regexes on ordinary text.
_PROHIBITED: list[tuple[tuple[str, ...], re.Pattern[str], str]] = [
    (("rm",), re.compile(r"\brm\s+-[a-z]*[rf]", re.IGNORECASE), "shell command"),
    (("sudo",), re.compile(r"\bsudo\b", re.IGNORECASE), "shell command"),
    (
        ("curl", "wget"),
        re.compile(r"\b(?:curl|wget)\b[^|\n]*\|\s*(?:sudo\s+)?(?:ba|z|da)?sh\b", re.IGNORECASE),
        "shell command",
    ),
    (("mkfs", "dd", "/dev/"), re.compile(r"\bmkfs(?:\.\w+)?\b|\bdd\s+if=|>\s*/dev/(?:sd|hd|nvme)", re.IGNORECASE), "shell command"),
    ((":()",), re.compile(r":\(\)\s*\{\s*:\s*\|\s*:\s*&\s*\}\s*;\s*:"), "shell command"),
    (("chmod",), re.compile(r"\bchmod\s+(?:-R\s+)?0?777\b", re.IGNORECASE), "shell command"),
    (
        ("remove-item", "format", "del"),
        re.compile(r"\bRemove-Item\b[^\n]*-Recurse|\bformat\s+[a-z]:|\bdel\s+/[sq]\b", re.IGNORECASE),
        "shell command",
    ),
    (
        ("powershell", "pwsh"),
        re.compile(r"\b(?:powershell|pwsh)\b[^\n]*\s-e(?:nc|ncodedcommand)?\b", re.IGNORECASE),
        "shell command",
    ),
    (("nc",), re.compile(r"\bnc\s+-e\b", re.IGNORECASE), "shell command"),
    (("/etc/",), re.compile(r"(?<![\w.-])/etc/(?:passwd|shadow|sudoers)\b", re.IGNORECASE), "reference to a system file"),
    (
        ("ignore", "disregard", "forget", "override"),
        re.compile(
            r"\b(?:ignore|disregard|forget|override)\s+(?:all\s+|any\s+)?(?:of\s+)?(?:the\s+|your\s+|my\s+)?"
            r"(?:previous|prior|above|earlier|system|original)\s+(?:instructions?|prompts?|rules|messages?|directions)",
            re.IGNORECASE,
        ),
        "prompt injection",
    ),
    (
        ("reveal", "print", "show", "leak", "repeat"),
        re.compile(
            r"\b(?:reveal|print|show|leak|repeat)\s+(?:me\s+)?(?:your|the)\s+"
            r"(?:system\s+prompt|hidden\s+instructions|api[\s_-]*keys?|secrets?|password)",
            re.IGNORECASE,
        ),
        "prompt injection",
    ),
    (
        ("developer", "jailbr", "instructions"),
        re.compile(r"\bdeveloper\s+mode\b|\bjailbr(?:eak|oken)\b|\bnew\s+instructions\s*:", re.IGNORECASE),
        "prompt injection",
    ),
]
_PLACEHOLDERS: list[re.Pattern[str]] = [
    re.compile(r"\b(?:TODO|TBD|FIXME)\b"),
    re.compile(r"^\s*(?:\.\.\.|\u2026)\s*$", re.MULTILINE),
    re.compile(
        r"<\s*(?:\.\.\.|\u2026|content|contents|text|placeholder|insert[^<>\n]*|your [^<>\n]*|[^<>\n]* here)\s*>",
        re.IGNORECASE,
    ),
    re.compile(
        r"\[\s*(?:\.\.\.|\u2026|insert[^\]\n]*|add [^\]\n]*here|your [^\]\n]*|placeholder[^\]\n]*|content[^\]\n]*)\s*\]",
        re.IGNORECASE,
    ),
    re.compile(r"\{\{?\s*(?:content|text|summary|placeholder)\s*\}?\}", re.IGNORECASE),
    re.compile(r"lorem\s+ipsum", re.IGNORECASE),
]


@dataclass
class StepSpec:
    """A plan step, in the names of the PlanStep model: THE step type inside the product, from the validated
    model answer to the stored row (`from_step`) to diffs, prompts and the editor. Its renderings and who reads
    each (`as_dict`, `step_plan_data`, the API's `StepOut`): docs/architecture.md, "One step"."""

    key: str
    description: str
    tool: str = ""
    input: dict[str, Any] = field(default_factory=dict)
    action_hint: str = ""
    expected_outcome: str = ""
    estimated_cycles: int = 1
    depends_on: list[str] = field(default_factory=list)
    requires_permission: bool = False
    risk: str = "safe"  # "safe" | "risky"
    tools_needed: list[str] = field(default_factory=list)
    loop: dict[str, Any] = field(default_factory=dict)  # {"for_each": key} or {"repeat": n} (seed 002)

    @classmethod
    def from_step(cls, step: PlanStep) -> StepSpec:
        """A stored step's spec (its row state, such as status or result, stays on the row)."""
        return cls(
            key=step.key, description=step.description, tool=step.tool, input=dict(step.tool_input),
            action_hint=step.action_hint, expected_outcome=step.expected_outcome,
            estimated_cycles=step.estimated_cycles, depends_on=list(step.depends_on),
            requires_permission=step.requires_permission, risk=step.risk, tools_needed=list(step.tools_needed),
            loop=dict(step.loop),
        )

    def as_dict(self) -> dict[str, Any]:
        """The step as plain values, every field (the shape `plan_diff` and the prompts read)."""
        return {
            "key": self.key,
            "description": self.description,
            "tool": self.tool,
            "input": dict(self.input),
            "action_hint": self.action_hint,
            "expected_outcome": self.expected_outcome,
            "estimated_cycles": self.estimated_cycles,
            "depends_on": list(self.depends_on),
            "requires_permission": self.requires_permission,
            "risk": self.risk,
            "tools_needed": list(self.tools_needed),
            "loop": dict(self.loop),
        }


@dataclass
class PlanSpec:
    goal: str
    thinking_summary: str
    confidence: float
    risks: list[str]
    steps: list[StepSpec]


@dataclass
class ValidationResult:
    plan: PlanSpec | None  # None when rejected
    problems: list[str]  # non-empty means rejected; each says precisely what is wrong
    flags: list[str]  # accepted, but the operator should know (e.g. a permission the validator raised)
    clarification: str = ""  # seed 003: the planner asks the operator instead of planning
    cannot: str = ""  # the planner says why the goal cannot be done (with these tools), instead of a plan
    steps_over_limit: int = 0  # seed 003: "too many steps" goes to the operator, not back to the model

    @property
    def ok(self) -> bool:
        return not self.problems


def _type_name(value: object) -> str:
    return {dict: "object", list: "list", str: "string", bool: "boolean", type(None): "null"}.get(
        type(value), type(value).__name__
    )


_FILLER_WORDS = frozenset({"a", "an", "the", "to", "of", "for", "with", "and", "my", "some"})


def _suggest(word: str, options: Sequence[str], *, n: int = 3, cutoff: float = 0.5) -> list[str]:
    """Options sharing a real word with `word` ("buy groceries" -> "buy food"), then look-alikes."""
    words = set(_normal(word).split()) - _FILLER_WORDS
    sharing = [o for o in options if words & set(_normal(o).split())] if " " in word.strip() else []
    close = difflib.get_close_matches(word, list(options), n=n, cutoff=cutoff)
    return list(dict.fromkeys([*sharing, *close]))[:n]


def _did_you_mean(word: str, options: Sequence[str], *, cutoff: float = 0.5) -> str:
    close = _suggest(word, options, cutoff=cutoff)
    return f"; did you mean: {', '.join(close)}?" if close else f"; allowed: {', '.join(options)}"


def _normal(text: str) -> str:
    return " ".join(text.lower().split())


def _clip(text: object, limit: int = 80) -> str:
    """Model-chosen text quoted in a reason, cut short: reasons go back into prompts and the timeline."""
    shown = str(text)
    return shown if len(shown) <= limit else shown[: limit - 3] + "..."


class _Checker:
    """Collects problems and flags while reading one plan."""

    def __init__(self) -> None:
        self.problems: list[str] = []
        self.flags: list[str] = []

    def problem(self, text: str) -> None:
        if text not in self.problems:
            self.problems.append(text)

    def pick(self, raw: Mapping[str, Any], aliases: tuple[str, ...], where: str) -> tuple[bool, Any]:
        """Whether one of a field's names is present, and its value."""
        present = [a for a in aliases if a in raw]
        if len(present) > 1:
            self.problem(f"{where}: give only one of {', '.join(repr(a) for a in present)}")
        return (True, raw[present[0]]) if present else (False, None)

    def text(
        self, value: Any, where: str, name: str, *, max_len: int, single_line: bool = False, required: bool = True
    ) -> str:
        if value is None:
            if required:
                self.problem(f"{where}: missing '{name}'")
            return ""
        if not isinstance(value, str):
            self.problem(f"{where}: '{name}' must be a string, got {_type_name(value)}")
            return ""
        value = value.strip()
        if required and not value:
            self.problem(f"{where}: '{name}' is empty")
        if single_line and ("\n" in value or "\r" in value):
            self.problem(f"{where}: '{name}' must be a single line (it contains a raw newline)")
        if len(value) > max_len:
            self.problem(f"{where}: '{name}' is too long ({len(value)} > {max_len} characters)")
        return value

    def key(self, value: Any, where: str) -> str:
        if isinstance(value, bool) or not isinstance(value, str | int):
            self.problem(f"{where}: 'id' must be a string or number, got {_type_name(value)}")
            return ""
        key = str(value).strip()
        if not key:
            self.problem(f"{where}: 'id' is empty")
        elif len(key) > KEY_MAX or any(c.isspace() and c != " " for c in key):
            self.problem(f"{where}: 'id' must be one short line (at most {KEY_MAX} characters)")
        return key

    def depends_on(self, value: Any, where: str) -> list[str]:
        if value is None:
            return []
        if isinstance(value, str | int) and not isinstance(value, bool):
            value = [value]  # "dependsOn": "1" is a common, unambiguous slip
        if not isinstance(value, list) or any(isinstance(v, bool) or not isinstance(v, str | int) for v in value):
            self.problem(f"{where}: 'dependsOn' must be a list of step ids")
            return []
        return [str(v).strip() for v in value]

    def cycles(self, value: Any, where: str) -> int:
        if value is None:
            return 1
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        if isinstance(value, bool) or not isinstance(value, int):
            self.problem(f"{where}: 'estimated_cycles' must be a whole number, got {_type_name(value)}")
            return 1
        if not 1 <= value <= CYCLES_MAX:
            self.problem(f"{where}: 'estimated_cycles' must be between 1 and {CYCLES_MAX}, got {value}")
        return value

    def unknown_keys(self, raw: Mapping[str, Any], fields: Mapping[str, tuple[str, ...]], where: str) -> None:
        known = [name for aliases in fields.values() for name in aliases]
        for key in raw:
            if key not in known:
                close = difflib.get_close_matches(str(key), known, n=1, cutoff=0.7)
                preferred = ", ".join(aliases[0] for aliases in fields.values())
                hint = f" (did you mean '{close[0]}'?)" if close else f" (allowed: {preferred})"
                self.problem(f"{where}: unknown key '{_clip(key)}'{hint}")

    def prohibited(self, value: Any, where: str) -> None:
        """Shell commands and prompt injection anywhere in a step's text are refused outright."""
        for text in _strings(value):
            lowered = text.lower()
            for triggers, pattern, category in _PROHIBITED:
                if not any(t in lowered for t in triggers):
                    continue
                match = pattern.search(text)
                if match:
                    self.problem(f"{where}: prohibited {category}: {_clip(match.group().strip())!r}")


def _strings(value: Any) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, Mapping):
        return [s for v in value.values() for s in _strings(v)]
    if isinstance(value, list | tuple):
        return [s for v in value for s in _strings(v)]
    return []


def _tool_step(
    c: _Checker, raw: Mapping[str, Any], where: str, tools: Mapping[str, ToolSpec], workspace: Path | None
) -> StepSpec:
    fields = TOOL_STEP_FIELDS
    c.unknown_keys(raw, fields, where)
    has_key, key_value = c.pick(raw, fields["key"], where)
    key = c.key(key_value, where) if has_key else ""
    if not has_key:
        c.problem(f"{where}: missing 'id'")
    _, tool_value = c.pick(raw, fields["tool"], where)
    tool = c.text(tool_value, where, "tool", max_len=64, single_line=True)
    _, description_value = c.pick(raw, fields["description"], where)
    description = c.text(description_value, where, "intent", max_len=DESCRIPTION_MAX, single_line=True)
    has_input, tool_input = c.pick(raw, fields["input"], where)
    if not has_input or tool_input is None:
        tool_input = {}
    if not isinstance(tool_input, dict):
        c.problem(f"{where}: 'input' must be an object, got {_type_name(tool_input)}")
        tool_input = {}
    has_permission, permission = c.pick(raw, fields["requires_permission"], where)
    if not has_permission:
        c.problem(f"{where}: missing 'requiresPermission'")
    elif not isinstance(permission, bool):
        c.problem(f"{where}: 'requiresPermission' must be true or false, got {_type_name(permission)}")
    requires_permission = permission is True
    depends_on = c.depends_on(c.pick(raw, fields["depends_on"], where)[1], where)
    expected = c.text(
        c.pick(raw, fields["expected_outcome"], where)[1], where, "expects", max_len=OUTCOME_MAX, required=False
    )
    cycles = c.cycles(c.pick(raw, fields["estimated_cycles"], where)[1], where)
    has_risk, risk_value = c.pick(raw, fields["risk"], where)
    risk = "safe"
    if has_risk:
        if isinstance(risk_value, str) and risk_value.strip().lower() in RISK_WORDS:
            risk = RISK_WORDS[risk_value.strip().lower()]
        else:
            c.problem(f"{where}: 'risk' must be \"safe\" or \"risky\", got {_clip(repr(risk_value))}")
    spec = tools.get(tool) if tool else None
    # Paths are judged by the path rules ("backup/etc/passwd" is a fine name inside the workspace).
    path_keys = spec.path_keys if spec is not None else ()
    c.prohibited([description, expected, {k: v for k, v in tool_input.items() if k not in path_keys}], where)
    tools_needed = _tools_needed(c, c.pick(raw, fields["tools_needed"], where)[1], where, tools)
    if tool and tool not in tools_needed and spec is not None:
        tools_needed.insert(0, tool)
    loop = _loop(c, raw, fields, where, tool, tool_input)
    if tool and spec is None:
        c.problem(f"{where}: unknown tool '{_clip(tool)}'{_did_you_mean(tool, list(tools))}")
    if spec is not None:
        for problem in tool_input_problems(spec, tool_input):
            c.problem(f"{where}: {problem}")
        _check_paths(c, spec, tool_input, where, workspace)
        _check_content(c, spec, tool_input, where)
        if spec.risky:
            raised = []
            if has_permission and permission is False:
                raised.append("it now needs permission")
            if has_risk and risk == "safe":
                raised.append("it is marked risky")
            if raised:
                # Operator-facing: the step named by its key, as the plan page and the inbox show it (not its
                # place in the model's list), and no field names of the model's JSON.
                c.flags.append(f"{f'step {key}' if key else where}: {tool} {RISK_DOES.get(spec.risk_class, 'changes things')}, so "
                               f"{' and '.join(raised)} (the plan said it did not)")
            risk, requires_permission = "risky", True
    return StepSpec(
        key=key, description=description, tool=tool, input=dict(tool_input), action_hint=tool,
        expected_outcome=expected, estimated_cycles=cycles, depends_on=depends_on,
        requires_permission=requires_permission, risk=risk, tools_needed=tools_needed, loop=loop,
    )


def _tools_needed(c: _Checker, value: Any, where: str, tools: Mapping[str, ToolSpec] | None) -> list[str]:
    """Seed 004's tools_needed: a list of tool names (known tools, for a tool agent)."""
    if value is None:
        return []
    if not isinstance(value, list) or not all(isinstance(v, str) and v.strip() for v in value) or len(value) > 10:
        c.problem(f"{where}: 'toolsNeeded' must be a list of at most 10 tool names")
        return []
    names = list(dict.fromkeys(v.strip() for v in value))
    for name in names:
        if tools is not None and name not in tools:
            c.problem(f"{where}: toolsNeeded names unknown tool '{_clip(name)}'{_did_you_mean(name, list(tools))}")
    return names


_LOOP_MARK = re.compile(r"\{(?:item|index(?::0?\d{1,2}d)?)\}")


def _loop(
    c: _Checker, raw: Mapping[str, Any], fields: Mapping[str, tuple[str, ...]], where: str, tool: str,
    tool_input: Mapping[str, Any],
) -> dict[str, Any]:
    """Seed 002's FOR_EACH (over the list an earlier step produced) and REPEAT (zero-based {index})."""
    has_each, each = c.pick(raw, fields["for_each"], where)
    has_repeat, repeat = c.pick(raw, fields["repeat"], where)
    marks = {m.group() for text in _strings(tool_input) for m in _LOOP_MARK.finditer(text)}
    if has_each and has_repeat:
        c.problem(f"{where}: give either 'forEach' or 'repeat', not both")
        return {}
    if (has_each or has_repeat) and tool in LOOP_FORBIDDEN:
        c.problem(f"{where}: {tool} may not run inside a loop; create folders in their own steps before it")
        return {}
    if has_each:
        if isinstance(each, bool) or not isinstance(each, str | int) or not str(each).strip():
            c.problem(f"{where}: 'forEach' must be the id of an earlier step that produces a list")
            return {}
        if "{item}" not in marks:
            c.problem(f"{where}: a forEach step must use {{item}} in its input")
        return {"for_each": str(each).strip()}
    if has_repeat:
        if isinstance(repeat, bool) or not isinstance(repeat, int) or not 1 <= repeat <= MAX_LOOP_RUNS:
            c.problem(f"{where}: 'repeat' must be a whole number from 1 to {MAX_LOOP_RUNS}")
            return {}
        if "{item}" in marks:
            c.problem(f"{where}: {{item}} needs 'forEach'; a repeat step has only {{index}}")
        return {"repeat": repeat}
    if marks:
        c.problem(f"{where}: {', '.join(sorted(marks))} is only filled in inside a loop; add 'forEach' or 'repeat'")
    return {}


def _check_loops(c: _Checker, steps: Sequence[StepSpec]) -> None:
    """A forEach names an earlier step that produces a list, and waits for it (seed 002: the list must exist)."""
    position_of = {s.key: i for i, s in enumerate(steps)}
    for position, step in enumerate(steps):
        source_key = step.loop.get("for_each")
        if source_key is None:
            continue
        where = f"step {position + 1}"
        source_position = position_of.get(source_key)
        if source_position is None or source_position >= position:
            c.problem(f"{where}: forEach '{_clip(source_key)}' must name an earlier step")
            continue
        source = steps[source_position]
        if source.tool not in LIST_TOOLS:
            c.problem(f"{where}: forEach step '{source.key}' ({source.tool or 'no tool'}) produces no list; "
                      f"use a {' or '.join(LIST_TOOLS)} step")
            continue
        step.loop = {"for_each": source_key, "items_from": {"tool": source.tool, "input": dict(source.input)}}
        if source_key not in step.depends_on:
            step.depends_on.append(source_key)  # the list must exist before the loop runs


def _check_paths(c: _Checker, spec: ToolSpec, tool_input: Mapping[str, Any], where: str, workspace: Path | None) -> None:
    real_workspace = workspace is not None and workspace.is_dir()
    for key in spec.path_keys:
        values = tool_input.get(key)
        for value in values if isinstance(values, list) else [values]:
            if not isinstance(value, str):
                continue  # type problems are reported by the schema check
            if not value.strip() and spec.name != "file.list":
                c.problem(f"{where}: {spec.name} input '{key}' is an empty path")
                continue
            problem = path_problem(value, workspace)
            if problem:
                c.problem(f"{where}: {problem}")
            elif real_workspace and workspace is not None:
                try:
                    workspace_resolve(workspace, value)
                except ToolError as exc:
                    c.problem(f"{where}: {exc}")


def _check_content(c: _Checker, spec: ToolSpec, tool_input: Mapping[str, Any], where: str) -> None:
    """Seed 002: written content must be real text, not a placeholder for text the model did not write."""
    content = tool_input.get("content")
    if "content" not in spec.schema or not isinstance(content, str):
        return
    if not content.strip():
        c.problem(f"{where}: {spec.name} content is empty; write the real text")
        return
    for pattern in _PLACEHOLDERS:
        match = pattern.search(content)
        if match:
            c.problem(f"{where}: {spec.name} content looks like a placeholder ({match.group().strip()!r}); write the real text")
            return


def _persona_step(
    c: _Checker, raw: dict[str, Any], where: str, position: int, allowed: Sequence[str]
) -> tuple[bool, StepSpec]:
    """A persona step, and whether the model gave its dependencies at all."""
    fields = PERSONA_STEP_FIELDS
    step_value = raw.get("step")
    if isinstance(step_value, str) and not step_value.strip().isdigit() and "description" not in raw:
        # Seed 002 models sometimes put the step's text under "step".
        raw = {("description" if k == "step" else k): v for k, v in raw.items()}
    c.unknown_keys(raw, fields, where)
    has_key, key_value = c.pick(raw, fields["key"], where)
    key = c.key(key_value, where) if has_key else str(position)
    _, hint_value = c.pick(raw, fields["action_hint"], where)
    _, description_value = c.pick(raw, fields["description"], where)
    hint = c.text(hint_value, where, "action_hint", max_len=ACTION_HINT_MAX, single_line=True, required=False)
    description = c.text(
        description_value, where, "description", max_len=DESCRIPTION_MAX, single_line=True, required=not hint
    )
    if not description and hint:
        description = hint[:1].upper() + hint[1:]
    if allowed:
        canonical = {_normal(a): a for a in allowed}
        if hint and "\n" not in hint and "\r" not in hint:
            if _normal(hint) in canonical:
                hint = canonical[_normal(hint)]
            else:
                c.problem(f"{where}: unknown action '{_clip(hint)}'{_did_you_mean(hint, list(allowed), cutoff=0.65)}")
        elif hint_value is None and description:
            # A text-list step ("3. buy food") names its action in the description.
            named = [a for n, a in canonical.items() if re.search(rf"\b{re.escape(n)}\b", _normal(description))]
            if named:
                hint = max(named, key=len)
                c.flags.append(f"{where}: no action_hint; used '{hint}' from the description")
            else:
                c.problem(f"{where}: missing 'action_hint' (one of: {', '.join(allowed)})")
    elif not hint and hint_value is None:
        c.problem(f"{where}: missing 'action_hint'")
    expected = c.text(
        c.pick(raw, fields["expected_outcome"], where)[1], where, "expected_outcome", max_len=OUTCOME_MAX, required=False
    )
    cycles = c.cycles(c.pick(raw, fields["estimated_cycles"], where)[1], where)
    has_depends, depends_value = c.pick(raw, fields["depends_on"], where)
    depends_on = c.depends_on(depends_value, where)
    c.prohibited([description, hint, expected], where)
    tools_needed = _tools_needed(c, c.pick(raw, fields["tools_needed"], where)[1], where, None)
    return has_depends, StepSpec(
        key=key, description=description, action_hint=hint, expected_outcome=expected,
        estimated_cycles=cycles, depends_on=depends_on, tools_needed=tools_needed,
    )


def _dependency_cycle(steps: Sequence[StepSpec]) -> list[str] | None:
    """The first dependency cycle as a path of keys ending where it started, or None."""
    graph = {s.key: [d for d in s.depends_on if d != s.key] for s in steps}
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    for root in graph:
        if state.get(root):
            continue
        path: list[str] = [root]
        iterators = [iter(graph[root])]
        state[root] = 1
        while iterators:
            dep = next(iterators[-1], None)
            if dep is None:
                state[path.pop()] = 2
                iterators.pop()
            elif dep in graph and state.get(dep) == 1:
                return path[path.index(dep) :] + [dep]
            elif dep in graph and not state.get(dep):
                state[dep] = 1
                path.append(dep)
                iterators.append(iter(graph[dep]))
    return None


def _check_dependencies(c: _Checker, steps: Sequence[StepSpec]) -> None:
    seen: dict[str, int] = {}
    for position, step in enumerate(steps, start=1):
        if not step.key:
            continue
        if step.key in seen:
            c.problem(f"duplicate step id '{step.key}' (steps {seen[step.key]} and {position})")
        else:
            seen[step.key] = position
    for position, step in enumerate(steps, start=1):
        for dep in step.depends_on:
            if dep == step.key:
                c.problem(f"step {position}: depends on itself")
            elif dep not in seen:
                c.problem(f"step {position}: depends on unknown step '{_clip(dep)}'")
    cycle = _dependency_cycle(steps)
    if cycle:
        c.problem(f"dependency cycle: {' -> '.join(cycle)}")


def _top_level(c: _Checker, data: Mapping[str, Any]) -> tuple[str, str, float, list[str]]:
    for key in data:
        if key not in TOP_LEVEL_KEYS:
            close = difflib.get_close_matches(str(key), TOP_LEVEL_KEYS, n=1, cutoff=0.7)
            hint = f" (did you mean '{close[0]}'?)" if close else f" (allowed: {', '.join(TOP_LEVEL_KEYS)})"
            c.problem(f"unknown top-level key '{_clip(key)}'{hint}")
    goal = c.text(data.get("goal"), "plan", "goal", max_len=DESCRIPTION_MAX, required=False)
    summary = c.text(data.get("thinking_summary"), "plan", "thinking_summary", max_len=SUMMARY_MAX, required=False)
    c.text(data.get("reflection"), "plan", "reflection", max_len=SUMMARY_MAX, required=False)
    ready = data.get("ready")
    if ready is not None and not isinstance(ready, bool):
        c.problem(f"plan: 'ready' must be true or false, got {_type_name(ready)}")
    elif ready is False:
        c.problem("the planner marked this plan as not ready (ready: false)")
    risks_value = data.get("risks")
    risks: list[str] = []
    if isinstance(risks_value, str):
        risks = [risks_value.strip()] if risks_value.strip() else []
    elif isinstance(risks_value, list) and all(isinstance(r, str) for r in risks_value):
        risks = [r.strip() for r in risks_value if r.strip()]
    elif risks_value is not None:
        c.problem("plan: 'risks' must be a list of strings")
    confidence = 0.5
    value = data.get("confidence")
    if value is not None:
        if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
            c.problem(f"plan: 'confidence' must be a number between 0 and 1, got {str(value)[:40]!r}")
        elif 0 <= value <= 1:
            confidence = float(value)
        elif 1 < value <= 100:
            confidence = value / 100
            c.flags.append(f"confidence {value} read as a percentage ({confidence:.2f})")
        else:
            c.problem(f"plan: 'confidence' must be between 0 and 1, got {value}")
    return goal, summary, confidence, risks


def plan_validate(
    data: dict[str, Any],
    *,
    kind: str,
    workspace: Path | None = None,
    max_steps: int = 20,
    allowed_actions: Sequence[str] = (),
    tools: Mapping[str, ToolSpec] | None = None,
    goal_text: str = "",
    steered: bool = False,
) -> ValidationResult:
    """Check parsed plan data for a tool agent (seed 003 shape) or a persona (seed 000 shape).

    Risky tools get requiresPermission forced on (flagged, not rejected); a persona step that does not
    give depends_on waits for the step before it, because seed 000 plans are sequences.
    With `goal_text`, the plan must also mean it (planning/engine/meaning.py): no write to a file the goal
    names as input, every named file used, its `goal` the one given, no placeholder nor example value.
    """
    if kind not in KINDS:
        raise ValueError(f"unknown plan kind {kind!r}")  # a programming error, not a model error
    c = _Checker()
    if not isinstance(data, Mapping):
        return ValidationResult(None, [f"plan must be a JSON object, got {_type_name(data)}"], [])
    goal, summary, confidence, risks = _top_level(c, data)
    question = data.get("clarification") or data.get("ask")
    raw_list = data.get("steps", data.get("plan"))
    if isinstance(question, str) and question.strip() and not raw_list:
        # Seed 003: an ambiguous intent is a question for the operator, not a guess.
        return ValidationResult(None, [f"the planner asks: {_clip(question.strip(), 500)}"], c.flags,
                                clarification=question.strip()[:2000])
    cannot = data.get("cannot")
    if kind == "tool" and isinstance(cannot, str) and cannot.strip() and not raw_list:
        # A goal the tools cannot (or must not) do is said so, with why: never a plan that only looks like one.
        why = " ".join(cannot.split())
        return ValidationResult(None, [f"the planner says it cannot be done: {_clip(why, 500)}"], c.flags,
                                cannot=why[:2000])
    if "steps" in data and "plan" in data:
        c.problem("give the steps under 'steps' only (both 'steps' and 'plan' are present)")
    raw_steps = data["steps"] if "steps" in data else data.get("plan")
    if raw_steps is None:
        c.problem("plan has no 'steps' list")
        return ValidationResult(None, c.problems, c.flags)
    if not isinstance(raw_steps, list):
        c.problem(f"'steps' must be a list, got {_type_name(raw_steps)}")
        return ValidationResult(None, c.problems, c.flags)
    if not raw_steps:
        c.problem("plan has no steps")
        return ValidationResult(None, c.problems, c.flags)
    if len(raw_steps) > max_steps:
        c.problem(f"too many steps: {len(raw_steps)} > {max_steps}")
        return ValidationResult(None, c.problems, c.flags, steps_over_limit=len(raw_steps))

    registry = TOOLS if tools is None else tools
    steps: list[StepSpec] = []
    for position, raw in enumerate(raw_steps, start=1):
        where = f"step {position}"
        if not isinstance(raw, dict):
            c.problem(f"{where}: expected an object, got {_type_name(raw)}")
            continue
        if kind == "tool":
            steps.append(_tool_step(c, raw, where, registry, workspace))
        else:
            has_depends, step = _persona_step(c, raw, where, position, allowed_actions)
            steps.append(step)
            if not has_depends and len(steps) > 1:
                # Seed 000 plans are ordered sequences: a step waits for the one before it.
                step.depends_on = [steps[-2].key] if steps[-2].key else []
    if len(steps) == len(raw_steps):
        _check_loops(c, steps)
        _check_dependencies(c, steps)
    if kind == "tool" and len(steps) == len(raw_steps):
        for problem in steps_duplicated(steps, registry):
            c.problem(problem)
    if goal_text and len(steps) == len(raw_steps):
        for problem in _meaning(goal_text, goal, summary, steps, kind, steered):
            c.problem(problem)
    if kind == "persona" and steps:
        low, high = PREFERRED_PERSONA_STEPS
        if not low <= len(steps) <= high:
            c.flags.append(f"plan has {len(steps)} step{'s' if len(steps) != 1 else ''}; {low}-{high} are preferred")
    if c.problems:
        return ValidationResult(None, c.problems, c.flags)
    plan = PlanSpec(goal=goal, thinking_summary=summary, confidence=confidence, risks=risks, steps=steps)
    return ValidationResult(plan, [], c.flags)


def _meaning(goal_text: str, goal: str, summary: str, steps: Sequence[StepSpec], kind: str,
             steered: bool) -> list[str]:
    from planning.engine.meaning import StepView, meaning_problems, value_problems

    problems = value_problems(goal=goal_text, where="plan", values={"goal": goal, "thinking_summary": summary})
    for position, step in enumerate(steps, start=1):
        where = f"step {position}"
        values: dict[str, object] = {"intent" if kind == "tool" else "description": step.description,
                                     "expects" if kind == "tool" else "expected_outcome": step.expected_outcome}
        if kind == "tool":
            values["input"] = step.input
        else:
            junk = junk_problem(step.description)
            if junk:
                problems.append(f"{where}: the description is {junk}, not a step")
        problems += value_problems(goal=goal_text, where=where, values=values)
    views = [StepView(position, step.tool, step.input) for position, step in enumerate(steps, start=1)]
    return problems + meaning_problems(goal=goal_text, plan_goal=goal, steps=views, tool_plan=kind == "tool",
                                       steered=steered)


def step_plan_data(step: StepSpec, kind: str) -> dict[str, Any]:
    """A step in the shape a model writes, to validate it again (a kept step, an operator's edit), its
    estimated cycles included: models write none for tool steps, but a stored step keeps the one it has."""
    if kind == "tool":
        data: dict[str, Any] = {
            "id": step.key, "tool": step.tool, "intent": step.description, "input": dict(step.input),
            "requiresPermission": step.requires_permission, "dependsOn": list(step.depends_on),
            "expects": step.expected_outcome,
        }
        if "for_each" in step.loop:
            data["forEach"] = step.loop["for_each"]
        elif "repeat" in step.loop:
            data["repeat"] = step.loop["repeat"]
        data["estimated_cycles"] = step.estimated_cycles
    else:
        data = {"id": step.key, "description": step.description, "action_hint": step.action_hint,
                "expected_outcome": step.expected_outcome, "estimated_cycles": step.estimated_cycles,
                "depends_on": list(step.depends_on)}
    if step.tools_needed:
        data["tools_needed" if kind != "tool" else "toolsNeeded"] = list(step.tools_needed)
    return data


_EDIT_FIELDS = {"tool_input": "input"}  # PlanStep field -> StepSpec field, where they differ


def plan_validate_edit(
    *,
    kind: str,
    steps: Sequence[StepSpec],
    key: str,
    changes: Mapping[str, Any],
    workspace: Path | None = None,
    max_steps: int = 20,
    allowed_actions: Sequence[str] = (),
    tools: Mapping[str, ToolSpec] | None = None,
) -> tuple[list[str], list[str]]:
    """Validate the whole plan as it would be after an operator's edit of step `key`: (problems, flags)."""
    rows = []
    for step in steps:
        if step.key == key:
            step = replace(step, **{_EDIT_FIELDS.get(name, name): value for name, value in changes.items()})
        rows.append(step_plan_data(step, kind))
    result = plan_validate({"steps": rows}, kind=kind, workspace=workspace, max_steps=max_steps,
                           allowed_actions=allowed_actions, tools=tools)
    return result.problems, result.flags


PATH_KEYS = ("path", "to", "output", "paths", "folder", "dir", "directory", "source", "destination")


def _step_identity(step: StepSpec) -> str:
    """What a step does, written one way: its tool, its input (paths normalised, keys sorted) and its loop."""
    def normal(key: str, value: Any) -> Any:
        if isinstance(value, str):
            text = value.strip()
            return posixpath.normpath(text) if key in PATH_KEYS and text else text
        if isinstance(value, list):
            return [normal(key, item) for item in value]
        if isinstance(value, dict):
            return {k: normal(k, v) for k, v in value.items()}
        return value

    loop = {k: v for k, v in step.loop.items() if k != "items_from"}
    return json.dumps([step.tool, normal("", step.input), loop], sort_keys=True, default=str)


def steps_duplicated(steps: Sequence[StepSpec], tools: Mapping[str, ToolSpec] | None = None) -> list[str]:
    """A tool plan's step that repeats an earlier one (the same tool and the same input) without a reason to: a
    problem naming both, so the model's retry can leave the copy out. A reason to repeat is a check (a tool that
    changes nothing) after a step that changed something in between; a change repeated is never one (its second
    run fails or doubles the change: "'backup/data.csv' already exists"), a loop says how often it runs."""
    registry = TOOLS if tools is None else tools

    def changes(step: StepSpec) -> bool:
        spec = registry.get(step.tool)
        return spec.risk_class in ("write", "system") if spec is not None else step.risk == "risky"

    problems: list[str] = []
    seen: dict[str, int] = {}  # identity -> the position of its latest occurrence
    for position, step in enumerate(steps, start=1):
        if not step.tool:
            continue
        identity = _step_identity(step)
        earlier = seen.get(identity)
        seen[identity] = position
        if earlier is None:
            continue
        if not changes(step) and any(changes(s) for s in steps[earlier:position - 1]):
            continue  # a check again after a change: the reason to repeat it
        what = f"{step.tool} with the same input as step {earlier}"
        if changes(step):
            problems.append(f"step {position} repeats step {earlier} ({what}): a change is made once; leave the "
                            "copy out, or give the step 'repeat' if it must run more than once")
        else:
            problems.append(f"step {position} repeats step {earlier} ({what}) with nothing changed in between: "
                            "leave the copy out")
    return problems


# The input naming what a tool step creates or changes (a redirected step moves it elsewhere).
TOOL_TARGET_KEY = {
    "file.convert": "output", "file.move": "to", "file.copy": "to", "file.write": "path", "file.append": "path",
    "report.write": "output", "dir.create": "path", "file.count": "output",
}


def steps_repeating_declined(steps: Sequence[StepSpec], declined: Sequence[Mapping[str, Any]],
                             existing: Sequence[str] = ()) -> list[str]:
    """Seed 002: a declined step never comes back unchanged. A proposed tool step with the tool and
    input of a step the operator declined (in any earlier version) is a problem whatever its description says; a
    persona step, with the description and action of a declined one. A tool step that is the declined step moved
    onto a file that already exists (`existing`, the workspace's files) is one too, unless the operator named that
    file. Each reason quotes the operator's feedback, so the planner's retry, reflection and fallback work on it.
    `declined`: the declined steps as plain values (StepSpec.as_dict()) with their "feedback"."""
    problems = []
    for step in steps:
        for old in declined:
            feedback = " ".join(str(old.get("feedback", "")).split())
            if step.tool or old.get("tool"):
                same = step.tool == old.get("tool") and step.input == (old.get("input") or {})
                onto = "" if same else _moved_onto_existing(step, old, existing, feedback)
            else:
                same = (_normal(step.description) == _normal(str(old.get("description", "")))
                        and _normal(step.action_hint) == _normal(str(old.get("action_hint", ""))))
                onto = ""
            if same:
                problems.append(
                    f"step {_clip(step.key, 32)} repeats the step the operator declined, unchanged "
                    f"(\"{_clip(step.description)}\"); the operator said: \"{_clip(feedback, 300)}\". "
                    "Change it, replace it or leave it out."
                )
                break
            if onto:
                problems.append(
                    f"step {_clip(step.key, 32)} moves the step the operator declined onto {_clip(onto, 80)}, a file "
                    f"that already exists; the operator said: \"{_clip(feedback, 300)}\". Write a new file or "
                    "leave the step out."
                )
                break
    return problems


def _moved_onto_existing(step: StepSpec, old: Mapping[str, Any], existing: Sequence[str], feedback: str) -> str:
    """The existing file a declined tool step was moved onto (its target changed, the rest of its input kept)."""
    key = TOOL_TARGET_KEY.get(step.tool)
    old_input = old.get("input") or {}
    if key is None or step.tool != old.get("tool") or not isinstance(old_input, dict):
        return ""
    target = step.input.get(key)
    if not isinstance(target, str) or target == old_input.get(key) or target not in existing:
        return ""
    if {k: v for k, v in step.input.items() if k != key} != {k: v for k, v in old_input.items() if k != key}:
        return ""
    return "" if re.search(rf"(?<![\w/.-]){re.escape(target)}(?![\w/-])", feedback) else target
