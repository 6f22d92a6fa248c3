"""plan_parse: finding the plan in whatever a model wrote, repairing it, and failing only with PlanParseError."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agents.llm.extract import json_extract
from planning.engine.parse import MAX_OUTPUT_CHARS, PlanParseError, plan_parse

STEP = {"id": "1", "tool": "file.list", "intent": "List the workspace", "input": {}, "requiresPermission": False}


def test_plan_parse_json_tag_wins_over_other_json() -> None:
    text = 'Example: {"steps": [{"id": "x"}]}\n<json>{"steps": [{"id": "1"}]}</json>'
    parsed = plan_parse(text)
    assert parsed.method == "json_tag"
    assert parsed.data["steps"] == [{"id": "1"}]


def test_plan_parse_valid_json_is_not_touched() -> None:
    data = {"goal": "Read Jen's notes, then {think}", "steps": [dict(STEP, intent="say \"hi\", then ] and }")]}
    parsed = plan_parse("<json>" + json.dumps(data) + "</json>")
    assert parsed.data == data
    assert parsed.repaired == []


def test_plan_parse_bare_array_becomes_steps() -> None:
    assert plan_parse(json.dumps([STEP])).data == {"steps": [STEP]}


def test_plan_parse_seed002_plan_key_is_steps() -> None:
    parsed = plan_parse('<json>{"goal": "g", "plan": [{"step": 1, "action": "eat", "expects": "full"}]}</json>')
    assert parsed.data == {"goal": "g", "steps": [{"step": 1, "action": "eat", "expects": "full"}]}


def test_plan_parse_truncated_output_is_closed_and_reported() -> None:
    parsed = plan_parse('<json>{"steps": [{"id": "1", "intent": "Read the fi')
    assert parsed.data == {"steps": [{"id": "1", "intent": "Read the fi"}]}
    assert "closed an unterminated string" in parsed.repaired
    assert "closed 3 unbalanced brackets" in parsed.repaired


def test_plan_parse_truncation_drops_a_key_without_value() -> None:
    parsed = plan_parse('{"steps": [{"id": "1", "tool": "file.list", "input": {}, "requiresPermission": false, "expects":')
    assert parsed.data["steps"] == [{"id": "1", "tool": "file.list", "input": {}, "requiresPermission": False}]


def test_plan_parse_python_dict_is_converted() -> None:
    parsed = plan_parse("{'steps': [{'id': 1, 'done': True, 'note': None, 'text': 'don't stop'}]}")
    assert parsed.data["steps"] == [{"id": 1, "done": True, "note": None, "text": "don't stop"}]
    assert "converted single quotes" in parsed.repaired
    assert "converted Python literals" in parsed.repaired


def test_plan_parse_invalid_escapes_keep_their_backslash() -> None:
    parsed = plan_parse('<json>{"steps": [{"path": "C:\\agent\\data.csv"}]}</json>')
    assert parsed.data["steps"][0]["path"] == "C:\\agent\\data.csv"
    assert "fixed invalid escapes" in parsed.repaired


def test_plan_parse_text_list() -> None:
    parsed = plan_parse("Plan:\n1. Read the file\n2) **Convert** it\n- Check the result\nThat's all.")
    assert parsed.method == "text_list"
    assert [s["description"] for s in parsed.data["steps"]] == ["Read the file", "Convert it", "Check the result"]


def test_plan_parse_single_step_collapses_whitespace() -> None:
    parsed = plan_parse("  Just eat\n something.  ")
    assert parsed.method == "single_step"
    assert parsed.data == {"steps": [{"description": "Just eat something."}]}


def test_plan_parse_single_step_can_be_refused() -> None:
    with pytest.raises(PlanParseError, match="no JSON plan or step list"):
        plan_parse("Just eat something.", allow_single_step=False)


def test_plan_parse_broken_json_is_an_error_not_a_step() -> None:
    with pytest.raises(PlanParseError) as info:
        plan_parse('<json>{"steps": [{"id": "1", "tool": }]}</json>')
    assert info.value.reason.startswith("invalid JSON")


def test_plan_parse_size_cap() -> None:
    with pytest.raises(PlanParseError, match=f"output too large: {MAX_OUTPUT_CHARS + 1} characters"):
        plan_parse("x" * (MAX_OUTPUT_CHARS + 1))


@pytest.mark.parametrize("text", ["", "   ", "\n\t"])
def test_plan_parse_empty(text: str) -> None:
    with pytest.raises(PlanParseError, match="empty output"):
        plan_parse(text)


def test_plan_parse_keeps_an_object_without_steps_for_the_validator() -> None:
    parsed = plan_parse('<json>{"hints": ["Use file.read"]}</json>', allow_single_step=False)
    assert parsed.data == {"hints": ["Use file.read"]}


def test_json_extract_finds_restatement_in_prose() -> None:
    found = json_extract('Sure. {"who": "Acta", "what": "convert",} done')
    assert found.value == {"who": "Acta", "what": "convert"}
    assert found.repaired == ["removed trailing comma"]


# -- properties ----------------------------------------------------------------------------------

FRAGMENTS = [
    "{", "}", "[", "]", ",", ":", '"', "'", "\\", "<json>", "</json>", "```json\n", "```", "//", "/*", "*/", "#",
    "True", "None", "null", "1", "-2.5e3", "steps", "plan", '"steps"', '"id"', "\n", " ", "1. ", "- ", "abc", "\x00",
]
json_ish = st.lists(st.sampled_from(FRAGMENTS), max_size=60).map("".join)
json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=20,
)


def _parse_or_reason(text: str) -> Any:
    try:
        return plan_parse(text)
    except PlanParseError as exc:
        assert exc.reason
        return exc


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.text(max_size=400))
def test_plan_parse_never_raises_anything_else_on_text(text: str) -> None:
    _parse_or_reason(text)


@settings(max_examples=300, deadline=None)
@given(json_ish)
def test_plan_parse_never_raises_anything_else_on_json_ish_text(text: str) -> None:
    result = _parse_or_reason(text)
    if not isinstance(result, PlanParseError):
        assert isinstance(result.data, dict)


@settings(max_examples=100, deadline=None)
@given(st.lists(st.dictionaries(st.text(max_size=8), json_values, max_size=5), max_size=5), st.data())
def test_plan_parse_round_trips_and_survives_truncation(steps: list[dict[str, Any]], data: st.DataObject) -> None:
    text = json.dumps({"steps": steps})
    parsed = plan_parse(f"<json>{text}</json>")
    assert parsed.data == {"steps": steps}
    assert parsed.repaired == []
    cut = data.draw(st.integers(min_value=1, max_value=len(text)))
    _parse_or_reason("<json>" + text[:cut])


def test_without_tags_the_last_block_that_parses_wins() -> None:
    text = 'For example {"steps": [{"id": "example"}]} and here is mine: {"steps": [{"id": "1"}]}'
    parsed = plan_parse(text)
    assert parsed.data["steps"] == [{"id": "1"}]
    assert parsed.flags == ["the answer was not inside <json>...</json> tags (the planner prompt asks for them)"]


def test_a_tagged_block_wins_even_before_later_json() -> None:
    parsed = plan_parse('<json>{"steps": [{"id": "1"}]}</json> PS: {"steps": [{"id": "ps"}]}')
    assert parsed.data["steps"] == [{"id": "1"}] and parsed.flags == []


def test_json_extract_prefers_the_last_answer_to_an_example() -> None:
    assert json_extract('e.g. {"who": "example"} -> {"who": "Acta"}').value == {"who": "Acta"}


def test_a_closing_tag_inside_a_json_string_does_not_cut_the_block() -> None:
    steps = [{"</JSON>": None, "id": "1"}]
    parsed = plan_parse(f"<json>{json.dumps({'steps': steps})}</json>")
    assert parsed.data == {"steps": steps} and parsed.repaired == []
    two = plan_parse('<json>{"steps": [{"id": "a"}]}</json> then <json>{"steps": [{"id": "b"}]}</json>')
    assert two.data == {"steps": [{"id": "b"}]}  # separate blocks stay separate: the last one wins
    from agents.llm.extract import json_extract

    assert json_extract('<json>{"why": "ends with </json> here"}</json>').value == {"why": "ends with </json> here"}


def test_broken_indented_json_in_an_unlabelled_fence_is_an_error_not_a_one_step_plan() -> None:
    """A model's fence without a language, its JSON indented: the broken JSON in it is said as such, so the retry
    fixes the JSON, instead of the whole answer becoming one step."""
    answer = "Here you go:\n```\n    {\"steps\": oops nothing here}\n```\n"
    with pytest.raises(PlanParseError, match="invalid JSON"):
        plan_parse(answer)
