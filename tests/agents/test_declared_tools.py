"""Declared tools' input schemas mean what JSON Schema (Draft 2020-12) says, with the built-in tools' wording."""

from __future__ import annotations

from typing import Any

import pytest

from agents.declared_tools import tool_spec, tools_declaration_problems
from agents.tools import tool_input_problems


def spec(schema: dict[str, Any]) -> Any:
    return tool_spec({"name": "echo", "input_schema": schema})


def test_declared_object_without_properties_accepts_any_key() -> None:
    assert tool_input_problems(spec({"type": "object"}), {"text": "hi"}) == []


def test_declared_additional_properties_false_refuses_unknown_keys() -> None:
    problems = tool_input_problems(spec({"type": "object", "properties": {"text": {"type": "string"}},
                                         "additionalProperties": False}), {"text": "hi", "loud": True})
    assert problems == ["echo input has unknown key 'loud' (allowed: text)"]


def test_declared_missing_required_and_wrong_type_are_named() -> None:
    schema = {"type": "object", "properties": {"q": {"type": "string"}, "n": {"type": "integer"}}, "required": ["q"]}
    assert tool_input_problems(spec(schema), {"n": "3"}) == [
        "echo input missing required key 'q'", "echo input 'n' must be integer, got string"]


def test_declared_enum_and_nested_rules_are_checked() -> None:
    schema = {"type": "object", "properties": {
        "mode": {"type": "string", "enum": ["a", "b"]},
        "tags": {"type": "array", "items": {"type": "string"}, "maxItems": 2}}}
    problems = tool_input_problems(spec(schema), {"mode": "c", "tags": ["x", "y", 3]})
    assert "echo input 'mode' must be one of: a, b (got 'c')" in problems
    assert any(p.startswith("echo input 'tags'") and "too long" in p for p in problems)
    assert "echo input 'tags/2' must be string, got integer" in problems


def test_declared_true_is_not_an_integer() -> None:
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}}
    assert tool_input_problems(spec(schema), {"n": True}) == ["echo input 'n' must be integer, got boolean"]


@pytest.mark.parametrize(("schema", "problem"), [
    ({"type": "object", "properties": {"x": {"type": "date"}}}, "unsupported type 'date'"),
    ({"type": "object", "properties": {"x": {"type": "string", "minLength": -1}}}, "not a valid JSON Schema"),
    ({"type": "object", "properties": {}, "required": ["x"]}, "'input_schema.required'"),
])
def test_declaration_with_an_invalid_schema_is_refused(schema: dict[str, Any], problem: str) -> None:
    problems = tools_declaration_problems([{"name": "echo", "input_schema": schema}])
    assert any(problem in p for p in problems), problems


def test_declared_schema_text_names_json_types_for_the_prompt() -> None:
    schema = {"type": "object", "properties": {"q": {"type": "string"}, "n": {"type": "integer"}}, "required": ["q"]}
    assert spec(schema).schema_text() == "{q: string, n?: integer}"
