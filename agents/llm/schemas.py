"""The JSON Schema of each purpose's answer, sent as the server's structured output (agents/llm/structured.py).

A plan's schema is built from the agent's tools: each step is one choice per tool, naming the tool as a
constant with that tool's exact input keys, so a constrained server cannot invent tools or inputs. The
decision's schema holds the action list; the rest are the fixed shapes the prompts show. The validators
still judge every answer: a schema constrains the shape, never the meaning.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

RESTATE_KEYS = ("who", "what", "when", "where", "why")
HORIZONS = ("short_term", "mid_term", "long_term")
STRING: dict[str, Any] = {"type": "string"}
STRINGS: dict[str, Any] = {"type": "array", "items": {"type": "string"}}
_TYPES = {str: "string", int: "integer", float: "number", bool: "boolean", list: "array", dict: "object"}


def _object(properties: Mapping[str, Any], required: Sequence[str] | None = None) -> dict[str, Any]:
    return {"type": "object", "properties": dict(properties),
            "required": list(properties if required is None else required), "additionalProperties": False}


class ToolSpec(Protocol):
    """What a plan's schema needs to know of a tool; the caller passes its tools (agents.tools.ToolSpec)."""

    @property
    def name(self) -> str: ...
    @property
    def risky(self) -> bool: ...
    @property
    def schema(self) -> Mapping[str, tuple[type, bool]]: ...  # input key -> (type, required)
    @property
    def path_keys(self) -> tuple[str, ...]: ...
    @property
    def choices(self) -> Mapping[str, tuple[str, ...]]: ...  # input key -> allowed values
    @property
    def input_schema(self) -> Mapping[str, Any] | None: ...  # a declared tool's own JSON Schema


# The input keys a tool writes to (the rest of its path keys are read).
TARGET_KEYS = {"file.write": "path", "file.append": "path", "dir.create": "path", "report.write": "output",
               "file.count": "output", "file.convert": "output", "file.copy": "to", "file.move": "to"}


@dataclass(frozen=True)
class PathChoices:
    """For a small model: the paths a step may read (the workspace's files and those the goal names) and
    write (the files the goal names; None leaves them free). Names outside the workspace cannot be chosen."""

    reads: tuple[str, ...] = ()
    writes: tuple[str, ...] | None = None
    sources: tuple[str, ...] = ()  # what a writing tool works from (the goal's inputs); () means `reads`


def _path_schema(spec: ToolSpec, key: str, kind: type, paths: PathChoices | None) -> dict[str, Any] | None:
    if paths is None or key not in spec.path_keys or spec.name == "file.list":
        return None
    if TARGET_KEYS.get(spec.name) == key:
        choices = paths.writes
    else:  # a writing tool converts, counts or copies the goal's inputs, not its outputs
        choices = (paths.sources or paths.reads) if spec.risky else paths.reads
    if not choices:
        return None
    one = {"type": "string", "enum": list(choices)}
    return {"type": "array", "items": one, "minItems": 1} if kind is list else one


def tool_input_schema(spec: ToolSpec, paths: PathChoices | None = None) -> dict[str, Any]:
    """A tool's input as JSON Schema: a declared tool's own schema, else one built from its key table."""
    if spec.input_schema is not None:
        return dict(spec.input_schema)
    properties: dict[str, Any] = {}
    for key, (kind, _required) in spec.schema.items():
        chosen = _path_schema(spec, key, kind, paths)
        if chosen is not None:
            properties[key] = chosen
        elif key in spec.choices:
            properties[key] = {"type": "string", "enum": list(spec.choices[key])}
        elif kind is list:
            properties[key] = STRINGS
        else:
            properties[key] = {"type": _TYPES.get(kind, "string")}
    # A small model's schema asks only for the required keys: an optional one is a chance to go astray.
    required = [k for k, (_kind, req) in spec.schema.items() if req]
    if paths is not None:  # an optional output only where the goal names where to write
        properties = {k: v for k, v in properties.items()
                      if k in required or (TARGET_KEYS.get(spec.name) == k and paths.writes)}
    return _object(properties, required if paths is None else list(properties))


def tool_step_schema(spec: ToolSpec, *, paths: PathChoices | None = None, ids: Sequence[str] = ()) -> dict[str, Any]:
    """One step that calls `spec`, with the keys the prompt asks for, in that order. With `ids` (a small
    model's schema), step ids and dependencies are chosen from them and the texts are kept short."""
    if ids:  # a small model: every token is slow, so only what the validator needs, texts kept short
        # ids[-1] is this step's own id; the ones before it are the steps it may wait for.
        earlier = list(ids[:-1])
        return _object({
            "id": {"type": "string", "const": ids[-1]},
            "tool": {"type": "string", "const": spec.name},
            "intent": {"type": "string", "minLength": 3, "maxLength": 60},
            "input": tool_input_schema(spec, paths),
            "requiresPermission": {"type": "boolean", "const": True} if spec.risky else {"type": "boolean"},
            "dependsOn": ({"type": "array", "items": {"type": "string", "enum": earlier}, "maxItems": 1} if earlier
                          else {"type": "array", "items": STRING, "maxItems": 0}),
        })
    return _object({
        "id": STRING,
        "tool": {"type": "string", "const": spec.name},
        "intent": STRING,
        "input": tool_input_schema(spec, paths),
        # A risky tool always needs an operator's yes (the validator raises it anyway).
        "requiresPermission": {"type": "boolean", "const": True} if spec.risky else {"type": "boolean"},
        "dependsOn": STRINGS,
        "expects": STRING,
    })


def persona_step_schema(actions: Sequence[str]) -> dict[str, Any]:
    return _object({
        "description": STRING,
        "action_hint": {"type": "string", "enum": list(actions)} if actions else STRING,
        "expected_outcome": STRING,
        "estimated_cycles": {"type": "integer", "minimum": 1, "maximum": 20},
    })


SMALL_MAX_STEPS = 3


def plan_schema(*, kind: str, goal: str, tools: Sequence[ToolSpec] = (), actions: Sequence[str] = (),
                max_steps: int = 6, paths: PathChoices | None = None) -> dict[str, Any]:
    """A plan answer: the goal given (as a constant: the model cannot answer another goal), a short
    summary and the steps, one choice per tool for a tool agent, an allowed action for a persona.

    With `paths` (a small model): at most SMALL_MAX_STEPS steps, ids "1".."3", paths chosen from the
    workspace and the goal, no summary to ramble in."""
    small = paths is not None
    properties: dict[str, Any] = {"goal": {"type": "string", "const": goal} if goal else STRING}
    if kind == "tool" and small and tools:
        # One to three steps, each in its place: step n has id "n" and may wait only for an earlier step.
        def at(n: int) -> dict[str, Any]:
            ids = [str(i) for i in range(1, n + 1)]
            return {"anyOf": [tool_step_schema(spec, paths=paths, ids=ids) for spec in tools]}

        properties["steps"] = {"anyOf": [
            {"type": "array", "prefixItems": [at(n) for n in range(1, length + 1)], "items": False,
             "minItems": length, "maxItems": length}
            for length in range(1, max(1, min(max_steps, SMALL_MAX_STEPS)) + 1)]}
        return _object(properties)
    if kind == "tool":
        steps: dict[str, Any] = ({"anyOf": [tool_step_schema(spec) for spec in tools]}
                                 if tools else {"type": "object"})
        low, high = 1, max(1, min(max_steps, 8))
    else:
        steps = persona_step_schema(actions)
        low, high = 2, max(2, min(max_steps, 6))
    properties["thinking_summary"] = STRING
    properties["steps"] = {"type": "array", "items": steps, "minItems": low, "maxItems": high}
    return _object(properties)


def plan_or_say_schema(plan: Mapping[str, Any]) -> dict[str, Any]:
    """A tool plan's answer: the plan, or a question for the operator ({"ask": ...}), or why it cannot be done
    ({"cannot": ...}). The root stays an object (OpenAI's rule); llama.cpp's grammar takes the anyOf."""
    return {"type": "object", "anyOf": [dict(plan), _object({"ask": STRING}), _object({"cannot": STRING})]}


def restate_schema() -> dict[str, Any]:
    return _object(dict.fromkeys(RESTATE_KEYS, STRING))


def reflect_schema() -> dict[str, Any]:
    return _object({"hints": {"type": "array", "items": STRING, "minItems": 1, "maxItems": 5}})


def decide_schema(actions: Sequence[str]) -> dict[str, Any]:
    return _object({"action": {"type": "string", "enum": list(actions)}, "reason": STRING})


def milestone_schema() -> dict[str, Any]:
    return _object({"achieved": {"type": "boolean"}, "explanation": STRING})


def goals_schema(needs: Sequence[str], actions: Sequence[str] = ()) -> dict[str, Any]:
    goal = _object({
        "description": STRING,
        "horizon": {"type": "string", "enum": list(HORIZONS)},
        "source_needs": {"type": "array", "items": {"type": "string", "enum": list(needs)} if needs else STRING},
        "recommended_actions": {"type": "array", "items": {"type": "string", "enum": list(actions)}
                                if actions else STRING},
        "reasoning": STRING,
    })
    return _object({"goals": {"type": "array", "items": goal, "minItems": 1, "maxItems": 3}})
