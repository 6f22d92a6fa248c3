"""Is a tool plan able to reach its goal? Checked before anyone can approve it, and its outcome after it ran.

Pure: plain values in, plain values out (no database, no files but the ones `outcome_check` is given).

Before planning (`goal_reachable`), from the goal's words and what the agent's tools can do (ToolSpec.verbs):
- a path outside the workspace ("read /etc/passwd", "../secrets.txt") is refused as such;
- an action no tool can do ("email the summary to my boss": no tool sends e-mail; "delete ...": no tool
  deletes files) is "cannot be done with this agent's tools: ...";
- a goal too vague to plan ("tidy this up", "do the thing") is a question for the operator.

After a plan is made (`plan_goal_problems`), whoever made it: every output file the goal names is written by a
step, and every action the goal asks for (copy, convert, move, count, summarize, append, ...) is done by a step
whose tool can do it. Never a plan of reads for a goal that asks for a change. Each problem names the step as
the plan page numbers it and is worded for the planner's retry and for the operator.

After the steps ran (`outcome_targets`, then `outcome_check`): each output the goal names exists and is not empty, a converted file
parses as its format (.json parses, .csv has rows, a .md table has a header row), and an answer the goal asks
for (a count, a summary) appears in a step's result.
"""

from __future__ import annotations

import csv
import io
import json
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import PurePosixPath

from agents.tools import tool_targets
from planning.engine.meaning import StepView, goal_files, path_normal

# What no tool makes (see "media" below).
_MEDIA_NOUNS = (r"(?:videos?|movies?|films?|clips?|animations?|gifs?|images?|pictures?|photos?|drawings?|diagrams?|"
                r"charts?\s+image|audio|podcasts?|recordings?|songs?|music|voice-?\s*overs?|slides(?:hows?)?|"
                r"slide\s+decks?|powerpoints?|presentations?|pdfs?|spreadsheets?|excel\s+(?:files?|sheets?)|"
                r"word\s+documents?)\b")
# Output files of kinds no tool makes (a copy or a move of one is fine).
MEDIA_EXTENSIONS = frozenset({".pdf", ".png", ".jpg", ".jpeg", ".gif", ".webp", ".svg", ".mp4", ".mov", ".avi",
                              ".webm", ".mp3", ".wav", ".ogg", ".m4a", ".xlsx", ".xls", ".docx", ".doc", ".pptx",
                              ".ppt", ".zip"})

# The actions a goal may ask for, in the words of ToolSpec.verbs, and the goal words that ask for them. File
# names are taken out of the goal before these are looked for ("email.txt" asks for nothing).
ACTION_WORDS: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("send", re.compile(r"\b(?:e-?mail(?:ed|ing|s)?|send|sent|forward|mail(?:ed)?|text\s+(?:it|this|them|me)|"
                        r"post\s+(?:it|this)\s+(?:to|on)|slack|tweet\w*|sms|"
                        r"(?:post|share|publish|put|upload)\b.{0,60}\b(?:to|on|in)\s+(?:my\s+|our\s+|the\s+)?"
                        r"(?:twitter|x\.com|facebook|linkedin|instagram|mastodon|bluesky|discord|microsoft\s+teams|whatsapp|"
                        r"telegram|reddit|social\s+media)|twitter|facebook|linkedin|whatsapp|telegram)\b",
                        re.IGNORECASE)),
    ("delete", re.compile(r"\b(?:delete|erase|wipe|purge|trash|rm|get\s+rid\s+of|clear\s+out|empty\s+the|"
                          r"remove(?!\s+(?:the\s+|all\s+|any\s+)?(?:duplicate|blank|empty\s+(?:rows|lines)|rows?|"
                          r"lines?|columns?|spaces?|words?|whitespace|header|trailing|leading|punctuation)))\b",
                          re.IGNORECASE)),
    ("copy", re.compile(r"\b(?:copy|copies|duplicate(?!\s+(?:rows|lines|entries))|back\s*-?\s*up|backup)\b",
                        re.IGNORECASE)),
    ("move", re.compile(r"\b(?:move|rename|relocate)\b", re.IGNORECASE)),
    ("convert", re.compile(r"\b(?:convert|export|turn\b.{0,60}\binto|transform\b.{0,60}\binto|"
                           r"(?:markdown|md|json|csv|html)\s+(?:version|table|format)|"
                           r"(?:as|to|into)\s+(?:a\s+)?(?:markdown|json|csv|html)\b)", re.IGNORECASE)),
    ("count", re.compile(r"\b(?:count|how\s+many|number\s+of|tally)\b", re.IGNORECASE)),
    ("summarize", re.compile(r"\b(?:summar\w*|summir\w*|tl;?dr|gist|recap|digest|sum(?:s|med|ming)?\s+"
                             r"(?:(?:it|this|them|FILE)\s+)?up)\b", re.IGNORECASE)),
    ("overwrite", re.compile(r"\b(?:overwrite|over-write|write\s+over|replace\s+(?:the\s+|all\s+(?:the\s+)?)?"
                             r"(?:contents?|text)\s+(?:of|in))\b", re.IGNORECASE)),
    ("append", re.compile(r"\b(?:append|add\b.{0,40}\bto\s+the\s+end)\b", re.IGNORECASE)),
    ("transform", re.compile(r"\b(?:upper-?case|lower-?case|capitali[sz]e|dedupe|de-?duplicate|reverse|translate|"
                             r"redact|anonymi[sz]e|remove\s+(?:the\s+|all\s+)?duplicates?)\b", re.IGNORECASE)),
    ("fetch", re.compile(r"https?://|\b(?:download|fetch)\b", re.IGNORECASE)),
    ("print", re.compile(r"\bprinters?\b|\bprint(?:ed|ing)?\s+(?:(?:it|this|that|them|FILE)\s+)?(?:out|off)\b|"
                         r"\bprint-?outs?\b|\bhard\s*-?\s*cop(?:y|ies)\b|\bfax\w*", re.IGNORECASE)),
    # A result no tool makes: the tools read and write text files, so a video, a picture, sound, slides, a PDF or
    # an Office file made from them is a stated "cannot" (reading or copying such a file is not this).
    ("media", re.compile(r"\b(?:make|create|produce|render|record|draw|generate|build|design|film|shoot|edit|"
                         r"put\s+together)\s+(?:[\w-]+\s+){0,4}?" + _MEDIA_NOUNS
                         + r"|\b(?:into|as)\s+(?:a|an)\s+(?:[\w-]+\s+){0,2}?" + _MEDIA_NOUNS
                         + r"|\bto\s+(?:a\s+|an\s+)?(?:pdf|png|jpe?g|gif|mp4|mp3|wav|xlsx|docx|pptx|excel|word\s+document|"
                           r"powerpoint)\b", re.IGNORECASE)),
    ("mkdir", re.compile(r"\b(?:create|make|add|set\s+up|start)\s+(?:(?!folder|directory)[\w-]+\s+){0,3}?"
                         r"(?:folder|directory|dir)\b", re.IGNORECASE)),
    ("list", re.compile(r"\b(?:list|inventory|what\W?s\s+in|which\s+files)\b", re.IGNORECASE)),
    ("read", re.compile(r"\b(?:read|show|open|look\s+at|view|check|print|cat)\b", re.IGNORECASE)),
)
# Actions that change files: a plan for one of them is never reads only.
CHANGING = frozenset({"delete", "copy", "move", "convert", "append", "transform", "mkdir", "overwrite"})
# What the refusal says when no tool can do the action.
NO_TOOL = {
    "send": "no tool sends e-mail or messages",
    "delete": "no tool deletes files",
    "copy": "no tool copies files",
    "move": "no tool moves or renames files",
    "convert": "no tool converts files",
    "count": "no tool counts",
    "summarize": "no tool summarizes",
    "append": "no tool appends to files",
    "overwrite": "no tool overwrites files",
    "transform": "no tool rewrites a file's content",
    "fetch": "no tool fetches web pages",
    "print": "no tool prints or faxes",
    "mkdir": "no tool creates folders",
    "media": "no tool makes videos, pictures, sound, slides, PDFs or Office files (the tools read and write text files)",
}
# What the goal asks, as the planner's retry reads it.
DOING = {
    "copy": "copy a file", "move": "move or rename a file", "convert": "convert a file",
    "count": "count", "summarize": "summarize", "append": "append to a file",
    "overwrite": "overwrite a file with new content", "transform": "change a file's content",
    "fetch": "fetch a web page", "mkdir": "create a folder", "delete": "delete files", "send": "send something",
    "print": "print something",
}
# Actions that answer with what the steps read: a plan of reads may do them ("what's in notes.txt?").
SEEING = frozenset({"read", "list", "count", "summarize"})
# A goal worded as a question asks to be told something, which reads can do.
_QUESTION = re.compile(r"\?\s*$|^\s*(?:what|what's|whats|which|how|where|who|whose|when|why|is|are|does|did|has|have|"
                       r"can\s+you\s+(?:tell|show|find)|tell\s+me|give\s+me|find\s+out|look\s+up)\b", re.IGNORECASE)
# What a count goal counts, in file.count's units: "count the words" is words, never lines.
_COUNT_UNIT = re.compile(r"\b(?:(?P<words>words?)|(?P<lines>lines?)|(?P<rows>rows?|records?|entries))\b", re.IGNORECASE)


def count_unit(goal: str) -> str:
    """The unit a count goal asks for ("words", "lines", "rows"), or "" when it names none."""
    if "count" not in goal_actions(goal):
        return ""
    found = _COUNT_UNIT.search(_without_names(goal))
    return next((unit for unit, hit in found.groupdict().items() if hit), "") if found else ""


def step_count_unit(step: StepView) -> str:
    """What a file.count step counts: its unit, else rows of a .csv and lines of anything else."""
    unit = step.input.get("unit") if isinstance(step.input, Mapping) else None
    path = str(step.input.get("path", "")) if isinstance(step.input, Mapping) else ""
    return str(unit) if unit else ("rows" if path.lower().endswith(".csv") else "lines")


# "create a folder named archive", "make a new directory called old/2026": the folder a mkdir goal asks for.
_FOLDER_NAMED = re.compile(r"\b(?:folder|directory|dir)\s+(?:named|called)\s+[\"'`]?(?P<a>[\w-][\w./-]*?)[\"'`]?"
                           r"(?=[\s,;!?]|\.?\s*$)|\b(?:named|called)\s+[\"'`]?(?P<b>[\w-][\w./-]*?)[\"'`]?\s+"
                           r"(?:folder|directory)\b|\b(?P<c>[\w-]+/)(?=[\s,;!?]|$)", re.IGNORECASE)
# An e-mail is named as such in the refusal.
_EMAIL = re.compile(r"\be-?mail|\bmail(?:ed)?\b", re.IGNORECASE)

_FILE = re.compile(r"(?<![\w/.-])(?:[\w-]+/)*[\w-][\w.-]*\.[A-Za-z][A-Za-z0-9]{0,7}(?![\w/-])")
_OUTSIDE = re.compile(
    r"""(?:^|(?<=[\s"'(=:,]))(?P<path>~[\w.-]*[/\\][^\s"',;)]*|[A-Za-z]:[\\/][^\s"',;)]*|"""
    r"""(?:\.\.[/\\])+[^\s"',;)]*|\.\.(?=\s|$)|/(?!/)[^\s"',;)]+)""")
_URL = re.compile(r"https?://\S+", re.IGNORECASE)
# "a folder called exports": a name, which asks for nothing ("exports" is not "export").
_NAMED = re.compile(r"\b(named|called)\s+[\"'`]?[\w./-]+", re.IGNORECASE)
# A goal that names nothing to work on: a pronoun, "stuff", "the thing", "everything" as its object.
_VAGUE_OBJECT = re.compile(r"\b(?:it|this|that|these|those|them|things?|stuff|everything|something|"
                           r"the\s+thing|whatever|up|out)\b", re.IGNORECASE)
_PLACE_WORDS = re.compile(r"\b(?:workspace|folder|directory|files?|documents?|notes|data|reports?)\b", re.IGNORECASE)
_WORD = re.compile(r"[A-Za-z]+")
VAGUE_MAX_WORDS = 6
# "turn data.csv into json": the format a convert goal asks for when it names no output file (file names are taken
# out first, so "into data.json" is a named output, not this).
_FORMAT_WANTED = re.compile(r"\b(?:into|to|as|in)\s+(?:a\s+|an\s+)?(?P<format>json|csv|markdown|md|html|txt|text)\b",
                            re.IGNORECASE)
FORMAT_EXTENSIONS = {"json": "json", "csv": "csv", "markdown": "md", "md": "md", "html": "html", "txt": "txt",
                     "text": "txt"}


@dataclass(frozen=True)
class GoalNeeds:
    """What a tool goal asks for: its actions (ACTION_WORDS), the files it names, a path outside the workspace."""

    actions: tuple[str, ...]
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    outside: str = ""
    vague: bool = False
    email: bool = False
    folders: tuple[str, ...] = ()  # the folders a goal that creates folders names
    question: bool = False  # worded as a question, or asks to see something (SEEING): reads may answer it


@dataclass(frozen=True)
class Reach:
    """A goal judged before planning: `cannot` (refused, with why) or `question` (for the operator), or neither."""

    cannot: str = ""
    question: str = ""

    @property
    def ok(self) -> bool:
        return not self.cannot and not self.question


def _without_names(goal: str) -> str:
    """The goal with its URLs and file names taken out: the words that say what to do."""
    return _NAMED.sub(r"\1 NAME", _FILE.sub(" FILE ", _URL.sub(" URL ", goal)))


def goal_actions(text: str) -> tuple[str, ...]:
    """The actions `text` asks for, in ACTION_WORDS order."""
    words = _without_names(text)
    return tuple(action for action, pattern in ACTION_WORDS if pattern.search(words)) + (
        ("fetch",) if _URL.search(text) and not re.search(r"\bfetch\b|\bdownload\b", words, re.IGNORECASE) else ())


def goal_needs(goal: str) -> GoalNeeds:
    """What `goal` asks a tool agent for."""
    files = goal_files(goal)
    actions = tuple(dict.fromkeys(goal_actions(goal)))
    inputs, outputs = files.inputs, files.outputs  # "a markdown version of x.csv in x.md": x.md is made
    if "convert" in actions and not outputs and len(inputs) == 1:
        outputs = implied_output(goal, inputs[0])
    if "media" not in actions and not {"copy", "move"} & set(actions) and any(
            PurePosixPath(path).suffix.lower() in MEDIA_EXTENSIONS for path in outputs):
        actions = (*actions, "media")  # "turn notes.md into notes.pdf"
    outside = ""
    for match in _OUTSIDE.finditer(_URL.sub(" ", goal)):
        outside = match.group("path").rstrip(".!?")
        break
    named = bool(inputs or outputs) or bool(_URL.search(goal))
    words = _WORD.findall(_without_names(goal))
    vague = (not named and not outside and not set(actions) - {"read"} and not _PLACE_WORDS.search(goal)
             and (bool(_VAGUE_OBJECT.search(goal)) or len(words) <= 2) and len(words) <= VAGUE_MAX_WORDS)
    folders: tuple[str, ...] = ()
    if "mkdir" in actions:
        folders = tuple(dict.fromkeys(
            (m.group("a") or m.group("b") or m.group("c")).strip("/.") for m in _FOLDER_NAMED.finditer(goal)))
    return GoalNeeds(actions=actions, inputs=inputs, outputs=outputs, outside=outside, vague=vague,
                     email=bool(_EMAIL.search(_without_names(goal))), folders=tuple(f for f in folders if f),
                     question=bool(_QUESTION.search(goal.strip())) or bool(set(actions) & SEEING))


def implied_output(goal: str, source: str) -> tuple[str, ...]:
    """"could you make data.csv into json?" names no output, yet asks for one: data.json beside its source (as
    file.convert and the offline planner name it), so the plan must write it and the outcome check reads it."""
    wanted = _FORMAT_WANTED.search(_without_names(goal))
    if wanted is None:
        return ()
    ext = FORMAT_EXTENSIONS[wanted.group("format").lower()]
    path = PurePosixPath(source)
    return () if path.suffix.lower() == f".{ext}" else (path.with_suffix(f".{ext}").as_posix(),)


def tool_verbs(name: str, verbs: Iterable[str], description: str = "") -> frozenset[str]:
    """What a tool can do: its declared verbs, else (a tool an external agent declared) the actions its name and
    description name ("send_email: Send an e-mail" sends)."""
    declared = frozenset(verbs)
    if declared:
        return declared
    return frozenset(goal_actions(f"{re.sub(r'[._-]+', ' ', name)} {description}"))


def goal_reachable(goal: str, tools: Mapping[str, frozenset[str]]) -> Reach:
    """Before planning: refused (outside the workspace; an action no tool of `tools` can do), a question (too
    vague to plan), or fine. `tools`: tool name -> what it can do (tool_verbs)."""
    needs = goal_needs(goal)
    if needs.outside:
        return Reach(cannot=f"refused: {needs.outside[:80]} is outside this agent's workspace; its tools may only "
                            "use files inside the workspace")
    can = frozenset().union(*tools.values()) if tools else frozenset()
    missing = [a for a in needs.actions if a in NO_TOOL and a not in can]
    if missing:
        reasons = ["no tool sends e-mail" if a == "send" and needs.email else NO_TOOL[a] for a in missing]
        return Reach(cannot=f"cannot be done with this agent's tools: {'; '.join(reasons)}")
    if needs.vague:
        return Reach(question=vague_question(goal))
    return Reach()


def vague_question(goal: str) -> str:
    shown = " ".join(goal.split())[:120]
    return (f"What should I do for \"{shown}\"? Name the files and the result you want, e.g. "
            "\"convert data.csv to JSON\" or \"copy notes.txt to backup/notes.txt\".")


def _same(a: str, b: str) -> bool:
    return path_normal(a) == path_normal(b)


def _written(step: StepView) -> list[str]:
    """What a step writes (a move's source is gone, not written)."""
    targets = tool_targets(step.tool, step.input)
    if step.tool == "file.move" and targets:
        return targets[1:]
    return targets


# Actions a planner may do itself, writing what it made into the goal's output ("write a short summary of
# notes.txt into summary.md" as a file.write of the summary): the outcome check then reads the file.
AUTHORED = frozenset({"summarize"})


def _authored(action: str, step: StepView, outputs: Sequence[str], tools: Mapping[str, frozenset[str]]) -> bool:
    content = step.input.get("content") if isinstance(step.input, Mapping) else None
    return (action in AUTHORED and "write" in tools.get(step.tool, frozenset()) and isinstance(content, str)
            and bool(content.strip()) and any(_same(output, path) for output in outputs for path in _written(step)))


def _names(goal: str, path: str, needs: GoalNeeds) -> bool:
    """Whether the goal names `path` (or a file of the same name, "backup/notes.txt" for "notes.txt") or its
    folder: then a step may change it."""
    named = [*needs.inputs, *needs.outputs, *needs.folders]
    base = PurePosixPath(path_normal(path))
    if len(base.stem) >= 3 and re.search(rf"\b{re.escape(base.stem)}s?\b", _without_names(goal), re.IGNORECASE):
        return True  # named by what it is: "write the report" names report.md
    return any(_same(name, path) or PurePosixPath(path_normal(name)).name == base.name
               or path_normal(path).startswith(path_normal(name).rstrip("/") + "/") for name in named)


def plan_goal_problems(goal: str, steps: Sequence[StepView], tools: Mapping[str, frozenset[str]],
                       existing: Iterable[str] = ()) -> list[str]:
    """Why the plan cannot reach `goal` (empty: it can, as far as its tools tell). `steps`: the plan's steps
    numbered as the plan page shows them; `tools`: tool name -> what it can do; `existing`: the workspace's files
    now (a step may change or remove one only when the goal names it)."""
    needs = goal_needs(goal)
    problems: list[str] = []
    written = [path for step in steps for path in _written(step)]
    for output in needs.outputs:
        if not any(_same(output, path) for path in written):
            problems.append(f"the goal asks for {output}, but no step writes it")
    for folder in needs.folders:
        if not any(_same(folder, path) or path_normal(path).startswith(path_normal(folder) + "/")
                   for path in written):
            problems.append(f"the goal asks for the folder {folder}, but no step creates it")
    unit = count_unit(goal)
    counts = [step for step in steps if step.tool == "file.count"]
    if unit and counts and not any(step_count_unit(step) == unit for step in counts):
        problems.append(f"the goal asks to count {unit}, but step {counts[0].position} counts "
                        f"{step_count_unit(counts[0])}; give file.count \"unit\": \"{unit}\"")
    present = {path_normal(path) for path in existing}
    for step in steps:
        for path in tool_targets(step.tool, step.input):
            if path_normal(path) in present and not _names(goal, path, needs):
                problems.append(f"step {step.position} changes {path}, a file the goal does not name; an input is "
                                "changed only when the goal asks for it: write a new file instead")
    for action in needs.actions:
        if action not in DOING:
            continue
        if not any(action in tools.get(step.tool, frozenset()) or _authored(action, step, needs.outputs, tools)
                   for step in steps):
            able = sorted(name for name, verbs in tools.items() if action in verbs)
            hint = f"; use {' or '.join(able)}" if able else ""
            problems.append(f"the goal asks to {DOING[action]}, but no step does{hint}")
    changes = bool(set(needs.actions) & CHANGING) or bool(needs.outputs)
    reads_only = bool(steps) and all(tools.get(step.tool, frozenset()) <= {"read", "list", "summarize"}
                                     for step in steps)
    if reads_only and changes:
        problems.append("the goal asks for a change, but every step only reads; a plan of reads does not do it")
    elif reads_only and not needs.question:
        problems.append("the goal asks for something done, not for a file to be read or shown, but every step only "
                        "reads; a plan of reads does not do it")
    return problems


@dataclass(frozen=True)
class OutputFile:
    """A file the goal named as its output, as found after the steps ran: None when it is missing."""

    path: str
    text: str | None


@dataclass(frozen=True)
class Outcome:
    """A finished plan's outcome as checked: what was found wrong (`problems`) and what was looked at and found
    right (`checked`). Verified only when nothing is wrong and something was checked."""

    problems: tuple[str, ...]
    checked: tuple[str, ...]

    @property
    def verified(self) -> bool:
        return not self.problems and bool(self.checked)


# Said when a goal names nothing the outcome check can look at ("make a 30 second video of the demo"): the plan is
# "Done, not verified" and the operator says whether it did what was asked.
NOTHING_TO_CHECK = ("nothing the goal asks for can be checked here (it names no file, folder or answer the steps "
                    "made), so the outcome is not verified")


def outcome_check(goal: str, outputs: Sequence[OutputFile], results: Sequence[str],
                  folders: Mapping[str, bool] | None = None) -> Outcome:
    """The outcome of a finished plan. `outputs`: the files to read (outcome_targets), as read now; `results`:
    the completed steps' results; `folders`: each folder the plan had to create -> whether it exists now."""
    needs = goal_needs(goal)
    problems: list[str] = []
    checked: list[str] = []
    for name, made in (folders or {}).items():
        if made:
            checked.append(f"the folder {name} exists")
        else:
            problems.append(f"the folder {name} was not created")
    for output in outputs:
        if output.text is None:
            problems.append(f"{output.path} was not written")
            continue
        if not output.text.strip():
            problems.append(f"{output.path} is empty")
            continue
        why = format_problem(output.path, output.text)
        if why:
            problems.append(f"{output.path} {why}")
        else:
            checked.append(f"{output.path} {format_shown(output.path)}")
    answered = " ".join(results)
    unit = count_unit(goal)
    if "count" in needs.actions and not needs.outputs:
        if not re.search(r"\d", answered):
            problems.append("the count the goal asks for appears in no step's result")
        elif not unit:
            checked.append("a step's result gives the count")
    if unit and re.search(r"\d", answered):
        if re.search(rf"\b\d+\s+{unit}\b", answered):
            checked.append(f"a step's result gives the number of {unit}")
        else:
            problems.append(f"no step's result gives the number of {unit} the goal asks for")
    if "summarize" in needs.actions and not needs.outputs:
        if re.search(r"\bSummary of\b|\bsummar", answered, re.IGNORECASE):
            checked.append("a step's result holds the summary")
        else:
            problems.append("the summary the goal asks for appears in no step's result")
    if needs.question and not needs.outputs and not checked and not problems:
        if any(result.strip() for result in results):
            checked.append("a step's result answers it")
        else:
            problems.append("no step's result answers the question")
    if not problems and not checked:
        problems.append(NOTHING_TO_CHECK)
    return Outcome(tuple(problems), tuple(dict.fromkeys(checked)))


def outcome_problems(goal: str, outputs: Sequence[OutputFile], results: Sequence[str],
                     folders: Mapping[str, bool] | None = None) -> list[str]:
    """Why the outcome of a finished plan is not verified (empty: verified); see outcome_check."""
    return list(outcome_check(goal, outputs, results, folders).problems)


def outcome_targets(goal: str, steps: Sequence[StepView], feedback: Sequence[str] = ()) -> tuple[
        tuple[str, ...], tuple[str, ...]]:
    """What the outcome check looks at, as (files, folders), from the goal and the plan's completed `steps`:
    - the outputs and folders the goal names. An output no step wrote is replaced by the files the operator's
      `feedback` names that a step wrote ("write sales_old.csv instead");
    - a goal that names no output: the files the steps wrote that it names by what they are ("write a report from
      the notes": report.md), or, when it asks for a change (copy, convert, move...), every file they wrote;
    - likewise the folders the steps created when the goal names none.
    A loop's template path ("out/{item}.txt") is not a file and is left out."""
    needs = goal_needs(goal)
    made: list[str] = []
    made_folders: list[str] = []
    for step in steps:
        for path in _written(step):
            if "{" not in path:
                (made_folders if step.tool == "dir.create" else made).append(path_normal(path))
    made, made_folders = list(dict.fromkeys(made)), list(dict.fromkeys(made_folders))
    named: list[str] = []
    for text in feedback:
        said = goal_files(text)
        named += [*said.inputs, *said.outputs]
    redirected = [path for path in made if any(_same(name, path) for name in named)]
    if needs.outputs:
        files = [output for output in needs.outputs if any(_same(output, path) for path in made) or not redirected]
        if len(files) < len(needs.outputs):
            files += redirected
    else:
        changes = bool(set(needs.actions) & CHANGING)
        files = [path for path in made if changes or path in redirected or _names(goal, path, needs)]
    folders = list(needs.folders) or [path for path in made_folders if "mkdir" in needs.actions
                                      or _names(goal, path, needs)]
    return tuple(dict.fromkeys(files)), tuple(dict.fromkeys(folders))


def format_shown(path: str) -> str:
    """What the outcome check found of a good output, in words."""
    ext = PurePosixPath(path).suffix.lower()
    return {".json": "parses as JSON", ".csv": "has rows"}.get(ext, "exists and is not empty")


def format_problem(path: str, text: str) -> str:
    """Why `text` does not parse as the format `path`'s extension says (empty: it does, or nothing is known)."""
    ext = PurePosixPath(path).suffix.lower()
    if ext == ".json":
        try:
            json.loads(text)
        except json.JSONDecodeError as exc:
            return f"is not valid JSON ({exc.msg} at line {exc.lineno})"
        return ""
    if ext == ".csv":
        rows = [row for row in csv.reader(io.StringIO(text)) if any(cell.strip() for cell in row)]
        return "" if rows else "has no rows"
    if ext in (".md", ".markdown"):
        lines = [line.strip() for line in text.splitlines() if line.strip()]
        if any(line.startswith("|") for line in lines):
            for first, second in zip(lines, lines[1:], strict=False):
                if first.startswith("|") and re.fullmatch(r"\|?\s*:?-{3,}:?\s*(?:\|\s*:?-{3,}:?\s*)*\|?", second):
                    return ""
            return "has a table without a header row"
    return ""
