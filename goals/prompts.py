"""The goal system's prompts (seed 001): goal generation and the milestone check, and reading their answers.

Each builder returns chat messages whose last line is `CONTEXT: {...}`, the structured inputs as one-line
JSON: real models may use it, and the offline rules model answers from it alone.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from agents.llm.context import bullets, context_line, needs_text, percent
from agents.llm.extract import ExtractError, json_extract
from agents.llm.placeholders import examples_register, junk_problem, placeholder_or_example

RECENT_EXPERIENCES = 10

Messages = list[dict[str, str]]


# The worked example: not an everyday goal, so a model that copies it is caught (its values are refused).
GOAL_EXAMPLE = ('{"description": "Learn the names of the birds in the park", "horizon": "long_term", '
                '"source_needs": ["fun"], "recommended_actions": ["relax"], '
                '"reasoning": "Fun has been low for days; birdwatching is calm and free"}')
examples_register("Learn the names of the birds in the park", "Fun has been low for days; birdwatching is calm and free")


class AnswerUnreadable(ValueError):
    """The model's answer holds no JSON value of the expected shape."""


def prompt_goals(*, needs: Mapping[str, float], personality: Mapping[str, Any], emotions: Mapping[str, float],
                 lessons: Sequence[str], existing: Sequence[str], waiting: Sequence[str] = ()) -> Messages:
    """Seed 001 goal generation: up to 3 new goals from needs, personality, emotions and lessons. `waiting`: the
    existing goals whose plan waits for an operator's decision (another way to their needs is welcome)."""
    context = {
        "purpose": "goals",
        "needs": {name: round(float(value), 4) for name, value in needs.items()},
        "personality": dict(personality),
        "emotions": {name: round(float(value), 4) for name, value in emotions.items()},
        "lessons": [str(lesson) for lesson in lessons],
        "existing": [str(goal) for goal in existing],
        "waiting": [str(goal) for goal in waiting],
    }
    existing = [f"{goal} (its plan waits for an operator's decision)" if goal in waiting else str(goal)
                for goal in existing]
    personality_text = ", ".join(f"{k}: {v}" for k, v in personality.items()) or "(none)"
    emotions_text = ", ".join(f"{k}: {percent(v)}" for k, v in emotions.items()) or "(none)"
    user = (
        f"CURRENT NEEDS (satisfaction, lowest first): {needs_text(needs)}\n"
        f"PERSONALITY: {personality_text}\nEMOTIONS: {emotions_text}\n"
        f"LEARNED LESSONS:\n{bullets(lessons)}\nEXISTING GOALS (do not duplicate):\n{bullets(existing)}\n\n"
        "Propose up to 3 new goals. horizon is short_term, mid_term or long_term; source_needs are need names "
        "from the list above. Answer with a JSON array inside <json>...</json>:\n"
        f"<json>[{GOAL_EXAMPLE}]</json>\n" + context_line(context)
    )
    system = "You set goals for a simulated person, grounded in their needs and what they have learned."
    return [{"role": "system", "content": system}, {"role": "user", "content": user}]


def prompt_milestone(*, goal: str, experiences: Sequence[str], needs: Mapping[str, float]) -> Messages:
    """Seed 001 milestone check: has this goal really been achieved?"""
    recent = [str(e) for e in experiences][-RECENT_EXPERIENCES:]
    context = {
        "purpose": "milestone",
        "goal": goal,
        "needs": {name: round(float(value), 4) for name, value in needs.items()},
        "experiences": recent,
    }
    user = (
        f"GOAL: {goal}\nRECENT RELATED EXPERIENCES:\n{bullets(recent)}\n"
        f"CURRENT SATISFACTION OF ITS SOURCE NEEDS: {needs_text(needs)}\n\n"
        "Has the goal been achieved? Answer with JSON inside <json>...</json>:\n"
        '<json>{"achieved": false, "explanation": "<one sentence of evidence from the experiences>"}</json>\n'
        + context_line(context)
    )
    system = "You judge whether a simulated person has achieved a goal, from evidence only."
    return [{"role": "system", "content": system}, {"role": "user", "content": user}]


def answer_json(text: str) -> Any:
    """The JSON value of a model's answer (the gateway's extraction: tags, fences, repairs)."""
    try:
        return json_extract(text).value
    except ExtractError as exc:
        raise AnswerUnreadable(str(exc)) from exc


def goal_proposals(text: str) -> list[dict[str, Any]]:
    """The goals a generation answer proposes: a list, or an object holding one under "goals"."""
    value = answer_json(text)
    if isinstance(value, dict):
        value = value.get("goals", [value] if "description" in value else [])
    if not isinstance(value, list):
        raise AnswerUnreadable("the answer is not a list of goals")
    goals = [item for item in value if isinstance(item, dict)]
    # Prose, code, placeholders and the prompt's example are no goals: such a proposal is left out.
    kept = [item for item in goals if not goal_description_problem(item.get("description"))]
    if goals and not kept:
        raise AnswerUnreadable(f"no usable goal: {goal_description_problem(goals[0].get('description'))}")
    return kept


def goal_description_problem(description: object) -> str:
    """Why a proposed goal's description is no goal (prose, junk, a placeholder, the example), or ""."""
    return junk_problem(description, max_words=20) or placeholder_or_example(description)


def milestone_verdict(text: str) -> tuple[bool, str]:
    """(achieved, explanation) from a milestone answer; only a JSON true counts as achieved."""
    value = answer_json(text)
    if not isinstance(value, dict) or "achieved" not in value:
        raise AnswerUnreadable('the answer has no "achieved"')
    explanation = " ".join(str(value.get("explanation", "")).split())[:1000]
    # "achieved" without evidence is no verdict: a placeholder explanation ("...") completes nothing.
    why = placeholder_or_example(explanation) or ("" if explanation else "empty")
    if why:
        raise AnswerUnreadable(f"the explanation is {why}, not evidence")
    return value.get("achieved") is True, explanation
