"""What people and models type, checked before anything reaches the database.

The operator's forms, the admin, the API and the services refuse the same text and JSON values the same
way, with a message that says what is wrong. Plain values in, a problem (or None) out.
"""

from __future__ import annotations

import json
import math
import unicodedata
from typing import Any

# JSON a step may carry: a tool's input is a handful of paths and options, never a document.
JSON_MAX_CHARS = 20_000
JSON_MAX_DEPTH = 20
JSON_MAX_NODES = 2_000
JSON_MAX_INT_DIGITS = 18  # fits a 64-bit integer; PostgreSQL and browsers agree on such numbers

# Explicit embeddings, overrides and isolates make text display as something else ("Trojan Source"); the
# invisible direction marks (LRM, RLM, ALM) reorder neighbouring text just as silently.
BIDI_CONTROLS = frozenset("\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069\u200e\u200f\u061c")
ALLOWED_CONTROLS = frozenset("\t\n\r")


class InputError(ValueError):
    """A value that cannot be accepted; the message says why, in words for the person who typed it."""


def char_problem(text: str) -> str | None:
    """Why one of the characters of `text` cannot be stored or shown faithfully, or None."""
    for ch in text:
        if ch == "\x00":
            return "contains a NUL character (U+0000)"
        category = unicodedata.category(ch)
        if category == "Cs":
            return f"contains an invalid character (a lone surrogate, U+{ord(ch):04X})"
        if category == "Cc" and ch not in ALLOWED_CONTROLS:
            return f"contains a control character (U+{ord(ch):04X})"
        if ch in BIDI_CONTROLS:
            return f"contains a bidirectional control character (U+{ord(ch):04X}) that changes how it displays"
    return None


def text_shown_plainly(text: str) -> str:
    """`text` with every character char_problem refuses written out as its code (`\\u202e`), for exports of rows
    stored before the validators existed: what a spreadsheet or terminal shows is what the row holds."""
    return "".join(
        f"\\u{ord(ch):04x}" if ch in BIDI_CONTROLS or (unicodedata.category(ch) in ("Cc", "Cs") and ch not in ALLOWED_CONTROLS)
        else ch for ch in text)


def text_problem(text: str, *, max_length: int | None = None) -> str | None:
    """Why `text` cannot be stored, or None: too long, a NUL, a lone surrogate, a control character."""
    if max_length is not None and len(text) > max_length:
        return f"is too long ({len(text)} characters; at most {max_length})"
    return char_problem(text)


def json_problem(value: Any, *, max_depth: int = JSON_MAX_DEPTH, max_nodes: int = JSON_MAX_NODES) -> str | None:
    """Why a JSON value cannot be stored, or None. Walks the value without recursion, so no depth of
    nesting can exhaust the stack."""
    stack: list[tuple[Any, int]] = [(value, 1)]
    nodes = 0
    while stack:
        item, depth = stack.pop()
        nodes += 1
        if depth > max_depth:
            return f"is nested too deeply (more than {max_depth} levels)"
        if nodes > max_nodes:
            return f"is too large (more than {max_nodes} values)"
        if isinstance(item, bool) or item is None:
            continue
        if isinstance(item, int):
            if abs(item) >= 10**JSON_MAX_INT_DIGITS:
                return f"has a number too large (more than {JSON_MAX_INT_DIGITS} digits)"
        elif isinstance(item, float):
            if not math.isfinite(item):
                return "has a number that is not finite (NaN or Infinity)"
        elif isinstance(item, str):
            if problem := char_problem(item):
                return f"has a text that {problem}"
        elif isinstance(item, list | tuple):
            stack.extend((v, depth + 1) for v in item)
        elif isinstance(item, dict):
            for key, v in item.items():
                if not isinstance(key, str):
                    return "has a key that is not a text"
                if problem := char_problem(key):
                    return f"has a key that {problem}"
                stack.append((v, depth + 1))
        else:
            return f"has a value that is not JSON ({type(item).__name__})"
    return None


def _int_parse(digits: str) -> int:
    # Before Python's own limit (4,300 digits) raises a bare ValueError deep inside the parser.
    if len(digits.lstrip("-")) > JSON_MAX_INT_DIGITS:
        raise InputError(f"has a number too large (more than {JSON_MAX_INT_DIGITS} digits)")
    return int(digits)


def _constant_refuse(name: str) -> float:
    raise InputError(f"has {name}, which is not a JSON number")


def json_parse(raw: str) -> Any:
    """Parse JSON typed by a person: the value, or InputError saying what is wrong (never another error)."""
    if len(raw) > JSON_MAX_CHARS:
        raise InputError(f"is too long ({len(raw)} characters; at most {JSON_MAX_CHARS})")
    try:
        value = json.loads(raw, parse_int=_int_parse, parse_constant=_constant_refuse)
    except json.JSONDecodeError as exc:
        raise InputError(f"is not valid JSON: {exc.msg} (line {exc.lineno}, column {exc.colno})") from None
    except RecursionError:
        raise InputError(f"is nested too deeply (more than {JSON_MAX_DEPTH} levels)") from None
    except ValueError as exc:  # InputError from the hooks above, or a number Python refuses
        if isinstance(exc, InputError):
            raise
        raise InputError(f"has a value that cannot be read: {exc}") from None
    if problem := json_problem(value):
        raise InputError(problem)
    return value
