"""A model provider no test imports on its own: `providers_import` must import it (tests/agents/test_gateway.py)."""

from __future__ import annotations

from typing import Any

from agents.llm.gateway import ProviderAnswer


def answer(*, purpose: str, model: str, messages: Any, ends_at: float | None = None, options: Any = None) -> ProviderAnswer:
    return ProviderAnswer(text=f"{purpose} by {model}")
