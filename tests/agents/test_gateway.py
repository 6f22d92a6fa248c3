"""The LLM gateway and the OpenAI-compatible provider, with the real `openai` client over HTTP.

The `llm_server` fixture (tests/llm_fixtures.py) scripts a local server per model name and sets a
0.5 s timeout with one retry, so a timeout costs about a second and a retry shows as two requests.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from decimal import Decimal
from typing import Any

import openai
import pytest
from asgiref.sync import sync_to_async
from pytest_django.fixtures import Settings

from agents.llm import openai_provider
from agents.llm.gateway import (
    Deadline,
    LLMDeadlineError,
    LLMError,
    ProviderAnswer,
    calls_recorded_together,
    llm_complete,
    model_chain,
)
from agents.llm.openai_provider import openai_aclose_clients, openai_acomplete, openai_client, openai_complete
from agents.llm.structured import CallOptions
from agents.models import LLMCall
from agents.offline_model import OFFLINE_MODEL
from tests.llm_server import LLMTestServer, Reply, answer, empty_choices, error, hang, malformed, raw

MESSAGES = [
    {"role": "system", "content": "You are a planner. Answer in <json> tags."},
    {"role": "user", "content": "Plan: buy milk.\nCONTEXT: {\"goal\": \"buy milk\"}"},
]


def calls_by_model() -> dict[str, list[LLMCall]]:
    calls: dict[str, list[LLMCall]] = {}
    for call in LLMCall.objects.order_by("pk"):
        calls.setdefault(call.model, []).append(call)
    return calls


class ClientSpy:
    """Records every client `openai_client` hands out, and the loop it was handed out on."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.handed_out: list[tuple[asyncio.AbstractEventLoop, openai.AsyncOpenAI]] = []
        real = openai_provider.openai_client

        async def spy() -> openai.AsyncOpenAI:
            client = await real()
            self.handed_out.append((asyncio.get_running_loop(), client))
            return client

        monkeypatch.setattr(openai_provider, "openai_client", spy)

    @property
    def clients(self) -> list[openai.AsyncOpenAI]:
        return [client for _, client in self.handed_out]


# -- answers ---------------------------------------------------------------------------------------


TRANSPORTS = pytest.mark.parametrize("transport", ["aiohttp", "httpx"])  # settings.LLM_HTTP_TRANSPORT


@pytest.mark.django_db
@TRANSPORTS
def test_llm_complete_records_prompt_response_tokens_and_latency(
    llm_server: LLMTestServer, settings: Settings, transport: str
) -> None:
    settings.LLM_HTTP_TRANSPORT = transport
    llm_server.script("m1", answer("<json>{}</json>", tokens_in=42, tokens_out=7, delay=0.2))

    result = llm_complete(purpose="plan", messages=MESSAGES, models=["m1"], agent_id=None)

    assert (result.text, result.model) == ("<json>{}</json>", "m1")
    assert (result.tokens_in, result.tokens_out) == (42, 7)
    assert result.latency_ms >= 200
    call = LLMCall.objects.get()
    assert call.pk == result.call_id
    assert (call.purpose, call.provider, call.model) == ("plan", "openai", "m1")
    assert call.prompt == MESSAGES
    assert call.response == "<json>{}</json>"
    assert (call.tokens_in, call.tokens_out, call.latency_ms) == (42, 7, result.latency_ms)
    assert call.error == ""
    assert call.cost is None  # no LLM_PRICES configured
    [request] = llm_server.requests
    assert request.model == "m1"
    assert request.messages == MESSAGES
    assert request.headers["authorization"] == "Bearer test-key"


@pytest.mark.django_db
def test_llm_complete_missing_usage_counts_zero_tokens(llm_server: LLMTestServer) -> None:
    llm_server.script("m1", answer("fine", usage=False))

    result = llm_complete(purpose="plan", messages=MESSAGES, models=["m1"])

    assert (result.text, result.tokens_in, result.tokens_out) == ("fine", 0, 0)
    assert (LLMCall.objects.get().tokens_in, LLMCall.objects.get().tokens_out) == (0, 0)


@pytest.mark.django_db
def test_llm_complete_without_api_key_sends_placeholder(
    llm_server: LLMTestServer, settings: Settings
) -> None:
    settings.OPENAI_API_KEY = ""
    llm_server.script("m1", answer("ok"))

    llm_complete(purpose="plan", messages=MESSAGES, models=["m1"])

    assert llm_server.requests[0].headers["authorization"] == "Bearer not-needed"


@pytest.mark.django_db
def test_llm_complete_uses_the_purpose_chain_from_settings(
    llm_server: LLMTestServer, settings: Settings
) -> None:
    settings.LLM_MODELS = {"planner": ["big", "small"], "fast": ["quick"]}
    llm_server.script("big", answer("plan"))
    llm_server.script("quick", answer("restated"))

    assert model_chain("plan") == ["big", "small"]
    assert llm_complete(purpose="plan", messages=MESSAGES).model == "big"
    assert llm_complete(purpose="restate", messages=MESSAGES).model == "quick"


# -- retries (the SDK's own) -----------------------------------------------------------------------


@pytest.mark.django_db
@pytest.mark.parametrize("status", [429, 500])
def test_llm_complete_retries_rate_limit_and_server_error(llm_server: LLMTestServer, status: int) -> None:
    llm_server.script("m1", error(status), answer("second time lucky"))

    result = llm_complete(purpose="plan", messages=MESSAGES, models=["m1"])

    assert result.text == "second time lucky"
    assert len(llm_server.requests_for("m1")) == 2
    call = LLMCall.objects.get()  # retries are inside one call
    assert (call.response, call.error) == ("second time lucky", "")


@pytest.mark.django_db
def test_llm_complete_server_error_without_retry_after_backs_off(llm_server: LLMTestServer) -> None:
    llm_server.script("m1", error(503, retry_after_ms=None), answer("ok"))

    llm_complete(purpose="plan", messages=MESSAGES, models=["m1"])

    first, second = llm_server.requests_for("m1")
    # The SDK's exponential backoff starts at 0.5 s, less up to 25% jitter.
    assert second.received_at - first.received_at >= 0.35


@pytest.mark.django_db
def test_llm_complete_retries_spent_records_error_and_falls_back(llm_server: LLMTestServer) -> None:
    llm_server.script("m1", error(429), error(429))
    llm_server.script("m2", answer("backup"))

    result = llm_complete(purpose="plan", messages=MESSAGES, models=["m1", "m2"])

    assert (result.model, result.text) == ("m2", "backup")
    assert len(llm_server.requests_for("m1")) == 2
    assert calls_by_model()["m1"][0].error.startswith("RateLimitError: Error code: 429")


# -- fallback --------------------------------------------------------------------------------------


@pytest.mark.django_db
@TRANSPORTS
def test_llm_complete_timeout_recorded_then_falls_back(
    llm_server: LLMTestServer, settings: Settings, transport: str
) -> None:
    settings.LLM_HTTP_TRANSPORT = transport
    llm_server.script("slow", hang(), hang())  # the first try and the one retry both hang
    llm_server.script("m2", answer("from the fallback"))

    started = time.perf_counter()
    result = llm_complete(purpose="plan", messages=MESSAGES, models=["slow", "m2"])

    assert (result.model, result.text) == ("m2", "from the fallback")
    assert time.perf_counter() - started < 4  # two 0.5 s timeouts and a backoff, not the 5 s hang
    assert len(llm_server.requests_for("slow")) == 2
    calls = calls_by_model()
    [timed_out] = calls["slow"]
    assert timed_out.error.startswith("APITimeoutError")
    assert timed_out.response == ""
    assert timed_out.latency_ms >= 1000
    assert timed_out.prompt == MESSAGES
    assert calls["m2"][0].response == "from the fallback"


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("reply", "expected"),
    [
        (malformed(), "malformed response body"),
        (empty_choices(), "no choices"),
        (answer(None), "no text"),
        (answer("   "), "no text"),
        (raw(b"<html><body>Bad gateway</body></html>", content_type="text/html"), "not a chat completion"),
        (raw(b'{"status": "ok"}'), "no choices"),
    ],
    ids=["malformed-json", "empty-choices", "null-content", "blank-content", "html-page", "not-a-completion"],
)
def test_llm_complete_unusable_answer_recorded_then_falls_back(
    llm_server: LLMTestServer, reply: Reply, expected: str
) -> None:
    llm_server.script("broken", reply)
    llm_server.script("m2", answer("sane"))

    result = llm_complete(purpose="plan", messages=MESSAGES, models=["broken", "m2"])

    assert (result.model, result.text) == ("m2", "sane")
    assert len(llm_server.requests_for("broken")) == 1  # a 200 is not retried
    [failed] = calls_by_model()["broken"]
    assert failed.error.startswith("ProviderResponseError: ")
    assert "broken" not in failed.error  # the model is named once, in its own column
    assert expected in failed.error
    assert (failed.response, failed.tokens_in, failed.cost) == ("", 0, None)


@pytest.mark.django_db
def test_llm_complete_all_models_failing_raises_listing_each(llm_server: LLMTestServer) -> None:
    llm_server.script("a", error(400, message="context too long"))
    llm_server.script("b", empty_choices())

    with pytest.raises(LLMError) as raised:
        llm_complete(purpose="plan", messages=MESSAGES, models=["a", "b"], agent_id=None, plan_id=None)

    assert "a: BadRequestError" in str(raised.value)
    assert "context too long" in str(raised.value)
    assert "b: ProviderResponseError" in str(raised.value)
    assert [e.split(":")[0] for e in raised.value.errors] == ["a", "b"]
    calls = LLMCall.objects.order_by("pk")
    assert [c.model for c in calls] == ["a", "b"]
    assert all(c.error and not c.response and c.prompt == MESSAGES for c in calls)
    assert len(llm_server.requests_for("a")) == 1  # a 400 is not retried


@pytest.mark.django_db
@TRANSPORTS
def test_llm_complete_unreachable_server_records_connection_error(settings: Settings, transport: str) -> None:
    """Not "Request timed out." (what the SDK's aiohttp transport says of a refused connection)."""
    settings.LLM_HTTP_TRANSPORT = transport
    with LLMTestServer() as server:
        base_url = server.base_url
    settings.OPENAI_BASE_URL = base_url  # closed: nothing listens there any more
    settings.LLM_MAX_RETRIES = 0

    with pytest.raises(LLMError, match="APIConnectionError"):
        llm_complete(purpose="plan", messages=MESSAGES, models=["m1"])

    assert LLMCall.objects.get().error.startswith("APIConnectionError: Connection error.")


# -- offline and cost ------------------------------------------------------------------------------


@pytest.mark.django_db
def test_llm_complete_offline_model_recorded_with_offline_provider(llm_server: LLMTestServer) -> None:
    result = llm_complete(purpose="restate", messages=MESSAGES, models=[OFFLINE_MODEL])

    assert result.text
    call = LLMCall.objects.get()
    assert (call.provider, call.model, call.error) == ("offline", OFFLINE_MODEL, "")
    assert call.response == result.text
    assert call.tokens_in == sum(len(m["content"].split()) for m in MESSAGES)
    assert llm_server.requests == []


@pytest.mark.django_db
def test_llm_complete_falls_back_to_offline(llm_server: LLMTestServer) -> None:
    llm_server.script("m1", error(404))

    result = llm_complete(purpose="restate", messages=MESSAGES, models=["m1", OFFLINE_MODEL])

    assert result.model == OFFLINE_MODEL
    assert [c.provider for c in LLMCall.objects.order_by("pk")] == ["openai", "offline"]


@pytest.mark.django_db
def test_llm_complete_cost_from_llm_prices(llm_server: LLMTestServer, settings: Settings) -> None:
    settings.LLM_PRICES = {"m1": (2.0, 8.0)}  # USD per million tokens in, out
    llm_server.script("m1", answer("priced", tokens_in=1000, tokens_out=500))
    llm_server.script("m2", answer("free", tokens_in=1000, tokens_out=500))

    llm_complete(purpose="plan", messages=MESSAGES, models=["m1"])
    llm_complete(purpose="plan", messages=MESSAGES, models=["m2"])

    calls = calls_by_model()
    assert calls["m1"][0].cost == Decimal("0.006")  # 1000 * 2 / 1e6 + 500 * 8 / 1e6
    assert calls["m2"][0].cost is None  # no price for m2


# -- providers from settings -----------------------------------------------------------------------


def echo_provider(*, purpose: str, model: str, messages: Sequence[Mapping[str, str]], ends_at: float | None = None,
                  options: CallOptions | None = None) -> ProviderAnswer:
    """A provider registered by a test: answers with the purpose, the model and the last message."""
    return ProviderAnswer(text=f"{purpose} by {model}: {messages[-1]['content']}", tokens_in=3, tokens_out=4,
                          finish_reason="stop")


@pytest.mark.django_db
def test_a_provider_registered_in_settings_answers_its_models_and_is_logged_by_name(
    llm_server: LLMTestServer, settings: Settings,
) -> None:
    settings.LLM_PROVIDERS = {**settings.LLM_PROVIDERS,
                              "echo": {"answer": "tests.agents.test_gateway.echo_provider", "models": ["echo-1"]}}
    llm_server.script("m1", answer("from the server"))

    echoed = llm_complete(purpose="restate", messages=MESSAGES, models=["echo-1"])
    served = llm_complete(purpose="restate", messages=MESSAGES, models=["m1"])

    assert echoed.text == f"restate by echo-1: {MESSAGES[-1]['content']}"
    assert served.text == "from the server"  # every other model still goes to the "*" provider
    assert [(c.provider, c.model, c.tokens_out) for c in LLMCall.objects.order_by("pk")] == [
        ("echo", "echo-1", 4), ("openai", "m1", served.tokens_out)]
    assert LLMCall.objects.get(pk=echoed.call_id).response == echoed.text
    assert [r.model for r in llm_server.requests] == ["m1"]


@pytest.mark.django_db
def test_a_starting_runner_imports_the_providers_its_chains_name_and_no_other(settings: Settings) -> None:
    """`runagents` and `serve` import the providers of the configured chains before their first cycle, so the
    first model call does not pay the SDK's import; a provider no chain names is left alone (its module does not
    even exist here: importing it would fail)."""
    import sys

    from agents.llm.gateway import imported, providers_import

    sys.modules.pop("tests.agents.lazy_provider", None)
    imported.cache_clear()
    settings.LLM_PROVIDERS = {**settings.LLM_PROVIDERS,
                              "lazy": {"answer": "tests.agents.lazy_provider.answer", "models": ["lazy-1"]},
                              "unused": {"answer": "tests.agents.no_such_provider.answer", "models": ["never-named"]}}
    settings.LLM_MODELS = {"planner": ["lazy-1"], "fast": [OFFLINE_MODEL]}

    assert providers_import() == ["lazy", "offline"]
    assert "tests.agents.lazy_provider" in sys.modules
    assert llm_complete(purpose="plan", messages=MESSAGES).text == "plan by lazy-1"


@pytest.mark.django_db
def test_a_model_no_provider_serves_is_a_logged_error_and_the_chain_moves_on(settings: Settings) -> None:
    settings.LLM_PROVIDERS = {"offline": settings.LLM_PROVIDERS["offline"]}  # no "*" provider

    result = llm_complete(purpose="restate", messages=MESSAGES, models=["unserved", OFFLINE_MODEL])

    assert result.model == OFFLINE_MODEL
    failed = LLMCall.objects.get(model="unserved")
    assert failed.provider == ""
    assert failed.error == "ImproperlyConfigured: no provider in LLM_PROVIDERS serves the model 'unserved'"


# -- clients and event loops -----------------------------------------------------------------------


def test_openai_complete_outside_any_loop_closes_each_loops_client(
    llm_server: LLMTestServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With no outer loop, each call gets a fresh loop: a client cached from an earlier, closed loop would
    fail with "Event loop is closed", so each loop gets its own client, closed when the loop shuts down."""
    spy = ClientSpy(monkeypatch)
    llm_server.script("m1", answer("one"), answer("two"), answer("three"))

    texts = [openai_complete(model="m1", messages=MESSAGES).text for _ in range(3)]

    assert texts == ["one", "two", "three"]
    loops = {loop for loop, _ in spy.handed_out}
    assert len(loops) == 3 and all(loop.is_closed() for loop in loops)
    assert all(client.is_closed() for client in spy.clients)
    assert not loops & set(openai_provider._loops)


@pytest.mark.timeout(15)
def test_openai_complete_from_runner_threads_waits_on_the_outer_loop(
    llm_server: LLMTestServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Agent threads from sync_to_async wait on the runner's loop together, through one pooled client.

    The agent threads get their own executor, as the runner's do: the loop's default executor stays free
    for the SDK's one-off platform lookup (the provider uses no private SDK API to avoid it).
    """
    spy = ClientSpy(monkeypatch)
    agents = 4
    llm_server.script("m1", *[answer(f"agent {i}", delay=0.4) for i in range(agents)])

    async def runner() -> tuple[list[str], float]:
        ask = sync_to_async(openai_complete, thread_sensitive=False, executor=ThreadPoolExecutor(max_workers=agents))
        started = time.perf_counter()
        answers = await asyncio.gather(*[ask(model="m1", messages=MESSAGES) for _ in range(agents)])
        return sorted(a.text for a in answers), time.perf_counter() - started

    texts, elapsed = asyncio.run(runner())

    assert texts == [f"agent {i}" for i in range(agents)]
    assert llm_server.max_in_flight == agents
    assert elapsed < agents * 0.4 - 0.3  # together, not one after another
    [runner_loop] = {loop for loop, _ in spy.handed_out}
    clients = {id(c): c for c in spy.clients}.values()  # the loop's one client, shared by all agents
    assert len(clients) == 1
    assert all(client.is_closed() for client in clients)  # closed when asyncio.run shut the runner's loop down
    assert runner_loop not in openai_provider._loops


async def test_openai_client_is_per_loop_and_per_settings(
    llm_server: LLMTestServer, settings: Settings
) -> None:
    taken = [await openai_client() for _ in range(3)]
    assert len({id(c) for c in taken}) == 1  # one client per loop and settings, reused
    first = taken[0]

    settings.LLM_MAX_RETRIES = 0
    other_settings = await openai_client()
    assert all(other_settings is not c for c in taken)
    assert other_settings.max_retries == 0

    other_loop = await asyncio.to_thread(lambda: asyncio.run(openai_client()))
    assert other_loop is not first
    assert other_loop.is_closed()

    await openai_aclose_clients()
    assert all(c.is_closed() for c in taken) and other_settings.is_closed()
    assert asyncio.get_running_loop() not in openai_provider._loops
    llm_server.script("m1", answer("after close"))
    assert (await openai_acomplete(model="m1", messages=MESSAGES)).text == "after close"  # a fresh client


def test_a_purpose_can_have_its_own_chain(settings: Settings) -> None:
    settings.LLM_MODELS = {"planner": ["big"], "fast": ["small"]}
    settings.LLM_PURPOSE_MODELS = {"reflect": ["critic", "small"]}
    assert model_chain("reflect") == ["critic", "small"]
    assert model_chain("restate") == ["small"]
    assert model_chain("plan") == ["big"]
    assert model_chain("plan", agent_models="mine, backup") == ["mine", "backup"]


@pytest.mark.django_db
def test_a_deadline_bounds_each_call_and_stops_the_chain(llm_server: LLMTestServer, settings: Settings) -> None:
    settings.LLM_TIMEOUT_SECONDS = 30
    llm_server.script("slow", answer("late", delay=6))
    llm_server.script("next", answer("never asked"))
    with pytest.raises(LLMDeadlineError) as raised:
        llm_complete(purpose="plan", messages=MESSAGES, models=["slow", "next"], deadline=Deadline.after(0.5))
    assert str(raised.value).startswith("no model answered within 0.5 s")
    assert raised.value.errors[0].startswith("slow: ProviderTimeout")
    assert llm_server.requests_for("next") == []
    assert [c.model for c in LLMCall.objects.all()] == ["slow"]


@pytest.mark.django_db
def test_a_long_answer_is_stored_up_to_64_kb_and_shown_behind_show_all(llm_server: LLMTestServer,
                                                                       viewer_client: Any) -> None:
    from tests.factories import PlanFactory

    plan = PlanFactory()
    long_text = "word " * 40_000  # 200,000 characters
    llm_server.script("verbose", answer(long_text))
    result = llm_complete(purpose="plan", messages=MESSAGES, models=["verbose"], plan_id=plan.pk)
    assert result.text == long_text  # the planner still reads the whole answer
    stored = LLMCall.objects.get().response
    assert len(stored.encode()) < 64 * 1024 + 100
    assert stored.endswith(f"[... {len(long_text) - 64 * 1024} more characters not stored]")
    html = viewer_client.get(plan.get_absolute_url()).content.decode()
    assert "show all (" in html
    assert len(html) < 200_000  # one chatty model no longer makes a megabyte page


@pytest.mark.django_db
def test_calls_recorded_together_are_one_insert_at_the_end_even_when_the_block_fails(
        django_assert_num_queries: Any) -> None:
    """A runner pass's milestone checks: each call is still in the call log, written in one INSERT when the
    block ends, also when it ends with an error (the calls were made)."""
    with pytest.raises(RuntimeError), calls_recorded_together():
        with django_assert_num_queries(0):  # nothing written while the calls are made
            first = llm_complete(purpose="milestone", messages=MESSAGES, models=[OFFLINE_MODEL])
            second = llm_complete(purpose="goals", messages=MESSAGES, models=[OFFLINE_MODEL])
        assert first.call_id is None and second.call_id is None  # no row yet
        assert not LLMCall.objects.exists()
        raise RuntimeError("the pass broke after its calls")
    calls = list(LLMCall.objects.order_by("pk"))
    assert [(c.purpose, c.response) for c in calls] == [("milestone", first.text), ("goals", second.text)]
