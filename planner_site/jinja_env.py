"""The Jinja2 environment of the templates that draw rows by the thousand (templates/jinja2/): Django's documented
second template backend (`django.template.backends.jinja2.Jinja2`), with the few Django helpers those templates
use. Every other template is a Django template; docs/architecture.md says which templates are Jinja2 and why."""

from __future__ import annotations

from datetime import datetime
from html import escape
from typing import Any

from django.template.defaultfilters import time as time_filter
from django.urls import reverse
from django.utils.text import Truncator
from django.utils.timezone import localtime
from jinja2 import Environment


def url(name: str, *args: Any) -> str:
    """`url("step-approve", step.pk)`: Django's `{% url %}`."""
    return reverse(name, args=args)


def truncatechars(value: object, length: int) -> str:
    """Django's `truncatechars` filter: at most `length` characters, the last one "…" when cut."""
    return Truncator(str(value)).chars(length)


def time(value: datetime, fmt: str) -> str:
    """Django's `time` filter, in the current time zone as a Django template shows a time."""
    return time_filter(localtime(value), fmt)


def escaped(value: object) -> str:
    """A value as a Django template writes it: escaped as `django.utils.html.escape` escapes (`html.escape`, the same
    entities), unless it is already HTML (a SafeString)."""
    html = getattr(value, "__html__", None)
    return html() if html is not None else escape(str(value))


def environment(**options: Any) -> Environment:
    """Every `{{ value }}` is escaped by `escaped`, as a Django template escapes it (`&quot;` and `&#x27;`, where
    Jinja2's autoescape writes `&#34;` and `&#39;`): `finalize` applies it to every value written, so autoescape is
    off (settings.TEMPLATES)."""
    options["autoescape"] = False
    env = Environment(finalize=escaped, **options)  # noqa: S701  # every value written is escaped by finalize
    env.globals["url"] = url
    env.filters["truncatechars"] = truncatechars
    env.filters["time"] = time
    return env
