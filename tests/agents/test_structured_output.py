"""Real model servers' controls (issue 19): the answer's JSON Schema per purpose, sent in the format each model
takes, a fallback when a server refuses it, the limits of each purpose, and finish_reason on the call log.
Against tests/llm_server.py, which records each request's body."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from agents.llm.gateway import llm_complete
from agents.llm.schemas import (
    decide_schema,
    goals_schema,
    milestone_schema,
    plan_schema,
    reflect_schema,
    restate_schema,
)
from agents.llm.structured import formats_forget
from agents.models import LLMCall
from agents.tools import TOOLS
from agents.world import ACTIONS
from tests.llm_server import LLMTestServer, answer, format_refused

MESSAGES = [{"role": "user", "content": "Plan it."}]
PLAN_JSON = '{"goal": "g", "thinking_summary": "t", "steps": []}'


@pytest.fixture(autouse=True)
def fresh_formats() -> Iterator[None]:
    formats_forget()
    yield
    formats_forget()


# -- the schemas ----------------------------------------------------------------------------------------------


def test_plan_schema_offers_one_choice_per_tool_with_its_exact_input_keys() -> None:
    schema = plan_schema(kind="tool", goal="Convert data.csv to JSON", tools=list(TOOLS.values()))
    assert schema["properties"]["goal"] == {"type": "string", "const": "Convert data.csv to JSON"}
    choices = schema["properties"]["steps"]["items"]["anyOf"]
    by_tool = {c["properties"]["tool"]["const"]: c for c in choices}
    assert list(by_tool) == list(TOOLS)
    convert = by_tool["file.convert"]["properties"]["input"]
    assert set(convert["properties"]) == {"path", "to", "output"}
    assert convert["required"] == ["path", "to"] and convert["additionalProperties"] is False
    assert convert["properties"]["to"] == {"type": "string", "enum": ["json", "csv", "md"]}
    assert by_tool["report.write"]["properties"]["input"]["properties"]["paths"]["type"] == "array"
    # A risky tool's step cannot say it needs no permission; a read may.
    assert by_tool["file.write"]["properties"]["requiresPermission"] == {"type": "boolean", "const": True}
    assert by_tool["file.read"]["properties"]["requiresPermission"] == {"type": "boolean"}


def test_persona_plan_and_decision_schemas_hold_the_action_list() -> None:
    persona = plan_schema(kind="persona", goal="Eat", actions=list(ACTIONS))
    step = persona["properties"]["steps"]["items"]
    assert step["properties"]["action_hint"]["enum"] == list(ACTIONS)
    assert persona["properties"]["steps"]["minItems"] == 2
    assert decide_schema(list(ACTIONS))["properties"]["action"]["enum"] == list(ACTIONS)


def test_each_purpose_has_the_shape_its_prompt_asks_for() -> None:
    assert restate_schema()["required"] == ["who", "what", "when", "where", "why"]
    assert milestone_schema()["properties"]["achieved"] == {"type": "boolean"}
    assert reflect_schema()["properties"]["hints"]["maxItems"] == 5
    goal = goals_schema(["hunger", "energy"])["properties"]["goals"]["items"]
    assert goal["properties"]["source_needs"]["items"]["enum"] == ["hunger", "energy"]


# -- the formats and the fallback --------------------------------------------------------------------------------


@pytest.mark.django_db
def test_the_schema_goes_out_as_json_schema_with_the_purposes_limits(llm_server: LLMTestServer) -> None:
    llm_server.script("schema-model", answer(PLAN_JSON))
    schema = restate_schema()
    result = llm_complete(purpose="plan", messages=MESSAGES, models=["schema-model"], schema=schema)
    body = llm_server.requests_for("schema-model")[0].body
    assert body["response_format"] == {"type": "json_schema",
                                       "json_schema": {"name": "plan", "schema": schema, "strict": False}}
    assert body["max_tokens"] == 900 and body["temperature"] == 0.1 and body["stop"] == ["</json>"]
    assert result.response_format == "json_schema"
    assert LLMCall.objects.get(pk=result.call_id).response_format == "json_schema"


@pytest.mark.django_db
@pytest.mark.parametrize(("fmt", "field", "expected"), [
    ("json_object", "response_format", lambda s: {"type": "json_object", "schema": s}),
    ("ollama", "format", lambda s: s),
])
def test_the_format_is_a_setting_per_model(llm_server: LLMTestServer, settings: Any, fmt: str, field: str,
                                           expected: Any) -> None:
    settings.LLM_MODEL_SETTINGS = {"local-model": {"format": fmt}}
    llm_server.script("local-model", answer(PLAN_JSON))
    llm_complete(purpose="milestone", messages=MESSAGES, models=["local-model"], schema=milestone_schema())
    body = llm_server.requests_for("local-model")[0].body
    assert body[field] == expected(milestone_schema())


@pytest.mark.django_db
def test_format_off_sends_no_schema_but_keeps_the_limits(llm_server: LLMTestServer, settings: Any) -> None:
    settings.LLM_MODEL_SETTINGS = {"plain-model": {"format": "off"}}
    llm_server.script("plain-model", answer(PLAN_JSON))
    llm_complete(purpose="decide", messages=MESSAGES, models=["plain-model"], schema=decide_schema(["eat"]))
    body = llm_server.requests_for("plain-model")[0].body
    assert "response_format" not in body and "format" not in body
    assert body["max_tokens"] == 100


@pytest.mark.django_db
def test_a_server_refusing_the_format_is_asked_again_without_it_and_the_model_remembers(
        llm_server: LLMTestServer) -> None:
    llm_server.script("old-server", format_refused(), format_refused(status=422), answer(PLAN_JSON), answer(PLAN_JSON))
    first = llm_complete(purpose="plan", messages=MESSAGES, models=["old-server"], schema=restate_schema())
    assert first.text == PLAN_JSON and first.response_format == ""  # prompt-and-repair from here on
    sent = [r.body.get("response_format", {}).get("type") for r in llm_server.requests_for("old-server")]
    assert sent == ["json_schema", "json_object", None]
    # The next call does not try the refused formats again; another model still gets its own.
    llm_complete(purpose="plan", messages=MESSAGES, models=["old-server"], schema=restate_schema())
    assert "response_format" not in llm_server.requests_for("old-server")[-1].body
    assert LLMCall.objects.filter(model="old-server").count() == 2  # one logged call each, not one per try


@pytest.mark.django_db
def test_a_400_about_something_else_is_an_error_not_a_refused_format(llm_server: LLMTestServer) -> None:
    from tests.llm_server import error

    llm_server.script("strict-server", error(400, message="messages: too long"), answer(PLAN_JSON))
    with pytest.raises(Exception, match="too long"):
        llm_complete(purpose="plan", messages=MESSAGES, models=["strict-server"], schema=restate_schema())
    assert len(llm_server.requests_for("strict-server")) == 1


# -- limits, context and finish_reason ---------------------------------------------------------------------------


@pytest.mark.django_db
def test_max_tokens_shrinks_to_what_the_models_context_leaves(llm_server: LLMTestServer, settings: Any) -> None:
    settings.LLM_MODEL_SETTINGS = {"tiny-context": {"context": 1024}}
    long_prompt = [{"role": "user", "content": "x " * 1000}]  # ~2,000 characters, ~630 tokens by the estimate
    llm_server.script("tiny-context", answer(PLAN_JSON))
    llm_complete(purpose="plan", messages=long_prompt, models=["tiny-context"])
    max_tokens = llm_server.requests_for("tiny-context")[0].body["max_tokens"]
    assert 64 <= max_tokens < 1024 - 600


@pytest.mark.django_db
def test_finish_reason_is_kept_and_a_cut_off_answer_is_marked_truncated(llm_server: LLMTestServer) -> None:
    llm_server.script("wordy", answer('{"goal": "g", "steps": [{"id": "1", "tool"', finish_reason="length"))
    result = llm_complete(purpose="plan", messages=MESSAGES, models=["wordy"])
    assert result.truncated
    call = LLMCall.objects.get(pk=result.call_id)
    assert call.finish_reason == "length" and call.truncated


@pytest.mark.django_db
def test_small_models_get_shorter_plan_answers(llm_server: LLMTestServer, settings: Any) -> None:
    settings.LLM_MODEL_SETTINGS = {"tiny": {"small": True}}
    llm_server.script("tiny", answer(PLAN_JSON))
    llm_complete(purpose="plan", messages=MESSAGES, models=["tiny"])
    assert llm_server.requests_for("tiny")[0].body["max_tokens"] == 300


def test_the_request_body_is_valid_json_schema_for_every_tool() -> None:
    jsonschema = pytest.importorskip("jsonschema")  # a dependency of declared tools
    schema = plan_schema(kind="tool", goal="Copy a.txt to b.txt", tools=list(TOOLS.values()))
    jsonschema.Draft202012Validator.check_schema(schema)
    plan = {"goal": "Copy a.txt to b.txt", "thinking_summary": "one copy", "steps": [
        {"id": "1", "tool": "file.copy", "intent": "Copy it", "input": {"path": "a.txt", "to": "b.txt"},
         "requiresPermission": True, "dependsOn": [], "expects": "b.txt exists"}]}
    jsonschema.validate(plan, schema)
    wrong = json.loads(json.dumps(plan))
    wrong["steps"][0]["input"]["destination"] = "b.txt"
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(wrong, schema)


@pytest.mark.django_db
def test_a_server_wanting_max_completion_tokens_gets_the_limit_under_that_name(llm_server: LLMTestServer) -> None:
    from tests.llm_server import error

    llm_server.script("reasoner", error(400, message="Unsupported parameter: 'max_tokens' is not supported with this "
                                                     "model. Use 'max_completion_tokens' instead."), answer(PLAN_JSON))
    llm_complete(purpose="restate", messages=MESSAGES, models=["reasoner"])
    first, second = (r.body for r in llm_server.requests_for("reasoner"))
    assert first["max_tokens"] == 160
    assert "max_tokens" not in second and second["max_completion_tokens"] == 160
