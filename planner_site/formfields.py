"""Form fields that refuse what the services refuse, with a message instead of a server error: used by
the operator's forms and, for every JSON field, by the admin."""

from __future__ import annotations

from typing import Any

from django import forms
from django.core.exceptions import ValidationError
from django.forms.fields import InvalidJSONInput, JSONString

from planner_site.validators import InputError, char_problem, json_parse


def text_validate(value: str) -> None:
    """A form field validator: no NUL, lone surrogate, control or bidirectional override characters."""
    if problem := char_problem(value):
        raise ValidationError(f"This text {problem}.", code="invalid_characters")


class TextField(forms.CharField):
    """A CharField whose characters are checked, trimmed like Django's default."""

    default_validators = [text_validate]


class JSONValueField(forms.JSONField):
    """Django's JSONField, refusing what the services refuse (too deep, too large, too big a number, NUL,
    lone surrogates) with a message instead of a server error. The admin uses it for every JSON field."""

    def to_python(self, value: Any) -> Any:
        if self.disabled:
            return value
        if value in self.empty_values:
            return None
        if isinstance(value, list | dict | int | float | JSONString):
            return value
        try:
            converted = json_parse(value)
        except InputError as exc:
            raise ValidationError(f"This JSON {exc}.", code="invalid") from None
        return JSONString(converted) if isinstance(converted, str) else converted

    def bound_data(self, data: Any, initial: Any) -> Any:
        if self.disabled:
            return initial
        if data is None:
            return None
        try:
            return json_parse(data)
        except InputError:
            return InvalidJSONInput(data)
