"""Tools an external agent declares over the API, as the registry the plan validator checks against.

Plain values in, plain values out. A declaration is `{"name", "description", "input_schema", "risk"}`;
`input_schema` is a JSON Schema (Draft 2020-12) whose top level is an object. Steps' inputs are checked
against it by the `jsonschema` library, so a declaration means what JSON Schema says it means
(`{"type": "object"}` accepts any keys; `"additionalProperties": false` refuses unknown ones), and the
problems read like the built-in tools' ("search input 'limit' must be integer, got str").
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from jsonschema import Draft202012Validator
from jsonschema.exceptions import SchemaError

from agents.tools import TOOLS, ToolSpec

MAX_TOOLS = 50
NAME_PATTERN = re.compile(r"^[A-Za-z][A-Za-z0-9_.\-]{0,63}$")
DESCRIPTION_MAX = 500
MAX_PROPERTIES = 30
RISK_CLASSES = ("read", "write", "network", "system")  # ToolSpec.risk_class; only "read" is safe
# "safe"/"risky" as a plan's steps say it, or one of the built-in risk classes; safe means a read.
RISK_NAMES = {"safe": "read", "risky": "write", **{name: name for name in RISK_CLASSES}}
JSON_TYPES = ("string", "integer", "number", "boolean", "array", "object", "null")


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
    """A declared input schema must be a valid Draft 2020-12 schema of an object, small enough to show."""
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
    # Said before the library's own check, whose wording ("'date' is not valid under any of the given
    # schemas") would not tell an agent's author which property is wrong.
    for key, prop in properties.items():
        kind = prop.get("type", "string") if isinstance(prop, Mapping) else None
        if isinstance(kind, str) and kind not in JSON_TYPES:
            problems.append(f"input property '{key}' has unsupported type {kind[:40]!r} "
                            f"(allowed: {', '.join(JSON_TYPES)})")
    required = schema.get("required", [])
    # JSON Schema allows requiring an undescribed key; in a tool declaration it is always a slip.
    if not isinstance(required, list) or not all(isinstance(r, str) and r in properties for r in required):
        problems.append("'input_schema.required' must list names of its properties")
    if not problems:
        try:
            Draft202012Validator.check_schema(schema)
        except SchemaError as error:
            at = "/".join(str(p) for p in error.path)
            problems.append(f"'input_schema' is not a valid JSON Schema{f' at {at}' if at else ''}: "
                            f"{error.message[:200]}")
    return problems


def tool_spec(tool: Mapping[str, Any]) -> ToolSpec:
    """One valid declaration as the ToolSpec the validator checks steps against."""
    schema = dict(tool.get("input_schema") or {"type": "object"})
    properties: Mapping[str, Mapping[str, Any]] = schema.get("properties", {})
    required = set(schema.get("required", []))
    return ToolSpec(
        name=tool["name"],
        description=tool.get("description", ""),
        risk_class=RISK_NAMES[tool.get("risk", "safe")],
        schema={key: (object, key in required) for key in properties},
        choices={key: tuple(map(str, prop["enum"])) for key, prop in properties.items() if prop.get("enum")},
        input_schema=schema,
    )


def tool_registry(tools: list[Mapping[str, Any]]) -> dict[str, ToolSpec]:
    """The agent's declared tools by name (declarations were checked when stored)."""
    return {tool["name"]: tool_spec(tool) for tool in tools}


def agent_plan_terms(kind: str, declared: list[Mapping[str, Any]],
                     tools: Sequence[str] = ()) -> tuple[str, dict[str, ToolSpec] | None]:
    """The validator's plan kind and tool registry for an agent: an external agent plans tool calls with the
    tools it declared; a tool agent given some of the built-in tools (`Agent.tools`) with those; the others with
    their own kind and the whole built-in registry (None)."""
    if kind == "external":
        return "tool", tool_registry(declared)
    if kind == "tool" and tools:
        return kind, {name: TOOLS[name] for name in sorted(tools) if name in TOOLS}
    return kind, None
