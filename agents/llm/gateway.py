"""The LLM gateway: one entry point for every purpose, every call recorded.

Providers come from settings.LLM_PROVIDERS: the offline rules models (the default, deterministic, no network;
they live with the world they simulate, agents/offline_model.py) and any OpenAI-compatible server through the
`openai` SDK (agents/llm/openai_provider.py). A chain of models is tried in order; a model that errors hands
over to the next one. Each call, answered or failed, goes to settings.LLM_CALL_RECORDER (the domain's call
log), so this layer imports no model and no app (`calls_recorded_together` hands it many at once). `llm_complete` is called from sync code (services, the
runner's agent threads); an HTTP model's answer is still awaited on the runner's event loop (see
openai_provider).
"""

from __future__ import annotations

import contextlib
import functools
import logging
import time
from collections.abc import Iterator, Mapping, Sequence
from contextvars import ContextVar
from dataclasses import dataclass
from decimal import Decimal
from typing import Any, Protocol

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.utils.module_loading import import_string

from agents.llm.limits import CallAborted
from agents.llm.structured import CallOptions, call_options, provider_name

logger = logging.getLogger("planner.llm")

FAST_PURPOSES = {"restate", "reflect", "goals", "milestone", "decide"}
PURPOSES = (*sorted(FAST_PURPOSES), "plan", "replan")
COST_PLACES = Decimal("0.000001")  # LLMCall.cost keeps six decimal places
ERROR_CHARS = 5000
RESPONSE_STORED_BYTES = 64 * 1024  # one long-winded model must not fill the database or the plan page


class LLMError(Exception):
    """Every model in the chain failed; the message lists each model's error."""

    def __init__(self, message: str, errors: Sequence[tuple[str, str]] = (), *, aborted: bool = False) -> None:
        super().__init__(message)
        self.failures = list(errors)  # (model, error), one per model tried
        self.aborted = aborted  # the call was stopped (its plan cancelled, its runner stopping): ask no other model

    @property
    def errors(self) -> list[str]:
        """"model: error", one per model tried."""
        return [f"{model}: {error}" for model, error in self.failures]

    @property
    def reason(self) -> str:
        """The errors without model names, for a caller that asked one model and names it itself."""
        return "; ".join(error for _model, error in self.failures) or str(self)


class LLMDeadlineError(LLMError):
    """The caller's deadline passed before a model answered."""


@dataclass(frozen=True)
class Deadline:
    """A point in time by which an answer is needed: each call may wait only for what remains."""

    seconds: float
    ends_at: float  # time.monotonic()

    @classmethod
    def after(cls, seconds: float) -> Deadline:
        return cls(seconds=seconds, ends_at=time.monotonic() + seconds)

    def remaining(self) -> float:
        return self.ends_at - time.monotonic()

    @property
    def expired(self) -> bool:
        return self.remaining() <= 0


@dataclass
class LLMResult:
    """The answer of the first model that answered, and the id of the call log's row recording it (None for a
    call made inside `calls_recorded_together`: its row is written when the block ends)."""

    text: str
    model: str
    call_id: int | None
    tokens_in: int = 0
    tokens_out: int = 0
    latency_ms: int = 0
    finish_reason: str = ""  # the server's: "stop", "length" (cut off at max_tokens or the context), ...
    response_format: str = ""  # the structured-output format the server honoured ("" when none was sent)

    @property
    def truncated(self) -> bool:
        """The answer was cut off at the token limit: whatever it holds is incomplete."""
        return self.finish_reason == "length"


@dataclass
class ProviderAnswer:
    """What a provider returns for one call."""

    text: str
    tokens_in: int = 0
    tokens_out: int = 0
    finish_reason: str = ""
    response_format: str = ""


class Provider(Protocol):
    """Answers one call to one of its models (settings.LLM_PROVIDERS names it by dotted path), over by `ends_at`
    (time.monotonic()) retries included; raises on any failure, and the gateway asks the next model."""

    def __call__(self, *, purpose: str, model: str, messages: Sequence[Mapping[str, str]],
                 ends_at: float | None = None, options: CallOptions | None = None) -> ProviderAnswer: ...


@dataclass(frozen=True)
class CallRecord:
    """One call as the call log keeps it: what settings.LLM_CALL_RECORDER is given (a sequence of them; it
    returns their rows' ids)."""

    purpose: str
    provider: str
    model: str
    prompt: list[dict[str, str]]
    agent_id: int | None
    plan_id: int | None
    latency_ms: int
    error: str = ""  # a failed call has an error and no answer
    response: str = ""
    tokens_in: int = 0
    tokens_out: int = 0
    cost: Decimal | None = None
    finish_reason: str = ""
    response_format: str = ""


@functools.cache
def imported(path: str) -> Any:
    """The object a setting names by dotted path, imported once."""
    return import_string(path)


# The calls of the innermost `calls_recorded_together` block under way, if any.
_together: ContextVar[list[CallRecord] | None] = ContextVar("llm_calls_together", default=None)


def call_record(record: CallRecord) -> int | None:
    """Hand a call to the domain's call log (settings.LLM_CALL_RECORDER); the id of its row, or None inside
    `calls_recorded_together` (the row is written when the block ends)."""
    held = _together.get()
    if held is not None:
        held.append(record)
        return None
    return calls_record([record])[0]


def calls_record(records: Sequence[CallRecord]) -> list[int]:
    recorder = imported(settings.LLM_CALL_RECORDER)
    return [int(pk) for pk in recorder(records)]


@contextlib.contextmanager
def calls_recorded_together() -> Iterator[None]:
    """The calls made inside the block are recorded together when it ends (also when it raises: they were
    made), in one write whatever their number: a runner pass's milestone checks. Their results carry no
    call_id, and the recorder's budget check follows at the block's end. A block inside another adds to it."""
    if _together.get() is not None:
        yield
        return
    records: list[CallRecord] = []
    token = _together.set(records)
    try:
        yield
    finally:
        _together.reset(token)
        if records:
            calls_record(records)


def model_chain(purpose: str, *, agent_models: str = "") -> list[str]:
    """The models to try for a purpose, strongest first: the agent's own planner chain for planning, when
    it has one, else the purpose's own chain (e.g. REPLAN_MODELS), else PLANNER_MODELS / FAST_MODELS."""
    key = "fast" if purpose in FAST_PURPOSES else "planner"
    own = [m.strip() for m in agent_models.split(",") if m.strip()]
    if own and key == "planner":
        return own
    by_purpose = getattr(settings, "LLM_PURPOSE_MODELS", {}).get(purpose)
    return list(by_purpose or settings.LLM_MODELS.get(key) or [settings.LLM_DEFAULT_MODEL])


def answers_at_once(*, agent_models: str = "") -> bool:
    """Whether every model a call of any purpose may reach (with the agent's own planner chain) is served in this
    process without waiting on anything (settings.LLM_PROVIDERS_AT_ONCE: the offline models). A runtime that
    drives many agents together can then make such calls in line, since none waits."""
    models = {model for purpose in PURPOSES for model in model_chain(purpose, agent_models=agent_models)}
    return all(provider_name(model) in settings.LLM_PROVIDERS_AT_ONCE for model in models)


def providers_import() -> list[str]:
    """Import the providers of every model the settings' chains name (the purposes' chains), as a process
    that will call them starts (`runagents`, `serve`): the first model call then does not pay the SDK's import
    (a large package). Their names, sorted; an agent's own planner chain is imported on its first call as before."""
    names = sorted({provider_name(model) for purpose in PURPOSES for model in model_chain(purpose)} - {""})
    for name in names:
        imported(settings.LLM_PROVIDERS[name]["answer"])
    return names


def provider_complete(
    purpose: str, model: str, messages: Sequence[Mapping[str, str]], *, ends_at: float | None = None,
    options: CallOptions | None = None,
) -> ProviderAnswer:
    """One call to one model by its provider, over by `ends_at` (time.monotonic()), retries included."""
    name = provider_name(model)
    if not name:
        raise ImproperlyConfigured(f"no provider in LLM_PROVIDERS serves the model {model!r}")
    provider: Provider = imported(settings.LLM_PROVIDERS[name]["answer"])
    return provider(purpose=purpose, model=model, messages=messages, ends_at=ends_at, options=options)


def error_text(exc: BaseException) -> str:
    """`Type: message`, plus the cause the SDK hides behind e.g. "Connection error."."""
    text = f"{type(exc).__name__}: {exc}"
    cause = exc.__cause__
    if cause is not None and str(cause) and str(cause) not in text:
        text += f" ({type(cause).__name__}: {cause})"
    return text


def response_stored(text: str) -> str:
    """The answer as kept in the call log: at most RESPONSE_STORED_BYTES of UTF-8, with a note of the rest."""
    data = text.encode("utf-8")
    if len(data) <= RESPONSE_STORED_BYTES:
        return text
    kept = data[:RESPONSE_STORED_BYTES].decode("utf-8", errors="ignore")
    return kept + f"\n[... {len(text) - len(kept)} more characters not stored]"


def llm_complete(
    *,
    purpose: str,
    messages: Sequence[Mapping[str, str]],
    models: Sequence[str] | None = None,
    agent_id: int | None = None,
    plan_id: int | None = None,
    deadline: Deadline | None = None,
    schema: Mapping[str, Any] | None = None,
) -> LLMResult:
    """Ask the first model of the chain that answers; record every call, failed or not (the recorder also
    pauses an agent that reached its budget).

    `schema`: the JSON Schema of the answer, sent as each model's structured-output format (see
    agents/llm/structured.py); the purpose's limits (max_tokens, stop, temperature) are always sent.
    With a deadline, each call may take only the time that remains, and once it has passed no further
    model is asked: LLMDeadlineError.
    """
    chain = list(models) if models else model_chain(purpose)
    failures: list[tuple[str, str]] = []
    aborted = False
    prompt = [dict(m) for m in messages]
    for model in chain:
        if deadline is not None and deadline.expired:
            break
        started = time.perf_counter()
        options = call_options(purpose, model, messages, schema)
        options.plan_id = plan_id
        try:
            answer = provider_complete(purpose, model, messages, ends_at=deadline.ends_at if deadline else None,
                                       options=options)
        except Exception as exc:  # any provider failure hands over to the next model
            error = error_text(exc)
            failures.append((model, error))
            logger.warning("LLM %s via %s failed: %s", purpose, model, error)
            call_record(CallRecord(purpose=purpose, provider=provider_name(model), model=model, prompt=prompt,
                                   agent_id=agent_id, plan_id=plan_id, error=error[:ERROR_CHARS],
                                   latency_ms=int((time.perf_counter() - started) * 1000)))
            if isinstance(exc, CallAborted):
                aborted = True
                break  # the plan was cancelled or the runner stops: no other model is asked for it
            continue
        latency = int((time.perf_counter() - started) * 1000)
        call_id = call_record(CallRecord(
            purpose=purpose, provider=provider_name(model), model=model, prompt=prompt, agent_id=agent_id,
            plan_id=plan_id, latency_ms=latency, response=response_stored(answer.text),
            tokens_in=answer.tokens_in, tokens_out=answer.tokens_out,
            cost=call_cost(model, answer.tokens_in, answer.tokens_out),
            finish_reason=answer.finish_reason[:20], response_format=answer.response_format[:20],
        ))
        return LLMResult(text=answer.text, model=model, call_id=call_id, tokens_in=answer.tokens_in,
                         tokens_out=answer.tokens_out, latency_ms=latency, finish_reason=answer.finish_reason,
                         response_format=answer.response_format)
    if deadline is not None and deadline.expired:
        message = f"no model answered within {deadline.seconds:g} s"
        raise LLMDeadlineError("; ".join([message, *(f"{m}: {e}" for m, e in failures)]), failures)
    raise LLMError("; ".join(f"{m}: {e}" for m, e in failures) or "no model configured", failures, aborted=aborted)


def call_cost(model: str, tokens_in: int, tokens_out: int) -> Decimal | None:
    """Cost in USD from settings.LLM_PRICES (model -> (USD per million tokens in, out)), when configured."""
    price = getattr(settings, "LLM_PRICES", {}).get(model)
    if not price:
        return None
    per_million = Decimal(str(price[0])) * tokens_in + Decimal(str(price[1])) * tokens_out
    return (per_million / Decimal(1_000_000)).quantize(COST_PLACES)
