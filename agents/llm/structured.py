"""What a call asks of a model server besides the messages: the answer's JSON Schema, its limits, its format.

Per model (LLM_MODEL_SETTINGS, one JSON object per model name; LLM_FORMAT and LLM_CONTEXT_TOKENS are the
defaults for models not listed):

- `format`: how the schema is sent.
  `json_schema`: `response_format={"type": "json_schema", ...}` (OpenAI, vLLM, llama.cpp's llama-server);
  `json_object`: `response_format={"type": "json_object", "schema": ...}` (llama-cpp-python's server);
  `ollama`: Ollama's own `format` field holding the schema; `off`: the prompt alone asks for JSON.
- `context`: the model's context size in tokens (0: unknown); prompts are trimmed and `max_tokens` lowered
  so that prompt and answer fit.
- `small`: a small model (<= ~3B): no reflection calls (their hints do not help it), the shortest prompts. Unset, it
  follows the parameter count in the model's name or its server's id for it ("135M", "1.5B": small; "7b": not).

A model's settings are found by the name the server reports for it: the key matches the model's name with any
case, and also any name `/v1/models` lists for it (a server serving one model answers to any name, so its one id is
an alias; a llama.cpp id such as `models/SmolLM2-135M-Instruct.Q4_1.gguf` also matches `SmolLM2-135M-Instruct`).

Formats are found, not configured: a server that refuses the format (an HTTP 400/422 naming `response_format`,
`format`, `json_schema` or `schema`, or a 500 whose body is a validation error about it, as llama-cpp-python's
server answers `json_schema`) is asked again at once in the next format. The finding is remembered per server and
model in this process and in the cache (settings.CACHES: every process of a scale-out learns it, the usage page
shows it), logged once, and kept for LLM_FORMAT_MEMORY_SECONDS (a server upgrade is tried again after that).
"""

from __future__ import annotations

import json
import logging
import math
import re
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from django.conf import settings
from django.core.cache import cache
from django.utils.module_loading import import_string

logger = logging.getLogger("planner.llm")

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
    small_from: str = ""  # why `small` holds: "settings", or the size read from the model's name ("135M")


QUANTIZATION = re.compile(r"[.\-_](q\d[\w]*|iq\d[\w]*|f16|f32|bf16|fp16)$", re.IGNORECASE)


def name_forms(name: str) -> set[str]:
    """The ways one model's name is written: any case, without a folder, without `.gguf` and a quantization."""
    lowered = name.strip().lower()
    base = lowered.rsplit("/", 1)[-1]
    stem = base.removesuffix(".gguf")
    return {form for form in (lowered, base, stem, QUANTIZATION.sub("", stem)) if form}


def provider_name(model: str) -> str:
    """The provider serving `model` in settings.LLM_PROVIDERS: the one listing it, else the one listing "*"
    ("" when none does)."""
    providers: Mapping[str, Mapping[str, Any]] = settings.LLM_PROVIDERS
    for wanted in (model, "*"):
        for name, provider in providers.items():
            if wanted in provider.get("models", ()):
                return name
    return ""


def model_aliases(model: str) -> list[str]:
    """The other names the model's server reports for `model` (its provider's `list` in LLM_PROVIDERS: the ids
    `/v1/models` lists); empty when the provider lists nothing or the server does not answer."""
    provider: Mapping[str, Any] = settings.LLM_PROVIDERS.get(provider_name(model), {})
    if not provider.get("list"):
        return []
    served: list[str] = list(import_string(provider["list"])())
    if len(served) == 1:
        return served  # a one-model server answers whatever name it is asked by
    forms = name_forms(model)
    return [name for name in served if name_forms(name) & forms]


def model_settings_key(model: str) -> str | None:
    """The key of LLM_MODEL_SETTINGS that holds `model`'s settings: its exact name, else any spelling of it, else
    of a name its server reports for it (see the module's docstring); None when none matches."""
    table: Mapping[str, Any] = getattr(settings, "LLM_MODEL_SETTINGS", {}) or {}
    if not table:
        return None
    if model in table:
        return model
    forms = name_forms(model)
    for key in table:
        if name_forms(key) & forms:
            return key
    for alias in model_aliases(model):
        alias_forms = name_forms(alias)
        for key in table:
            if name_forms(key) & alias_forms:
                return key
    return None


def model_settings(model: str) -> dict[str, Any]:
    """`model`'s entry in LLM_MODEL_SETTINGS ({} when none matches)."""
    key = model_settings_key(model)
    return {} if key is None else dict(settings.LLM_MODEL_SETTINGS[key] or {})


# A parameter count in a model's name: "SmolLM2-135M-Instruct", "qwen2.5:7b", "Qwen2.5-1.5B-Instruct". Not a digit
# or letter just before it ("8x7b" is a mixture of eight, "A3B" the active part of a larger one) or after it.
NAME_SIZE = re.compile(r"(?<![a-z0-9.])(\d+(?:\.\d+)?)([mb])(?![a-z0-9])", re.IGNORECASE)
SMALL_MAX_BILLIONS = 3.0  # up to ~3B parameters, a model is small (docs/models.md)


def name_size(name: str) -> tuple[float, str] | None:
    """The parameter count a model's name gives, in billions, and as written ("135M"); None when it gives none.
    The largest count wins when there are several."""
    found = [(float(number) / (1000.0 if unit.lower() == "m" else 1.0), f"{number}{unit.upper()}")
             for number, unit in NAME_SIZE.findall(name.rsplit("/", 1)[-1])]
    return max(found) if found else None


def model_size(model: str) -> tuple[float, str] | None:
    """`model`'s parameter count from its name, else from a name its server reports for it (a llama.cpp server's
    file name, `SmolLM2-135M-Instruct.Q4_1.gguf`, for `LLM_MODEL=local`)."""
    return name_size(model) or next(filter(None, (name_size(alias) for alias in model_aliases(model))), None)


def model_profile(model: str) -> ModelProfile:
    """The settings for `model`: its own entry in LLM_MODEL_SETTINGS over the defaults. `small`, when not set,
    follows the size in the model's name (up to SMALL_MAX_BILLIONS): a new user of a 135M model need set nothing."""
    own = model_settings(model)
    fmt = str(own.get("format", getattr(settings, "LLM_FORMAT", "json_schema")))
    if "small" in own:
        small, small_from = bool(own["small"]), "settings"
    else:
        size = model_size(model)
        small = size is not None and size[0] <= SMALL_MAX_BILLIONS
        small_from = f"{size[1]} in its name" if size else ""
    return ModelProfile(
        format=fmt if fmt in FORMATS else "off",
        context=int(own.get("context", getattr(settings, "LLM_CONTEXT_TOKENS", 0)) or 0),
        small=small,
        small_from=small_from,
    )


# Formats found: (server, model) -> the format to use after refusals, and the models whose format answered.
_found: dict[str, str] = {}
_confirmed: set[str] = set()
_looked_up: set[str] = set()  # keys already read from the cache by this process
_found_lock = threading.Lock()
FOUND_INDEX = "llm-format:index"


def format_key(model: str) -> str:
    """Where a model's finding is kept: its server and its name (any case)."""
    return f"{getattr(settings, 'OPENAI_BASE_URL', '')}|{model.strip().lower()}"


def _cache_key(key: str) -> str:
    return "llm-format:" + key.replace(" ", "_")[:200]


def format_found(model: str) -> dict[str, Any] | None:
    """What was found about `model`'s formats ({"format", "refused", "reason", "at"}), None when nothing was."""
    try:
        found = cache.get(_cache_key(format_key(model)))
    except Exception:  # the cache away (Redis down): process memory alone
        return None
    return found if isinstance(found, dict) else None


def format_for(model: str) -> str:
    """The format to send `model` now: what earlier refusals left (this process's, or another's through the
    cache), else its setting."""
    key = format_key(model)
    with _found_lock:
        known = _found.get(key)
        looked = key in _looked_up
        _looked_up.add(key)
    if known:
        return known
    if not looked:
        found = format_found(model)
        if found and found.get("format") in FORMATS:
            with _found_lock:
                _found[key] = str(found["format"])
            return str(found["format"])
    return model_profile(model).format


def format_confirmed(model: str) -> None:
    """`model`'s server answered in the format it was sent: no probing of it any more."""
    with _found_lock:
        _confirmed.add(format_key(model))


def format_is_confirmed(model: str) -> bool:
    with _found_lock:
        return format_key(model) in _confirmed


def format_refused(model: str, fmt: str, reason: str = "") -> str:
    """Remember that `model`'s server refused `fmt` (here and in the cache), logged once; the format to use
    instead."""
    following = FORMAT_FALLBACK.get(fmt, "off")
    key = format_key(model)
    with _found_lock:
        _found[key] = following
    earlier = format_found(model) or {}
    if earlier.get("format") == following:
        return following  # another process found it first and logged it
    refused = [*[str(f) for f in earlier.get("refused", []) if f != fmt], fmt]
    record = {"model": model, "server": getattr(settings, "OPENAI_BASE_URL", ""), "format": following,
              "refused": refused, "reason": " ".join(reason.split())[:300],
              "at": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())}
    logger.warning("model %s refused the %s format (%s): it is sent %s from now on", model, fmt,
                   record["reason"] or "no reason given", following if following != "off" else "no format")
    seconds = float(getattr(settings, "LLM_FORMAT_MEMORY_SECONDS", 7 * 24 * 3600)) or None
    try:
        cache.set(_cache_key(key), record, seconds)
        index = [k for k in (cache.get(FOUND_INDEX) or []) if k != key][-99:]
        cache.set(FOUND_INDEX, [*index, key], seconds)
    except Exception:  # the cache away: this process still knows
        logger.warning("the format found for %s could not be shared through the cache", model)
    return following


def formats_found() -> list[dict[str, Any]]:
    """Every finding still kept (the usage page): model, server, format, refused formats, reason, when."""
    try:
        keys = list(cache.get(FOUND_INDEX) or [])
        found = cache.get_many([_cache_key(k) for k in keys])
    except Exception:
        return []
    return [found[_cache_key(k)] for k in keys if isinstance(found.get(_cache_key(k)), dict)]


def formats_forget(*, process_only: bool = False) -> None:
    """Forget every finding, here and in the cache (tests; a server that was upgraded); `process_only`: this
    process's memory alone (what a fresh process knows)."""
    with _found_lock:
        keys = {*_found, *_confirmed, *_looked_up}
        _found.clear()
        _confirmed.clear()
        _looked_up.clear()
    if process_only:
        return
    try:
        keys |= set(cache.get(FOUND_INDEX) or [])
        cache.delete_many([_cache_key(k) for k in keys] + [FOUND_INDEX])
    except Exception:
        pass


REFUSAL_WORDS = ("response_format", "json_schema", "schema", "format", "grammar")
VALIDATION_WORDS = ("validation error", "input should be", "literal_error", "unsupported", "not supported")
FORMAT_WORDS = ("response_format", "json_schema", "json_object")


def is_format_refusal(status: int, message: str) -> bool:
    """Whether an HTTP error is the server refusing the response format (not the prompt or the model): a 400 or
    422 naming it, or a 500 whose body is a validation error about it (llama-cpp-python's answer to
    `json_schema`: "Input should be 'text' or 'json_object'")."""
    lowered = message.lower()
    if status in (400, 422):
        return any(word in lowered for word in REFUSAL_WORDS)
    if status == 500:
        return any(word in lowered for word in VALIDATION_WORDS) and any(word in lowered for word in FORMAT_WORDS)
    return False


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
    plan_id: int | None = None  # the plan the call is for: its cancel stops the call (agents/llm/limits.py)
    stream: bool = False  # the answer streamed: a call stopped early stops the server computing it (limits.py)


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
