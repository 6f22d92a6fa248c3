"""Finding JSON in a model's answer: the generic extraction every purpose uses (plans, restatements,
hints, goals, decisions), with one repair pass for almost-JSON.

Models wrap JSON in prose, fences or tags, cut it off mid-way, or write Python instead of JSON. The
candidates are `<json>...</json>` blocks, fenced code, and balanced `{...}`/`[...]` regions elsewhere.
Seed 002 asks for the tags, so a tagged block wins; otherwise the LAST block that parses wins: models
show an example first and give their answer after it, never the other way round.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

MAX_OUTPUT_CHARS = 200_000
MAX_NESTING = 64  # deeper than any real plan; keeps json.loads away from RecursionError
MAX_BALANCED_CANDIDATES = 12


class ExtractError(ValueError):
    """The answer holds no usable JSON; `reason` says why, in words fit for a retry prompt."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


@dataclass
class ExtractedJSON:
    """A JSON value found in a model's answer, how it was found, and what was repaired."""

    value: Any
    method: str  # "json_tag" | "fenced" | "balanced"
    repaired: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class Candidate:
    """Text that may be JSON: where it starts, how it was found, and whether it was meant as JSON."""

    method: str
    text: str
    start: int
    explicit: bool


class Unloadable(Exception):
    """A JSON candidate that even the repair pass could not load."""


# -- finding candidates --------------------------------------------------------------------------

_JSON_TAG = re.compile(r"<json>(.*?)(?:</json>|\Z)", re.IGNORECASE | re.DOTALL)
_JSON_TAG_LONGEST = re.compile(r"<json>((?:(?!<json>).)*)</json>", re.IGNORECASE | re.DOTALL)
_FENCE = re.compile(r"```[ \t]*([A-Za-z0-9_+-]*)[^\n]*\n(.*?)(?:```|\Z)", re.DOTALL)
_INNER_FENCE = re.compile(r"^\s*```[A-Za-z0-9_+-]*[^\n]*\n?|\n?```\s*$")
_JSON_LANGS = {"json", "json5", "jsonc", "javascript", "js", "python", "py"}
# A `{` or `[` that starts JSON rather than prose like "{name}" or "[1]".
LOOKS_LIKE_JSON = re.compile(r"""\{\s*(?:["'}]|[A-Za-z_][\w-]*\s*:)|\[\s*[{\["'\]]""")


def json_candidates(text: str) -> Iterator[Candidate]:
    """Tagged blocks, then fenced blocks, then balanced regions outside both (so no block counts twice)."""
    taken: list[tuple[int, int]] = []
    for match in _JSON_TAG.finditer(text):
        taken.append(match.span())
        yield Candidate("json_tag", _INNER_FENCE.sub("", match.group(1)), match.start(), True)
        # A "</json>" inside a JSON string ends the block too early: the block up to the last closing tag
        # before the next opening one comes after, so it wins when it loads (json_extract takes the last).
        longest = _JSON_TAG_LONGEST.match(text, match.start())
        if longest is not None and longest.end() > match.end():
            taken.append(longest.span())
            yield Candidate("json_tag", _INNER_FENCE.sub("", longest.group(1)), match.start(), True)
    for match in _FENCE.finditer(text):
        if any(a <= match.start() < b for a, b in taken):
            continue
        lang, body = match.group(1).lower(), match.group(2)
        if lang in _JSON_LANGS or (not lang and body.lstrip()[:1] in ("{", "[")):
            taken.append(match.span())
            yield Candidate("fenced", body, match.start(), lang in ("json", "json5", "jsonc"))
    yield from _balanced_candidates(text, taken)


def _balanced_candidates(text: str, taken: list[tuple[int, int]]) -> Iterator[Candidate]:
    """Balanced `{...}`/`[...]` regions that look like JSON; an unclosed one runs to the end (cut off)."""
    position = 0
    for _ in range(MAX_BALANCED_CANDIDATES):
        match = LOOKS_LIKE_JSON.search(text, position)
        if match is None:
            return
        inside = next((b for a, b in taken if a <= match.start() < b), None)
        if inside is not None:
            position = inside
            continue
        # The next candidate starts after this one: a step object inside a plan is not a plan.
        position = _balanced_end(text, match.start())
        yield Candidate("balanced", text[match.start() : position], match.start(), False)


def _balanced_end(text: str, start: int) -> int:
    """Index just past the bracket closing the one at `start`, or len(text) if it never closes."""
    depth = 0
    i = start
    n = len(text)
    while i < n:
        c = text[i]
        if c == '"':
            i += 1
            while i < n and text[i] != '"':
                i += 2 if text[i] == "\\" else 1
        elif c in "{[":
            depth += 1
        elif c in "}]":
            depth -= 1
            if depth == 0:
                return i + 1
        i += 1
    return n


# -- loading and repairing -----------------------------------------------------------------------


def json_load(candidate: str) -> tuple[Any, list[str]]:
    """The JSON value in `candidate`, repaired if need be; Unloadable with the decoder's complaint."""
    start = min((i for i in (candidate.find("{"), candidate.find("[")) if i >= 0), default=-1)
    if start < 0:
        raise Unloadable("no JSON object or array")
    candidate = candidate[start:].strip()
    try:
        return json.loads(candidate, strict=False), []  # strict=False: raw newlines are the validator's call
    except (ValueError, RecursionError):
        pass
    repaired, notes = _repair(candidate)
    try:
        return json.loads(repaired, strict=False), notes
    except json.JSONDecodeError as exc:
        raise Unloadable(f"{exc.msg} at line {exc.lineno} column {exc.colno}") from None
    except (ValueError, RecursionError):
        raise Unloadable("JSON nested too deeply") from None


_WS = re.compile(r"\s*")
_NUMBER = re.compile(r"-?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?")
_WORD = re.compile(r"[A-Za-z_$][\w.$-]*")
_VALID_ESCAPES = set('"\\/bfnrtu')
_HEX4 = re.compile(r"[0-9a-fA-F]{4}")
_PYTHON_LITERALS = {"True": "true", "False": "false", "None": "null"}
_JSON_WORDS = {"true", "false", "null", "NaN", "Infinity"}
_VALUE_ENDS = {"str", "lit", "close"}


class _Repairer:
    """One pass over almost-JSON, emitting tokens and noting each kind of repair made."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.tokens: list[tuple[str, str]] = []  # (kind, text): open close , : str lit ws
        self.stack: list[str] = []
        self.notes: dict[str, int] = {}

    def note(self, what: str, count: int = 1) -> None:
        self.notes[what] = self.notes.get(what, 0) + count

    def next_char(self, i: int) -> tuple[str, bool]:
        """The next non-space character after `i` and whether a newline came before it."""
        end = _WS.match(self.text, i)
        j = end.end() if end else i
        return (self.text[j] if j < len(self.text) else ""), "\n" in self.text[i:j]

    def last_kind(self) -> str:
        for kind, _ in reversed(self.tokens):
            if kind != "ws":
                return kind
        return ""

    def emit_value(self, kind: str, token: str) -> None:
        # Two values in a row inside a container: the model forgot a comma.
        if self.stack and self.last_kind() in _VALUE_ENDS:
            self.tokens.append((",", ","))
            self.note("inserted missing comma")
        self.tokens.append((kind, token))

    def string_end(self, i: int, quote: str) -> tuple[str, int]:
        """Read a string starting at `i`; return it re-quoted for JSON and the index after it."""
        text, n = self.text, len(self.text)
        chars: list[str] = []
        j = i + 1
        while j < n:
            c = text[j]
            if c == "\\" and j + 1 < n:
                nxt = text[j + 1]
                if nxt == "'":
                    chars.append("'")
                elif nxt in _VALID_ESCAPES and (nxt != "u" or _HEX4.fullmatch(text, j + 2, j + 6)):
                    chars.append(c + nxt)
                else:  # Windows paths and regexes: keep the backslash as a character
                    chars.append("\\\\" + nxt)
                    self.note("fixed invalid escapes")
                j += 2
                continue
            if c == quote:
                following, newline = self.next_char(j + 1)
                # A quote closes the string only where JSON could go on; otherwise it is part of the text.
                if following in ("", ",", ":", "}", "]") or (newline and following in "\"'{["):
                    return '"' + "".join(chars) + '"', j + 1
                chars.append('\\"' if c == '"' else c)
                if c == '"':
                    self.note("escaped quotes inside strings")
                j += 1
                continue
            chars.append('\\"' if c == '"' else c)
            j += 1
        self.note("closed an unterminated string")
        return '"' + "".join(chars).rstrip("\\") + '"', n

    def run(self) -> tuple[str, list[str]]:
        text, n = self.text, len(self.text)
        i = 0
        started = False
        while i < n:
            c = text[i]
            if started and not self.stack:
                if text[i:].strip():
                    self.note("ignored text after the JSON")
                break
            if c.isspace():
                end = _WS.match(text, i)
                j = end.end() if end else i + 1
                self.tokens.append(("ws", text[i:j]))
                i = j
            elif c in "\"'":
                token, i = self.string_end(i, c)
                if c == "'":
                    self.note("converted single quotes")
                self.emit_value("str", token)
            elif c in "{[":
                if len(self.stack) >= MAX_NESTING:
                    raise Unloadable("JSON nested too deeply")
                self.emit_value("open", c)
                self.stack.append(c)
                started = True
                i += 1
            elif c in "}]":
                self.close(c)
                i += 1
            elif c == ",":
                following, _ = self.next_char(i + 1)
                if following in ("}", "]"):
                    self.note("removed trailing comma")
                elif self.last_kind() in (",", "open"):
                    self.note("removed extra comma")
                else:
                    self.tokens.append((",", ","))
                i += 1
            elif c == ":":
                self.tokens.append((":", ":"))
                i += 1
            elif c == "/" and text.startswith("//", i) or c == "#":
                end_of_line = text.find("\n", i)
                i = n if end_of_line < 0 else end_of_line
                self.note("removed comments")
            elif c == "/" and text.startswith("/*", i):
                close = text.find("*/", i + 2)
                i = n if close < 0 else close + 2
                self.note("removed comments")
            elif number := _NUMBER.match(text, i):
                self.emit_value("lit", number.group())
                i = number.end()
            elif word := _WORD.match(text, i):
                i = word.end()
                self.word(word.group(), i)
            else:
                self.tokens.append(("lit", c))  # junk: leave it for the decoder to complain about
                i += 1
        self.finish()
        return "".join(token for _, token in self.tokens), self.describe()

    def word(self, word: str, after: int) -> None:
        following, _ = self.next_char(after)
        if word in _PYTHON_LITERALS:
            self.emit_value("lit", _PYTHON_LITERALS[word])
            self.note("converted Python literals")
        elif word in _JSON_WORDS:
            self.emit_value("lit", word)
        elif self.stack and self.stack[-1] == "{" and following == ":":
            self.emit_value("str", json.dumps(word))
            self.note("quoted bare keys")
        elif self.stack and self.last_kind() == ":":
            self.emit_value("str", json.dumps(word))
            self.note("quoted bare values")
        else:
            self.emit_value("lit", word)

    def close(self, c: str) -> None:
        opener = "{" if c == "}" else "["
        if opener not in self.stack:
            self.note("removed stray closing bracket")
            return
        while self.stack[-1] != opener:  # a bracket the model forgot to close before this one
            self.tokens.append(("close", "}" if self.stack.pop() == "{" else "]"))
            self.note("closed unbalanced brackets")
        self.stack.pop()
        self.tokens.append(("close", c))

    def finish(self) -> None:
        """Output cut off mid-way: drop a dangling comma, key or colon, then close what is open."""
        if not self.stack:
            return
        while self.tokens:
            while self.tokens and self.tokens[-1][0] == "ws":
                self.tokens.pop()
            kind = self.tokens[-1][0] if self.tokens else ""
            if kind == ",":
                self.tokens.pop()
            elif kind == ":":
                self.tokens.pop()
                while self.tokens and self.tokens[-1][0] == "ws":
                    self.tokens.pop()
                if self.tokens and self.tokens[-1][0] == "str":
                    self.tokens.pop()
            elif kind == "str" and self.stack[-1] == "{" and self._before_last() in ("open", ","):
                self.tokens.pop()  # a key without its value
            else:
                break
        self.note("closed unbalanced brackets", len(self.stack))
        while self.stack:
            self.tokens.append(("close", "}" if self.stack.pop() == "{" else "]"))

    def _before_last(self) -> str:
        seen = 0
        for kind, _ in reversed(self.tokens):
            if kind == "ws":
                continue
            seen += 1
            if seen == 2:
                return kind
        return ""

    def describe(self) -> list[str]:
        out = []
        for what, count in self.notes.items():
            if what == "closed unbalanced brackets":
                out.append(f"closed {count} unbalanced bracket{'s' if count != 1 else ''}")
            elif what == "removed trailing comma" and count > 1:
                out.append(f"removed {count} trailing commas")
            else:
                out.append(what)
        return out


def _repair(text: str) -> tuple[str, list[str]]:
    return _Repairer(text).run()


# -- public API ----------------------------------------------------------------------------------


def check_size(text: object) -> str:
    if not isinstance(text, str):
        raise ExtractError(f"output is not text ({type(text).__name__})")
    if len(text) > MAX_OUTPUT_CHARS:
        raise ExtractError(f"output too large: {len(text)} characters")
    if not text.strip():
        raise ExtractError("empty output")
    return text


def json_extract(text: str) -> ExtractedJSON:
    """The JSON object or array a model meant as its answer: the last tagged block that loads, else the
    last block of any kind that loads. ExtractError if there is none."""
    text = check_size(text)
    first_error = ""
    found: list[tuple[Candidate, ExtractedJSON]] = []
    for candidate in json_candidates(text):
        try:
            value, repairs = json_load(candidate.text)
        except Unloadable as exc:
            first_error = first_error or f"invalid JSON ({candidate.method}): {exc}"
            continue
        if isinstance(value, dict | list):
            found.append((candidate, ExtractedJSON(value, candidate.method, repairs)))
    tagged = [extracted for candidate, extracted in found if candidate.method == "json_tag"]
    if tagged:
        return tagged[-1]
    if found:
        return max(found, key=lambda pair: pair[0].start)[1]
    raise ExtractError(first_error or "no JSON found in output")
