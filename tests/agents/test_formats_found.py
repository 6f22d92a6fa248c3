"""Formats found, not configured (issue 52): a server refusing the structured-output format, in any of the ways real
servers do (llama-cpp-python's HTTP 500 with a validation error), is sent the next format at once; the finding is
shared through the cache, logged once and shown on the usage page; model settings match the name the server reports."""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.test import Client

from agents.llm.gateway import llm_complete
from agents.llm.schemas import restate_schema
from agents.llm.structured import format_for, formats_forget, formats_found, model_profile
from tests.llm_server import LLMTestServer, answer, error

ROOT = Path(__file__).resolve().parents[2]
MESSAGES = [{"role": "user", "content": "Plan it."}]
PLAN_JSON = '{"goal": "g", "thinking_summary": "t", "steps": []}'


@pytest.fixture(autouse=True)
def fresh_formats() -> Iterator[None]:
    formats_forget()
    yield
    formats_forget()


@pytest.fixture
def llama_cpp(settings: Any) -> Iterator[LLMTestServer]:
    """A server answering as llama-cpp-python 0.3.36 does: a 500 for json_schema, one model listed by its file."""
    with LLMTestServer(models=["/models/SmolLM2-135M-Instruct.Q4_1.gguf"], refuse_json_schema=True) as server:
        settings.OPENAI_BASE_URL = server.base_url
        settings.OPENAI_API_KEY = ""
        settings.LLM_TIMEOUT_SECONDS = 2
        settings.LLM_MAX_RETRIES = 2  # the default: a refusal must not be retried as a server error
        settings.LLM_MODEL_SETTINGS = {}
        yield server


def sent_formats(server: LLMTestServer, model: str) -> list[str | None]:
    return [(r.body.get("response_format") or {}).get("type") for r in server.requests_for(model)]


@pytest.mark.django_db
def test_a_500_refusing_json_schema_moves_to_json_object_at_once_and_is_remembered(
        llama_cpp: LLMTestServer, caplog: pytest.LogCaptureFixture) -> None:
    llama_cpp.script("SmolLM2-135M-Instruct", answer(PLAN_JSON), answer(PLAN_JSON))
    with caplog.at_level(logging.WARNING, logger="planner.llm"):
        first = llm_complete(purpose="plan", messages=MESSAGES, models=["SmolLM2-135M-Instruct"],
                             schema=restate_schema())
        second = llm_complete(purpose="plan", messages=MESSAGES, models=["SmolLM2-135M-Instruct"],
                              schema=restate_schema())
    assert first.text == PLAN_JSON and first.response_format == "json_object"
    assert second.response_format == "json_object"
    # One refused request (not three: the SDK's retries of a 500 are not spent on it), then json_object for good.
    assert sent_formats(llama_cpp, "SmolLM2-135M-Instruct") == ["json_schema", "json_object", "json_object"]
    refusals = [r.getMessage() for r in caplog.records if "refused the json_schema format" in r.getMessage()]
    assert len(refusals) == 1 and "Input should be 'text' or 'json_object'" in refusals[0]
    [found] = formats_found()
    assert found["model"] == "SmolLM2-135M-Instruct" and found["format"] == "json_object"
    assert found["refused"] == ["json_schema"] and "HTTP 500" in found["reason"]


@pytest.mark.django_db
def test_another_process_learns_the_format_from_the_cache(llama_cpp: LLMTestServer,
                                                           caplog: pytest.LogCaptureFixture) -> None:
    llama_cpp.script("smol", answer(PLAN_JSON), answer(PLAN_JSON))
    llm_complete(purpose="plan", messages=MESSAGES, models=["smol"], schema=restate_schema())
    formats_forget(process_only=True)  # what a fresh process knows: the cache alone
    assert format_for("SMOL") == "json_object"  # the model's name in any case
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="planner.llm"):
        llm_complete(purpose="plan", messages=MESSAGES, models=["smol"], schema=restate_schema())
    assert sent_formats(llama_cpp, "smol")[-1] == "json_object"
    assert not [r for r in caplog.records if "refused" in r.getMessage()]


@pytest.mark.django_db
def test_a_500_about_something_else_is_retried_as_a_server_error_not_taken_for_a_refusal(
        llm_server: LLMTestServer) -> None:
    llm_server.script("busy", error(500, message="CUDA out of memory"), answer(PLAN_JSON))
    result = llm_complete(purpose="plan", messages=MESSAGES, models=["busy"], schema=restate_schema())
    assert result.response_format == "json_schema"
    assert sent_formats(llm_server, "busy") == ["json_schema", "json_schema"]
    assert formats_found() == []


@pytest.mark.django_db
def test_the_usage_page_says_which_format_was_found(llama_cpp: LLMTestServer, viewer_client: Client) -> None:
    llama_cpp.script("smol", answer(PLAN_JSON))
    llm_complete(purpose="plan", messages=MESSAGES, models=["smol"], schema=restate_schema())
    page = viewer_client.get("/usage/").content.decode()
    section = page[page.index('id="usage-formats"'):]
    section = section[:section.index("</section>")]
    assert "smol" in section and "json_object" in section and "json_schema" in section
    assert "Input should be" in section


# -- settings matched by the name the server reports ---------------------------------------------------------------


@pytest.mark.django_db
@pytest.mark.parametrize("key", ["SmolLM2-135M-Instruct", "smollm2-135m-instruct", "SMOLLM2-135M-INSTRUCT"])
def test_model_settings_match_any_case(llm_server: LLMTestServer, settings: Any, key: str) -> None:
    settings.LLM_MODEL_SETTINGS = {key: {"context": 2048, "small": True}}
    assert model_profile("SmolLM2-135M-Instruct") == model_profile("smollm2-135m-instruct")
    assert model_profile("SmolLM2-135M-Instruct").small


@pytest.mark.django_db
@pytest.mark.parametrize("listed", [["/models/SmolLM2-135M-Instruct.Q4_1.gguf"], ["smollm2-135m"]])
def test_model_settings_match_the_names_v1_models_lists(settings: Any, listed: list[str]) -> None:
    """A one-model server answers whatever name it is asked: its listed id is the model's other name."""
    with LLMTestServer(models=listed) as server:
        settings.OPENAI_BASE_URL = server.base_url
        settings.LLM_MODEL_SETTINGS = {listed[0].rsplit("/", 1)[-1]: {"context": 2048, "small": True}}
        assert model_profile("my-local-model").small
        assert model_profile("my-local-model").context == 2048
        model_profile("my-local-model")
        assert server.listed == 1  # asked once, then kept


@pytest.mark.django_db
def test_a_many_model_server_lends_no_alias_to_an_unlisted_name(settings: Any) -> None:
    with LLMTestServer(models=["qwen2.5:7b", "llama3.2:3b"]) as server:
        settings.OPENAI_BASE_URL = server.base_url
        settings.LLM_MODEL_SETTINGS = {"qwen2.5:7b": {"small": True}}
        assert not model_profile("mistral").small
        assert model_profile("Qwen2.5:7B").small


def example_settings(path: Path) -> dict[str, Any]:
    """The LLM_MODEL_SETTINGS example of a Markdown file, as a shell would pass it."""
    text = path.read_text()
    match = re.search(r"LLM_MODEL_SETTINGS='(\{.*?\})'", text, re.DOTALL)
    assert match, f"no LLM_MODEL_SETTINGS='...' example in {path.name}"
    return dict(json.loads(match.group(1)))


@pytest.mark.django_db
@pytest.mark.parametrize("doc", [
    "docs/models.md", "docs/llm.md", "README.md",
])
@pytest.mark.parametrize("listed", [["/models/SmolLM2-135M-Instruct.Q4_1.gguf"], ["SmolLM2-135M-Instruct"]])
def test_the_documented_example_applies_to_smollm2_as_the_docs_serve_it(
        settings: Any, doc: str, listed: list[str]) -> None:
    """LLM_MODEL=SmolLM2-135M-Instruct against llama-cpp-python's server, started with or without an alias."""
    with LLMTestServer(models=listed, refuse_json_schema=True) as server:
        settings.OPENAI_BASE_URL = server.base_url
        settings.LLM_MODEL_SETTINGS = example_settings(ROOT / doc)
        server.script("SmolLM2-135M-Instruct", answer(PLAN_JSON))
        profile = model_profile("SmolLM2-135M-Instruct")
        assert profile.small and profile.context == 2048
        result = llm_complete(purpose="plan", messages=MESSAGES, models=["SmolLM2-135M-Instruct"],
                              schema=restate_schema())
        assert result.text == PLAN_JSON
        assert server.requests_for("SmolLM2-135M-Instruct")[-1].body["max_tokens"] <= 300  # a small model's


# -- manage.py llm_check -------------------------------------------------------------------------------------------------


@pytest.mark.django_db
def test_llm_check_says_what_the_server_takes_and_what_to_set(llama_cpp: LLMTestServer, settings: Any) -> None:
    from io import StringIO

    from django.core.management import call_command

    settings.LLM_MODELS = {"planner": ["SmolLM2-135M-Instruct"], "fast": ["offline-rules"]}
    settings.LLM_PURPOSE_MODELS = {}
    ok = '{"ok": true}'
    # json_schema is refused by the mode itself; json_object and ollama's field answer JSON, "off" prose.
    llama_cpp.script("SmolLM2-135M-Instruct", answer(ok), answer("sure, here it is"), answer("ok!"))
    out = StringIO()
    call_command("llm_check", stdout=out)
    text = out.getvalue()
    assert "lists 1 model(s): /models/SmolLM2-135M-Instruct.Q4_1.gguf" in text
    assert "small True (135M in its name)" in text  # known small with nothing set
    lines = {line.split()[0]: line for line in text.splitlines() if line.startswith("  ") and len(line.split()) > 2}
    assert lines["json_schema"].split()[1] == "refused" and "Input should be" in lines["json_schema"]
    assert lines["json_object"].split()[1] == "json"
    assert lines["ollama"].split()[1] == "answered"  # taken, not honoured
    assert "use format json_object" in text
    assert """LLM_MODEL_SETTINGS='{"SmolLM2-135M-Instruct": {"format": "json_object"}}'""" in text
    assert "offline-rules: served by offline in this process" in text
    assert format_for("SmolLM2-135M-Instruct") == "json_object"  # the planner's processes learn it too


@pytest.mark.django_db
def test_llm_check_fails_clearly_when_the_server_is_not_there(settings: Any) -> None:
    from django.core.management import call_command
    from django.core.management.base import CommandError

    settings.OPENAI_BASE_URL = "http://127.0.0.1:9/v1"  # the discard port: nothing listens
    settings.LLM_TIMEOUT_SECONDS = 1
    with pytest.raises(CommandError, match="No answer from gone-model. Nothing was changed."):
        call_command("llm_check", "--model", "gone-model", stdout=__import__("io").StringIO())


# -- a small model known by its name -------------------------------------------------------------------------------------


@pytest.mark.django_db
@pytest.mark.parametrize(("model", "small"), [
    ("SmolLM2-135M-Instruct", True), ("Qwen2.5-1.5B-Instruct", True), ("llama3.2:3b", True),
    ("qwen2.5:7b", False), ("mixtral:8x7b", False), ("Qwen3-30B-A3B", False), ("gpt-4o-mini", False),
])
def test_a_model_whose_name_gives_its_size_is_small_without_settings(settings: Any, model: str, small: bool) -> None:
    settings.LLM_MODEL_SETTINGS = {}
    settings.OPENAI_BASE_URL = "http://127.0.0.1:9/v1"  # nothing listens: the name alone decides
    assert model_profile(model).small is small


@pytest.mark.django_db
def test_a_one_model_servers_file_name_tells_the_size_of_any_name_it_is_asked_by(llama_cpp: LLMTestServer) -> None:
    """LLM_MODEL=local against llama-cpp-python serving SmolLM2's file: small, with nothing set."""
    profile = model_profile("local")
    assert profile.small and profile.small_from == "135M in its name"


@pytest.mark.django_db
def test_small_in_the_settings_wins_over_the_name(settings: Any) -> None:
    settings.LLM_MODEL_SETTINGS = {"SmolLM2-135M-Instruct": {"small": False}, "my-7b-finetune": {"small": True}}
    assert not model_profile("SmolLM2-135M-Instruct").small
    assert model_profile("my-7b-finetune").small


@pytest.mark.django_db
def test_with_only_the_three_settings_a_smollm2_plan_asks_one_short_call(llama_cpp: LLMTestServer, settings: Any,
) -> None:
    """OPENAI_BASE_URL, OPENAI_API_KEY and LLM_MODEL alone, against llama-cpp-python as it answers: the first plan
    call finds the format (one refused request, never shown) and is a small model's: the compact prompt, a short
    answer, no restatement or reflection calls."""
    from agents.models import Agent, LLMCall
    from planning.models import Plan
    from planning.planner import plan_generate
    from tests.factories import AgentFactory

    settings.LLM_MODELS = {"planner": ["SmolLM2-135M-Instruct"], "fast": ["SmolLM2-135M-Instruct"]}
    settings.LLM_PURPOSE_MODELS = {}
    agent = AgentFactory(kind=Agent.Kind.TOOL, rules_planner=False)
    (agent.workspace / "notes.txt").parent.mkdir(parents=True, exist_ok=True)
    (agent.workspace / "notes.txt").write_text("Buy milk.\nCall Ann.\n")
    goal = "Write a report of notes.txt to report.md"
    step = {"id": "1", "tool": "report.write", "intent": "Write the report",
            "input": {"paths": ["notes.txt"], "output": "report.md"}, "requiresPermission": True}
    llama_cpp.script("SmolLM2-135M-Instruct", answer(json.dumps({"goal": goal, "steps": [step]})))
    plan = plan_generate(agent=agent, goal_text=goal)
    assert plan.status == Plan.Status.AWAITING_APPROVAL, plan.failure_reason
    calls = list(LLMCall.objects.filter(plan=plan))
    assert [(c.purpose, c.error, c.response_format) for c in calls] == [("plan", "", "json_object")]
    sent = llama_cpp.requests_for("SmolLM2-135M-Instruct")
    assert [r.body["response_format"]["type"] for r in sent] == ["json_schema", "json_object"]
    assert sent[-1].body["max_tokens"] <= 300
