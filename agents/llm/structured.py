"""What a call asks of a model server besides the messages: the answer's JSON Schema, its limits, its format.

Per model (LLM_MODEL_SETTINGS, one JSON object per model name; LLM_FORMAT and LLM_CONTEXT_TOKENS are the
defaults for models not listed):

- `format`: how the schema is sent.
  `json_schema`: `response_format={"type": "json_schema", ...}` (OpenAI, vLLM, llama.cpp's llama-server);
  `json_object`: `response_format={"type": "json_object", "schema": ...}` (llama-cpp-python's server);
  `ollama`: Ollama's own `format` field holding the schema; `off`: the prompt alone asks for JSON.
- `context`: the model's context size in tokens (0: unknown); prompts are trimmed and `max_tokens` lowered
  so that prompt and answer fit.
- `small`: a small model (<= ~3B): no reflection calls (their hints do not help it), the shortest prompts.

A server that refuses the format (an HTTP 400/422 naming `response_format`, `format`, `json_schema` or
`schema`) is asked again at once without it, and the refusal is remembered for that model by this process
(in memory: a restart tries the format again, which is what a server upgrade needs).
"""

from __future__ import annotations

import json
import math
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from django.conf import settings

FORMATS = ("json_schema", "json_object", "ollama", "off")
# After a refusal, the next format to try ("json_schema" servers that do not know it often take a schema
# under "json_object", like llama-cpp-python's); "off" ends the chain.
FORMAT_FALLBACK = {"json_schema": "json_object", "json_object": "off", "ollama": "off", "off": "off"}
CHARS_PER_TOKEN = 3.2  # an estimate for English and JSON with the common tokenizers; no tokenizer needed
MIN_ANSWER_TOKENS = 64  # below this, an answer cannot hold a plan: trim the prompt instead


@dataclass(frozen=True)
class Limits:
    """A purpose's bounds on one answer."""

    max_tokens: int
    temperature: float | None = None
    stop: tuple[str, ...] = ("</json>",)
    small_max_tokens: int = 0  # for a model marked small (its plans are short; its runaways are long)


# The answers' sizes: a plan of 3-6 tool steps is 250-600 tokens; the rest are a few lines.
PURPOSE_LIMITS: Mapping[str, Limits] = {
    "plan": Limits(max_tokens=900, temperature=0.1, small_max_tokens=300),
    "replan": Limits(max_tokens=900, temperature=0.1, small_max_tokens=300),
    "restate": Limits(max_tokens=160, temperature=0.1),
    "reflect": Limits(max_tokens=200, temperature=0.2),
    "goals": Limits(max_tokens=500, temperature=0.7),
    "milestone": Limits(max_tokens=120, temperature=0.0),
    "decide": Limits(max_tokens=100, temperature=0.3),
}


@dataclass(frozen=True)
class ModelProfile:
    """One model's settings (see the module's docstring)."""

    format: str = "json_schema"
    context: int = 0
    small: bool = False


def model_profile(model: str) -> ModelProfile:
    """The settings for `model`: its own entry in LLM_MODEL_SETTINGS over the defaults."""
    own = dict(getattr(settings, "LLM_MODEL_SETTINGS", {}).get(model) or {})
    fmt = str(own.get("format", getattr(settings, "LLM_FORMAT", "json_schema")))
    return ModelProfile(
        format=fmt if fmt in FORMATS else "off",
        context=int(own.get("context", getattr(settings, "LLM_CONTEXT_TOKENS", 0)) or 0),
        small=bool(own.get("small", False)),
    )


_refused: dict[str, str] = {}  # model -> the format this process uses for it after a refusal
_refused_lock = threading.Lock()


def format_for(model: str) -> str:
    """The format to send `model` now: its setting, or what is left after the refusals this process saw."""
    with _refused_lock:
        return _refused.get(model) or model_profile(model).format


def format_refused(model: str, fmt: str) -> str:
    """Remember that `model`'s server refused `fmt`; returns the format to use instead."""
    following = FORMAT_FALLBACK.get(fmt, "off")
    with _refused_lock:
        _refused[model] = following
    return following


def formats_forget() -> None:
    """Forget every refusal (tests; a server that was upgraded)."""
    with _refused_lock:
        _refused.clear()


REFUSAL_WORDS = ("response_format", "json_schema", "schema", "format", "grammar")


def is_format_refusal(status: int, message: str) -> bool:
    """Whether an HTTP error is the server refusing the response format (not the prompt or the model)."""
    lowered = message.lower()
    return status in (400, 422) and any(word in lowered for word in REFUSAL_WORDS)


def response_format_body(fmt: str, schema: Mapping[str, Any] | None, name: str) -> dict[str, Any]:
    """The request fields that carry `schema` in format `fmt` (empty for "off" or no schema)."""
    if schema is None or fmt == "off":
        return {}
    if fmt == "json_schema":
        return {"response_format": {"type": "json_schema",
                                    "json_schema": {"name": name, "schema": dict(schema), "strict": False}}}
    if fmt == "json_object":
        return {"response_format": {"type": "json_object", "schema": dict(schema)}}
    if fmt == "ollama":
        return {"format": dict(schema)}
    return {}


def tokens_estimate(messages: Sequence[Mapping[str, str]]) -> int:
    """About how many tokens the messages take (a few per message for the chat template)."""
    chars = sum(len(str(m.get("content", ""))) for m in messages)
    return math.ceil(chars / CHARS_PER_TOKEN) + 8 * len(messages)


@dataclass
class CallOptions:
    """What one call sends besides the messages."""

    schema: Mapping[str, Any] | None = None
    max_tokens: int | None = None
    temperature: float | None = None
    stop: tuple[str, ...] = ()
    name: str = "answer"
    extra: dict[str, Any] = field(default_factory=dict)


def call_options(purpose: str, model: str, messages: Sequence[Mapping[str, str]],
                 schema: Mapping[str, Any] | None = None) -> CallOptions:
    """The limits of `purpose`, `max_tokens` lowered to what the model's context leaves after the prompt."""
    limits = PURPOSE_LIMITS.get(purpose, Limits(max_tokens=600))
    profile = model_profile(model)
    max_tokens = limits.small_max_tokens if profile.small and limits.small_max_tokens else limits.max_tokens
    context = profile.context
    if context:
        max_tokens = max(min(max_tokens, context - tokens_estimate(messages)), MIN_ANSWER_TOKENS)
    return CallOptions(schema=schema, max_tokens=max_tokens, temperature=limits.temperature, stop=limits.stop,
                       name=purpose)


def prompt_budget(purpose: str, model: str) -> int | None:
    """How many prompt tokens leave room for a whole answer of `purpose` (None: the context is unknown)."""
    context = model_profile(model).context
    if not context:
        return None
    return max(context - PURPOSE_LIMITS.get(purpose, Limits(max_tokens=600)).max_tokens, context // 2)


def schema_text(schema: Mapping[str, Any]) -> str:
    return json.dumps(schema, separators=(",", ":"))
