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
_OUT = r"(?P<output>[\w.-]+(?:/[\w.-]+)*\.[A-Za-z0-9]{1,8})"
_DEST = r"(?P<to>[\w.-]+(?:/[\w.-]+)*/?)"
_FOLDER = r"(?P<path>[\w.-]+(?:/[\w.-]+)*)"
_THE_FILE = r"(?:the\s+(?:file\s+)?)?"
# (pattern, tool): one call on what the goal names exactly, nothing else asked: a read of a named file or folder.
_SINGLE_STEPS: tuple[tuple[re.Pattern[str], str], ...] = (
    (re.compile(rf"^(?:read|open|show)\s+{_THE_FILE}{_FILE}$", re.IGNORECASE), "file.read"),
    (re.compile(rf"^summari[sz]e\s+{_THE_FILE}{_FILE}$", re.IGNORECASE), "text.summarize"),
    (re.compile(rf"^(?:list|show)\s+(?:the\s+files\s+in\s+)?the\s+folder\s+{_FOLDER}/?$", re.IGNORECASE), "file.list"),
)
# The everyday goals (list the workspace, convert, count, copy), whose every input the goal gives: one step for a
# small model (a strong one plans them with a check of the result); the writes still wait for an operator's yes.
_EVERYDAY_STEPS: tuple[tuple[re.Pattern[str], str], ...] = (
    (re.compile(r"^(?:list|show)\s+(?:all\s+)?(?:the\s+)?(?:files\s+(?:in\s+)?)?(?:the\s+|my\s+)?workspace"
                r"(?:\s+files)?$", re.IGNORECASE), "file.list"),
    (re.compile(rf"^convert\s+{_THE_FILE}{_FILE}\s+(?:from\s+\w+\s+)?(?:to|into)\s+(?:a\s+)?(?P<to>json|csv)"
                rf"(?:\s+file)?(?:\s+(?:as|named|called|in|into|at)\s+{_OUT})?$", re.IGNORECASE), "file.convert"),
    (re.compile(rf"^convert\s+{_THE_FILE}{_FILE}\s+(?:to|into)\s+{_OUT}$", re.IGNORECASE), "file.convert"),
    (re.compile(rf"^count\s+(?:the\s+)?(?P<unit>rows|lines|words)\s+(?:in|of)\s+{_THE_FILE}{_FILE}\s*,?\s*"
                rf"(?:and\s+)?(?:(?:write|save|put|store)\s+(?:the\s+|that\s+)?(?:count|number|result|total|it)\s+)?"
                rf"(?:to|in|into)\s+{_OUT}$", re.IGNORECASE), "file.count"),
    (re.compile(rf"^copy\s+{_THE_FILE}{_FILE}\s+(?:to|into)\s+(?:the\s+folder\s+)?{_DEST}$", re.IGNORECASE),
     "file.copy"),
)


def _single_input(tool: str, found: dict[str, str | None]) -> dict[str, object] | None:
    path = found.get("path") or ""
    if tool == "file.list":
        return {"path": path} if path else {}
    if tool == "file.convert":
        output = found.get("output") or ""
        to = (found.get("to") or output.rsplit(".", 1)[-1]).lower()
        if to not in ("json", "csv") or path.lower().endswith("." + to):
            return None
        return {"path": path, "to": to, **({"output": output} if output else {})}
    if tool == "file.count":
        return {"path": path, "output": found["output"], "unit": (found.get("unit") or "rows").lower()}
    if tool == "file.copy":
        return {"path": path, "to": found["to"]}
    return {"path": path}


def tool_single_step(goal: str, *, everyday: bool = False) -> dict[str, object] | None:
    """Seed 004's create_single_step_plan for a tool agent: the one step a simple goal names, or None.

    A read on a file or folder the goal names exactly ("Read notes.txt"), or ("List the workspace") one of
    the everyday writes whose every input the goal gives ("Convert data.csv to JSON", "Count the rows in
    data.csv and write the count to count.txt", "Copy notes.txt to backup/"): anything else is left to the
    model, because guessing a tool is worse than one planning call. The everyday ones only with `everyday`."""
    text = " ".join(goal.split()).rstrip(".!")
    for pattern, tool in _SINGLE_STEPS + (_EVERYDAY_STEPS if everyday else ()):
        match = pattern.match(text)
        if not match:
            continue
        tool_input = _single_input(tool, match.groupdict())
        if tool_input is None:
            continue
        named = str(tool_input.get("path") or "the workspace")
        return {"id": "1", "tool": tool, "intent": text, "input": tool_input,
                "requiresPermission": tool not in ("file.read", "text.summarize", "file.list"),
                "expects": f"the result of {tool} on {named}"}
    return None
