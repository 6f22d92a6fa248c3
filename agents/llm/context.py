"""The `CONTEXT: {...}` line that ends every prompt: the structured inputs of a call as one-line JSON.

Real models may read it; the offline rules model answers from it alone, so its keys are a contract
between the prompt builders (planning/engine/prompts.py, goals/) and agents/offline_model.py.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

CONTEXT_PREFIX = "CONTEXT: "


def context_line(context: Mapping[str, Any]) -> str:
    """The context as one line (json.dumps escapes newlines)."""
    return CONTEXT_PREFIX + json.dumps(context, ensure_ascii=False, default=str)


def prompt_context(messages: Sequence[Mapping[str, str]]) -> dict[str, Any]:
    """The CONTEXT JSON of the last message ({} if there is none or it is not valid JSON)."""
    if not messages:
        return {}
    content = str(messages[-1].get("content", ""))
    for line in reversed(content.splitlines()):
        if line.startswith(CONTEXT_PREFIX):
            try:
                value = json.loads(line[len(CONTEXT_PREFIX) :])
            except ValueError:
                return {}
            return value if isinstance(value, dict) else {}
    return {}


def percent(value: float) -> str:
    """A satisfaction or confidence in [0, 1] as the prompts show it: "42%"."""
    return f"{round(float(value) * 100)}%"


def needs_text(needs: Mapping[str, float]) -> str:
    """Needs, most urgent first, as one prompt line."""
    if not needs:
        return "(none)"
    return ", ".join(f"{name}: {percent(value)}" for name, value in sorted(needs.items(), key=lambda kv: kv[1]))


def bullets(items: Sequence[str], empty: str = "(none)") -> str:
    """Items as a bulleted prompt list, each on one line."""
    lines = [f"- {' '.join(str(item).split())}" for item in items if str(item).strip()]
    return "\n".join(lines) if lines else empty
