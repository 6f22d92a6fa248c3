"""Values a model writes when it has nothing to say: "...", "string", the prompts' own example values.

Every purpose refuses them (a restatement "Who ...", a milestone explained by "...", a plan copied from the
worked example), and persona answers that are prose or code rather than a short line are refused too:
nothing of the kind is stored as a goal, a step or an explanation.
"""

from __future__ import annotations

import re
import threading

GENERIC = frozenset({
    "...", "\u2026", "string", "str", "text", "value", "todo", "tbd", "n/a", "na", "none", "null", "placeholder",
    "example", "your question", "description", "explanation", "reason", "hint", "who", "what", "when", "where",
    "why", "lorem ipsum",
})
_ONLY_MARKS = re.compile(r"^[\W_]*$")
# "<your text>", "[insert here]"; not "{item}", a loop's mark.
_ANGLE = re.compile(r"^<[^<>]{0,60}>$|^\[[^\[\]]{0,60}\]$")

_examples: set[str] = set()
_examples_lock = threading.Lock()


def _normal(text: str) -> str:
    return " ".join(str(text).lower().split()).strip(" .!")


def examples_register(*values: str) -> None:
    """Values a prompt shows as its example: an answer that gives one back copied the example."""
    with _examples_lock:
        _examples.update(_normal(v) for v in values if len(_normal(v)) >= 3)


def is_example(value: str) -> bool:
    with _examples_lock:
        return _normal(value) in _examples


def is_placeholder(value: object) -> bool:
    """Empty, only punctuation ("...", "—"), a generic word ("string", "TBD") or a <slot> / [slot]."""
    if not isinstance(value, str):
        return False
    text = value.strip()
    if text in (".", "./"):
        return False  # the workspace folder itself, as a path
    return bool(_ONLY_MARKS.match(text) or _normal(text) in GENERIC or _ANGLE.match(text))


def placeholder_or_example(value: object, *, goal: str = "") -> str:
    """Why `value` is no answer ("a placeholder", "the prompt's example"), or "" when it may be one.
    An example value the goal itself contains is the goal's own word, not a copy."""
    if is_placeholder(value):
        return "a placeholder"
    if isinstance(value, str) and is_example(value) and _normal(value) not in _normal(goal):
        return "the prompt's example"
    return ""


_PROSE_OPENERS = re.compile(
    r"^(?:sure|certainly|of course|here(?:'s| is| are)|as an ai|i (?:can|cannot|can't|will|would|am)|okay|ok,|"
    r"yes|no,|hello|hi\b|let me|to do this|in this)", re.IGNORECASE)
_CODE = re.compile(r"```|\bdef \w+\(|\bimport \w+|\bprint\(|</?\w+>|;\s*$|\{\s*\"", re.MULTILINE)


def junk_problem(value: object, *, max_words: int = 25) -> str:
    """Why a short line a persona answer should hold (a goal, a step) is prose or junk, or ""."""
    if not isinstance(value, str):
        return "not text"
    text = value.strip()
    if is_placeholder(text):
        return "a placeholder"
    if "\n" in text:
        return "more than one line"
    words = text.split()
    if len(words) > max_words:
        return f"prose, not a short line ({len(words)} words)"
    if _PROSE_OPENERS.match(text):
        return "a chat reply, not a line of its own"
    if _CODE.search(text):
        return "code or markup"
    if sum(c.isalpha() for c in text) < max(3, len(text) // 3):
        return "not words"
    return ""
