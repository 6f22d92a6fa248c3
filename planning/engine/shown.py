"""What an operator approves, as shown, and the fingerprint that binds an approval to it.

Pure: plain values in, plain values out.

- `input_preview`: a step's tool input in one line, paths as they are and long texts (the content a step writes)
  cut to a preview that says how long the whole is. The caller escapes it (the page's autoescape, plan_rows' `e`).
- `steps_fingerprint`: a short digest of the steps as rendered (what they do, with which input, in which
  order). The approve forms carry it; a plan whose steps changed since the page was opened (an edit, a new
  version) is refused: "The plan changed since you opened it. Nothing was changed."
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping
from typing import Any

PREVIEW_CHARS = 120  # of one text value (the content a step writes)
PLAN_CHANGED = "The plan changed since you opened it. Nothing was changed."
FINGERPRINT_FIELDS = ("key", "description", "tool", "input", "action_hint", "requires_permission", "depends_on",
                      "loop")


def value_preview(value: Any, limit: int = PREVIEW_CHARS) -> str:
    """One input value in one line: a long text cut with its length said, a list or object as compact JSON."""
    if isinstance(value, str):
        flat = value.replace("\r\n", "\n").replace("\n", "\u23ce")  # a visible line break: ⏎
        if len(flat) <= limit:
            return json.dumps(flat, ensure_ascii=False)
        return json.dumps(flat[:limit], ensure_ascii=False)[:-1] + f'…" ({len(value):,} characters)'
    text = json.dumps(value, ensure_ascii=False)
    return text if len(text) <= limit else text[:limit] + f"… ({len(text):,} characters)"


# What a step reads first, then what it writes, then how: one order whatever the database kept the keys in
# (PostgreSQL's jsonb orders them by length).
INPUT_ORDER = ("path", "paths", "folder", "source", "to", "output", "destination", "format", "to_format", "content")


def input_preview(tool_input: Mapping[str, Any], limit: int = PREVIEW_CHARS) -> str:
    """`path="data.csv", content="# Notes⏎…" (2,400 characters)`: every key with its value's preview."""
    def rank(key: str) -> tuple[int, str]:
        return (INPUT_ORDER.index(key) if key in INPUT_ORDER else len(INPUT_ORDER), key)

    return ", ".join(f"{key}={value_preview(tool_input[key], limit)}" for key in sorted(tool_input, key=rank))


def steps_fingerprint(steps: Iterable[Mapping[str, Any]]) -> str:
    """16 hex digits over the steps' FINGERPRINT_FIELDS, in the order given (the plan page's order)."""
    rows = [[step.get(name) for name in FINGERPRINT_FIELDS] for step in steps]
    digest = hashlib.sha256(json.dumps(rows, sort_keys=True, ensure_ascii=False, default=str).encode("utf-8"))
    return digest.hexdigest()[:16]
