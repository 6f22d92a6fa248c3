"""The audit log (every recorded change: plan events, policies, notification settings, the admin's log; one
selector over them, filtered, paginated, exported as CSV or JSON) and usage
(model calls, tokens, latency, errors, fallbacks and cost, with server-rendered charts)."""

from __future__ import annotations

import csv
import json
from collections.abc import Iterable, Iterator
from datetime import date
from typing import Any

from django import forms
from django.core.paginator import Paginator
from django.core.serializers.json import DjangoJSONEncoder
from django.http import HttpRequest, HttpResponse, StreamingHttpResponse
from django.shortcuts import render
from django.views.decorators.http import require_GET

from agents.models import Agent
from planner_site.formfields import TextField
from planner_site.validators import text_shown_plainly
from planning.audit_selectors import AUDIT_EXPORT_FIELDS, KIND_LABELS, audit_entries, audit_rows, entries_of
from planning.operator_selectors import USAGE_PERIODS, usage_context

AUDIT_PAGE_SIZE = 50
ID_MAX = 2**63 - 1  # the largest primary key either database stores; a larger one is refused, not a 500


class AuditFilterForm(forms.Form):
    operator = TextField(label="Operator or runner", max_length=150, required=False)
    agent = forms.TypedChoiceField(label="Agent", required=False, coerce=int, empty_value=None)
    plan = forms.IntegerField(label="Plan id", required=False, min_value=1, max_value=ID_MAX)
    kind = forms.ChoiceField(label="Kind", required=False, choices=[("", "any kind"), *KIND_LABELS.items()])
    since = forms.DateField(label="From", required=False, widget=forms.DateInput(attrs={"type": "date"}))
    until = forms.DateField(label="Until", required=False, widget=forms.DateInput(attrs={"type": "date"}))

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        agents = Agent.objects.order_by("name").values_list("pk", "name")
        self.fields["agent"].choices = [("", "any agent"), *agents]  # type: ignore[attr-defined]

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        since, until = data.get("since"), data.get("until")
        if isinstance(since, date) and isinstance(until, date) and since > until:
            raise forms.ValidationError("“From” is after “Until”.")
        return data


def audit_filtered(request: HttpRequest) -> tuple[AuditFilterForm, Any]:
    form = AuditFilterForm(request.GET or None)
    filters: dict[str, Any] = {}
    if form.is_bound and form.is_valid():
        data = form.cleaned_data
        filters = {"operator": data["operator"], "agent_id": data["agent"], "plan_id": data["plan"],
                   "kind": data["kind"], "since": data["since"], "until": data["until"]}
    return form, audit_entries(**filters)


@require_GET
def audit(request: HttpRequest) -> HttpResponse:
    form, events = audit_filtered(request)
    if form.is_bound and not form.is_valid():
        events = events.none()
    page = Paginator(events, AUDIT_PAGE_SIZE).get_page(request.GET.get("page"))
    query = request.GET.copy()
    query.pop("page", None)
    status = 400 if form.is_bound and not form.is_valid() else 200
    return render(request, "planning/audit.html", {"form": form, "page": page, "entries": entries_of(page.object_list),
                                                   "query": query.urlencode()}, status=status)


class Echo:
    """A file-like object whose write returns the line, for streaming CSV."""

    def write(self, value: str) -> str:
        return value


FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")  # what a spreadsheet would run as a formula (OWASP CSV injection)


def csv_cell(value: Any) -> Any:
    """A cell as a spreadsheet shows it harmlessly: text that would start a formula gets a leading quote, and
    control or bidirectional characters (in rows older than the validators) are written out as their codes."""
    if not isinstance(value, str):
        return value
    value = text_shown_plainly(value)
    return "'" + value if value.startswith(FORMULA_STARTS) else value


def csv_lines(rows: Iterable[dict[str, Any]]) -> Iterator[str]:
    writer = csv.writer(Echo())
    yield writer.writerow(AUDIT_EXPORT_FIELDS)
    for row in rows:
        values = [json.dumps(row[f], ensure_ascii=False) if f == "detail" else row[f] for f in AUDIT_EXPORT_FIELDS]
        yield writer.writerow([csv_cell(v) for v in values])


def json_lines(rows: Iterable[dict[str, Any]]) -> Iterator[str]:
    yield "["
    for i, row in enumerate(rows):
        yield ("," if i else "") + "\n" + json.dumps(row, cls=DjangoJSONEncoder, ensure_ascii=False)
    yield "\n]\n"


@require_GET
def audit_export(request: HttpRequest, fmt: str) -> HttpResponse | StreamingHttpResponse:
    """The filtered audit log as CSV or JSON, streamed (any size, constant memory)."""
    form, events = audit_filtered(request)
    if form.is_bound and not form.is_valid():
        return HttpResponse("Invalid filter: " + " ".join(str(m) for e in form.errors.values() for m in e),
                            status=400, content_type="text/plain; charset=utf-8")
    rows = audit_rows(events)
    if fmt == "csv":
        response = StreamingHttpResponse(csv_lines(rows), content_type="text/csv; charset=utf-8")
    else:
        response = StreamingHttpResponse(json_lines(rows), content_type="application/json")
    response["Content-Disposition"] = f'attachment; filename="audit.{fmt}"'
    return response


@require_GET
def usage(request: HttpRequest) -> HttpResponse:
    period = request.GET.get("period", "7d")
    raw_agent = request.GET.get("agent", "")
    agent_id = int(raw_agent) if raw_agent.isascii() and raw_agent.isdigit() and len(raw_agent) <= 18 else None
    context = usage_context(period=period if period in USAGE_PERIODS else "7d", agent_id=agent_id)
    context["agents"] = list(Agent.objects.order_by("name").values_list("pk", "name"))
    context["agent_id"] = agent_id
    return render(request, "planning/usage.html", context)
