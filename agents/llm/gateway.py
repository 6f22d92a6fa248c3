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
from typing import Any

from django.conf import settings

from agents.llm.offline import OFFLINE_MODEL, OFFLINE_MODELS, SLOPPY_MODEL, offline_complete, sloppy_complete
from agents.models import LLMCall

logger = logging.getLogger("planner.llm")

FAST_PURPOSES = {"restate", "reflect", "goals", "milestone", "decide"}
COST_PLACES = Decimal("0.000001")  # LLMCall.cost keeps six decimal places
ERROR_CHARS = 5000


class LLMError(Exception):
    """Every model in the chain failed; the message lists each model's error."""

    def __init__(self, message: str, errors: Sequence[str] = ()) -> None:
        super().__init__(message)
        self.errors = list(errors)  # "model: error", one per model tried


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
    it has one, else the purpose's own chain (e.g. REFLECT_MODELS), else PLANNER_MODELS / FAST_MODELS."""
    key = "fast" if purpose in FAST_PURPOSES else "planner"
    own = [m.strip() for m in agent_models.split(",") if m.strip()]
    if own and key == "planner":
        return own
    by_purpose = getattr(settings, "LLM_PURPOSE_MODELS", {}).get(purpose)
    return list(by_purpose or settings.LLM_MODELS.get(key) or [OFFLINE_MODEL])


def provider_name(model: str) -> str:
    return "offline" if model in OFFLINE_MODELS else "openai"


def offline_answer(purpose: str, messages: Sequence[Mapping[str, str]], model: str = OFFLINE_MODEL) -> ProviderAnswer:
    text = (sloppy_complete if model == SLOPPY_MODEL else offline_complete)(purpose, messages)
    # Offline "tokens" are words, so the call log and cost columns stay meaningful in the demo.
    return ProviderAnswer(
        text=text,
        tokens_in=sum(len(m["content"].split()) for m in messages),
        tokens_out=len(text.split()),
    )


def provider_complete(purpose: str, model: str, messages: Sequence[Mapping[str, str]]) -> ProviderAnswer:
    if model in OFFLINE_MODELS:
        return offline_answer(purpose, messages, model)
    from agents.llm.openai_provider import openai_complete

    return openai_complete(model=model, messages=messages)


def error_text(exc: BaseException) -> str:
    """`Type: message`, plus the cause the SDK hides behind e.g. "Connection error."."""
    text = f"{type(exc).__name__}: {exc}"
    cause = exc.__cause__
    if cause is not None and str(cause) and str(cause) not in text:
        text += f" ({type(cause).__name__}: {cause})"
    return text


def _call_fields(
    *, purpose: str, model: str, messages: Sequence[Mapping[str, str]], agent_id: int | None,
    plan_id: int | None, latency_ms: int, answer: ProviderAnswer | None = None, error: str = "",
) -> dict[str, Any]:
    """The LLMCall row for one attempt: an answer, or the error that made the chain move on."""
    fields: dict[str, Any] = {
        "agent_id": agent_id, "plan_id": plan_id, "purpose": purpose, "provider": provider_name(model),
        "model": model, "prompt": [dict(m) for m in messages], "latency_ms": latency_ms,
    }
    if answer is None:
        fields["error"] = error[:ERROR_CHARS]
    else:
        fields.update(
            response=answer.text, tokens_in=answer.tokens_in, tokens_out=answer.tokens_out,
            cost=call_cost(model, answer.tokens_in, answer.tokens_out),
        )
    return fields


def _elapsed_ms(started: float) -> int:
    return int((time.perf_counter() - started) * 1000)


def _failed(purpose: str, model: str, exc: Exception, errors: list[str]) -> str:
    error = error_text(exc)
    errors.append(f"{model}: {error}")
    logger.warning("LLM %s via %s failed: %s", purpose, model, error)
    return error


def _result(model: str, answer: ProviderAnswer, call: LLMCall, latency_ms: int) -> LLMResult:
    return LLMResult(
        text=answer.text, model=model, call_id=call.pk, tokens_in=answer.tokens_in,
        tokens_out=answer.tokens_out, latency_ms=latency_ms,
    )


def _chain_error(errors: list[str]) -> LLMError:
    return LLMError("; ".join(errors) or "no model configured", errors)


def llm_complete(
    *,
    purpose: str,
    messages: Sequence[Mapping[str, str]],
    models: Sequence[str] | None = None,
    agent_id: int | None = None,
    plan_id: int | None = None,
) -> LLMResult:
    """Ask the first model of the chain that answers; record every call, failed or not."""
    chain = list(models) if models else model_chain(purpose)
    errors: list[str] = []
    for model in chain:
        started = time.perf_counter()
        try:
            answer = provider_complete(purpose, model, messages)
        except Exception as exc:  # any provider failure hands over to the next model
            latency = _elapsed_ms(started)
            error = _failed(purpose, model, exc, errors)
            LLMCall.objects.create(**_call_fields(
                purpose=purpose, model=model, messages=messages, agent_id=agent_id, plan_id=plan_id,
                latency_ms=latency, error=error,
            ))
            continue
        latency = _elapsed_ms(started)
        call = LLMCall.objects.create(**_call_fields(
            purpose=purpose, model=model, messages=messages, agent_id=agent_id, plan_id=plan_id,
            latency_ms=latency, answer=answer,
        ))
        return _result(model, answer, call, latency)
    raise _chain_error(errors)


def call_cost(model: str, tokens_in: int, tokens_out: int) -> Decimal | None:
    """Cost in USD from settings.LLM_PRICES (model -> (USD per million tokens in, out)), when configured."""
    price = getattr(settings, "LLM_PRICES", {}).get(model)
    if not price:
        return None
    per_million = Decimal(str(price[0])) * tokens_in + Decimal(str(price[1])) * tokens_out
    return (per_million / Decimal(1_000_000)).quantize(COST_PLACES)
