"""Turning a model's answer into plan data (seeds 002 and 004).

The JSON is found by the gateway's generic extraction (`agents.llm.extract`): a `<json>` block wins,
else the last block that parses. What is plan-specific lives here: seed 002's "plan" key is the step
list, a bare list is the steps, plain-text steps become objects, and prose falls back to a numbered or
bulleted list, then to the whole text as a single step. Every repair is reported so the operator sees it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from agents.llm.extract import (
    LOOKS_LIKE_JSON,
    MAX_OUTPUT_CHARS,
    ExtractError,
    Unloadable,
    check_size,
    json_candidates,
    json_load,
)

__all__ = ["MAX_OUTPUT_CHARS", "NO_TAGS_FLAG", "ParsedPlan", "PlanParseError", "plan_parse"]

MAX_DESCRIPTION_CHARS = 500
# Seed 002 requires the tags, seed 004 accepts any JSON: an answer without them is used, and flagged.
NO_TAGS_FLAG = "the answer was not inside <json>...</json> tags (the planner prompt asks for them)"

# A plan the model's answer does not hold: the same error as the generic extraction's.
PlanParseError = ExtractError


@dataclass
class ParsedPlan:
    """Plan data as the model meant it: a dict with "steps" (unless the model's object had neither
    "steps" nor "plan"; `plan_validate` then says so), how it was found, and what was repaired."""

    data: dict[str, Any]
    method: str  # "json_tag" | "fenced" | "balanced" | "text_list" | "single_step"
    repaired: list[str] = field(default_factory=list)

    @property
    def flags(self) -> list[str]:
        """What the operator should know about how the plan was found (seed 002's tags)."""
        return [] if self.method == "json_tag" else [NO_TAGS_FLAG]


def _plan_data(value: Any, repairs: list[str]) -> dict[str, Any] | None:
    """The value as {"steps": [...], ...}, or None if it is no container at all."""
    if isinstance(value, list):
        data: dict[str, Any] = {"steps": value}
    elif isinstance(value, dict):
        data = dict(value)
        if "steps" not in data and "plan" in data:
            data["steps"] = data.pop("plan")  # seed 002 calls the step list "plan"
    else:
        return None
    steps = data.get("steps")
    if isinstance(steps, list):
        texts = sum(1 for step in steps if isinstance(step, str))
        if texts:
            data["steps"] = [{"description": step} if isinstance(step, str) else step for step in steps]
            repairs.append(f"turned {texts} plain-text step{'s' if texts != 1 else ''} into objects")
    return data


_LIST_LINE = re.compile(r"^\s*(?:(?:step\s*)?\d{1,3}\s*[.):-]|[-*\u2022+])\s+(.+?)\s*$", re.IGNORECASE | re.MULTILINE)


def _text_steps(text: str) -> list[dict[str, Any]]:
    steps = []
    for match in _LIST_LINE.finditer(text):
        description = match.group(1).replace("**", "").replace("__", "").strip().rstrip(":").strip()
        if len(description) >= 2:
            steps.append({"description": description[:MAX_DESCRIPTION_CHARS]})
    return steps


NO_JSON_PLAN = "no JSON plan in the answer"


def plan_parse(text: str, *, allow_single_step: bool = True, allow_text_list: bool = True) -> ParsedPlan:
    """Find the plan in a model's answer. Raises only PlanParseError, whose reason fits a retry prompt.

    Once the output visibly tried to give JSON, a broken attempt is an error rather than a one-step
    plan made of broken JSON; prose falls back to a step list and then to a single step, where allowed
    (the planner allows neither for tool plans: prose is "no JSON plan in the answer", never tool steps).
    """
    text = check_size(text)
    first_error = ""
    plans: list[tuple[bool, int, int, ParsedPlan]] = []  # (tagged, start, length, plan)
    keyless: list[tuple[bool, int, int, ParsedPlan]] = []
    for candidate in json_candidates(text):
        try:
            value, repairs = json_load(candidate.text)
        except Unloadable as exc:
            if candidate.explicit or LOOKS_LIKE_JSON.match(candidate.text.lstrip()):
                first_error = first_error or f"invalid JSON: {exc}"
            continue
        data = _plan_data(value, repairs)
        if data is None:
            first_error = first_error or f"the JSON is a {type(value).__name__}, not a plan object or list of steps"
            continue
        # An object without steps may be a restatement echoed before or after the plan: steps win.
        found = (candidate.method == "json_tag", candidate.start, len(candidate.text),
                 ParsedPlan(data, candidate.method, repairs))
        (plans if "steps" in data else keyless).append(found)
    for group in (plans, keyless):
        if group:
            # The tagged block wins; among equals, the last one (an example comes before the answer), and of
            # one block read two ways, the longer (a "</json>" inside a string cut the shorter).
            return max(group, key=lambda item: item[:3])[3]
    if first_error:
        raise PlanParseError(first_error)
    steps = _text_steps(text) if allow_text_list else []
    if steps:
        return ParsedPlan({"steps": steps}, "text_list", [])
    if allow_single_step:
        return ParsedPlan({"steps": [{"description": " ".join(text.split())[:MAX_DESCRIPTION_CHARS]}]}, "single_step", [])
    raise PlanParseError("no JSON plan or step list found in output" if allow_text_list else NO_JSON_PLAN)
