"""The offline rules model: the default "LLM", deterministic and without network.

It answers every purpose from the `CONTEXT:` line our prompt builders append (see
`agents.llm.context.prompt_context`), in the shape a real model would: a sentence, then JSON in
`<json>` tags. Its plans come from templates keyed by words in the goal, so the demo worlds run, plans
pass validation, and replans visibly take the operator's feedback into account. Same input, same output:
nothing here iterates over a set or reads the clock.

It simulates the agents' world (the personas' needs and actions, agents/world.py) and the tool agents' tools
(agents/tools.py), so it lives with them; the gateway reaches it as a provider named in settings.LLM_PROVIDERS.
"""

from __future__ import annotations

import difflib
import json
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import PurePosixPath
from typing import Any

from agents.llm.context import prompt_context
from agents.llm.gateway import Provider, ProviderAnswer
from agents.llm.structured import CallOptions
from agents.tools import TOOLS
from agents.world import URGENT_ACTION, URGENT_BELOW

OFFLINE_MODEL = "offline-rules"
MILESTONE_MEAN = 0.6  # a goal counts as achieved when its source needs average above this
MAX_HINTS = 5
TEXT_EXTENSIONS = ("txt", "md", "markdown", "log", "rst")
_FILE_EXTENSIONS = (
    "csv", "json", "txt", "md", "markdown", "log", "rst", "html", "xml", "yaml", "yml", "toml", "ini",
    "cfg", "tsv", "py", "js", "ts", "css", "pdf", "png", "jpg", "jpeg", "gif", "doc", "docx"
)
_FILE_NAME = re.compile(r"(?<![\w/.-])((?:[\w-]+/)*[\w-]+\.([A-Za-z0-9]{1,8}))(?![\w/-])")
_QUOTED = re.compile(r"\"([^\"\n]{1,400})\"|'([^'\n]{1,400})'|\u201c([^\u201d\n]{1,400})\u201d")
_URL = re.compile(r"https?://[^\s\"'<>]+")


def offline_complete(purpose: str, messages: Sequence[Mapping[str, str]]) -> str:
    """Answer one prompt like a model would; deterministic in the prompt's CONTEXT line."""
    answer = _ANSWERS.get(purpose)
    if answer is None:
        raise ValueError(f"the offline model has no answer for purpose {purpose!r}")
    return answer(prompt_context(messages))


def _reply(prose: str, value: Any) -> str:
    return f"{prose}\n<json>\n{json.dumps(value, indent=2, ensure_ascii=False)}\n</json>"


# -- reading the context defensively (it is JSON from a prompt, so anything may be missing) --------


def _text(ctx: Mapping[str, Any], key: str) -> str:
    value = ctx.get(key)
    return " ".join(value.split()) if isinstance(value, str) else ""


def _texts(ctx: Mapping[str, Any], key: str) -> list[str]:
    value = ctx.get(key)
    return [" ".join(v.split()) for v in value if isinstance(v, str)] if isinstance(value, list) else []


def _needs(ctx: Mapping[str, Any], key: str = "needs") -> dict[str, float]:
    value = ctx.get(key)
    if not isinstance(value, dict):
        return {}
    return {
        str(k): float(v) for k, v in value.items() if isinstance(v, int | float) and not isinstance(v, bool)
    }


def _steps(ctx: Mapping[str, Any], key: str) -> list[dict[str, Any]]:
    value = ctx.get(key)
    return [s for s in value if isinstance(s, dict)] if isinstance(value, list) else []


def _max_steps(ctx: Mapping[str, Any]) -> int:
    value = ctx.get("max_steps")
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 20


def _pct(value: float) -> str:
    return f"{round(value * 100)}%"


def _one_line(text: str, limit: int = 480) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3].rstrip() + "..."


# -- persona plans (seed 000) ----------------------------------------------------------------------


@dataclass(frozen=True)
class _Move:
    action: str
    description: str
    outcome: str
    cycles: int = 1


_CHAINS: Mapping[str, tuple[_Move, ...]] = {
    "money": (
        _Move("look for work", "Look for a job opportunity", "have a job lead", 2),
        _Move("work", "Work a shift to earn money", "earn income", 3),
    ),
    "hunger": (
        _Move("go to the store", "Go to the store", "arrive at the store"),
        _Move("buy food", "Buy some food", "have groceries"),
        _Move("eat", "Eat a meal", "no longer hungry"),
    ),
    "energy": (
        _Move("go home", "Go home", "be at home"),
        _Move("sleep", "Get a good sleep", "feel rested", 2),
    ),
    "social": (
        _Move("call a friend", "Call a friend to catch up", "feel less lonely"),
        _Move("meet friend", "Meet the friend in person", "spend time together", 2),
    ),
    "fun": (
        _Move("go home", "Go home to unwind", "be at home"),
        _Move("relax", "Relax with something enjoyable", "feel refreshed", 2),
    ),
}
# Words in a goal that say which need it serves, checked in this order.
_NEED_WORDS: Mapping[str, tuple[str, ...]] = {
    "hunger": ("eat", "food", "hungry", "hunger", "meal", "lunch", "dinner", "breakfast", "groceries", "cook"),
    "energy": ("sleep", "rest", "tired", "energy", "nap", "exhausted"),
    "social": ("friend", "social", "lonely", "company", "talk", "chat"),
    "money": ("money", "job", "work", "earn", "income", "wage", "rent", "pay"),
    "fun": ("fun", "relax", "enjoy", "bored", "hobby", "unwind"),
}
# The world's own rule for what relieves an urgent need (money is not one: being broke never overrides).
_URGENT_RELIEF = URGENT_ACTION
# Another way to the same end, for a step the operator declined without saying what to do instead.
_INSTEAD: Mapping[str, tuple[str, ...]] = {
    "buy food": ("cook",),
    "go to the store": ("cook",),
    "eat": ("cook",),
    "meet friend": ("call a friend",),
    "work": ("look for work",),
    "sleep": ("relax",),
}


def _normal(text: str) -> str:
    return " ".join(text.lower().split())


def _match_action(wanted: str, allowed: Sequence[str]) -> str | None:
    """The allowed action closest to `wanted`, or None; any action goes when none are listed."""
    if not allowed:
        return wanted
    by_normal = {_normal(a): a for a in allowed}
    if _normal(wanted) in by_normal:
        return by_normal[_normal(wanted)]
    close = difflib.get_close_matches(_normal(wanted), list(by_normal), n=1, cutoff=0.75)
    return by_normal[close[0]] if close else None


def _actions_named(text: str, allowed: Sequence[str]) -> list[str]:
    """Allowed actions named in free text (operator feedback), longest first."""
    found = [a for a in allowed if re.search(rf"\b{re.escape(_normal(a))}\b", _normal(text))]
    return sorted(found, key=lambda a: (-len(a), a))


def _goal_need(goal: str, needs: Mapping[str, float]) -> str:
    words = set(re.findall(r"[a-z]+", goal.lower()))
    for need, keywords in _NEED_WORDS.items():
        if words & set(keywords):
            return need
    known = sorted((value, name) for name, value in needs.items() if name in _CHAINS)
    return known[0][1] if known else "fun"


def _persona_moves(goal: str, needs: Mapping[str, float], allowed: Sequence[str]) -> list[_Move]:
    need = _goal_need(goal, needs)
    other = next((alt for alt in _GOAL_OTHER_WAYS.values() if _normal(alt[0]) == _normal(goal)), None)
    moves = list(other[2] if other is not None else _CHAINS[need])
    if need == "hunger" and needs.get("money", 1.0) < 0.3:
        moves = list(_CHAINS["money"]) + moves  # "to eat I need food, so money, so first I need to work"
    mapped = []
    for move in moves:
        action = _match_action(move.action, allowed)
        if action is not None:
            mapped.append(replace(move, action=action))
    if not mapped:
        # None of the usual actions exist in this world: take the allowed action most like the goal.
        fallback = _closest_to_goal(goal, allowed)
        mapped = [_Move(fallback, _one_line(goal[:1].upper() + goal[1:], 200) or "Make progress", "goal advanced")]
    return mapped


def _closest_to_goal(goal: str, allowed: Sequence[str]) -> str:
    if not allowed:
        return "idle"
    named = _actions_named(goal, allowed)
    if named:
        return named[0]
    close = difflib.get_close_matches(_normal(goal), [_normal(a) for a in allowed], n=1, cutoff=0.0)
    return next((a for a in allowed if _normal(a) == close[0]), allowed[0]) if close else allowed[0]


def _persona_step(move: _Move, key: str | None = None) -> dict[str, Any]:
    step: dict[str, Any] = {} if key is None else {"id": key}
    step |= {
        "description": move.description,
        "action_hint": move.action,
        "expected_outcome": move.outcome,
        "estimated_cycles": move.cycles,
    }
    return step


def _persona_plan(ctx: Mapping[str, Any]) -> str:
    goal = _text(ctx, "goal") or "feel better"
    needs = _needs(ctx)
    moves = _persona_moves(goal, needs, _texts(ctx, "allowed_actions"))[: _max_steps(ctx)]
    low = sorted(needs.items(), key=lambda kv: (kv[1], kv[0]))[:2]
    state = ", ".join(f"{name} at {_pct(value)}" for name, value in low) or "my needs"
    data = {
        "goal": goal,
        "thinking_summary": _one_line(f"With {state}, I will " + ", then ".join(m.action for m in moves) + "."),
        "confidence": 0.7,
        "steps": [_persona_step(m) for m in moves],
    }
    return _reply(f"To {goal[:1].lower() + goal[1:]}, I need {len(moves)} step(s).", data)


def _fresh_keys(taken: Sequence[str], count: int) -> list[str]:
    used = set(taken)
    keys: list[str] = []
    number = 1
    while len(keys) < count:
        if str(number) not in used:
            keys.append(str(number))
            used.add(str(number))
        number += 1
    return keys


def _failure_reason(ctx: Mapping[str, Any], failed: Mapping[str, Any] | None) -> str:
    """Why the plan is being replanned, with the failed step's own error when there is one."""
    own = " ".join(str(failed.get("failure_reason", "")).split()) if failed else ""
    return "; ".join(part for part in (_text(ctx, "reason"), own) if part)


def _persona_replan(ctx: Mapping[str, Any]) -> str:
    goal = _text(ctx, "goal") or "feel better"
    needs = _needs(ctx)
    allowed = _texts(ctx, "allowed_actions")
    completed = _steps(ctx, "completed_steps")
    failed = ctx.get("failed_step") if isinstance(ctx.get("failed_step"), dict) else None
    reason = _failure_reason(ctx, failed)
    feedback = _texts(ctx, "feedback")
    remaining = _persona_moves(goal, needs, allowed)
    for step in completed:  # what is done is not planned again
        done = _normal(str(step.get("action_hint", "")))
        index = next((i for i, m in enumerate(remaining) if _normal(m.action) == done), None)
        if index is not None:
            remaining.pop(index)
    # The operator's own words say it best; the recorded reason repeats them when a step was declined.
    why = "; ".join(dict.fromkeys(feedback or ([reason] if reason else [])))
    if failed is not None:
        failed_action = str(failed.get("action_hint", ""))
        failed_move = next((m for m in remaining if _normal(m.action) == _normal(failed_action)), None)
        if failed_move is None and _match_action(failed_action, allowed):
            failed_move = _Move(
                _match_action(failed_action, allowed) or failed_action,
                _one_line(str(failed.get("description", "")) or failed_action, 200),
                str(failed.get("expected_outcome", "")),
            )
            remaining.insert(0, failed_move)
        named = _actions_named(" ".join(feedback), allowed)
        if failed_move is not None:
            index = remaining.index(failed_move)
            # Why goes into the thinking summary, never into step text: a step's description stays the same
            # across replans instead of growing by the feedback each time.
            if named:  # the operator said what to do instead
                remaining[index] = _Move(named[0], f"{named[0].capitalize()} instead", "")
            else:
                remaining[index] = replace(failed_move, cycles=min(failed_move.cycles + 1, 20))
            # An unmet requirement ("not enough money") is met first, unless the operator chose another way.
            if not named and "money" in why.lower() and _normal(failed_move.action) not in ("work", "look for work"):
                for move in reversed(_CHAINS["money"]):
                    action = _match_action(move.action, allowed)
                    if action and all(_normal(m.action) != _normal(action) for m in remaining[:index]):
                        remaining.insert(index, replace(move, action=action))
    refused = {_normal(str(s.get("action_hint", ""))) for s in _steps(ctx, "declined_steps")}
    remaining = _persona_without_declined(remaining, _steps(ctx, "declined_steps"), allowed)
    if not remaining:
        open_actions = [a for a in allowed if _normal(a) not in refused] or allowed
        remaining = [_Move(_closest_to_goal(goal, open_actions), _one_line(f"Finish: {goal}", 200), "goal reached")]
    keep = [_persona_echo(step) for step in completed]
    room = max(_max_steps(ctx) - len(keep), 0)
    keys = _fresh_keys([s["id"] for s in keep], len(remaining[:room]))
    data = {
        "goal": goal,
        "thinking_summary": _one_line(
            f"Keeping {len(keep)} completed step(s); " + (f"adjusting because {why}. " if why else "")
            + "Next: " + ", ".join(m.action for m in remaining[:room]) + "."
        ),
        "confidence": 0.6,
        "steps": keep + [_persona_step(m, k) for m, k in zip(remaining[:room], keys, strict=True)],
    }
    return _reply("Replanning from where I am.", data)


def _persona_without_declined(moves: list[_Move], declined: Sequence[Mapping[str, Any]],
                              allowed: Sequence[str]) -> list[_Move]:
    """The operator said no to these actions (in this version or an earlier one): each declined one is replaced
    by the action its feedback names, else by another way to the same end the world has, else left out."""
    refused = {_normal(str(s.get("action_hint", ""))) for s in declined}
    result = list(moves)
    for old in declined:
        action = _normal(str(old.get("action_hint", "")))
        if not any(_normal(m.action) == action for m in result):
            continue
        named = [a for a in _actions_named(str(old.get("feedback", "")), allowed) if _normal(a) not in refused]
        usual = [a for a in (_match_action(w, allowed) for w in _INSTEAD.get(action, ())) if a is not None]
        other = [a for a in usual if _normal(a) not in refused and all(_normal(m.action) != _normal(a) for m in result)]
        instead: str | None = next(iter(named or other), None)
        replaced: list[_Move] = []
        for move in result:
            if _normal(move.action) != action:
                replaced.append(move)
            elif instead is not None:
                replaced.append(_Move(instead, f"{instead.capitalize()} instead", ""))
                instead = None  # one replacement; the declined action's other steps go
        result = replaced
    return result


def _persona_echo(step: Mapping[str, Any]) -> dict[str, Any]:
    cycles = step.get("estimated_cycles")
    return {
        "id": str(step.get("key", "")),
        "description": str(step.get("description", "")),
        "action_hint": str(step.get("action_hint", "")),
        "expected_outcome": str(step.get("expected_outcome", "")),
        "estimated_cycles": cycles if isinstance(cycles, int) and not isinstance(cycles, bool) else 1,
    }


# -- tool plans (seed 003) -------------------------------------------------------------------------


@dataclass
class _ToolStep:
    ref: str  # template-local; real ids are given when the plan is written out
    tool: str
    intent: str
    input: dict[str, Any]
    depends: list[str] = field(default_factory=list)
    expects: str = ""
    for_each: str = ""  # seed 002 FOR_EACH: the ref of the file.list step whose files this step runs over


@dataclass
class _Template:
    summary: str
    steps: list[_ToolStep]
    risks: list[str] = field(default_factory=list)


def _mentioned_files(text: str) -> list[str]:
    found = []
    for match in _FILE_NAME.finditer(text):
        if match.group(2).lower() in _FILE_EXTENSIONS and match.group(1) not in found:
            found.append(match.group(1))
    return found


def _workspace_files(ctx: Mapping[str, Any]) -> list[str]:
    return [f for f in _texts(ctx, "workspace_files") if f and not f.endswith("/")]


def _ext(path: str) -> str:
    return PurePosixPath(path).suffix.lower().lstrip(".")


def _with_ext(path: str, ext: str) -> str:
    return PurePosixPath(path).with_suffix(f".{ext}").as_posix()


def _template_convert(goal: str, files: Sequence[str]) -> _Template:
    mentioned = _mentioned_files(goal)
    if re.search(r"\bmarkdown\b|\bmd\b", goal.lower()) or any(_ext(f) in ("md", "markdown") for f in mentioned):
        return _template_markdown(goal, files)
    wants_csv = bool(re.search(r"\bto\s+(?:a\s+)?csv\b", goal.lower()))
    source_ext = "json" if wants_csv else "csv"
    source = next((f for f in mentioned if _ext(f) == source_ext), None)
    source = source or next((f for f in mentioned if _ext(f) in ("csv", "json")), None)
    source = source or next((f for f in files if _ext(f) == source_ext), None) or f"data.{source_ext}"
    target_ext = "json" if _ext(source) == "csv" else "csv"
    output = next((f for f in mentioned if _ext(f) == target_ext and f != source), None) or _with_ext(source, target_ext)
    steps = [
        _ToolStep("read", "file.read", f"Read {source} to check its header and rows", {"path": source},
                  expects=f"{source} is readable"),
        _ToolStep("convert", "file.convert", f"Convert {source} to {target_ext.upper()}",
                  {"path": source, "to": target_ext, "output": output}, ["read"], f"{output} is written"),
        _ToolStep("check", "file.read", f"Check the converted file {output}", {"path": output}, ["convert"],
                  f"{output} holds the same rows"),
    ]
    return _Template(f"Read {source}, convert it to {target_ext.upper()} as {output}, then check the result.",
                     steps, [f"Overwrites {output} if it already exists"])


def _template_markdown(goal: str, files: Sequence[str]) -> _Template:
    """"Turn data.csv into a Markdown table in data.md": file.convert to md, the source left as it is."""
    mentioned = _mentioned_files(goal)
    source = next((f for f in mentioned if _ext(f) in ("csv", "json")), None)
    source = source or next((f for f in files if _ext(f) in ("csv", "json")), None) or "data.csv"
    output = next((f for f in mentioned if _ext(f) in ("md", "markdown") and f != source), None) or _with_ext(source, "md")
    steps = [
        _ToolStep("convert", "file.convert", f"Convert {source} to a Markdown table in {output}",
                  {"path": source, "to": "md", "output": output}, expects=f"{output} holds a table with a header row"),
        _ToolStep("check", "file.read", f"Read {output} back to check the table", {"path": output}, ["convert"],
                  f"{output} holds the rows of {source}"),
    ]
    return _Template(f"Convert {source} to a Markdown table in {output} ({source} itself is not changed), then check it.",
                     steps, [f"Overwrites {output} if it already exists"])


def _template_copy(goal: str, files: Sequence[str]) -> _Template:
    """"Make a backup copy of data.csv called data_backup.csv": file.copy, the source left as it is."""
    mentioned = _mentioned_files(goal)
    source = next(iter(mentioned), None) or next(iter(files), None) or "data.csv"
    path = PurePosixPath(source)
    target = next((f for f in mentioned if f != source), None) or path.with_name(f"{path.stem}_backup{path.suffix}").as_posix()
    steps = [
        _ToolStep("copy", "file.copy", f"Copy {source} to {target}", {"path": source, "to": target},
                  expects=f"{target} holds the same content as {source}"),
        _ToolStep("check", "file.read", f"Read {target} back to check the copy", {"path": target}, ["copy"],
                  f"{target} is readable"),
    ]
    return _Template(f"Copy {source} to {target} ({source} itself is not changed), then check the copy.", steps,
                     [f"Fails if {target} already exists (a copy never overwrites)"])


def _template_move(goal: str, files: Sequence[str]) -> _Template | None:
    """"Rename notes.txt to old-notes.txt": one file.move, when the goal names both."""
    mentioned = _mentioned_files(goal)
    if len(mentioned) < 2:
        return None
    source, target = mentioned[0], mentioned[1]
    steps = [_ToolStep("move", "file.move", f"Move {source} to {target}", {"path": source, "to": target},
                       expects=f"{target} exists and {source} is gone")]
    return _Template(f"Move {source} to {target}.", steps, [f"Links to {source} will break"])


def _template_sort(goal: str, files: Sequence[str], max_steps: int) -> _Template:
    loose = [f for f in files if "/" not in f and not f.startswith(".")]
    steps = [_ToolStep("list", "file.list", "List the workspace to see which files need sorting", {"path": "."})]
    risks = ["Moves files; links to their old locations will break"]
    groups: dict[str, list[str]] = {}
    for name in sorted(loose):
        groups.setdefault(_ext(name) or "other", []).append(name)
    left_out = 0
    for ext in sorted(groups):
        if len(steps) + 2 > max_steps:
            left_out += len(groups[ext])
            continue
        steps.append(_ToolStep(f"dir-{ext}", "dir.create", f"Create the folder {ext}/ for .{ext} files",
                               {"path": ext}, ["list"], f"{ext}/ exists"))
        for name in groups[ext]:
            if len(steps) + 1 > max_steps:
                left_out += 1
                continue
            steps.append(_ToolStep(f"move-{name}", "file.move", f"Move {name} into {ext}/",
                                   {"path": name, "to": f"{ext}/"}, [f"dir-{ext}"], f"{ext}/{name} exists"))
    if left_out:
        risks.append(f"{left_out} file(s) left for a later plan (step limit {max_steps})")
    summary = (f"List the workspace, then move {len(loose)} file(s) into one folder per extension."
               if loose else "List the workspace first; no loose files are known yet.")
    return _Template(summary, steps, risks)


def _text_sources(goal: str, files: Sequence[str], skip: Sequence[str] = ()) -> list[str]:
    mentioned = [f for f in _mentioned_files(goal) if _ext(f) in TEXT_EXTENSIONS and f not in skip]
    if mentioned:
        return mentioned[:5]
    report_like = ("report", "summary", "summaries")
    known = [f for f in files if _ext(f) in TEXT_EXTENSIONS and not PurePosixPath(f).stem.lower().startswith(report_like)]
    return known[:5] or ["notes.txt"]


def _template_summaries(goal: str, files: Sequence[str], *, output: str, listing: bool,
                        skip: Sequence[str] = ()) -> _Template:
    written = next((f for f in _mentioned_files(goal) if _ext(f) == "md"), output)
    # The file the summaries go to is not one of their sources ("summarize notes.txt to summary.md").
    sources = [f for f in _text_sources(goal, files, [*skip, written]) if f != written] or ["notes.txt"]
    steps = [_ToolStep("list", "file.list", "List the workspace to find the files", {"path": "."})] if listing else []
    for number, path in enumerate(sources, start=1):
        steps.append(_ToolStep(f"sum-{number}", "text.summarize", f"Summarize {path}",
                               {"path": path, "max_sentences": 3}, ["list"] if listing else [],
                               f"a 3-sentence summary of {path}"))
    steps.append(_ToolStep("report", "report.write", f"Write the summaries of {len(sources)} file(s) to {written}",
                           {"paths": sources, "output": written}, [s.ref for s in steps if s.tool == "text.summarize"],
                           f"{written} has one section per file"))
    return _Template(f"Summarize {', '.join(sources)}, then collect the summaries in {written}.", steps,
                     [f"Overwrites {written} if it already exists"])


def _template_write(goal: str) -> _Template:
    path = next((f for f in _mentioned_files(goal) if _ext(f) in (*TEXT_EXTENSIONS, "csv", "json", "html")), "note.txt")
    quoted = _QUOTED.search(goal)
    if quoted:
        content = next(g for g in quoted.groups() if g)
    else:
        after = re.search(r"\b(?:saying|that says|with the text|containing|reading)\b:?\s*(.+)$", goal, re.IGNORECASE)
        content = after.group(1).strip() if after else f"Note: {goal}"
    steps = [
        _ToolStep("write", "file.write", f"Write {path}", {"path": path, "content": content.rstrip() + "\n"},
                  expects=f"{path} exists"),
        _ToolStep("check", "file.read", f"Read {path} back to check it", {"path": path}, ["write"]),
    ]
    return _Template(f"Write {path} and read it back.", steps, [f"Overwrites {path} if it already exists"])


def _template_count(goal: str, files: Sequence[str]) -> _Template:
    """"Count the rows in data.csv and write the count to count.txt": read the source, never write it."""
    mentioned = _mentioned_files(goal)
    lowered = goal.lower()
    source = next((f for f in mentioned if _ext(f) == "csv"), None) or next(iter(mentioned), None)
    source = source or next((f for f in files if _ext(f) == "csv"), None) or "data.csv"
    output = next((f for f in mentioned if f != source), None) or "count.txt"
    unit = "words" if "word" in lowered else "lines" if "line" in lowered and _ext(source) != "csv" else (
        "rows" if _ext(source) == "csv" else "lines")
    steps = [
        _ToolStep("read", "file.read", f"Read {source} to check it has a header and rows", {"path": source},
                  expects=f"{source} is readable"),
        _ToolStep("count", "file.count", f"Count the {unit} of {source} and write the number to {output}",
                  {"path": source, "output": output, "unit": unit}, ["read"], f"{output} holds the number of {unit}"),
        _ToolStep("check", "file.read", f"Read {output} back to check the count", {"path": output}, ["count"],
                  f"{output} holds one number"),
    ]
    return _Template(f"Read {source}, count its {unit} into {output} ({source} itself is not changed), then check it.",
                     steps, [f"Overwrites {output} if it already exists"])


# Words that say what a tool goal wants; a goal with none of them and no file or URL is a question.
_INTENT_WORDS = frozenset((
    "list", "show", "read", "look", "files", "file", "folder", "workspace", "open", "check", "find", "see",
    "what", "which", "inventory", "contents",
))


def _ambiguous(goal: str, words: set[str]) -> bool:
    return not _mentioned_files(goal) and not _URL.search(goal) and not words & _INTENT_WORDS


def _template_each(goal: str, files: Sequence[str]) -> _Template | None:
    """"Summarize each file in notes": list the folder, then one summary per file it holds (seed 002 FOR_EACH)."""
    folders = sorted({f.split("/", 1)[0] for f in files if "/" in f})
    words = re.findall(r"[\w.-]+/?", goal.lower())
    folder = next((w.rstrip("/") for w in words if w.rstrip("/") in folders), None)
    folder = folder or next((w.rstrip("/") for w in words if w.endswith("/") and len(w) > 1), None)
    if folder is None:
        return None
    steps = [
        _ToolStep("list", "file.list", f"List the files in {folder}/", {"path": folder}, expects=f"the files of {folder}/"),
        _ToolStep("each", "text.summarize", f"Summarize each file listed in {folder}/", {"path": "{item}", "max_sentences": 3},
                  ["list"], "a short summary of every file", for_each="list"),
    ]
    return _Template(f"List {folder}/, then summarize every file in it, one by one.", steps)


def _template_fetch(goal: str, url: str) -> _Template:
    steps = [_ToolStep("fetch", "web.fetch", f"Fetch {url}", {"url": url}, expects="the page content")]
    return _Template(f"Fetch {url}.", steps, ["Needs network access"])


def _template_list(goal: str) -> _Template:
    steps = [_ToolStep("list", "file.list", "List the files in the workspace", {"path": "."})]
    for number, path in enumerate(_mentioned_files(goal)[:3], start=1):
        steps.append(_ToolStep(f"read-{number}", "file.read", f"Read {path}", {"path": path}, ["list"]))
    return _Template("List the workspace" + (" and read the files named in the goal." if len(steps) > 1 else "."), steps)


_TEMPLATE_WORDS = frozenset((
    "count", "convert", "sort", "organize", "organise", "tidy", "arrange", "report", "summarize", "summarise",
    "summary", "write", "note", "save", "create", "csv", "json",
))


def _tool_template(goal: str, files: Sequence[str], max_steps: int, skip: Sequence[str] = ()) -> _Template:
    """The plan template for a goal, chosen by its words; files the operator said to skip are left out of
    every step."""
    files = [f for f in files if f not in skip]
    url = _URL.search(goal)
    text = _URL.sub(" ", goal).lower()  # "https://x/report.csv" asks for a fetch, not a report
    words = set(re.findall(r"[a-z]+", text))
    if url:
        template = _template_fetch(goal, url.group())
    elif "count" in words or "how many" in text:
        template = _template_count(goal, files)
    elif words & {"copy", "backup", "duplicate"} or re.search(r"\bback\s*-?\s*up\b", text):
        template = _template_copy(goal, files)
    elif words & {"move", "rename"} and (moved := _template_move(goal, files)) is not None:
        template = moved
    elif "convert" in words or ({"csv", "json"} <= words) or (
            words & {"markdown", "turn", "export"} and any(_ext(f) in ("csv", "json") for f in _mentioned_files(goal))):
        template = _template_convert(goal, files)
    elif words & {"sort", "organize", "organise", "tidy", "arrange"} or "by extension" in text:
        template = _template_sort(goal, files, max_steps)
    elif words & {"each", "every"} and any(w.startswith(("summar", "summir")) for w in words) and (
            each := _template_each(goal, files)) is not None:
        template = each
    elif "report" in words:
        template = _template_summaries(goal, files, output="report.md", listing=True, skip=skip)
    elif any(w.startswith(("summar", "summir")) for w in words):
        template = _template_summaries(goal, files, output="summaries.md", listing=False, skip=skip)
    elif words & {"write", "note", "save", "create"}:
        template = _template_write(goal)
    else:
        template = _template_list(goal)
    template.steps = _steps_without_files(template.steps, skip)[:max_steps]
    kept = {s.ref for s in template.steps}
    for step in template.steps:
        step.depends = [d for d in step.depends if d in kept]
    return template


def _steps_without_files(steps: list[_ToolStep], skip: Sequence[str]) -> list[_ToolStep]:
    """Steps with the skipped files taken out of every input: a step on one of them goes, a list loses them
    (and goes when nothing is left of it)."""
    if not skip:
        return steps
    kept = []
    for step in steps:
        if any(value in skip for value in step.input.values() if isinstance(value, str)):
            continue
        lists = {k: [v for v in value if v not in skip] for k, value in step.input.items() if isinstance(value, list)}
        if any(not value for value in lists.values()):
            continue
        kept.append(replace(step, input=step.input | lists) if lists != {k: step.input[k] for k in lists} else step)
    return kept


# "Skip tuesday", "leave out the notes/tuesday.txt file": the word right after says what to leave out.
_SKIP_WHAT = re.compile(r"\b(?:skip|leave out|drop|exclude|without)\s+(?:the\s+|all\s+)?([\w./-]+)", re.IGNORECASE)


def _files_named(word: str, files: Sequence[str]) -> list[str]:
    """Workspace files one word names: by path, by name, or by the name without its extension ("tuesday")."""
    word = word.lower().rstrip(".")
    return [f for f in files if word in (f.lower(), PurePosixPath(f).name.lower())
            or (len(word) >= 3 and PurePosixPath(f).stem.lower() == word)]


def _skipped_files(declined: Sequence[Mapping[str, Any]], files: Sequence[str]) -> list[str]:
    """The files the operator said to skip when declining a step ("Skip tuesday"), in any earlier version."""
    skipped: list[str] = []
    for old in declined:
        for word in _SKIP_WHAT.findall(str(old.get("feedback", ""))):
            skipped += [f for f in _files_named(word, files) if f not in skipped]
    return skipped


def _tool_step_out(step: _ToolStep, key: str, depends_on: list[str]) -> dict[str, Any]:
    spec = TOOLS.get(step.tool)
    out: dict[str, Any] = {
        "id": key,
        "tool": step.tool,
        "intent": _one_line(step.intent),
        "input": step.input,
        "requiresPermission": bool(spec and spec.risky),
        "dependsOn": depends_on,
    }
    if step.expects:
        out["expects"] = _one_line(step.expects)
    if step.for_each:
        out["forEach"] = depends_on[step.depends.index(step.for_each)] if step.for_each in step.depends else ""
    return out


def _tool_plan(ctx: Mapping[str, Any]) -> str:
    goal = _text(ctx, "goal") or "List the workspace"
    words = set(re.findall(r"[a-z]+", goal.lower()))
    if _ambiguous(goal, words) and not _TEMPLATE_WORDS & words:
        # Seed 003: ask rather than guess what an unclear goal means.
        question = (f"What should I do for \"{_one_line(goal, 120)}\"? Name the files and the result you want, "
                    "e.g. \"convert data.csv to JSON\" or \"summarize notes.txt\".")
        return _reply("The goal is not clear enough to plan.", {"clarification": question})
    template = _tool_template(goal, _workspace_files(ctx), _max_steps(ctx))
    keys = {step.ref: str(number) for number, step in enumerate(template.steps, start=1)}
    data = {
        "goal": goal,
        "thinking_summary": template.summary,
        "confidence": 0.8,
        "risks": template.risks,
        "steps": [_tool_step_out(s, keys[s.ref], [keys[d] for d in s.depends]) for s in template.steps],
    }
    return _reply(f"Plan with {len(template.steps)} step(s); writes need permission.", data)


_SKIP_WORDS = ("skip", "not needed", "unnecessary", "leave it out", "remove this step", "don't need", "do not need")
_RENAME_WORDS = ("overwrite", "different name", "new file", "keep the original", "another name", "rename")


# The input naming what a step creates or changes, which a rename request or a redirection changes.
_TARGET_KEY = {
    "file.convert": "output", "file.move": "to", "file.copy": "to", "file.write": "path", "file.append": "path",
    "report.write": "output", "dir.create": "path", "file.count": "output",
}

# Plain redirections in an operator's feedback. A file name, as _FILE_NAME finds it.
_F = r"((?:[\w-]+/)*[\w-]+\.[A-Za-z0-9]{1,8})"
_GAP = r"[\s,;:]+(?:(?:the|a|file|to|into|in|it|them|of|and|but)\s+){0,3}"
_INSTEAD_OF = re.compile(_F + r"\s+(?:instead\s+of|rather\s+than|in\s+place\s+of)" + _GAP + _F, re.IGNORECASE)
_INSTEAD_OF_FIRST = re.compile(r"\b(?:instead\s+of|rather\s+than)\s+(?:the\s+)?" + _F + r"[\s,;:]+(?:\w+\s+){0,6}?"
                               + _F, re.IGNORECASE)
_X_NOT_Y = re.compile(_F + r"[\s,;:]+(?:and\s+|but\s+)?not\s+(?:the\s+|in\s+|to\s+|into\s+)?" + _F, re.IGNORECASE)
_X_INSTEAD = re.compile(_F + r"\s+instead\b(?!\s+of)", re.IGNORECASE)
_USE_X = re.compile(r"\b(?:use|write\s+(?:\w+\s+){0,4}?(?:to|into|in)|save\s+(?:\w+\s+){0,4}?(?:to|as|in)|"
                    r"put\s+(?:\w+\s+){0,4}?in(?:to)?|call\s+it|name\s+it)\s+" + _F, re.IGNORECASE)
_HANDS_OFF = re.compile(
    r"\b(?:don['\u2019]?t|do\s+not|never|not|no)\s+(?:(?:touch|overwrite|change|modify|edit|delete|remove|move|"
    r"replace|clobber|write|writing|to|into|on|onto|over|the|file|in|my|our)\s+){0,3}" + _F
    + r"|\bleave\s+(?:the\s+)?" + _F + r"\s+(?:alone|as\s+it\s+is|untouched)"
    + r"|\bhands\s+off\s+(?:the\s+)?" + _F + r"|\bkeep\s+(?:the\s+)?" + _F + r"\s+(?:as\s+it\s+is|unchanged|intact)",
    re.IGNORECASE)
_NO_USE = re.compile(r"\b(?:don['\u2019]?t|do\s+not|never)\s+(?:touch|use|read|open)\s+(?:the\s+|my\s+|our\s+)?" + _F
                     + r"|\bhands\s+off\s+(?:the\s+)?" + _F + r"|\bstay\s+away\s+from\s+(?:the\s+)?" + _F,
                     re.IGNORECASE)
_SKIP_STEP = re.compile(r"\b(?:skip|drop|leave\s+out|remove|no)\s+(?:the\s+|that\s+|this\s+|all\s+(?:the\s+)?)?"
                        r"([a-z]+)\s+steps?\b", re.IGNORECASE)


@dataclass
class _Redirect:
    """What plain feedback asks, read from every word the operator said about the plan."""

    moves: dict[str, str] = field(default_factory=dict)  # "use weekly.md instead of report.md": report.md -> weekly.md
    instead: str = ""  # "write it to weekly.md instead": the declined step's target becomes weekly.md
    hands_off: list[str] = field(default_factory=list)  # "don't touch data.csv", "not report.md": nothing changes it
    skip_steps: list[str] = field(default_factory=list)  # "skip the summary step": steps named so are left out
    no_use: list[str] = field(default_factory=list)  # "don't touch data.csv": no step uses it at all
    named: list[str] = field(default_factory=list)  # every file the operator named

    def __bool__(self) -> bool:
        return bool(self.moves or self.instead or self.hands_off or self.skip_steps or self.no_use)


def _redirect_read(feedback: Sequence[str]) -> _Redirect:
    said = _Redirect()
    for text in feedback:
        text = " ".join(text.split())
        said.named += [f for f in _mentioned_files(text) if f not in said.named]
        for new, old in _INSTEAD_OF.findall(text) + _X_NOT_Y.findall(text):
            if new != old:
                said.moves[old] = new
        for old, new in _INSTEAD_OF_FIRST.findall(text):
            if new != old:
                said.moves.setdefault(old, new)
        for match in _HANDS_OFF.finditer(text):
            path = next(g for g in match.groups() if g)
            if path not in said.hands_off and path not in said.moves.values():
                said.hands_off.append(path)
        for match in _NO_USE.finditer(text):
            path = next(g for g in match.groups() if g)
            if path not in said.no_use:
                said.no_use.append(path)
        alone = [m for m in _X_INSTEAD.findall(text) if m not in said.moves.values()]
        alone += [m for m in _USE_X.findall(text) if m not in said.moves.values() and m not in said.hands_off]
        if alone:
            said.instead = alone[-1]
        said.skip_steps += [w.lower() for w in _SKIP_STEP.findall(text) if w.lower() not in ("this", "that", "it")]
    for old in said.hands_off:  # "Do not overwrite report.md: write ... to weekly.md instead"
        if old not in said.moves and said.instead and said.instead != old:
            said.moves[old] = said.instead
    return said


def _step_target(step: _ToolStep) -> str:
    """What the step creates or changes ('' when it only reads)."""
    key = _TARGET_KEY.get(step.tool)
    value = step.input.get(key) if key else None
    if step.tool == "file.convert" and not value:
        value = _with_ext(str(step.input.get("path", "data")), str(step.input.get("to", "json")))
    return value if isinstance(value, str) else ""


def _step_paths(step: _ToolStep) -> list[str]:
    """Every path the step's input names."""
    return [v for value in step.input.values() for v in (value if isinstance(value, list) else [value])
            if isinstance(v, str)]


def _step_changes(step: _ToolStep, path: str) -> bool:
    """Whether the step writes, moves or removes `path`."""
    return _step_target(step) == path or (step.tool == "file.move" and step.input.get("path") == path)


def _moved(step: _ToolStep, moves: Mapping[str, str]) -> _ToolStep:
    """The step with every path the operator redirected replaced, its description following."""
    if not moves:
        return step
    new_input: dict[str, Any] = {}
    for key, value in step.input.items():
        if isinstance(value, str):
            value = moves.get(value, value)
        elif isinstance(value, list):
            value = [moves.get(v, v) if isinstance(v, str) else v for v in value]
        new_input[key] = value
    if new_input == step.input:
        return step
    intent = step.intent
    for old, new in moves.items():
        intent = re.sub(rf"(?<![\w/.-]){re.escape(old)}(?![\w/-])", new, intent)
    return replace(step, intent=intent, input=new_input)


def _retarget(step: _ToolStep, target: str) -> _ToolStep:
    key = _TARGET_KEY.get(step.tool)
    old = _step_target(step)
    if key is None or not old or old == target:
        return step
    intent = re.sub(rf"(?<![\w/.-]){re.escape(old)}(?![\w/-])", target, step.intent)
    if intent == step.intent:
        intent = f"{step.intent} as {target}"
    return replace(step, intent=intent, input=step.input | {key: target})


def _suffixed(path: str, suffix: str = "-new", taken: Sequence[str] = ()) -> str:
    """A new name next to `path` that no file in `taken` has: a renamed output never lands on an existing file."""
    pure = PurePosixPath(path)
    number = 1
    while True:
        name = pure.with_name(f"{pure.stem}{suffix}{'' if number == 1 else f'-{number}'}{pure.suffix}").as_posix()
        if name not in taken:
            return name
        number += 1


def _revise_tool_step(step: _ToolStep, why: str, feedback: Sequence[str], files: Sequence[str]) -> _ToolStep:
    """The failed or declined step, changed the way the feedback and the failure reason ask. Its description
    says what it does now, never the feedback pasted in: whether it changed is in its tool and input."""
    spoken = " ".join(feedback)
    lowered = f"{spoken} {why}".lower()
    said = _redirect_read(feedback)
    moved = _moved(step, said.moves)
    if moved is not step:
        return moved
    if said.instead and _step_target(step):
        return _retarget(step, said.instead)
    new_input = dict(step.input)
    spec = TOOLS.get(step.tool)
    named = [f for f in _mentioned_files(spoken) if f not in said.hands_off]
    if named and spec is not None:
        # A file named in the feedback replaces the output if it has the output's type, else the source.
        if "output" in spec.schema and _ext(named[0]) == _ext(str(new_input.get("output", ""))):
            new_input["output"] = named[0]
        elif step.tool in ("file.move", "file.copy") and len(named) == 1 and named[0] != new_input.get("path"):
            new_input["to"] = named[0]
        elif "path" in spec.schema and not _step_target(step):
            new_input["path"] = named[0]
    elif "does not exist" in lowered and isinstance(new_input.get("path"), str):
        others = [f for f in files if f != new_input["path"]]
        close = difflib.get_close_matches(new_input["path"], others, n=1, cutoff=0.3)
        if close:
            new_input["path"] = close[0]
    elif (any(w in lowered for w in _RENAME_WORDS) or "already exists" in lowered
          or any(_step_changes(step, h) for h in said.hands_off)) and step.tool in _TARGET_KEY:
        key = _TARGET_KEY[step.tool]
        value = _step_target(step)
        if value.endswith("/"):  # a move into a folder: rename the file inside it
            name = PurePosixPath(str(new_input.get("path", "file"))).name
            new_input[key] = value + PurePosixPath(_suffixed(name, taken=[f[len(value):] for f in files
                                                                           if f.startswith(value)])).name
        elif value:
            new_input[key] = _suffixed(value, taken=files)
    quoted = _QUOTED.search(spoken)
    if quoted and "content" in new_input:
        new_input["content"] = next(g for g in quoted.groups() if g).rstrip() + "\n"
    if new_input == step.input:
        return step
    revised = replace(step, input=new_input)
    target = _step_target(revised)
    if target and target != _step_target(step):
        revised = replace(_retarget(step, target), input=new_input)
    return revised


def _same(a: _ToolStep, b: _ToolStep) -> bool:
    return a.tool == b.tool and a.input == b.input


def _tool_replan(ctx: Mapping[str, Any]) -> str:
    goal = _text(ctx, "goal") or "List the workspace"
    files = _workspace_files(ctx)
    max_steps = _max_steps(ctx)
    completed = _steps(ctx, "completed_steps")
    failed = ctx.get("failed_step") if isinstance(ctx.get("failed_step"), dict) else None
    reason = _failure_reason(ctx, failed)
    feedback = _texts(ctx, "feedback")
    declined = _steps(ctx, "declined_steps")
    skipped = _skipped_files(declined, files)
    everything_said = list(dict.fromkeys([*feedback, *(str(d.get("feedback", "")) for d in declined)]))
    said = _redirect_read(everything_said)
    template = _tool_template(goal, files, max_steps, skipped)
    plain = [replace(s) for s in template.steps]  # as planned without the feedback, to tell what changed
    template.steps = _not_reading_outputs([_moved(s, said.moves) for s in template.steps],
                                          [*said.moves.values(), said.instead])

    # Template steps already done map to the completed step's key; the rest remain to be done.
    key_of: dict[str, str] = {}
    matched: list[str] = []
    remaining: list[_ToolStep] = []
    for step in template.steps:
        done = next(
            (c for c in completed
             if str(c.get("key")) not in matched and c.get("tool") == step.tool and c.get("input") == step.input),
            None,
        )
        if done is not None:
            key_of[step.ref] = str(done.get("key"))
            matched.append(str(done.get("key")))
        else:
            remaining.append(step)

    why = reason
    target: _ToolStep | None = None
    if failed is not None:
        failed_tool, failed_input = str(failed.get("tool", "")), failed.get("input") or {}
        target = next((s for s in remaining if s.tool == failed_tool and s.input == failed_input), None)
        target = target or next((s for s in remaining if s.tool == failed_tool), None)
        if target is None and failed_tool in TOOLS and isinstance(failed_input, dict):
            target = _ToolStep("failed", failed_tool, str(failed.get("description", "")) or failed_tool, dict(failed_input))
            remaining.insert(0, target)
        spoken = " ".join(feedback).lower()
        if failed_tool == "web.fetch" or "network access is disabled" in reason.lower():
            remaining = [s for s in remaining if s.tool != "web.fetch"]
            url = str(failed_input.get("url", "the page")) if isinstance(failed_input, dict) else "the page"
            remaining.append(_ToolStep(
                "note", "file.write", "Leave a note that the page could not be fetched",
                {"path": "fetch-notes.md",
                 "content": f"Could not fetch {url}: network access is disabled for this agent.\n"
                            "Put the page into the workspace to continue.\n"},
                expects="fetch-notes.md explains what is needed",
            ))
        elif target is not None and said.skip_steps:
            pass  # "skip the summary step": the steps so named go below
        elif target is not None and any(w in spoken for w in _SKIP_WORDS):
            if not skipped:  # "skip this step": the step goes; "skip tuesday": tuesday is out of every step
                remaining.remove(target)
        elif target is not None:
            if said.instead and _step_target(target) and not said.moves:
                revised = _retarget(target, said.instead)
            else:
                revised = _revise_tool_step(target, why, feedback, files)
            remaining[remaining.index(target)] = revised
            _readers_follow(remaining, target, revised)

    planned = list(remaining)
    remaining = _tool_without_declined(_steps_without_files(remaining, skipped), declined, files)
    remaining = _tool_as_told(remaining, said, target)
    if failed is None and said.instead and not said.moves and not any(_step_target(s) == said.instead
                                                                      for s in remaining):
        # The whole plan sent back with "write it to data_old.csv instead": the step making the file of that kind
        # (the last one, the plan's result) writes there, and the steps reading what it made follow.
        main = next((s for s in reversed(remaining) if _step_target(s) and not _step_target(s).endswith("/")
                     and _ext(_step_target(s)) == _ext(said.instead)), None)
        if main is not None:
            moved = _retarget(main, said.instead)
            remaining[remaining.index(main)] = moved
            _readers_follow(remaining, main, moved)
    # A check of what a left-out step would have written goes with it.
    left = {s.ref for s in remaining}
    gone = {_step_target(s) for s in planned if s.ref not in left} - {""}
    remaining = [s for s in remaining if not (s.tool == "file.read" and s.input.get("path") in gone)]
    if not remaining and said and (said.no_use or said.hands_off or said.skip_steps):
        question = (f"Following your feedback (\"{_one_line(' '.join(everything_said), 160)}\") leaves no step that "
                    f"does \"{_one_line(goal, 120)}\". What should be done instead?")
        return _reply("The feedback leaves nothing of the goal to do.", {"clarification": question})
    if not remaining:
        remaining = [_ToolStep("list", "file.list", "List the workspace to confirm the result", {"path": "."})]
    keep = [_tool_echo(step, [str(c.get("key")) for c in completed]) for step in completed]
    room = max(max_steps - len(keep), 0)
    remaining = remaining[:room]
    before = [(s.tool, s.input) for s in plain if not any(
        c.get("tool") == s.tool and c.get("input") == s.input for c in completed)]
    if failed is not None and not any(c.get("tool") == failed.get("tool") and c.get("input") == failed.get("input")
                                      for c in completed):
        failed_pair = (str(failed.get("tool", "")), failed.get("input") or {})
        if failed_pair not in before:
            before.insert(0, failed_pair)
    changed = before != [(s.tool, s.input) for s in remaining]
    if failed is None and feedback and (not changed or not _redirect_read(feedback[-1:])):
        # A plan sent back whose newest feedback says nothing this planner can follow: ask, rather than offer
        # the same plan again.
        question = (f"What should change in the plan for \"{_one_line(goal, 120)}\"? Your feedback "
                    f"(\"{_one_line(feedback[-1], 160)}\") names no step or file to change, e.g. \"write "
                    "weekly.md instead of report.md\", \"don't touch data.csv\" or \"skip the check step\".")
        return _reply("The feedback does not say what to change.", {"clarification": question})
    for step, key in zip(remaining, _fresh_keys([s["id"] for s in keep], len(remaining)), strict=True):
        key_of[step.ref] = key
    steps = keep + [
        _tool_step_out(s, key_of[s.ref], [key_of[d] for d in s.depends if d in key_of]) for s in remaining
    ]
    because = "; ".join([*feedback, reason] if reason else feedback)
    if changed and because:
        why_line = f" Changed course because: {because}."
    elif because:
        why_line = f" Trying the same steps again after: {because}."
    else:
        why_line = ""
    data = {
        "goal": goal,
        "thinking_summary": _one_line(f"Keeping {len(keep)} completed step(s)." + why_line),
        "confidence": 0.7,
        "risks": [r for r in template.risks if not any(f"Overwrites {h} " in f"{r} " for h in said.hands_off)],
        "steps": steps,
    }
    return _reply("Replanning: completed steps stay as they are.", data)


def _not_reading_outputs(steps: list[_ToolStep], outputs: Sequence[str]) -> list[_ToolStep]:
    """A report redirected to weekly.md does not summarize weekly.md into itself: its sources leave out the
    files the operator named as the place to write."""
    outputs = [o for o in outputs if o]
    if not outputs:
        return steps
    result = []
    for step in steps:
        if step.tool == "text.summarize" and step.input.get("path") in outputs:
            continue
        if step.tool == "report.write" and isinstance(step.input.get("paths"), list):
            paths = [p for p in step.input["paths"] if p not in outputs]
            if paths != step.input["paths"]:
                step = replace(step, input=step.input | {"paths": paths},
                               intent=re.sub(r"of \d+ file\(s\)", f"of {len(paths)} file(s)", step.intent))
        result.append(step)
    kept = {s.ref for s in result}
    for step in result:
        step.depends = [d for d in step.depends if d in kept]
    return result


def _tool_as_told(steps: list[_ToolStep], said: _Redirect, target: _ToolStep | None) -> list[_ToolStep]:
    """The operator's plain redirections applied to the steps still to do: a file they said not to touch is
    changed by no step (one writing it goes, unless they named where to write instead); steps they said to skip
    ("skip the summary step") go."""
    result = []
    changed: list[tuple[_ToolStep, _ToolStep]] = []
    for step in steps:
        kept: _ToolStep | None = step
        for path in said.hands_off:
            if kept is not None and _step_changes(kept, path):
                new = said.moves.get(path) or said.instead
                kept = _retarget(kept, new) if new and new != path and _step_target(kept) == path else None
        if kept is not None and any(path in _step_paths(kept) for path in said.no_use):
            kept = None
        if kept is not None and said.skip_steps:
            words = f"{kept.tool} {kept.intent.split(' ', 1)[0]}".lower()
            if any(w in words or (len(w) > 5 and w[:6] in words) for w in said.skip_steps):
                kept = None
        if kept is not None:
            result.append(kept)
            if kept is not step:
                changed.append((step, kept))
    for before, after in changed:
        _readers_follow(result, before, after)
    return result


def _tool_without_declined(steps: list[_ToolStep], declined: Sequence[Mapping[str, Any]],
                           files: Sequence[str]) -> list[_ToolStep]:
    """A step the operator declined (in this version or an earlier one) never comes back with the same tool and
    input, whatever its description: a step they said to skip stays out, any other is changed by everything
    they said about it, and left out when nothing they said tells how."""
    result = list(steps)
    for step in steps:
        said = [str(d.get("feedback", "")) for d in declined
                if d.get("tool") == step.tool and (d.get("input") or {}) == step.input]
        if not said:
            continue
        if any(w in " ".join(said).lower() for w in _SKIP_WORDS):
            result.remove(step)
            continue
        revised = _revise_tool_step(step, "", said, files)
        if any(d.get("tool") == revised.tool and (d.get("input") or {}) == revised.input for d in declined):
            result.remove(step)
            continue
        result[result.index(step)] = revised
        _readers_follow(result, step, revised)
    return result


def _readers_follow(steps: list[_ToolStep], old: _ToolStep, revised: _ToolStep) -> None:
    """Later steps that read what a revised step writes follow it to its new place."""
    moved = {
        before: after for key, before in old.input.items()
        if isinstance(before, str) and isinstance(after := revised.input.get(key), str) and after != before
    }
    for step in steps:
        if step is not revised and step.tool in ("file.read", "text.summarize") and step.input.get("path") in moved:
            before = step.input["path"]
            step.input = step.input | {"path": moved[before]}
            step.intent = re.sub(rf"(?<![\w/.-]){re.escape(before)}(?![\w/-])", moved[before], step.intent)


def _tool_echo(step: Mapping[str, Any], completed_keys: Sequence[str]) -> dict[str, Any]:
    tool = str(step.get("tool", ""))
    spec = TOOLS.get(tool)
    out: dict[str, Any] = {
        "id": str(step.get("key", "")),
        "tool": tool,
        "intent": _one_line(str(step.get("description", "")) or tool),
        "input": step.get("input") if isinstance(step.get("input"), dict) else {},
        "requiresPermission": bool(step.get("requires_permission")) or bool(spec and spec.risky),
        "dependsOn": [d for d in step.get("depends_on") or [] if d in completed_keys],
    }
    if step.get("expected_outcome"):
        out["expects"] = _one_line(str(step["expected_outcome"]))
    return out


def _answer_plan(ctx: Mapping[str, Any]) -> str:
    return _tool_plan(ctx) if ctx.get("kind") == "tool" else _persona_plan(ctx)


def _answer_replan(ctx: Mapping[str, Any]) -> str:
    return _tool_replan(ctx) if ctx.get("kind") == "tool" else _persona_replan(ctx)


# -- the fast purposes -----------------------------------------------------------------------------

_HINTS: list[tuple[str, Callable[[str], str]]] = [
    ("operator declined", lambda r: f"Do what the operator said{_operator_said(r)}: change the declined step, "
     "replace it or leave it out."),
    ("unknown tool", lambda r: "Use only the listed tools" + _suggestion(r) + "."),
    ("unknown action", lambda r: "Use exactly one of the allowed actions as action_hint" + _suggestion(r) + "."),
    ("dependency cycle", lambda r: "Remove the dependency cycle: dependsOn may only name steps that come earlier."),
    ("depends on itself", lambda r: "A step must not list its own id in dependsOn."),
    ("depends on unknown step", lambda r: "List in dependsOn only ids of steps that exist in this plan."),
    ("duplicate step id", lambda r: 'Give every step a different id: "1", "2", "3", ...'),
    ("placeholder", lambda r: "Write the real file content; never TODO, '...' or <placeholders>."),
    ("content is empty", lambda r: "Write the real file content; never leave it empty."),
    ("workspace", lambda r: "Use paths relative to the workspace, without '..' and without a leading '/'."),
    ("absolute path", lambda r: "Use paths relative to the workspace, without '..' and without a leading '/'."),
    ("too many steps", lambda r: f"Use at most {_limit(r)} steps; merge similar steps."),
    ("no steps", lambda r: 'Put at least one step in a "steps" list.'),
    ("no 'steps'", lambda r: 'Put the steps in a "steps" list.'),
    ("unknown top-level key", lambda r: f"Remove the top-level key {_quoted(r)}; use only the template's keys."),
    ("unknown key", lambda r: f"Remove the step key {_quoted(r)}; use only the template's step keys."),
    ("requirespermission", lambda r: "Give every step requiresPermission: true for writes, false for reads."),
    ("missing", lambda r: f"Add the missing field {_quoted(r)} to every step."),
    ("prohibited", lambda r: "Remove shell commands and instructions aimed at the assistant; use only the tools."),
    ("single line", lambda r: "Keep every intent, description and action on one line."),
    ("json", lambda r: "Answer with one valid JSON object inside <json>...</json>, nothing else."),
    ("empty output", lambda r: "Answer with one valid JSON object inside <json>...</json>, nothing else."),
    ("output too large", lambda r: "Answer briefly: only the JSON plan inside <json>...</json>."),
    ("not ready", lambda r: 'Give a complete plan and set "ready": true, or leave "ready" out.'),
]


def _operator_said(reason: str) -> str:
    match = re.search(r'the operator said: "(.*)"', reason)
    return f' ("{match.group(1)}")' if match else ""


def _suggestion(reason: str) -> str:
    match = re.search(r"did you mean: ([^?]+)\?", reason)
    return f", for example {match.group(1)}" if match else ""


def _quoted(reason: str) -> str:
    match = re.search(r"'([^']+)'", reason)
    return f"'{match.group(1)}'" if match else "named in the reason"


def _limit(reason: str) -> str:
    match = re.search(r">\s*(\d+)", reason)
    return match.group(1) if match else "fewer"


def _answer_reflect(ctx: Mapping[str, Any]) -> str:
    hints: list[str] = []
    for reason in _texts(ctx, "reasons"):
        lowered = reason.lower()
        hint = next((make(reason) for needle, make in _HINTS if needle in lowered), f"Fix this: {reason}")
        if hint not in hints:
            hints.append(hint)
    if not hints:
        hints = ["Follow the template exactly and answer inside <json>...</json>."]
    return _reply("Here is what to fix.", {"hints": hints[:MAX_HINTS]})


_TOOL_WORDS = ("file", "files", "csv", "json", "folder", "report", "workspace", "summar", "convert", "list")


def _stated_why(goal: str) -> str:
    """Why, as the goal itself says it; nobody is claimed to have asked (a seeded goal was asked by no operator)."""
    said = re.search(r"\b(because|so that|so|since|in order to)\b\s+(.+)$", goal, re.IGNORECASE)
    return _one_line(f"{said.group(1).lower()} {said.group(2).rstrip('.')}", 200) if said else "not stated in the goal"


def _answer_restate(ctx: Mapping[str, Any]) -> str:
    goal = _text(ctx, "goal") or "(no goal given)"
    agent = _text(ctx, "agent_name") or "the agent"
    lowered = goal.lower()
    tool_like = any(word in lowered for word in _TOOL_WORDS) or bool(_mentioned_files(goal))
    when = "today" if "today" in lowered else ("as soon as possible" if "now" in lowered.split() else "now, in this run")
    data = {
        "who": agent,
        "what": _one_line(goal, 300),
        "when": when,
        "where": f"in {agent}'s workspace" if tool_like else f"where {agent} is now",
        "why": _stated_why(goal) if tool_like else f"because {agent} needs it",
    }
    return _reply("Restated goal:", data)


_GOALS: Mapping[str, tuple[str, tuple[str, ...]]] = {
    # The most direct action first: a simple goal may become a one-step plan with the first one.
    "hunger": ("Get something to eat", ("eat", "buy food", "go to the store")),
    "energy": ("Get some rest", ("sleep", "go home")),
    "social": ("Spend time with a friend", ("call a friend", "meet friend")),
    "money": ("Earn some money", ("work", "look for work")),
    "fun": ("Do something fun", ("relax", "meet friend")),
}


# Another way to a need when its usual goal is already active (its plan waits for an operator's yes): one
# that needs nobody's permission. The goal's words and the plan's steps.
_GOAL_OTHER_WAYS: Mapping[str, tuple[str, tuple[str, ...], tuple[_Move, ...]]] = {
    "hunger": ("Cook a meal at home", ("cook",), (_Move("cook", "Cook a meal at home", "a home-cooked meal"),)),
    "social": ("Catch up with a friend on the phone", ("call a friend",),
               (_Move("call a friend", "Call a friend to catch up", "feel less lonely"),)),
}


def _answer_goals(ctx: Mapping[str, Any]) -> str:
    needs = _needs(ctx)
    existing = {_normal(e) for e in _texts(ctx, "existing")}
    waiting = {_normal(e) for e in _texts(ctx, "waiting")}
    goals: list[dict[str, Any]] = []
    for name, value in sorted(needs.items(), key=lambda kv: (kv[1], kv[0])):
        if value >= 0.6 or len(goals) >= 3:
            break
        description, actions = _GOALS.get(name, (f"Improve my {name}", ()))
        if _normal(description) in waiting and name in _GOAL_OTHER_WAYS:
            description, actions, _ = _GOAL_OTHER_WAYS[name]
        if _normal(description) in existing:
            continue
        horizon = "short_term" if value < 0.3 else "mid_term" if value < 0.5 else "long_term"
        level = "critically low" if value < 0.2 else "low"
        goals.append({
            "description": description,
            "horizon": horizon,
            "source_needs": [name],
            "recommended_actions": list(actions),
            "reasoning": f"{name.capitalize()} is {level} at {_pct(value)}",
        })
    prose = f"{len(goals)} new goal(s) from the lowest needs." if goals else "No need is low enough for a new goal."
    return _reply(prose, goals)


def _answer_milestone(ctx: Mapping[str, Any]) -> str:
    needs = _needs(ctx)
    mean = sum(needs.values()) / len(needs) if needs else 0.0
    achieved = bool(needs) and mean > MILESTONE_MEAN
    detail = ", ".join(f"{name} at {_pct(value)}" for name, value in sorted(needs.items())) or "no source needs"
    verdict = "above" if achieved else "not above"
    data = {"achieved": achieved, "explanation": f"{detail}: the average is {verdict} {_pct(MILESTONE_MEAN)}"}
    return _reply("Milestone check:", data)


def _answer_decide(ctx: Mapping[str, Any]) -> str:
    needs = _needs(ctx)
    actions = _texts(ctx, "actions")
    suggested = _match_action(_text(ctx, "suggested_action"), actions) if _text(ctx, "suggested_action") else None
    action, reason = None, ""
    for value, name in sorted((v, n) for n, v in needs.items() if v < URGENT_BELOW):
        relief = _match_action(_URGENT_RELIEF.get(name, ""), actions) if name in _URGENT_RELIEF else None
        if relief is not None:
            if relief != suggested:
                action, reason = relief, f"{name} is urgent ({_pct(value)}), so it overrides the plan"
            break
    if action is None and suggested:
        action, reason = suggested, "following the current plan step"
    if action is None:
        low = sorted((v, n) for n, v in needs.items() if n in _URGENT_RELIEF)
        relief = _match_action(_URGENT_RELIEF[low[0][1]], actions) if low else None
        action = relief or ("idle" if not actions or "idle" in actions else actions[0])
        reason = f"no plan step; {low[0][1]} is lowest" if relief and low else "nothing pressing"
    return _reply(f"I will {action}.", {"action": action, "reason": reason})


_ANSWERS: Mapping[str, Callable[[Mapping[str, Any]], str]] = {
    "restate": _answer_restate,
    "plan": _answer_plan,
    "replan": _answer_replan,
    "reflect": _answer_reflect,
    "goals": _answer_goals,
    "milestone": _answer_milestone,
    "decide": _answer_decide,
}


# -- a second offline model that errs like a small real model, for the demo and tests ----------------

SLOPPY_MODEL = "offline-sloppy"
OFFLINE_MODELS = (OFFLINE_MODEL, SLOPPY_MODEL)


def sloppy_complete(purpose: str, messages: Sequence[Mapping[str, str]]) -> str:
    """Like `offline_complete`, but its tool plans make the mistakes small models make, one per attempt:
    an invented tool first, then a path that leaves the workspace, then right but with broken JSON
    (which the repair pass mends). It shows the planner's rejection, reflection and fallback offline."""
    answer = offline_complete(purpose, messages)
    ctx = prompt_context(messages)
    if purpose not in ("plan", "replan") or ctx.get("kind") != "tool":
        return answer
    attempt = len(_texts(ctx, "reasons"))
    body = answer[answer.find("<json>") + len("<json>"):answer.rfind("</json>")]
    try:
        plan = json.loads(body)
    except ValueError:
        return answer
    steps = plan.get("steps") if isinstance(plan, dict) else None
    if not isinstance(steps, list) or not steps or not isinstance(steps[0], dict):
        return answer
    if attempt == 0:
        steps[0]["tool"] = "file.open"  # an invented tool
        return f"Sure! Here is my plan:\n{json.dumps(plan)}\nLet me know if you need anything else."
    if attempt == 1:
        tool_input = steps[0].get("input")
        if isinstance(tool_input, dict) and "path" in tool_input:
            tool_input["path"] = "../" + str(tool_input["path"])  # reaching outside the workspace
        return f"```json\n{json.dumps(plan, indent=2)}\n```"
    return "<json>" + json.dumps(plan).replace("]}", "],}", 1) + "</json>"  # a trailing comma


def offline_answer(
    *, purpose: str, model: str, messages: Sequence[Mapping[str, str]], ends_at: float | None = None,
    options: CallOptions | None = None,
) -> ProviderAnswer:
    """The offline models as a gateway provider (settings.LLM_PROVIDERS): they answer at once and need no bound
    (`ends_at`) nor limits (`options`): they write what their rules say."""
    text = (sloppy_complete if model == SLOPPY_MODEL else offline_complete)(purpose, messages)
    # Offline "tokens" are words, so the call log and cost columns stay meaningful in the demo.
    return ProviderAnswer(
        text=text, tokens_in=sum(len(m["content"].split()) for m in messages), tokens_out=len(text.split()),
        finish_reason="stop",
    )


PROVIDER: Provider = offline_answer  # what settings.LLM_PROVIDERS names: mypy checks it has the signature
