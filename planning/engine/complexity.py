"""How complex a goal sounds (seed 004), to decide between a plan and a single step.

Weights: length 25%, action verbs 30%, multi-action keywords 30%, structure 15%. Each factor saturates,
so one very long sentence cannot look like a five-part project on its own.
"""

from __future__ import annotations

import re

WEIGHTS = {"length": 0.25, "verbs": 0.30, "multi_action": 0.30, "structure": 0.15}
LENGTH_SATURATION = 40  # words
VERB_SATURATION = 4  # distinct action verbs
MULTI_ACTION_SATURATION = 3  # sequencing keywords
STRUCTURE_SATURATION = 4  # list items, clauses, lines

ACTION_VERBS = frozenset(
    (
        "add", "analyze", "analyse", "build", "buy", "call", "check", "clean", "collect", "compare",
        "compile", "configure", "convert", "copy", "count", "create", "delete", "deploy", "design",
        "document", "download", "draft", "eat", "edit", "email", "export", "extract", "fetch", "find",
        "fix", "format", "gather", "generate", "go", "group", "implement", "import", "install", "list",
        "load", "make", "merge", "migrate", "move", "organize", "organise", "parse", "plan", "prepare",
        "publish", "read", "refactor", "remove", "rename", "render", "replace", "report", "research",
        "review", "rewrite", "run", "save", "scan", "schedule", "search", "send", "set", "sleep", "sort",
        "split", "summarize", "summarise", "test", "tidy", "train", "transform", "translate", "update",
        "upload", "validate", "verify", "work", "write"
    )
)
MULTI_ACTION_WORDS = frozenset(
    (
        "and", "then", "after", "before", "also", "each", "every", "all", "finally", "first", "next",
        "afterwards", "plus"
    )
)
_WORD = re.compile(r"[a-z][a-z'-]*")
_LIST_MARK = re.compile(r"^\s*(?:\d+[.)]|[-*\u2022])\s+", re.MULTILINE)


def goal_complexity(goal: str) -> float:
    """A 0..1 estimate of how many distinct things a goal asks for."""
    text = goal.lower()
    words = _WORD.findall(text)
    if not words:
        return 0.0
    length = min(len(words) / LENGTH_SATURATION, 1.0)
    verbs = min(len(set(words) & ACTION_VERBS) / VERB_SATURATION, 1.0)
    multi = min(sum(1 for w in words if w in MULTI_ACTION_WORDS) / MULTI_ACTION_SATURATION, 1.0)
    marks = text.count(",") + text.count(";") + len(_LIST_MARK.findall(goal)) + goal.strip().count("\n")
    structure = min(marks / STRUCTURE_SATURATION, 1.0)
    score = (
        WEIGHTS["length"] * length
        + WEIGHTS["verbs"] * verbs
        + WEIGHTS["multi_action"] * multi
        + WEIGHTS["structure"] * structure
    )
    return round(min(score, 1.0), 3)


def should_plan(goal: str, threshold: float = 0.3) -> bool:
    """Whether a goal deserves a multi-step plan rather than a single step."""
    return goal_complexity(goal) >= threshold


_FILE = r"(?P<path>[\w.-]+(?:/[\w.-]+)*\.[A-Za-z0-9]{1,8})"
_FOLDER = r"(?P<path>[\w.-]+(?:/[\w.-]+)*)"
# (pattern, tool, input key): one read-only call on a named file or folder, nothing else asked.
_SINGLE_STEPS: tuple[tuple[re.Pattern[str], str], ...] = (
    (re.compile(rf"^(?:read|open|show)\s+(?:the\s+file\s+)?{_FILE}$", re.IGNORECASE), "file.read"),
    (re.compile(rf"^summari[sz]e\s+(?:the\s+file\s+)?{_FILE}$", re.IGNORECASE), "text.summarize"),
    (re.compile(rf"^(?:list|show)\s+(?:the\s+files\s+in\s+)?the\s+folder\s+{_FOLDER}/?$", re.IGNORECASE), "file.list"),
)


def tool_single_step(goal: str) -> dict[str, object] | None:
    """Seed 004's create_single_step_plan for a tool agent: the one step a simple goal names, or None.

    Only a read-only call on a file or folder the goal names exactly ("Read notes.txt"): anything else
    is left to the model, because guessing a tool is worse than one planning call."""
    text = " ".join(goal.split()).rstrip(".!")
    for pattern, tool in _SINGLE_STEPS:
        match = pattern.match(text)
        if match:
            return {"id": "1", "tool": tool, "intent": text, "input": {"path": match.group("path")},
                    "requiresPermission": False, "expects": f"the result of {tool} on {match.group('path')}"}
    return None
