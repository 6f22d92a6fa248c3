"""Helpers the Python-built parts of the plan page share (plan_rows.py, operator_pages.py): a step status's label and
text cut as the templates' `truncatechars` cuts it. The dashboard's rows are the template partial `row` of
templates/planning/dashboard.html."""

from __future__ import annotations

from django.utils.text import Truncator

from planning.models import PlanStep

STEP_STATUS = dict(PlanStep.Status.choices)
TRUNCATE = 60  # characters of a goal or step shown in a row, as the template's truncatechars:60


def short(text: str, length: int = TRUNCATE) -> str:
    """truncatechars:60, or `length` (a text this short is itself: most are)."""
    return text if len(text) <= length else Truncator(text).chars(length)


def label(choices: dict[str, str], value: str) -> str:
    """A choice's label, as get_FOO_display gives it (the value itself when it is no choice)."""
    return choices.get(value, value)
