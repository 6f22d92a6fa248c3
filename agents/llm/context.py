"""The `CONTEXT: {...}` line that ends every prompt: the structured inputs of a call as one-line JSON.

Real models may read it; the offline rules model answers from it alone, so its keys are a contract
between the prompt builders (planning/engine/prompts.py, goals/) and agents/llm/offline.py.
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
