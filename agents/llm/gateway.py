"""The LLM gateway: one entry point for every purpose, every call recorded as an LLMCall.

Providers: the built-in offline rules model (the default, deterministic, no network) and any
OpenAI-compatible server through the `openai` SDK. A chain of models is tried in order; a model that
errors hands over to the next one.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from django.conf import settings

from agents.llm.offline import OFFLINE_MODEL, offline_complete
from agents.models import LLMCall

logger = logging.getLogger("planner.llm")

FAST_PURPOSES = {"restate", "reflect", "goals", "milestone", "decide"}


class LLMError(Exception):
    """Every model in the chain failed; the message lists each model's error."""


@dataclass
class LLMResult:
    text: str
    model: str
    call_id: int
    tokens_in: int = 0
    tokens_out: int = 0
    latency_ms: int = 0


@dataclass
class ProviderAnswer:
    text: str
    tokens_in: int = 0
    tokens_out: int = 0


def model_chain(purpose: str) -> list[str]:
    """The models to try for a purpose, strongest first (settings PLANNER_MODELS / FAST_MODELS)."""
    key = "fast" if purpose in FAST_PURPOSES else "planner"
    return list(settings.LLM_MODELS.get(key) or [OFFLINE_MODEL])


def provider_name(model: str) -> str:
    return "offline" if model == OFFLINE_MODEL else "openai"


def provider_complete(purpose: str, model: str, messages: Sequence[Mapping[str, str]]) -> ProviderAnswer:
    if model == OFFLINE_MODEL:
        text = offline_complete(purpose, messages)
        # Offline "tokens" are words, so the call log and cost columns stay meaningful in the demo.
        return ProviderAnswer(
            text=text,
            tokens_in=sum(len(m["content"].split()) for m in messages),
            tokens_out=len(text.split()),
        )
    from agents.llm.openai_provider import openai_complete

    return openai_complete(model=model, messages=messages)


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
            latency = int((time.perf_counter() - started) * 1000)
            LLMCall.objects.create(
                agent_id=agent_id, plan_id=plan_id, purpose=purpose, provider=provider_name(model), model=model,
                prompt=list(messages), error=f"{type(exc).__name__}: {exc}"[:5000], latency_ms=latency,
            )
            errors.append(f"{model}: {type(exc).__name__}: {exc}")
            logger.warning("LLM %s via %s failed: %s", purpose, model, exc)
            continue
        latency = int((time.perf_counter() - started) * 1000)
        call = LLMCall.objects.create(
            agent_id=agent_id, plan_id=plan_id, purpose=purpose, provider=provider_name(model), model=model,
            prompt=list(messages), response=answer.text, tokens_in=answer.tokens_in, tokens_out=answer.tokens_out,
            latency_ms=latency, cost=call_cost(model, answer.tokens_in, answer.tokens_out),
        )
        return LLMResult(
            text=answer.text, model=model, call_id=call.pk, tokens_in=answer.tokens_in,
            tokens_out=answer.tokens_out, latency_ms=latency,
        )
    raise LLMError("; ".join(errors) or "no model configured")


def call_cost(model: str, tokens_in: int, tokens_out: int):  # type: ignore[no-untyped-def]
    """Cost from LLM_PRICES (model -> USD per million tokens in/out), when configured."""
    from decimal import Decimal

    price = getattr(settings, "LLM_PRICES", {}).get(model)
    if not price:
        return None
    return (Decimal(str(price[0])) * tokens_in + Decimal(str(price[1])) * tokens_out) / Decimal(1_000_000)
