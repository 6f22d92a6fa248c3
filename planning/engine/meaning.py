"""Does a plan mean what its goal says? Checks a schema cannot make (structured output fixes the shape only).

- A plan may not write to a file the goal names only as its input ("Convert data.csv to JSON" must leave
  data.csv as it is), unless the goal asks to change it (move, rename, edit, append to ...).
- A plan must use every file the goal names ("Count the rows in data.csv" that never reads data.csv
  answered another goal).
- The plan's `goal` is the goal given, not the prompt's example nor another goal.
- No value is a placeholder or the worked example's own value (agents/llm/placeholders.py).
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from agents.llm.placeholders import is_example, placeholder_or_example
from agents.tools import tool_targets

_FILE = re.compile(r"(?<![\w/.-])((?:[\w-]+/)*[\w-][\w.-]*\.[A-Za-z][A-Za-z0-9]{0,7})(?![\w/-])")
_OUTPUT_BEFORE = re.compile(
    r"(?:\b(?:to|into|as|named|called|create|creates|write|writes|save|saves|append|overwrite|output|new file|"
    r"a file)\s+(?:the\s+|a\s+|new\s+|file\s+)*)$", re.IGNORECASE)
# A goal that asks to change the files it names: none of them is input only.
_CHANGING = re.compile(
    r"\b(?:move|rename|delete|remove|edit|update|modify|change|fix|overwrite|append|replace|clean|tidy|sort|"
    r"organi[sz]e|add\s+\w+(?:\s+\w+)?\s+to)\b", re.IGNORECASE)
# A goal that makes one file from another (planning/engine/goal_check.py names the same actions "convert", "copy"),
# the file it makes named after "in" ("a markdown version of data.csv in data.md").
_IN_BEFORE = re.compile(r"\bin\s+(?:the\s+|a\s+|new\s+|file\s+)*$", re.IGNORECASE)
_MAKES = re.compile(r"\b(?:convert|export|turn\b.{0,60}\binto|transform\b.{0,60}\binto|"
                    r"(?:markdown|md|json|csv|html)\s+(?:version|table|format)|"
                    r"(?:as|to|into)\s+(?:a\s+)?(?:markdown|json|csv|html)\b|copy|copies|duplicate|"
                    r"back\s*-?\s*up|backup)", re.IGNORECASE)
_STOP = frozenset({"the", "a", "an", "to", "of", "in", "into", "and", "for", "with", "file", "files", "it", "its",
                   "my", "this", "that", "from", "as", "on", "at", "by", "all"})


@dataclass(frozen=True)
class GoalFiles:
    """The files a goal names: those it reads (inputs) and those it makes (outputs), in the goal's order."""

    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    changes_inputs: bool  # the goal asks to change what it names (move, edit, append ...)

    @property
    def named(self) -> tuple[str, ...]:
        return self.inputs + self.outputs


def path_normal(path: str) -> str:
    return path.strip().replace("\\", "/").removeprefix("./").strip("/").lower()


def goal_files(goal: str) -> GoalFiles:
    """The files `goal` names, an output when "to", "into", "as", "write" ... comes right before it."""
    inputs: list[str] = []
    outputs: list[str] = []
    for match in _FILE.finditer(goal):
        path = match.group(1)
        if "." not in path.rsplit("/", 1)[-1][1:] or path.lower() in ("e.g", "i.e"):
            continue
        before = goal[max(0, match.start() - 40): match.start()]
        (outputs if _OUTPUT_BEFORE.search(before) else inputs).append(path)
    inputs = list(dict.fromkeys(inputs))
    if len(inputs) >= 2 and _MAKES.search(_FILE.sub(" ", goal)):
        # "a markdown version of data.csv in data.md", "back up data.csv in old/data.csv": the later file named
        # after "in" is what the goal makes, not what it reads.
        made = [f for f in inputs[1:] if _IN_BEFORE.search(goal[:max(0, goal.find(f))])]
        inputs = [f for f in inputs if f not in made]
        outputs = [*outputs, *made]
    return GoalFiles(tuple(inputs), tuple(dict.fromkeys(o for o in outputs if o not in inputs)),
                     bool(_CHANGING.search(goal)))


def _strings(value: object) -> Iterable[str]:
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for v in value.values():
            yield from _strings(v)
    elif isinstance(value, list | tuple):
        for v in value:
            yield from _strings(v)


@dataclass(frozen=True)
class StepView:
    """What the meaning checks read of a step."""

    position: int
    tool: str
    input: dict[str, object]


def _same_file(a: str, b: str) -> bool:
    """The same workspace path ("./data.csv" is "data.csv"; "backup/notes.txt" is not "notes.txt")."""
    return path_normal(a) == path_normal(b)


def meaning_problems(*, goal: str, plan_goal: str, steps: Sequence[StepView], tool_plan: bool,
                     steered: bool = False) -> list[str]:
    """Why the plan does not do what `goal` says (empty: nothing found). `steered`: an operator's feedback
    may leave out a file the goal names ("do not read data.csv"), so unused files are not a problem then."""
    problems: list[str] = []
    if plan_goal.strip() and not goal_matches(goal, plan_goal):
        problems.append(f"the plan's goal \"{plan_goal[:120]}\" is not the goal given (\"{goal[:120]}\"); "
                        "answer the goal given")
    if not tool_plan:
        return problems
    files = goal_files(goal)
    if not files.changes_inputs:
        for step in steps:
            for target in tool_targets(step.tool, step.input):
                if "{" in target:
                    continue  # a loop's item: judged when it runs
                hit = next((f for f in files.inputs if _same_file(target, f)), None)
                if hit is not None:
                    problems.append(f"step {step.position}: {step.tool} writes to {hit}, which the goal names only "
                                    "as its input; leave it unchanged and write the result to another file")
    for name in () if steered else files.named:
        touched = any(_same_file(text, name) for step in steps
                      for text in [*_strings(step.input), *tool_targets(step.tool, step.input)])
        if not touched:
            problems.append(f"the plan never uses {name}, which the goal names")
    return problems


def _words(text: str) -> set[str]:
    return {w for w in re.findall(r"[a-z0-9][a-z0-9._/-]*", text.lower()) if w not in _STOP and len(w) > 1}


def goal_matches(goal: str, plan_goal: str) -> bool:
    """Whether the plan's own statement of its goal is the goal given, in the same or other words."""
    a, b = " ".join(goal.lower().split()).strip(" ."), " ".join(plan_goal.lower().split()).strip(" .")
    if a == b or (len(b) >= 8 and (b in a or a in b)):
        return True
    if is_example(plan_goal):
        return False
    theirs = _words(plan_goal)
    shared = len(theirs & _words(goal)) / max(1, len(theirs))
    return shared >= 0.5 or difflib.SequenceMatcher(None, a, b).ratio() >= 0.6


def value_problems(*, goal: str, where: str, values: dict[str, object]) -> list[str]:
    """Placeholders and the worked example's values among a step's (or an answer's) values."""
    problems = []
    for name, value in values.items():
        for text in _strings(value):
            if not text.strip():
                continue
            why = placeholder_or_example(text, goal=goal)
            if why:
                problems.append(f"{where}: '{name}' is {why} ({text.strip()[:40]!r}), not an answer for this goal")
                break
    return problems


# Goal words -> the tool they name, for a small model's schema (its choice of tool narrowed to the goal's).
_TOOL_WORDS: tuple[tuple[re.Pattern[str], str], ...] = (
    (re.compile(r"\bconvert", re.IGNORECASE), "file.convert"),
    (re.compile(r"\bcount", re.IGNORECASE), "file.count"),
    (re.compile(r"\b(?:copy|duplicate)", re.IGNORECASE), "file.copy"),
    (re.compile(r"\b(?:move|rename)", re.IGNORECASE), "file.move"),
    (re.compile(r"\b(?:append|add\b[^.]*\bto\b)", re.IGNORECASE), "file.append"),
    (re.compile(r"\breport\b", re.IGNORECASE), "report.write"),
    (re.compile(r"\b(?:folder|directory|mkdir)", re.IGNORECASE), "dir.create"),
    (re.compile(r"\blist\b", re.IGNORECASE), "file.list"),
    (re.compile(r"\bsummar", re.IGNORECASE), "text.summarize"),
    (re.compile(r"\b(?:fetch|download|https?://)", re.IGNORECASE), "web.fetch"),
)
_GENERIC_TOOL_WORDS: tuple[tuple[re.Pattern[str], str], ...] = (
    (re.compile(r"\b(?:write|create|save|put)\b", re.IGNORECASE), "file.write"),
    (re.compile(r"\b(?:read|show|open|look)\b", re.IGNORECASE), "file.read"),
)


def goal_tools(goal: str, available: Sequence[str]) -> list[str]:
    """The tools a goal's words name ("convert" -> file.convert): the specific ones, else the generic write or
    read; every available tool when the goal names none."""
    named = [tool for pattern, tool in _TOOL_WORDS if pattern.search(goal) and tool in available]
    if not named:
        named = [tool for pattern, tool in _GENERIC_TOOL_WORDS if pattern.search(goal) and tool in available]
    return [t for t in available if t in named] or list(available)


def goal_paths(goal: str, workspace_files: Sequence[str]) -> tuple[tuple[str, ...], tuple[str, ...] | None,
                                                                  tuple[str, ...]]:
    """The paths a small model may read (the files the goal names, else the workspace's), write (the files
    the goal makes, the ones it asks to change, a folder it names; None when it names none), and the goal's
    inputs (what a writing tool works from)."""
    files = goal_files(goal)
    # A goal that names its inputs reads those (and may check its outputs); one that names none, any file.
    others = [] if files.inputs else [f for f in workspace_files if not f.endswith("/")]
    reads = tuple(dict.fromkeys([*files.inputs, *others, *files.outputs]))
    writes = [*files.outputs, *(files.inputs if files.changes_inputs else ()), *_FOLDER_NAMED.findall(goal)]
    return reads, (tuple(dict.fromkeys(writes)) or None), files.inputs


_FOLDER_NAMED = re.compile(r"\b(?:folder|directory)\s+(?:named\s+|called\s+)?['\"]?([\w-]+(?:/[\w-]+)*)", re.IGNORECASE)
