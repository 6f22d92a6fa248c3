"""Every realistic bad or borderline model output in corpus/cases.json gets the outcome a user would expect."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from planning.engine.parse import PlanParseError, plan_parse
from planning.engine.validate import plan_validate

CORPUS = json.loads((Path(__file__).parent / "corpus" / "cases.json").read_text(encoding="utf-8"))
CASES: list[dict[str, Any]] = CORPUS["cases"]


def judge(case: dict[str, Any]) -> tuple[str, list[str], str | None]:
    """(outcome, every message produced, parse method) for one model output."""
    output = case["output"] * case.get("repeat", 1)
    try:
        parsed = plan_parse(output)
    except PlanParseError as exc:
        return "rejected", [exc.reason], None
    result = plan_validate(
        parsed.data, kind=case["kind"], max_steps=case.get("max_steps", 20), allowed_actions=CORPUS["allowed_actions"]
    )
    flags = [*result.flags, *parsed.flags]  # seed 002: an answer outside <json> tags is flagged
    messages = [*result.problems, *flags, *parsed.repaired]
    if not result.ok:
        return "rejected", messages, parsed.method
    if flags:
        return "flagged", messages, parsed.method
    if parsed.repaired:
        return "repaired", messages, parsed.method
    return "accepted", messages, parsed.method


def test_corpus_is_big_and_covers_every_outcome() -> None:
    assert len(CASES) >= 60
    assert {c["expect"] for c in CASES} == {"accepted", "repaired", "flagged", "rejected"}
    assert {c["kind"] for c in CASES} == {"tool", "persona"}


@pytest.mark.parametrize("case", CASES, ids=[c["name"] for c in CASES])
def test_corpus_case(case: dict[str, Any]) -> None:
    outcome, messages, method = judge(case)
    assert outcome == case["expect"], messages
    if case["reason"]:
        assert any(case["reason"] in m for m in messages), messages
    if outcome == "accepted":
        assert messages == []
    if "method" in case:
        assert method == case["method"]
