"""Tools an external agent declares over the API, as the registry the plan validator checks against.

Plain values in, plain values out. A declaration is `{"name", "description", "input_schema", "risk"}`
with a small JSON-schema subset for the input (an object whose properties have a type, maybe an enum,
and a `required` list): enough to reject a plan that calls an unknown tool or passes the wrong input,
with the same messages the built-in tools get.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from agents.tools import ToolSpec

MAX_TOOLS = 50
NAME_PATTERN = re.compile(r"^[A-Za-z][A-Za-z0-9_.\-]{0,63}$")
DESCRIPTION_MAX = 500
MAX_PROPERTIES = 30
RISK_CLASSES = ("read", "write", "network", "system")  # ToolSpec.risk_class; only "read" is safe
# "safe"/"risky" as a plan's steps say it, or one of the built-in risk classes; safe means a read.
RISK_NAMES = {"safe": "read", "risky": "write", **{name: name for name in RISK_CLASSES}}


class _JsonTypeMeta(type):
    """isinstance() by JSON meaning: `true` is not an integer, an integer is a number."""

    accepts: tuple[type, ...] = ()

    def __instancecheck__(cls, value: object) -> bool:
        if isinstance(value, bool):
            return bool in cls.accepts
        return isinstance(value, cls.accepts)


# Named as JSON schema names them, so a problem reads "input 'n' must be integer, got str".
class string(metaclass=_JsonTypeMeta):  # noqa: N801
    accepts = (str,)


class integer(metaclass=_JsonTypeMeta):  # noqa: N801
    accepts = (int,)


class number(metaclass=_JsonTypeMeta):  # noqa: N801
    accepts = (int, float)


class boolean(metaclass=_JsonTypeMeta):  # noqa: N801
    accepts = (bool,)


class array(metaclass=_JsonTypeMeta):  # noqa: N801
    accepts = (list,)


class object_(metaclass=_JsonTypeMeta):  # noqa: N801
    accepts = (dict,)


object_.__name__ = "object"
JSON_TYPES: Mapping[str, type] = {
    "string": string, "integer": integer, "number": number, "boolean": boolean, "array": array, "object": object_,
}


def tools_declaration_problems(tools: object) -> list[str]:
    """Why a declaration cannot be stored; empty when it can."""
    if not isinstance(tools, list):
        return ["tools must be a list"]
    if len(tools) > MAX_TOOLS:
        return [f"too many tools: {len(tools)} > {MAX_TOOLS}"]
    problems: list[str] = []
    seen: set[str] = set()
    for position, tool in enumerate(tools, start=1):
        where = f"tool {position}"
        if not isinstance(tool, Mapping):
            problems.append(f"{where}: expected an object")
            continue
        unknown = set(tool) - {"name", "description", "input_schema", "risk"}
        if unknown:
            problems.append(f"{where}: unknown key(s) {', '.join(sorted(map(str, unknown)))} "
                            "(allowed: name, description, input_schema, risk)")
        name = tool.get("name")
        if not isinstance(name, str) or not NAME_PATTERN.match(name):
            problems.append(f"{where}: 'name' must be 1-64 letters, digits, '_', '.' or '-', starting with a letter")
        elif name in seen:
            problems.append(f"{where}: duplicate tool name '{name}'")
        else:
            seen.add(name)
            where = f"tool '{name}'"
        description = tool.get("description", "")
        if not isinstance(description, str) or len(description) > DESCRIPTION_MAX:
            problems.append(f"{where}: 'description' must be a string of at most {DESCRIPTION_MAX} characters")
        risk = tool.get("risk", "safe")
        if risk not in RISK_NAMES:
            problems.append(f"{where}: 'risk' must be one of {', '.join(RISK_NAMES)}, got {str(risk)[:40]!r}")
        problems.extend(f"{where}: {p}" for p in _schema_problems(tool.get("input_schema", {"type": "object"})))
    return problems


def _schema_problems(schema: object) -> list[str]:
    if not isinstance(schema, Mapping):
        return ["'input_schema' must be a JSON schema object"]
    if schema.get("type", "object") != "object":
        return ["'input_schema' must have \"type\": \"object\""]
    properties = schema.get("properties", {})
    if not isinstance(properties, Mapping):
        return ["'input_schema.properties' must be an object"]
    if len(properties) > MAX_PROPERTIES:
        return [f"'input_schema' has too many properties: {len(properties)} > {MAX_PROPERTIES}"]
    problems: list[str] = []
    for key, prop in properties.items():
        if not isinstance(prop, Mapping):
            problems.append(f"input property '{key}' must be an object")
            continue
        kind = prop.get("type", "string")
        if kind not in JSON_TYPES:
            problems.append(f"input property '{key}' has unsupported type {str(kind)[:40]!r} "
                            f"(allowed: {', '.join(JSON_TYPES)})")
        enum = prop.get("enum")
        if enum is not None and (not isinstance(enum, list) or not enum or not all(isinstance(v, str) for v in enum)):
            problems.append(f"input property '{key}': 'enum' must be a non-empty list of strings")
    required = schema.get("required", [])
    if not isinstance(required, list) or not all(isinstance(r, str) and r in properties for r in required):
        problems.append("'input_schema.required' must list names of its properties")
    return problems


def tool_spec(tool: Mapping[str, Any]) -> ToolSpec:
    """One valid declaration as the ToolSpec the validator checks steps against."""
    schema = tool.get("input_schema") or {}
    properties: Mapping[str, Mapping[str, Any]] = schema.get("properties", {})
    required = set(schema.get("required", []))
    return ToolSpec(
        name=tool["name"],
        description=tool.get("description", ""),
        risk_class=RISK_NAMES[tool.get("risk", "safe")],
        schema={key: (JSON_TYPES[prop.get("type", "string")], key in required) for key, prop in properties.items()},
        choices={key: tuple(prop["enum"]) for key, prop in properties.items() if prop.get("enum")},
    )


def tool_registry(tools: list[Mapping[str, Any]]) -> dict[str, ToolSpec]:
    """The agent's declared tools by name (declarations were checked when stored)."""
    return {tool["name"]: tool_spec(tool) for tool in tools}


def agent_plan_terms(kind: str, declared: list[Mapping[str, Any]]) -> tuple[str, dict[str, ToolSpec] | None]:
    """The validator's plan kind and tool registry for an agent: an external agent plans tool calls with the
    tools it declared; the others with their own kind and the built-in registry (None)."""
    if kind == "external":
        return "tool", tool_registry(declared)
    return kind, None
