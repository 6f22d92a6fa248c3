"""The tool registry and its sandbox (seed 003): what a tool agent may do, confined to its workspace.

Every tool reads and writes only inside the agent's workspace directory. Paths are checked twice:
lexically when a plan is validated (`path_problem`), and again, following symlinks, when a step runs
(`workspace_resolve`), because the workspace can change between approval and execution.
"""

from __future__ import annotations

import csv
import errno
import io
import json
import ntpath
import os
import re
import secrets
import unicodedata
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from jsonschema import Draft202012Validator

MAX_FILE_BYTES = 1_000_000  # reads and writes above this are refused: a runaway plan must not fill the disk
MAX_LIST_ENTRIES = 200
RESULT_PREVIEW_CHARS = 2_000  # results are shown on the dashboard and fed back to the planner
MAX_PATH_CHARS = 1_024  # far beyond any real relative path; the OS refuses long ones with a confusing error
MAX_NAME_CHARS = 255  # one folder or file name (the usual file-system limit)
MAX_LOOP_RUNS = 50  # seed 002 loops: FOR_EACH items or REPEAT count
UNDO_FOLDER = ".undo"  # beside the workspaces, never inside one: agents cannot touch their own undo copies


class ToolError(Exception):
    """A tool could not run; the message is meant for the operator and the planner."""


@dataclass(frozen=True)
class ToolSpec:
    """A tool the planner may use: its input schema, which inputs are paths, and its risk class."""

    name: str
    description: str
    risk_class: str  # "read" | "write" | "network" | "system"
    schema: Mapping[str, tuple[type, bool]]  # input key -> (type, required)
    path_keys: tuple[str, ...] = ()
    choices: Mapping[str, tuple[str, ...]] = field(default_factory=dict)  # input key -> allowed values
    # A declared tool's JSON Schema (agents/declared_tools.py): its inputs are checked by the jsonschema
    # library instead of `schema`, which then only names the keys for prompts.
    input_schema: Mapping[str, Any] | None = None
    # What the tool can do, in the words of planning/engine/goal_check.py's ACTIONS ("copy", "convert", "send"...):
    # a plan for a goal that asks to copy needs a step whose tool can copy. A declared tool gives none; its
    # verbs are read from its name and description there.
    verbs: tuple[str, ...] = ()

    @property
    def risky(self) -> bool:
        """Seed 003: writes, network access and system changes are risky; reads are safe."""
        return self.risk_class != "read"

    def schema_text(self) -> str:
        """The input schema in one line, for prompts: `{path: str, max_sentences?: int}`."""
        parts = []
        properties = (self.input_schema or {}).get("properties", {})
        for key, (kind, required) in self.schema.items():
            if key in self.choices:
                type_name = " | ".join(f'"{c}"' for c in self.choices[key])
            elif key in properties:
                type_name = str(properties[key].get("type", "any"))
            else:
                type_name = kind.__name__
            parts.append(f"{key}{'' if required else '?'}: {type_name}")
        return "{" + ", ".join(parts) + "}"


TOOLS: Mapping[str, ToolSpec] = {
    spec.name: spec
    for spec in [
        ToolSpec("file.read", "Read a text file", "read", {"path": (str, True)}, ("path",), verbs=("read",)),
        ToolSpec("file.list", "List a folder (the workspace root by default)", "read", {"path": (str, False)}, ("path",),
                 verbs=("list", "read")),
        ToolSpec(
            "file.write", "Create or overwrite a text file with the given content", "write",
            {"path": (str, True), "content": (str, True)}, ("path",),
            verbs=("write", "transform", "convert", "overwrite"),
        ),
        ToolSpec(
            "file.append", "Append text to a file (created if missing)", "write",
            {"path": (str, True), "content": (str, True)}, ("path",),
            verbs=("append", "write"),
        ),
        ToolSpec(
            "file.convert", "Convert a CSV file to JSON, a JSON list of objects to CSV, or either to a Markdown "
            "table (to: md)", "write",
            {"path": (str, True), "to": (str, True), "output": (str, False)}, ("path", "output"),
            choices={"to": ("json", "csv", "md")},
            verbs=("convert",),
        ),
        ToolSpec(
            "file.move", "Move or rename a file; `to` may be an existing folder", "write",
            {"path": (str, True), "to": (str, True)}, ("path", "to"),
            verbs=("move",),
        ),
        ToolSpec(
            "file.copy", "Copy a file; `to` may be an existing folder", "write",
            {"path": (str, True), "to": (str, True)}, ("path", "to"),
            verbs=("copy",),
        ),
        ToolSpec("dir.create", "Create a folder (and its parents)", "write", {"path": (str, True)}, ("path",),
                 verbs=("mkdir",)),
        ToolSpec(
            "text.summarize", "Summarize a text file in a few of its own sentences", "read",
            {"path": (str, True), "max_sentences": (int, False)}, ("path",),
            verbs=("summarize", "read"),
        ),
        ToolSpec(
            "report.write", "Write a markdown report with a summary of each given file", "write",
            {"paths": (list, True), "output": (str, True)}, ("paths", "output"),
            verbs=("summarize", "write"),
        ),
        ToolSpec(
            "file.count", "Count the data rows of a CSV file (lines or words of a text file) and write the number "
            "to `output`", "write", {"path": (str, True), "output": (str, True), "unit": (str, False)},
            ("path", "output"), choices={"unit": ("rows", "lines", "words")},
            verbs=("count", "write"),
        ),
        ToolSpec("web.fetch", "Fetch a web page", "network", {"url": (str, True)}, verbs=("fetch",)),
    ]
}


# -- paths ---------------------------------------------------------------------------------------


def _shown(rel: str) -> str:
    return rel if len(rel) <= 80 else rel[:77] + "..."


# What a model leaves in a path when it writes its JSON badly: "people.json'}, ", "log.txt,", "{path}".
# A loop's placeholders ("part-{index:03d}.txt", "{item}") are braces that belong.
_JSON_DEBRIS = re.compile(r"[\"{}]|['`],?\s*$|,\s*$|'\s*[,\]]")
_PLACEHOLDER = re.compile(r"\{\w+(?::[^{}\"]*)?\}")


def path_problem(rel: object, workspace: Path | None = None) -> str | None:
    """Why `rel` may not be used as a path inside the workspace, or None if it may.

    Lexical checks only (no filesystem access), so a plan can be judged before its workspace exists.
    """
    if not isinstance(rel, str):
        return f"path must be a string, got {type(rel).__name__}"
    if "\x00" in rel:
        return "path contains a NUL byte"
    if _name_shown(rel) != rel:
        return f"path {_name_shown(rel)[:80]} contains control or bidirectional characters"
    text = rel.strip().replace("\\", "/")  # models trained on Windows prompts write backslashes
    if len(rel) > MAX_PATH_CHARS:
        return f"path '{_shown(rel)}' is too long ({len(rel)} characters; at most {MAX_PATH_CHARS})"
    longest = max((len(part) for part in text.split("/")), default=0)
    if longest > MAX_NAME_CHARS:
        return f"path '{_shown(rel)}' has a name of {longest} characters (at most {MAX_NAME_CHARS} per name)"
    if _JSON_DEBRIS.search(_PLACEHOLDER.sub("", text)):
        return (f"path '{_shown(rel)}' holds a piece of the answer's JSON (a double quote, a brace, or a quote or "
                "comma at its end), not a file name")
    if text.startswith("~"):
        return f"path '{_shown(rel)}' points into a home directory; use a path relative to the workspace"
    if ntpath.splitdrive(rel)[0] or text.startswith("//"):
        return f"absolute path '{_shown(rel)}' is outside the workspace; use a path relative to the workspace"
    if text.startswith("/"):
        if workspace is None:
            return f"absolute path '{_shown(rel)}' is not allowed; use a path relative to the workspace"
        target = os.path.normpath(text)
        # Accept the workspace as spelled and as resolved (e.g. /tmp -> /private/tmp on macOS).
        for root in {os.path.normpath(str(workspace.absolute())), os.path.normpath(str(workspace.resolve()))}:
            if target == root or target.startswith(root.rstrip("/") + "/"):
                return None
        return f"absolute path '{_shown(rel)}' is outside the workspace"
    depth = 0
    for part in text.split("/"):
        if part == "..":
            depth -= 1
            if depth < 0:
                return f"path '{_shown(rel)}' escapes the workspace with '..'"
        elif part not in ("", "."):
            depth += 1
    return None


def workspace_resolve(workspace: Path, rel: str) -> Path:
    """The real path of `rel` inside `workspace`; ToolError if it would leave it (.., absolute, symlink, NUL)."""
    problem = path_problem(rel, workspace)
    if problem:
        raise ToolError(problem)
    root = workspace.resolve()
    text = rel.strip().replace("\\", "/")
    candidate = Path(text) if text.startswith("/") else root / text
    # resolve() follows symlinks, so a link inside the workspace pointing outside is caught here.
    try:
        resolved = candidate.resolve(strict=True)
    except FileNotFoundError:  # a file about to be written; its folders may not exist yet either
        resolved = candidate.resolve()
    except RuntimeError:  # a symlink loop before Python 3.13
        raise ToolError(f"path '{_shown(rel)}' cannot be resolved: a symbolic link loop") from None
    except OSError as exc:  # ELOOP since Python 3.13, or whatever else the OS says: say that, not a guess
        what = "a symbolic link loop" if exc.errno == errno.ELOOP else (exc.strerror or str(exc))
        raise ToolError(f"path '{_shown(rel)}' cannot be resolved: {what}") from None
    if resolved != root and not resolved.is_relative_to(root):
        raise ToolError(f"path '{_shown(rel)}' leads outside the workspace (through a symbolic link)")
    return resolved


def workspace_listing(workspace: Path, *, limit: int = MAX_LIST_ENTRIES) -> list[str]:
    """Files and folders in the workspace (folders end in '/'), relative and sorted, for planner prompts."""
    root = workspace.resolve()
    if not root.is_dir():
        return []
    entries: list[str] = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames.sort()
        base = Path(dirpath).relative_to(root)
        for name in dirnames:
            entries.append(f"{(base / name).as_posix()}/")
        for name in sorted(filenames):
            entries.append((base / name).as_posix())
        if len(entries) >= limit:
            break
    return sorted(entries)[:limit]


@dataclass(frozen=True)
class WorkspaceFile:
    """A file in a workspace, as its page lists it."""

    path: str
    size: int


def workspace_files(workspace: Path, *, limit: int = MAX_LIST_ENTRIES) -> list[WorkspaceFile]:
    """The files in the workspace with their sizes, relative and sorted (at most `limit`); none when it does not
    exist yet. Symbolic links are not followed, and a file that goes while it is read is left out."""
    root = workspace.resolve()
    if not root.is_dir():
        return []
    found: list[WorkspaceFile] = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames.sort()
        base = Path(dirpath)
        for name in sorted(filenames):
            try:
                size = (base / name).lstat().st_size
            except OSError:
                continue
            found.append(WorkspaceFile(_name_shown((base / name).relative_to(root).as_posix()), size))
        if len(found) >= limit:
            break
    return sorted(found, key=lambda f: f.path)[:limit]


def upload_name_problem(name: object) -> str | None:
    """Why `name` may not be the name of a file put into a workspace by an operator (one name, no folder), or
    None. The folder it goes to is checked as a path (`path_problem`)."""
    if not isinstance(name, str) or not name.strip():
        return "a file has no name"
    if problem := path_problem(name):
        return problem
    if "/" in name or "\\" in name:
        return f"'{_shown(name)}' names a folder; give a file name, and the folder in its own field"
    if name.strip() in (".", ".."):
        return f"'{name}' is not a file name"
    if name.startswith(".") or name != name.strip():
        return f"'{_shown(name)}' starts with a dot or a space (hidden or easily mistaken); rename it"
    return None


def upload_folder_problem(folder: str) -> str | None:
    """Why `folder` may not receive uploaded files (relative, inside the workspace, no hidden folder), or None."""
    if problem := path_problem(folder):
        return problem
    parts = [part for part in folder.replace("\\", "/").split("/") if part not in ("", ".")]
    if any(part.startswith(".") for part in parts):
        return f"folder '{_shown(folder)}' leaves the workspace or is hidden (a name starting with a dot)"
    return None


def workspace_upload_stage(workspace: Path, rel: str, data: bytes, *, replace: bool) -> tuple[Path, Path]:
    """Check where an uploaded file goes (confined to the workspace through symbolic links too, never over a
    folder, over a file only when `replace`) and write its bytes beside it under a temporary name. Returns
    (temporary, target): `os.replace` of the one onto the other puts it in place."""
    workspace.mkdir(parents=True, exist_ok=True)
    target = workspace_resolve(workspace, rel)
    if target.is_dir():
        raise ToolError(f"'{_shown(rel)}' is a folder in the workspace")
    if target.exists() and not replace:
        raise ToolError(f"'{_shown(rel)}' already exists; tick Replace to overwrite it")
    target.parent.mkdir(parents=True, exist_ok=True)
    if workspace_resolve(workspace, rel) != target:  # a folder on the way became a link meanwhile
        raise ToolError(f"path '{_shown(rel)}' leads outside the workspace (through a symbolic link)")
    temporary = target.with_name(f".{target.name}.upload-{secrets.token_hex(6)}")
    temporary.write_bytes(data)
    return temporary, target


def _name_shown(name: str) -> str:
    """A file name as shown: escaped when control or bidirectional characters would make it look like another."""
    return ascii(name) if any(unicodedata.category(c) in ("Cc", "Cf", "Cs") for c in name) else name


def _display(workspace: Path, path: Path) -> str:
    rel = path.relative_to(workspace.resolve()).as_posix()
    return rel if rel != "." else "."


# -- input checks --------------------------------------------------------------------------------


def _has_type(value: Any, kind: type) -> bool:
    # bool is an int subclass; a model writing `true` for a count is a mistake, not a number.
    return isinstance(value, kind) and not (kind is int and isinstance(value, bool))


def tool_input_problems(spec: ToolSpec, tool_input: object) -> list[str]:
    """Schema problems of `tool_input` for `spec`: missing or unknown keys, wrong types, bad choices."""
    if not isinstance(tool_input, Mapping):
        return [f"{spec.name} input must be an object, got {type(tool_input).__name__}"]
    if spec.input_schema is not None:
        return declared_input_problems(spec, tool_input)
    problems: list[str] = []
    for key in tool_input:
        if key not in spec.schema:
            allowed = ", ".join(spec.schema) or "none"
            problems.append(f"{spec.name} input has unknown key '{_shown(str(key))}' (allowed: {allowed})")
    for key, (kind, required) in spec.schema.items():
        if key not in tool_input or tool_input[key] is None:
            if required:
                problems.append(f"{spec.name} input missing required key '{key}'")
            continue
        value: Any = tool_input[key]
        if not _has_type(value, kind):
            problems.append(f"{spec.name} input '{key}' must be {kind.__name__}, got {type(value).__name__}")
            continue
        if kind is list:
            if not value:
                problems.append(f"{spec.name} input '{key}' must not be empty")
            elif not all(isinstance(item, str) for item in value):
                problems.append(f"{spec.name} input '{key}' must be a list of strings")
        if key in spec.choices and value not in spec.choices[key]:
            allowed = ", ".join(spec.choices[key])
            problems.append(f"{spec.name} input '{key}' must be one of: {allowed} (got {_shown(repr(value))})")
        if kind is int and not 1 <= value <= 50:
            problems.append(f"{spec.name} input '{key}' must be between 1 and 50 (got {value})")
    return problems


def declared_input_problems(spec: ToolSpec, tool_input: Mapping[str, Any]) -> list[str]:
    """Problems of an input against a declared tool's JSON Schema, worded as the built-in tools' are."""
    validator = Draft202012Validator(spec.input_schema or {})
    problems: list[str] = []
    for error in sorted(validator.iter_errors(dict(tool_input)), key=lambda e: list(map(str, e.path))):
        at = "/".join(str(p) for p in error.path)
        where = f"{spec.name} input '{_shown(at)}'" if at else f"{spec.name} input"
        if error.validator == "required" and isinstance(error.instance, Mapping):
            # One error per missing key, each naming the whole required list: said once per key.
            problems.extend(f"{where} missing required key '{_shown(str(key))}'" for key in error.validator_value
                            if key not in error.instance and f"{where} missing required key '{_shown(str(key))}'" not in problems)
        elif error.validator == "additionalProperties" and not at:
            allowed = ", ".join((spec.input_schema or {}).get("properties", {})) or "none"
            extra = sorted(set(tool_input) - set((spec.input_schema or {}).get("properties", {})))
            problems.extend(f"{where} has unknown key '{_shown(str(key))}' (allowed: {allowed})" for key in extra)
        elif error.validator == "type":
            problems.append(f"{where} must be {error.validator_value}, got {_json_type(error.instance)}")
        elif error.validator == "enum":
            allowed = ", ".join(map(str, error.validator_value))
            problems.append(f"{where} must be one of: {allowed} (got {_shown(repr(error.instance))})")
        else:
            problems.append(f"{where}: {_shown(error.message)}")
    return problems


def _json_type(value: object) -> str:
    """A value's type as JSON names it, for a problem's wording."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    return {int: "integer", float: "number", str: "string", list: "array", dict: "object"}.get(type(value), type(value).__name__)


# -- execution -----------------------------------------------------------------------------------


def _read_text(path: Path, shown: str) -> str:
    if not path.exists():
        raise ToolError(f"file '{shown}' does not exist")
    if not path.is_file():
        raise ToolError(f"'{shown}' is not a file")
    size = path.stat().st_size
    if size > MAX_FILE_BYTES:
        raise ToolError(f"file '{shown}' is too large to read ({size} bytes; the limit is {MAX_FILE_BYTES})")
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise ToolError(f"file '{shown}' is not UTF-8 text") from None


def _write_text(path: Path, shown: str, content: str, *, append: bool = False) -> None:
    if len(content.encode("utf-8")) > MAX_FILE_BYTES:
        raise ToolError(f"content for '{shown}' is larger than {MAX_FILE_BYTES} bytes")
    if path.is_dir():
        raise ToolError(f"'{shown}' is a folder, not a file")
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a" if append else "w", encoding="utf-8", newline="") as handle:
        handle.write(content)


def _preview(text: str) -> str:
    return text if len(text) <= RESULT_PREVIEW_CHARS else text[:RESULT_PREVIEW_CHARS] + "\n[... truncated]"


def _run_read(ws: Path, args: Mapping[str, Any]) -> str:
    path = workspace_resolve(ws, args["path"])
    text = _read_text(path, args["path"])
    lines = text.count("\n") + (1 if text and not text.endswith("\n") else 0)
    return f"Read {_display(ws, path)} ({len(text)} characters, {lines} lines):\n{_preview(text)}"


def _run_list(ws: Path, args: Mapping[str, Any]) -> str:
    rel = args.get("path") or "."
    path = workspace_resolve(ws, rel)
    if not path.exists():
        raise ToolError(f"folder '{rel}' does not exist")
    if not path.is_dir():
        raise ToolError(f"'{rel}' is not a folder")
    names = sorted(f"{_name_shown(p.name)}/" if p.is_dir() else _name_shown(p.name) for p in path.iterdir())
    shown = _display(ws, path)
    if not names:
        return f"{shown} is empty"
    more = f"\n(and {len(names) - MAX_LIST_ENTRIES} more)" if len(names) > MAX_LIST_ENTRIES else ""
    return f"{len(names)} entries in {shown}:\n" + "\n".join(names[:MAX_LIST_ENTRIES]) + more


def _run_write(ws: Path, args: Mapping[str, Any], *, append: bool = False) -> str:
    path = workspace_resolve(ws, args["path"])
    content = args["content"]
    if path == ws.resolve():
        raise ToolError("cannot write to the workspace folder itself; give a file name")
    existed = path.exists()
    _write_text(path, args["path"], content, append=append)
    if append:
        return f"Appended {len(content)} characters to {_display(ws, path)}"
    return f"{'Overwrote' if existed else 'Wrote'} {_display(ws, path)} ({len(content)} characters)"


def csv_to_json(text: str) -> str:
    """CSV with a header row -> a JSON list of objects (values stay strings: no guessing at types)."""
    rows = list(csv.DictReader(io.StringIO(text)))
    if not rows and not text.strip():
        raise ToolError("the CSV file is empty")
    for number, row in enumerate(rows, start=2):
        if None in row:  # DictReader files extra cells under the None key
            raise ToolError(f"CSV line {number} has more cells than the header")
    return json.dumps(rows, indent=2, ensure_ascii=False) + "\n"


def json_to_csv(text: str) -> str:
    """A JSON list of objects -> CSV with the union of their keys as header, in first-seen order."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ToolError(f"the file is not valid JSON ({exc.msg} at line {exc.lineno})") from None
    if isinstance(data, dict):
        data = [data]
    if not isinstance(data, list) or not all(isinstance(item, dict) for item in data):
        raise ToolError("only a JSON list of objects can be converted to CSV")
    header: list[str] = []
    for item in data:
        header.extend(key for key in item if key not in header)
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=header, lineterminator="\n")
    writer.writeheader()
    for item in data:
        writer.writerow(
            {k: json.dumps(v, ensure_ascii=False) if isinstance(v, dict | list) else v for k, v in item.items()}
        )
    return out.getvalue()


def _cell(value: object) -> str:
    """One Markdown table cell: on one line, its pipes escaped."""
    text = json.dumps(value, ensure_ascii=False) if isinstance(value, dict | list) else "" if value is None else str(value)
    return " ".join(text.split()).replace("|", "\\|")


def to_markdown_table(text: str, source_format: str) -> str:
    """A CSV file (header row first) or a JSON list of objects -> a Markdown table: a header row, its
    separator, one row per record."""
    if source_format == "json":
        rows = list(csv.reader(io.StringIO(json_to_csv(text))))
    elif source_format == "csv":
        rows = [row for row in csv.reader(io.StringIO(text)) if any(cell.strip() for cell in row)]
    else:
        raise ToolError(f"only a CSV or JSON file can be converted to a Markdown table, not '.{source_format}'")
    if not rows:
        raise ToolError("the file is empty")
    width = max(len(row) for row in rows)
    lines = []
    for number, row in enumerate(rows):
        cells = [_cell(c) for c in row] + [""] * (width - len(row))
        lines.append("| " + " | ".join(cells) + " |")
        if number == 0:
            lines.append("|" + "|".join(" --- " for _ in range(width)) + "|")
    return "\n".join(lines) + "\n"


def _converted(ws: Path, args: Mapping[str, Any]) -> tuple[Path, str, Path, str]:
    """What a conversion writes: (its source, its output's path as given, the output, the converted text)."""
    source = workspace_resolve(ws, args["path"])
    target_format = args["to"]
    if target_format not in ("json", "csv", "md"):
        raise ToolError(f"cannot convert to '{target_format}'; use 'json', 'csv' or 'md'")
    source_format = source.suffix.lower().lstrip(".")
    if source_format == target_format:
        raise ToolError(f"'{args['path']}' is already {target_format}")
    output_rel = args.get("output") or Path(args["path"].replace("\\", "/")).with_suffix(f".{target_format}").as_posix()
    output = workspace_resolve(ws, output_rel)
    text = _read_text(source, args["path"])
    if target_format == "md":
        converted = to_markdown_table(text, source_format)
    else:
        converted = csv_to_json(text) if target_format == "json" else json_to_csv(text)
    return source, output_rel, output, converted


def _run_convert(ws: Path, args: Mapping[str, Any]) -> str:
    source, output_rel, output, converted = _converted(ws, args)
    _write_text(output, output_rel, converted)
    return f"Converted {_display(ws, source)} to {args['to']}: wrote {_display(ws, output)} ({len(converted)} characters)"


def _run_copy(ws: Path, args: Mapping[str, Any]) -> str:
    source = workspace_resolve(ws, args["path"])
    if not source.is_file():
        raise ToolError(f"'{args['path']}' is not a file")
    target = workspace_resolve(ws, args["to"])
    if target.is_dir() or args["to"].rstrip().endswith(("/", "\\")):
        target = target / source.name
    if target.exists():
        raise ToolError(f"'{_display(ws, target)}' already exists; choose another name")
    _write_text(target, _display(ws, target), _read_text(source, args["path"]))
    return f"Copied {_display(ws, source)} to {_display(ws, target)}"


def _run_move(ws: Path, args: Mapping[str, Any]) -> str:
    source = workspace_resolve(ws, args["path"])
    if not source.exists():
        raise ToolError(f"'{args['path']}' does not exist")
    if source == ws.resolve():
        raise ToolError("cannot move the workspace folder itself")
    target = workspace_resolve(ws, args["to"])
    if target.is_dir() or args["to"].rstrip().endswith(("/", "\\")):
        target = target / source.name
    if target.exists():
        raise ToolError(f"'{_display(ws, target)}' already exists; choose another name")
    if source.is_dir() and target.is_relative_to(source):
        raise ToolError("cannot move a folder into itself")
    target.parent.mkdir(parents=True, exist_ok=True)
    source.rename(target)
    return f"Moved {_display(ws, source)} to {_display(ws, target)}"


def _run_mkdir(ws: Path, args: Mapping[str, Any]) -> str:
    path = workspace_resolve(ws, args["path"])
    if path.exists() and not path.is_dir():
        raise ToolError(f"'{args['path']}' exists and is a file")
    existed = path.exists()
    path.mkdir(parents=True, exist_ok=True)
    return f"Folder {_display(ws, path)} {'already existed' if existed else 'created'}"


_SENTENCE = re.compile(r"(?<=[.!?])\s+(?=[A-Z0-9\"'(])|\n\s*\n")
_WORD = re.compile(r"[a-zA-Z][a-zA-Z'-]+")
_STOPWORDS = frozenset(
    (
        "a", "an", "and", "are", "as", "at", "be", "been", "but", "by", "for", "from", "has", "have",
        "he", "her", "his", "i", "if", "in", "into", "is", "it", "its", "of", "on", "or", "our", "she",
        "so", "that", "the", "their", "them", "then", "there", "these", "they", "this", "to", "was", "we",
        "were", "what", "when", "which", "who", "will", "with", "you", "your"
    )
)


def text_summary(text: str, max_sentences: int = 3) -> str:
    """An extractive summary: the sentences with the most frequent content words, in their original order.

    Deterministic on purpose, so the offline demo and the tests give the same answer every time.
    """
    # Markdown headings are labels, not sentences worth repeating.
    text = "\n".join(line for line in text.splitlines() if not line.lstrip().startswith("#"))
    sentences = [" ".join(s.split()) for s in _SENTENCE.split(text) if s and s.strip()]
    sentences = [s.lstrip("#-* ").strip() for s in sentences]
    sentences = [s for s in sentences if s]
    if len(sentences) <= max_sentences:
        return " ".join(sentences)
    counts = Counter(w.lower() for w in _WORD.findall(text) if w.lower() not in _STOPWORDS)

    def score(sentence: str) -> float:
        words = [w.lower() for w in _WORD.findall(sentence) if w.lower() not in _STOPWORDS]
        return sum(counts[w] for w in words) / (len(words) + 1) ** 0.5

    ranked = sorted(range(len(sentences)), key=lambda i: (-score(sentences[i]), i))[:max_sentences]
    return " ".join(sentences[i] for i in sorted(ranked))


def _run_summarize(ws: Path, args: Mapping[str, Any]) -> str:
    path = workspace_resolve(ws, args["path"])
    text = _read_text(path, args["path"])
    summary = text_summary(text, args.get("max_sentences") or 3)
    return f"Summary of {_display(ws, path)}: {summary or '(the file is empty)'}"


def _report(ws: Path, args: Mapping[str, Any]) -> tuple[list[Path], Path, str, int]:
    """What a report writes: (the files it reads, its output, the report, how many files it covers)."""
    output = workspace_resolve(ws, args["output"])
    sections, sources = [], []
    for rel in args["paths"]:
        path = workspace_resolve(ws, rel)
        summary = text_summary(_read_text(path, rel)) or "(empty file)"
        sections.append(f"## {_display(ws, path)}\n\n{summary}\n")
        sources.append(path)
    report = f"# Report\n\nSummaries of {len(sections)} file(s).\n\n" + "\n".join(sections)
    return sources, output, report, len(sections)


def _run_report(ws: Path, args: Mapping[str, Any]) -> str:
    _, output, report, covered = _report(ws, args)
    _write_text(output, args["output"], report)
    return f"Wrote report {_display(ws, output)} covering {covered} file(s)"


def count_of(text: str, unit: str) -> int:
    """Rows of CSV data (the header is not a row), lines, or words of a text."""
    if unit == "words":
        return len(text.split())
    if unit == "lines":
        return len(text.splitlines())
    return max(len([row for row in csv.reader(io.StringIO(text)) if any(cell.strip() for cell in row)]) - 1, 0)


def _counted(ws: Path, args: Mapping[str, Any]) -> tuple[Path, str, int, Path]:
    """What a count writes: (its source, the unit, the count, its output)."""
    source = workspace_resolve(ws, args["path"])
    unit = args.get("unit") or ("rows" if source.suffix.lower() == ".csv" else "lines")
    count = count_of(_read_text(source, args["path"]), unit)
    return source, unit, count, workspace_resolve(ws, args["output"])


def _run_count(ws: Path, args: Mapping[str, Any]) -> str:
    source, unit, count, output = _counted(ws, args)
    _write_text(output, args["output"], f"{count}\n")
    return f"{_display(ws, source)} has {count} {unit}; wrote {count} to {_display(ws, output)}"


def _run_fetch(ws: Path, args: Mapping[str, Any]) -> str:
    raise ToolError("network access is disabled for this agent")


_RUNNERS: Mapping[str, Callable[[Path, Mapping[str, Any]], str]] = {
    "file.read": _run_read,
    "file.list": _run_list,
    "file.write": _run_write,
    "file.append": lambda ws, args: _run_write(ws, args, append=True),
    "file.convert": _run_convert,
    "file.move": _run_move,
    "file.copy": _run_copy,
    "dir.create": _run_mkdir,
    "text.summarize": _run_summarize,
    "report.write": _run_report,
    "file.count": _run_count,
    "web.fetch": _run_fetch,
}


# -- seed 002 loops: FOR_EACH over a list an earlier step produced, REPEAT n times ---------------------

LIST_TOOLS = ("file.list",)  # tools whose result is a list a later step may iterate over
LOOP_FORBIDDEN = ("dir.create",)  # seed 002: folders are created explicitly, never inside a loop
_INDEX = re.compile(r"\{index(?::(0?)(\d{1,2})d)?\}")


def loop_items(source_tool: str, source_input: Mapping[str, Any], workspace: Path) -> list[str]:
    """The list an earlier step produced, read again when the loop runs: the files of the folder a
    `file.list` step listed, as paths from the workspace root (seed 002: `{item}` is a full path)."""
    if source_tool not in LIST_TOOLS:
        raise ToolError(f"{source_tool} produces no list to iterate over")
    rel = source_input.get("path") or "."
    folder = workspace_resolve(workspace, rel)
    if not folder.is_dir():
        raise ToolError(f"the list to iterate over does not exist: folder '{_shown(str(rel))}' is missing")
    root = workspace.resolve()
    return sorted(p.relative_to(root).as_posix() for p in folder.iterdir() if p.is_file())


def loop_fill(value: Any, *, item: str | None, index: int) -> Any:
    """`{item}` and `{index}` / `{index:03d}` (zero-based) filled in, in every string of a tool input."""
    if isinstance(value, str):
        text = value.replace("{item}", item) if item is not None else value
        return _INDEX.sub(lambda m: str(index).rjust(int(m.group(2)), "0" if m.group(1) else " ")
                          if m.group(2) else str(index), text)
    if isinstance(value, list):
        return [loop_fill(v, item=item, index=index) for v in value]
    if isinstance(value, Mapping):
        return {k: loop_fill(v, item=item, index=index) for k, v in value.items()}
    return value


def loop_inputs(tool_input: Mapping[str, Any], loop: Mapping[str, Any], workspace: Path) -> list[dict[str, Any]]:
    """One tool input per run of a loop step."""
    if "repeat" in loop:
        count = int(loop["repeat"])
        items: list[str | None] = [None] * count
    else:
        source = loop.get("items_from") or {}
        items = list(loop_items(str(source.get("tool", "")), source.get("input") or {}, workspace))
    if len(items) > MAX_LOOP_RUNS:
        raise ToolError(f"the loop would run {len(items)} times; at most {MAX_LOOP_RUNS}")
    return [loop_fill(dict(tool_input), item=item, index=i) for i, item in enumerate(items)]


# -- undo: what a write, move or delete changed is kept, so an operator can roll the step back ----------


def undo_dir_for(workspace: Path, key: str) -> Path:
    """Where the undo copies of one step live: beside the workspaces, out of every agent's reach."""
    return workspace.parent / UNDO_FOLDER / workspace.name / key


def _targets(name: str, args: Mapping[str, Any]) -> list[str]:
    """The workspace paths a writing tool creates, changes or removes."""
    if name in ("file.write", "file.append", "dir.create"):
        return [args["path"]]
    if name in ("report.write", "file.count"):
        return [args["output"]]
    if name == "file.convert":
        target = args.get("to") if args.get("to") in ("json", "md") else "csv"
        return [args.get("output") or Path(args["path"].replace("\\", "/")).with_suffix(f".{target}").as_posix()]
    if name == "file.copy":
        to = args["to"]
        return [to.rstrip("/\\") + "/" + Path(args["path"]).name if to.rstrip().endswith(("/", "\\")) else to]
    if name == "file.move":
        source = args["path"].rstrip("/\\")
        to = args["to"]
        return [source, to.rstrip("/\\") + "/" + Path(source).name if to.rstrip().endswith(("/", "\\")) else to]
    return []


def tool_targets(name: str, args: Mapping[str, Any]) -> list[str]:
    """The workspace paths a call of tool `name` creates, changes or removes (none for a read)."""
    try:
        return [t for t in _targets(name, args) if isinstance(t, str)]
    except (KeyError, TypeError, AttributeError):
        return []  # an input the schema check refuses anyway


def undo_keep(name: str, inputs: list[dict[str, Any]], workspace: Path, undo_dir: Path) -> None:
    """Before the step runs: copy every file it will change or remove; note what it will create."""
    entries: list[dict[str, Any]] = []
    seen: set[str] = set()
    for args in inputs:
        for rel in _targets(name, args):
            path = workspace_resolve(workspace, rel)
            if name == "file.move" and rel != args["path"] and path.is_dir():
                path = path / Path(args["path"].replace("\\", "/")).name  # moved into an existing folder
            shown = path.relative_to(workspace.resolve()).as_posix()
            if shown in seen:
                continue
            seen.add(shown)
            entry: dict[str, Any] = {"path": shown, "existed": path.exists(), "folder": path.is_dir()}
            if path.is_file():
                copy = undo_dir / f"{len(entries)}.copy"
                undo_dir.mkdir(parents=True, exist_ok=True)
                copy.write_bytes(path.read_bytes())
                entry["copy"] = copy.name
            entries.append(entry)
    undo_dir.mkdir(parents=True, exist_ok=True)
    (undo_dir / "manifest.json").write_text(json.dumps({"tool": name, "entries": entries}), encoding="utf-8")


def tool_rollback(workspace: Path, undo_dir: Path) -> list[str]:
    """Put back what a step changed: files it overwrote or removed return, files and empty folders it
    created go. Returns what was done, one line each; ToolError when there is nothing to roll back."""
    manifest = undo_dir / "manifest.json"
    if not manifest.is_file():
        raise ToolError("this step kept no undo copies (it changed no files, or its plan closed more than "
                        "RETAIN_UNDO_HOURS ago and they were pruned)")
    entries = json.loads(manifest.read_text(encoding="utf-8"))["entries"]
    done: list[str] = []
    for entry in reversed(entries):
        path = workspace_resolve(workspace, entry["path"])
        if entry.get("copy"):
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes((undo_dir / entry["copy"]).read_bytes())
            done.append(f"restored {entry['path']}")
        elif not entry["existed"] and path.is_file():
            path.unlink()
            done.append(f"removed {entry['path']}")
        elif not entry["existed"] and path.is_dir():
            if any(path.iterdir()):
                done.append(f"kept folder {entry['path']}: it is not empty")
            else:
                path.rmdir()
                done.append(f"removed folder {entry['path']}")
    manifest.unlink()
    return done


# -- began: a step's tool call leaves a mark first, so a takeover can tell "never began" from "may have run" --

TOOL_BEGAN = "began.json"


def tool_began_mark(undo_dir: Path, attempt: int) -> None:
    """Just before a step's tool runs (runtime/cycle.py tool_call): which try of the step began it. An earlier
    try's undo manifest goes (this try keeps its own, or changes nothing), so what is found there after an
    interruption belongs to this try."""
    undo_dir.mkdir(parents=True, exist_ok=True)
    (undo_dir / "manifest.json").unlink(missing_ok=True)
    (undo_dir / TOOL_BEGAN).write_text(json.dumps({"attempt": attempt}), encoding="utf-8")


def tool_began(undo_dir: Path, attempt: int) -> bool:
    """Whether try `attempt` of the step began its tool call (tool_began_mark)."""
    try:
        return json.loads((undo_dir / TOOL_BEGAN).read_text(encoding="utf-8")).get("attempt") == attempt
    except (OSError, ValueError, AttributeError):
        return False


def tool_has_effects(name: str) -> bool:
    """Whether a call of tool `name` changes anything outside the database (an unknown tool is assumed to)."""
    spec = TOOLS.get(name)
    return spec is None or spec.risky


# The tools whose whole effect a takeover can check in the workspace (docs/runtime-guarantees.md). A step of any
# other tool that began and was cut off (web.fetch, an outside agent's declared tools), or of a loop, waits for an
# operator: "outcome unknown".
EFFECT_CHECKED = ("file.write", "file.append", "dir.create", "file.copy", "file.move", "file.convert", "report.write",
                  "file.count")


def tool_effect_found(name: str, tool_input: Mapping[str, Any], workspace: Path, undo_dir: Path) -> bool:
    """Whether the whole effect of a step's tool call is found in the workspace, checked against the undo copies
    its call kept (what each path held before): a file holding the content written; a file holding what it held
    before plus the text appended, once; the folder created; a copy that did not exist before, holding what its
    source holds; a move's source gone and its target holding what the source held; the output of a conversion,
    a count or a report, which did not stand in for one of its own sources, holding what the call writes from
    those sources now. False when it is not found, or cannot be told (other tools, no undo manifest of this try,
    inputs the call would refuse)."""
    manifest = undo_dir / "manifest.json"
    if name not in EFFECT_CHECKED or not manifest.is_file():
        return False
    try:
        entries = json.loads(manifest.read_text(encoding="utf-8"))["entries"]
        kept = {entry["path"]: entry for entry in entries}
        root = workspace.resolve()

        def before(path: Path) -> dict[str, Any] | None:
            """What the call's undo copies say `path` was before it (None: not one of its targets)."""
            return kept.get(path.relative_to(root).as_posix())

        if name == "file.move":
            if len(entries) != 2 or not entries[0]["existed"] or entries[1]["existed"]:
                return False
            source, target = (workspace_resolve(workspace, entry["path"]) for entry in entries)
            if source.exists() or not target.exists():
                return False
            copy = entries[0].get("copy")
            return target.is_file() and target.read_bytes() == (undo_dir / copy).read_bytes() if copy else \
                target.is_dir()
        if name == "file.copy":
            source = workspace_resolve(workspace, tool_input["path"])
            target = workspace_resolve(workspace, tool_input["to"])
            if target.is_dir() or str(tool_input["to"]).rstrip().endswith(("/", "\\")):
                target = target / source.name
            was = before(target)
            return (was is not None and not was["existed"] and source.is_file() and target.is_file()
                    and target.read_bytes() == source.read_bytes())
        if name in ("file.convert", "report.write", "file.count"):
            if name == "file.convert":
                source, _, output, text = _converted(workspace, tool_input)
                sources = [source]
            elif name == "report.write":
                sources, output, text, _ = _report(workspace, tool_input)
            else:
                source, _, count, output = _counted(workspace, tool_input)
                sources, text = [source], f"{count}\n"
            if output in sources or before(output) is None:
                return False  # it wrote over its own source: what it read is gone
            return output.is_file() and output.read_bytes() == text.encode("utf-8")
        path = workspace_resolve(workspace, tool_input["path"])
        was = before(path)
        if was is None or len(entries) != 1:
            return False
        if name == "dir.create":
            return path.is_dir()
        if not path.is_file():
            return False
        now = path.read_bytes()
        content = str(tool_input["content"]).encode("utf-8")
        if name == "file.write":
            return now == content
        return now == ((undo_dir / was["copy"]).read_bytes() if was.get("copy") else b"") + content
    except (OSError, ValueError, KeyError, TypeError, AttributeError, ToolError):
        return False


# -- pre-check: what a step will touch, shown to the operator before it runs (seed 002) ---------------


def tool_precheck(name: str, tool_input: Mapping[str, Any], workspace: Path) -> str:
    """A one-line summary of what the step will read, create, overwrite or move, and what is missing.

    Deterministic and instant: a look at the workspace, not a model call."""
    spec = TOOLS.get(name)
    if spec is None or not isinstance(tool_input, Mapping) or tool_input_problems(spec, tool_input):
        return ""
    notes: list[str] = []
    writes = set(_targets(name, tool_input)) if spec.risk_class == "write" else set()
    for key in spec.path_keys:
        values = tool_input.get(key)
        for rel in values if isinstance(values, list) else [values]:
            if not isinstance(rel, str) or "{" in rel:
                continue
            try:
                path = workspace_resolve(workspace, rel or ".")
            except ToolError as exc:
                notes.append(str(exc))
                continue
            if rel in writes or (name == "file.move" and key == "to"):
                notes.append(f"will overwrite {rel}" if path.is_file() else f"will create {rel}")
            elif path.is_file():
                notes.append(f"reads {rel} ({path.stat().st_size} bytes)")
            elif path.is_dir():
                notes.append(f"reads folder {rel}")
            else:
                notes.append(f"{rel} does not exist yet")
    if name == "file.move" and isinstance(tool_input.get("path"), str):
        notes.append(f"moves {tool_input['path']} away")
    return "; ".join(notes)


def tool_run(
    name: str,
    tool_input: Mapping[str, Any],
    *,
    workspace: Path,
    loop: Mapping[str, Any] | None = None,
    undo_dir: Path | None = None,
) -> str:
    """Run one tool call confined to `workspace`; a short human-readable result, or ToolError.

    With `loop`, the call runs once per item (or `repeat` times); with `undo_dir`, what a writing tool
    will change is kept there first, for `tool_rollback`."""
    spec = TOOLS.get(name)
    if spec is None:
        raise ToolError(f"unknown tool '{name}'")
    workspace.mkdir(parents=True, exist_ok=True)
    inputs = loop_inputs(tool_input, loop, workspace) if loop else [dict(tool_input)]
    for args in inputs:
        tool_input_check(spec, args, workspace)
    try:
        if undo_dir is not None and spec.risk_class == "write":
            undo_keep(name, inputs, workspace, undo_dir)
        results = [_RUNNERS[name](workspace, args) for args in inputs]
    except ToolError:
        raise
    except OSError as exc:  # permissions, full disk, races: say what happened, not a traceback
        raise ToolError(f"{name} failed: {exc.strerror or exc}") from None
    if not loop:
        return results[0]
    if not results:
        return "the loop had nothing to do: the list is empty"
    return f"{len(results)} runs:\n" + "\n".join(f"- {r.splitlines()[0]}" for r in results)


def tool_input_check(spec: ToolSpec, tool_input: Mapping[str, Any], workspace: Path) -> None:
    """ToolError for a schema problem or a path outside the workspace."""
    problems = tool_input_problems(spec, tool_input)
    if problems:
        raise ToolError("; ".join(problems))
    for key in spec.path_keys:
        values = tool_input.get(key)
        for value in values if isinstance(values, list) else [values]:
            if value is not None and (problem := path_problem(value, workspace)):
                raise ToolError(problem)
