"""The OpenAI-compatible provider: any server speaking `POST /v1/chat/completions`, through the `openai` SDK.

The SDK's async client is used so that a model's answer is awaited on an event loop: the runtime's cycles call
`openai_complete` from their threads, and `async_to_sync` hands the request to the loop that started the thread
(the runtime's), where one client per loop serves every agent. Elsewhere (a web request, the shell) it runs on
a loop of its own.
Retries (exponential backoff on 429, 5xx, timeouts and connection errors) are the SDK's own, set by
LLM_MAX_RETRIES; LLM_TIMEOUT_SECONDS bounds each attempt.

An `AsyncOpenAI` client's connection pool belongs to the event loop it was first used on, so one client per
loop and settings is kept and closed when that loop shuts down (see `_LoopClients`).

Resolving a host name in OPENAI_BASE_URL, and the SDK's one-off platform lookup for its diagnostic headers,
take a thread of the loop's default executor: threads that wait for the loop must therefore not fill that
executor (the runner's cycle threads are its own). Only the SDK's public API is used here.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import re
import ssl
import threading
import time
from collections.abc import AsyncGenerator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import openai
from asgiref.sync import async_to_sync
from django.conf import settings
from openai.types.chat import ChatCompletion

from agents.connections import connection_release
from agents.llm.gateway import Provider, ProviderAnswer
from agents.llm.limits import (
    BACKGROUND,
    OPERATOR,
    SHARED_LIMIT_MAX,
    call_class,
    model_call_bounded,
    model_concurrency,
)
from agents.llm.structured import (
    CallOptions,
    format_confirmed,
    format_for,
    format_is_confirmed,
    format_refused,
    is_format_refusal,
    response_format_body,
)


class ProviderResponseError(Exception):
    """The server answered, but not with a usable chat completion: the gateway falls back to the next."""


class ProviderTimeout(Exception):
    """No answer within the time the caller had left (its plan's deadline), retries included."""


# base_url, api_key, timeout in seconds, max retries, HTTP transport: the settings a client is built from.
ClientKey = tuple[str, str, float, int, str]


@dataclass
class _LoopClients:
    """The clients of one event loop, and the async generator that closes them when the loop shuts down.

    A loop gives no callback when it closes, but `asyncio.run`, `asyncio.Runner` and server loops all call
    `loop.shutdown_asyncgens()` first, which closes every suspended async generator started on that loop:
    the keeper's `finally` then closes the clients on their own loop, as httpx requires.
    """

    clients: dict[ClientKey, openai.AsyncOpenAI] = field(default_factory=dict)
    keeper: AsyncGenerator[None, None] | None = None


# Event loop -> its clients. Loops run in different threads (a fresh one per `async_to_sync` call made
# outside any loop), hence the lock; within one loop the lookups below never await, so need no lock.
_loops: dict[asyncio.AbstractEventLoop, _LoopClients] = {}
_loops_lock = threading.Lock()


def client_key() -> ClientKey:
    """The client settings now in force (read each call, so tests' `settings` overrides take effect)."""
    return (
        settings.OPENAI_BASE_URL,
        settings.OPENAI_API_KEY,
        float(settings.LLM_TIMEOUT_SECONDS),
        int(settings.LLM_MAX_RETRIES),
        settings.LLM_HTTP_TRANSPORT,
    )


async def _close_at_loop_shutdown(
    loop: asyncio.AbstractEventLoop, entry: _LoopClients
) -> AsyncGenerator[None, None]:
    try:
        yield
    finally:
        with _loops_lock:
            if _loops.get(loop) is entry:
                del _loops[loop]
        for client in list(entry.clients.values()):
            # A failing close must not stop the loop's shutdown.
            with contextlib.suppress(Exception):
                await client.close()
        entry.clients.clear()


async def _loop_clients() -> _LoopClients:
    """This loop's clients, registering the loop (and its shutdown hook) on first use."""
    loop = asyncio.get_running_loop()
    with _loops_lock:
        # A loop closed without shutting down its async generators leaves its entry behind: its clients
        # cannot be closed any more (their loop is gone), only dropped.
        for closed in [other for other in _loops if other.is_closed()]:
            del _loops[closed]
        entry = _loops.get(loop)
        if entry is not None:
            return entry
        entry = _loops[loop] = _LoopClients()
    entry.keeper = _close_at_loop_shutdown(loop, entry)
    # The first step runs to the `yield` without suspending, and registers the generator with this loop.
    await anext(entry.keeper)
    return entry


async def openai_client() -> openai.AsyncOpenAI:
    """The running event loop's shared client for the current settings."""
    key = client_key()
    entry = await _loop_clients()
    client = entry.clients.get(key)
    if client is None:
        base_url, api_key, timeout, retries, _transport = key
        client = entry.clients[key] = openai.AsyncOpenAI(
            # An empty base URL means the SDK's default (OPENAI_BASE_URL from the environment, else OpenAI).
            base_url=base_url or None,
            # Local servers (llama.cpp, vLLM, Ollama) ignore the key; the SDK refuses to start without one.
            api_key=api_key or "not-needed",
            timeout=timeout,
            max_retries=retries,
            http_client=http_client(plain=base_url.startswith("http://")),
        )
    return client


@functools.cache
def plain_http_tls() -> ssl.SSLContext:
    return ssl.create_default_context()


def http_client(*, plain: bool) -> openai.DefaultAsyncHttpxClient:
    """The SDK's own HTTP client, on the transport LLM_HTTP_TRANSPORT names: "aiohttp" (the default, the
    SDK's documented choice for concurrency, `openai[aiohttp]`) or "httpx" (the SDK's default transport).

    With many calls in flight, httpx's pool costs more CPU a call than aiohttp's (it looks at every pooled
    connection each time one is handed back; docs/performance.md). A plain-HTTP server (a local model) needs no
    certificates: every client would read the CA bundle for a TLS it never uses, so they share one context."""
    verify: ssl.SSLContext | bool = plain_http_tls() if plain else True
    if settings.LLM_HTTP_TRANSPORT == "httpx":
        return openai.DefaultAsyncHttpxClient(verify=verify)
    return openai.DefaultAioHttpClient(verify=verify)


def connection_error_behind(exc: openai.APITimeoutError) -> aiohttp.ClientConnectionError | None:
    """The connection error behind the SDK's timeout, when the aiohttp transport saw one.

    That transport maps every aiohttp connection error (a refused connection, a server that hung up) to a
    connect timeout, so the SDK would report "Request timed out." for a server that is not there. The caller
    raises the SDK's "Connection error." with this cause instead: the call log then reads as with the httpx
    transport (e.g. "Cannot connect to host ...")."""
    cause = exc.__cause__
    while cause is not None:
        if isinstance(cause, aiohttp.ClientConnectionError) and not isinstance(cause, TimeoutError):
            return cause
        cause = cause.__cause__
    return None


async def openai_aclose_clients() -> None:
    """Close the running loop's clients now (e.g. at the end of a long-lived loop that is not shut down)."""
    loop = asyncio.get_running_loop()
    with _loops_lock:
        entry = _loops.get(loop)
    if entry is not None and entry.keeper is not None:
        await entry.keeper.aclose()


LIST_TIMEOUT_SECONDS = 3.0
LIST_KEPT_SECONDS = 600.0  # a listing (or its failure) is asked again after this
_listed: dict[str, tuple[float, list[str]]] = {}  # base URL -> (when, the ids its /v1/models listed)
_listed_lock = threading.Lock()


def models_list_fetch(base_url: str, api_key: str, timeout: float = LIST_TIMEOUT_SECONDS) -> list[str]:
    """The ids `GET {base_url}/models` lists; raises on any failure (llm_check reports it)."""
    import httpx  # the openai SDK's own HTTP library

    url = (base_url or "https://api.openai.com/v1").rstrip("/") + "/models"
    headers = {"Authorization": f"Bearer {api_key or 'not-needed'}"}
    response = httpx.get(url, headers=headers, timeout=timeout)
    response.raise_for_status()
    data = response.json().get("data", [])
    return [str(item["id"]) for item in data if isinstance(item, dict) and item.get("id")]


def served_models() -> list[str]:
    """The models the configured server lists (its aliases for settings, agents/llm/structured.py), asked once
    per LIST_KEPT_SECONDS; [] when it lists none or does not answer. A sync call, never made on an event loop."""
    base_url, api_key = settings.OPENAI_BASE_URL, settings.OPENAI_API_KEY
    with _listed_lock:
        kept = _listed.get(base_url)
    if kept is not None and time.monotonic() - kept[0] < LIST_KEPT_SECONDS:
        return kept[1]
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        pass
    else:
        return kept[1] if kept else []  # never block an event loop on it
    try:
        names = models_list_fetch(base_url, api_key)
    except Exception:  # no listing: the settings match by name alone
        names = []
    with _listed_lock:
        _listed[base_url] = (time.monotonic(), names)
    return names


def answer_from_completion(model: str, completion: object) -> ProviderAnswer:
    """The text and token counts of a chat completion; a clear error when it holds no answer."""
    if not isinstance(completion, ChatCompletion):
        # The SDK hands back the raw text when a server answers 200 with a non-JSON content type.
        preview = str(completion)[:200]
        raise ProviderResponseError(f"the server's answer is not a chat completion: {preview!r}")
    choices = getattr(completion, "choices", None)
    if not choices:
        raise ProviderResponseError("the answer has no choices")
    message = getattr(choices[0], "message", None)
    content = getattr(message, "content", None)
    if not isinstance(content, str) or not content.strip():
        reason = getattr(choices[0], "finish_reason", None)
        raise ProviderResponseError(f"the answer has no text (finish_reason={reason!r})")
    usage = getattr(completion, "usage", None)
    return ProviderAnswer(
        text=content,
        tokens_in=int(getattr(usage, "prompt_tokens", 0) or 0),
        tokens_out=int(getattr(usage, "completion_tokens", 0) or 0),
        finish_reason=str(getattr(choices[0], "finish_reason", "") or ""),
    )


def request_fields(options: CallOptions | None, fmt: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """The SDK's keyword arguments for the limits, and the extra body fields for the format `fmt`."""
    if options is None:
        return {}, {}
    kwargs: dict[str, Any] = {}
    if options.max_tokens:
        kwargs["max_tokens"] = options.max_tokens
    if options.temperature is not None:
        kwargs["temperature"] = options.temperature
    if options.stop:
        kwargs["stop"] = list(options.stop)
    return kwargs, response_format_body(fmt, options.schema, options.name) | options.extra


async def openai_acomplete(
    *, model: str, messages: Sequence[Mapping[str, str]], ends_at: float | None = None,
    options: CallOptions | None = None,
) -> ProviderAnswer:
    """Ask `model` on the OpenAI-compatible server for one chat completion.

    Raises the SDK's errors (`openai.APITimeoutError`, `openai.RateLimitError`, `openai.APIStatusError`...)
    once its retries are spent, `ProviderResponseError` for an answer without text or a malformed body, and
    `ProviderTimeout` when the clock (`time.monotonic()`) reaches `ends_at` first: it bounds the whole call,
    the SDK's retries and the client's setup included.

    `options` carry the answer's schema and limits; a server that refuses the schema's format (a 400 or 422
    naming it) is asked again at once in the next format, and the model keeps that format in this process.
    """
    client = await openai_client()
    chat: list[Any] = [{"role": m["role"], "content": m["content"]} for m in messages]
    timeout = None if ends_at is None else max(ends_at - time.monotonic(), 0.001)
    # Each attempt may wait at most what remains, and so may all of them together (asyncio.timeout: no task
    # of its own, unlike wait_for; None bounds nothing).
    attempt_timeout = openai.NOT_GIVEN if timeout is None else min(timeout, float(settings.LLM_TIMEOUT_SECONDS))
    fmt = format_for(model) if options is not None and options.schema is not None else ""
    # Until a format has answered, a refusal is found at its first answer: no SDK retries of a 500 that is the
    # server refusing the format (llama-cpp-python's answer to json_schema).
    probing = bool(fmt) and fmt != "off" and not format_is_confirmed(model)
    try:
        async with asyncio.timeout(timeout):
            while True:
                kwargs, extra = request_fields(options, fmt or "off")
                caller = client.with_options(max_retries=0) if probing and extra else client
                # The messages are sent as body fields of their own (`extra_body`, merged into the request's JSON
                # as given): the SDK's transform of its typed parameters walks each message through the types of
                # every kind of message, about 0.35 ms of CPU a call, to change nothing in role/content messages.
                body = {"messages": chat, **extra}
                try:
                    if options is not None and options.stream:
                        completion: Any = await streamed_completion(
                            caller, model=model, messages=[], timeout=attempt_timeout, extra_body=body, **kwargs)
                    else:
                        completion = await caller.chat.completions.create(
                            model=model, messages=[], timeout=attempt_timeout, extra_body=body, **kwargs)
                except openai.APIConnectionError as exc:
                    if probing and extra and client.max_retries:
                        probing = False  # not about the format: asked again with the SDK's retries
                        continue
                    if not isinstance(exc, openai.APITimeoutError):
                        raise
                    refused = connection_error_behind(exc)
                    if refused is None:
                        raise
                    raise openai.APIConnectionError(request=exc.request) from refused
                except openai.APIStatusError as exc:
                    if (exc.status_code == 400 and "max_tokens" in kwargs and "max_completion_tokens" in str(exc)
                            and options is not None):
                        # OpenAI's reasoning models take the limit under its newer name only.
                        options.extra["max_completion_tokens"] = options.max_tokens
                        options.max_tokens = None
                        continue
                    if extra and is_format_refusal(exc.status_code, str(exc)):
                        fmt = format_refused(model, fmt, f"HTTP {exc.status_code}: {status_message(exc)}")
                        continue
                    if probing and extra and retried_by_sdk(exc) and client.max_retries:
                        probing = False  # not about the format: asked again with the SDK's retries
                        continue
                    raise
                break
    except TimeoutError:
        raise ProviderTimeout(f"no answer within the {timeout:.1f} s left") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        # A 200 whose body is not valid JSON: the SDK lets the decoder's error through.
        raise ProviderResponseError(f"malformed response body: {exc}") from exc
    answer = answer_from_completion(model, completion)
    answer.response_format = "" if fmt == "off" else fmt
    if answer.response_format:
        format_confirmed(model)
    return answer


async def streamed_completion(client: openai.AsyncOpenAI, **kwargs: Any) -> ChatCompletion:
    """One chat completion asked with `stream=True` and put together as the SDK's ChatCompletion. A call stopped
    while its answer streams (cancelled: an operator's call needs the model, the runner stops) closes the
    connection, and a streaming server (llama-cpp-python, llama.cpp, Ollama) stops computing the rest; without
    streaming it would compute the whole answer for nobody, holding its one slot."""
    parts: list[str] = []
    finish_reason: str | None = None
    usage: Any = None
    pieces = 0
    stream = await client.chat.completions.create(stream=True, **kwargs)
    async with stream:  # closed however the loop ends: a cancel hangs up on the server
        async for chunk in stream:
            usage = chunk.usage or usage
            for choice in chunk.choices:
                if choice.delta is not None and choice.delta.content:
                    parts.append(choice.delta.content)
                    pieces += 1
                finish_reason = choice.finish_reason or finish_reason
    counts = ({"prompt_tokens": usage.prompt_tokens, "completion_tokens": usage.completion_tokens,
               "total_tokens": usage.total_tokens} if usage is not None
              else {"prompt_tokens": 0, "completion_tokens": pieces, "total_tokens": pieces})  # a piece is a token
    return ChatCompletion.model_validate({
        "id": "streamed", "object": "chat.completion", "created": int(time.time()), "model": str(kwargs["model"]),
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "".join(parts)},
                     "finish_reason": finish_reason or "stop"}],
        "usage": counts})


def status_message(exc: openai.APIStatusError) -> str:
    """The server's own message, without the SDK's "Error code: 500 - " before it."""
    return re.sub(r"^Error code: \d+ - ", "", exc.message)


def retried_by_sdk(exc: openai.APIStatusError) -> bool:
    """The statuses the SDK retries by itself (408, 409, 429, 5xx)."""
    return exc.status_code in (408, 409, 429) or exc.status_code >= 500


def openai_complete(
    *, model: str, messages: Sequence[Mapping[str, str]], ends_at: float | None = None,
    options: CallOptions | None = None, purpose: str = "",
) -> ProviderAnswer:
    """`openai_acomplete` for sync callers: runs on the caller's outer event loop when there is one. The
    gateway's provider for every OpenAI-compatible model (settings.LLM_PROVIDERS); `purpose` is not sent: what
    it asks for is in `options`."""
    connection_release()  # the wait for the model holds no database connection (agents/connections.py)
    who = call_class()
    wait_limit = who.wait_limit
    if ends_at is not None:  # the turn is waited for within the caller's deadline too
        left = max(ends_at - time.monotonic(), 0.001)
        wait_limit = left if wait_limit is None else min(wait_limit, left)
    if model_concurrency(model) <= SHARED_LIMIT_MAX:
        # A model of few slots (a local server): the answer is streamed, so that a call that stops early (a persona's
        # giving way to an operator's, a cancelled plan, a deadline passed, the runner stopping) stops the server
        # computing an answer nobody waits for any more, instead of holding its one slot until max_tokens.
        options = options if options is not None else CallOptions()
        options.stream = True
    return async_to_sync(functools.partial(model_call_bounded, openai_acomplete))(
        model=model, messages=messages, ends_at=ends_at, options=options,
        priority=OPERATOR if who.operator else BACKGROUND, wait_limit=wait_limit,
        plan_id=options.plan_id if options is not None else None)


PROVIDER: Provider = openai_complete  # what settings.LLM_PROVIDERS names: mypy checks it has the signature


# -- what a server supports (manage.py llm_check) ---------------------------------------------------------------------

PROBE_SCHEMA: Mapping[str, Any] = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"],
                                   "additionalProperties": False}
PROBE_MESSAGES = [{"role": "user", "content": 'Answer with the JSON object {"ok": true} and nothing else.'}]


@dataclass(frozen=True)
class FormatProbe:
    """How a server took one structured-output format: "json" (answered JSON), "answered" (but not JSON: the format
    is ignored), "refused" (an error naming the format) or "error" (another failure), with the detail."""

    format: str
    outcome: str
    detail: str
    seconds: float


def format_probe(model: str, fmt: str) -> FormatProbe:
    """One tiny request to `model` in format `fmt`, no retries."""
    client = openai.OpenAI(base_url=settings.OPENAI_BASE_URL or None, api_key=settings.OPENAI_API_KEY or "not-needed",
                           timeout=float(settings.LLM_TIMEOUT_SECONDS), max_retries=0)
    started = time.monotonic()
    extra = response_format_body(fmt, PROBE_SCHEMA, "probe")
    try:
        with client:
            completion = client.chat.completions.create(
                model=model, messages=[dict(m) for m in PROBE_MESSAGES],  # type: ignore[misc]
                max_tokens=24, temperature=0, extra_body=extra or None)
        text = answer_from_completion(model, completion).text
    except openai.APIStatusError as exc:
        outcome = "refused" if extra and is_format_refusal(exc.status_code, str(exc)) else "error"
        return FormatProbe(fmt, outcome, f"HTTP {exc.status_code}: {' '.join(status_message(exc).split())[:200]}",
                           time.monotonic() - started)
    except Exception as exc:
        return FormatProbe(fmt, "error", f"{type(exc).__name__}: {' '.join(str(exc).split())[:200]}",
                           time.monotonic() - started)
    try:
        parsed = json.loads(text.strip().removeprefix("<json>").removesuffix("</json>").strip())
    except ValueError:
        parsed = None
    outcome = "json" if isinstance(parsed, dict) else "answered"
    return FormatProbe(fmt, outcome, " ".join(text.split())[:80], time.monotonic() - started)
