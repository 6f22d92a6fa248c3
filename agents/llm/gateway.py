"""The LLM gateway: one entry point for every purpose, every call recorded as an LLMCall.

Providers: the built-in offline rules model (the default, deterministic, no network) and any
OpenAI-compatible server through the `openai` SDK. A chain of models is tried in order; a model that
errors hands over to the next one. `llm_complete` is called from sync code (services, the runner's agent
threads); an HTTP model's answer is still awaited on the runner's event loop (see openai_provider).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from decimal import Decimal

from django.conf import settings

from agents.llm.offline import OFFLINE_MODEL, OFFLINE_MODELS, SLOPPY_MODEL, offline_complete, sloppy_complete
from agents.models import LLMCall
from planner_site import statements

logger = logging.getLogger("planner.llm")

FAST_PURPOSES = {"restate", "reflect", "goals", "milestone", "decide"}
COST_PLACES = Decimal("0.000001")  # LLMCall.cost keeps six decimal places
ERROR_CHARS = 5000
RESPONSE_STORED_BYTES = 64 * 1024  # one long-winded model must not fill the database or the plan page


class LLMError(Exception):
    """Every model in the chain failed; the message lists each model's error."""

    def __init__(self, message: str, errors: Sequence[tuple[str, str]] = ()) -> None:
        super().__init__(message)
        self.failures = list(errors)  # (model, error), one per model tried

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
    """The answer of the first model that answered, and the LLMCall recording it."""

    text: str
    model: str
    call_id: int
    tokens_in: int = 0
    tokens_out: int = 0
    latency_ms: int = 0


@dataclass
class ProviderAnswer:
    """What a provider returns for one call."""

    text: str
    tokens_in: int = 0
    tokens_out: int = 0


def model_chain(purpose: str, *, agent_models: str = "") -> list[str]:
    """The models to try for a purpose, strongest first: the agent's own planner chain for planning, when
    it has one, else the purpose's own chain (e.g. REPLAN_MODELS), else PLANNER_MODELS / FAST_MODELS."""
    key = "fast" if purpose in FAST_PURPOSES else "planner"
    own = [m.strip() for m in agent_models.split(",") if m.strip()]
    if own and key == "planner":
        return own
    by_purpose = getattr(settings, "LLM_PURPOSE_MODELS", {}).get(purpose)
    return list(by_purpose or settings.LLM_MODELS.get(key) or [OFFLINE_MODEL])


def provider_name(model: str) -> str:
    return "offline" if model in OFFLINE_MODELS else "openai"


def provider_complete(
    purpose: str, model: str, messages: Sequence[Mapping[str, str]], *, ends_at: float | None = None
) -> ProviderAnswer:
    """One call to one model, over by `ends_at` (time.monotonic()), retries included; the offline model
    answers at once and needs no bound."""
    if model in OFFLINE_MODELS:
        text = (sloppy_complete if model == SLOPPY_MODEL else offline_complete)(purpose, messages)
        # Offline "tokens" are words, so the call log and cost columns stay meaningful in the demo.
        return ProviderAnswer(
            text=text, tokens_in=sum(len(m["content"].split()) for m in messages), tokens_out=len(text.split())
        )
    from agents.llm.openai_provider import openai_complete

    return openai_complete(model=model, messages=messages, ends_at=ends_at)


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
) -> LLMResult:
    """Ask the first model of the chain that answers; record every call, failed or not.

    With a deadline, each call may take only the time that remains, and once it has passed no further
    model is asked: LLMDeadlineError.
    """
    chain = list(models) if models else model_chain(purpose)
    failures: list[tuple[str, str]] = []
    row = {"agent_id": agent_id, "plan_id": plan_id, "purpose": purpose, "prompt": [dict(m) for m in messages]}
    for model in chain:
        if deadline is not None and deadline.expired:
            break
        started = time.perf_counter()
        try:
            answer = provider_complete(purpose, model, messages, ends_at=deadline.ends_at if deadline else None)
        except Exception as exc:  # any provider failure hands over to the next model
            error = error_text(exc)
            failures.append((model, error))
            logger.warning("LLM %s via %s failed: %s", purpose, model, error)
            statements.insert([LLMCall(**row, provider=provider_name(model), model=model, error=error[:ERROR_CHARS],
                                       latency_ms=int((time.perf_counter() - started) * 1000))])
            continue
        latency = int((time.perf_counter() - started) * 1000)
        call = LLMCall(
            **row, provider=provider_name(model), model=model, latency_ms=latency, response=response_stored(answer.text),
            tokens_in=answer.tokens_in, tokens_out=answer.tokens_out,
            cost=call_cost(model, answer.tokens_in, answer.tokens_out),
        )
        statements.insert([call])  # one per model call: its SQL written once (planner_site/statements.py)
        return LLMResult(text=answer.text, model=model, call_id=call.pk, tokens_in=answer.tokens_in,
                         tokens_out=answer.tokens_out, latency_ms=latency)
    if deadline is not None and deadline.expired:
        message = f"no model answered within {deadline.seconds:g} s"
        raise LLMDeadlineError("; ".join([message, *(f"{m}: {e}" for m, e in failures)]), failures)
    raise LLMError("; ".join(f"{m}: {e}" for m, e in failures) or "no model configured", failures)


def call_cost(model: str, tokens_in: int, tokens_out: int) -> Decimal | None:
    """Cost in USD from settings.LLM_PRICES (model -> (USD per million tokens in, out)), when configured."""
    price = getattr(settings, "LLM_PRICES", {}).get(model)
    if not price:
        return None
    per_million = Decimal(str(price[0])) * tokens_in + Decimal(str(price[1])) * tokens_out
    return (per_million / Decimal(1_000_000)).quantize(COST_PLACES)
