"""The plan editor (a whole plan, saved as version n+1 through the planner's validator), the versions of a plan
with why each was made, and the compare view of any two."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

from django.contrib import messages
from django.contrib.auth.decorators import permission_required
from django.http import HttpRequest, HttpResponse, QueryDict
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.http import require_GET, require_http_methods
from django_htmx.http import HttpResponseClientRedirect

from agents.models import Agent
from planner_site.request_guard import form_checks_text
from planner_site.roles import DECIDE_PERMISSION
from planner_site.validators import InputError, json_parse, text_problem
from planning import services
from planning.engine.validate import StepSpec
from planning.forms import agent_tool_names
from planning.models import Plan, PlanStep
from planning.operator_selectors import plan_chain, plans_compare
from planning.services import (
    EDITABLE_PLAN_STATUSES,
    PlanEditInvalid,
    StaleVersion,
    plan_edit_save,
)
from planning.views import operator

INPUT_MAX = 20000
REASON_MAX = 500
# The editor's text fields and their limits (the PlanStep columns'), checked like every other form's text.
ROW_TEXT_FIELDS = (("key", "Step id", 32), ("description", "Description", 500), ("tool", "Tool", 64),
                   ("action_hint", "Action", 200), ("expected_outcome", "Expected outcome", 500),
                   ("depends_on", "Depends on", 2000))
# Which editor field a validator problem is about, by the words the validator uses.
PROBLEM_FIELDS = (
    ("depends", "depends_on"),
    ("requirespermission", "requires_permission"),
    ("'input'", "input"),
    (" input ", "input"),
    ("path", "input"),
    ("content", "input"),
    ("tool", "tool"),
    ("'intent'", "description"),
    ("'description'", "description"),
    ("action", "action_hint"),
    ("expects", "expected_outcome"),
    ("expected_outcome", "expected_outcome"),
    ("estimated_cycles", "estimated_cycles"),
    ("'id'", "key"),
)
STEP_PROBLEM = re.compile(r"^step (\d+): (.*)$", re.DOTALL)


@dataclass
class EditorRow:
    """One editable step as the form shows it, with its errors by field."""

    index: str
    key: str
    description: str = ""
    tool: str = ""
    input: str = "{}"
    action_hint: str = ""
    expected_outcome: str = ""
    estimated_cycles: str = "1"
    depends_on: str = ""
    requires_permission: bool = False
    status: str = PlanStep.Status.PENDING
    errors: dict[str, list[str]] = field(default_factory=dict)

    def error(self, name: str, text: str) -> None:
        self.errors.setdefault(name, []).append(text)


def small_number(text: str) -> bool:
    """Digits a form may send for a count, a version or a row number (not "²", not 5,000 digits)."""
    return text.isascii() and text.isdigit() and len(text) <= 9


def row_from_step(index: int, step: PlanStep) -> EditorRow:
    return EditorRow(
        index=str(index), key=step.key, description=step.description, tool=step.tool,
        input=json.dumps(step.tool_input, ensure_ascii=False), action_hint=step.action_hint,
        expected_outcome=step.expected_outcome, estimated_cycles=str(step.estimated_cycles),
        depends_on=", ".join(step.depends_on), requires_permission=step.requires_permission, status=step.status,
    )


def rows_from_post(data: QueryDict) -> list[EditorRow]:
    rows = []
    for index in data.getlist("row")[:100]:
        if not small_number(index):
            continue
        def value(name: str, index: str = index) -> str:
            return data.get(f"{index}-{name}", "").strip()
        rows.append(EditorRow(
            index=index, key=value("key")[:32], description=value("description"), tool=value("tool"),
            input=value("input") or "{}", action_hint=value("action_hint"), expected_outcome=value("expected_outcome"),
            estimated_cycles=value("estimated_cycles") or "1", depends_on=value("depends_on"),
            requires_permission=data.get(f"{index}-requires_permission") == "on",
        ))
    return rows


def row_apply(rows: list[EditorRow], op: str, used_keys: set[str]) -> list[EditorRow]:
    """Add, remove or move a row (nothing is saved until "Save as version n+1")."""
    name, _, target = op.partition("-")
    position = next((i for i, r in enumerate(rows) if r.index == target), None)
    if name == "add":
        taken = used_keys | {r.key for r in rows}
        number = len(taken) + 1
        while str(number) in taken:
            number += 1
        index = str(max((int(r.index) for r in rows), default=-1) + 1)
        previous = rows[-1].key if rows else ""
        rows.append(EditorRow(index=index, key=str(number), depends_on=previous))
    elif position is not None and name == "remove":
        rows.pop(position)
    elif position is not None and name == "up" and position > 0:
        rows[position - 1], rows[position] = rows[position], rows[position - 1]
    elif position is not None and name == "down" and position < len(rows) - 1:
        rows[position + 1], rows[position] = rows[position], rows[position + 1]
    return rows


def dependencies_follow_order(rows: list[EditorRow], *, before: list[str], kept: list[str]) -> list[EditorRow]:
    """After a reorder the operator chose "update": each step whose dependencies followed the old order (it waited
    for the step just before it, or, first, for none) waits for the step now just before it. Other dependencies,
    chosen by hand, stay as they are. `before` is the order of the rows before the moves; kept steps come first."""
    old = kept + before
    new = kept + [r.key for r in rows]
    for row in rows:
        if row.key not in old:
            continue  # added since: its dependencies are the operator's own
        at = old.index(row.key)
        followed = [old[at - 1]] if at > 0 else []
        if [d.strip() for d in row.depends_on.split(",") if d.strip()] != followed:
            continue
        now = new.index(row.key)
        row.depends_on = new[now - 1] if now > 0 else ""
    return rows


def rows_parse(rows: list[EditorRow]) -> list[StepSpec]:
    """The rows as steps; what cannot even be read (JSON, numbers) is marked on its row's field."""
    steps = []
    for row in rows:
        tool_input: Any = {}
        for name, label, limit in ROW_TEXT_FIELDS:
            if problem := text_problem(getattr(row, name), max_length=limit):
                row.error(name, f"{label} {problem}.")
        if len(row.input) > INPUT_MAX:
            row.error("input", f"Input is too long ({len(row.input)} > {INPUT_MAX} characters).")
        else:
            try:
                tool_input = json_parse(row.input)
            except InputError as exc:
                row.error("input", f"Input {exc}.")
            else:
                if not isinstance(tool_input, dict):
                    row.error("input", 'Input must be a JSON object, like {"path": "data.csv"}.')
                    tool_input = {}
        cycles = int(row.estimated_cycles) if small_number(row.estimated_cycles) else 0
        if cycles < 1:
            row.error("estimated_cycles", "Estimated cycles must be a whole number of at least 1.")
        if not row.key:
            row.error("key", "Give the step an id.")
        steps.append(StepSpec(
            key=row.key, description=row.description, tool=row.tool, input=tool_input, action_hint=row.action_hint,
            expected_outcome=row.expected_outcome, estimated_cycles=max(cycles, 1),
            depends_on=[d.strip() for d in row.depends_on.split(",") if d.strip()],
            requires_permission=row.requires_permission,
        ))
    return steps


def problems_place(problems: list[str], rows: list[EditorRow], kept: int) -> list[str]:
    """Put each validator problem by the field it is about; return those that belong to no single field."""
    general = []
    for problem in problems:
        match = STEP_PROBLEM.match(problem)
        position = int(match.group(1)) - kept - 1 if match else -1
        if match is None or not 0 <= position < len(rows):
            general.append(problem)
            continue
        text = match.group(2)
        lowered = f" {text.lower()} "
        name = next((f for word, f in PROBLEM_FIELDS if word in lowered), "description")
        rows[position].error(name, text[:1].upper() + text[1:] + ".")
    return general


def editor_context(plan: Plan, rows: list[EditorRow], **extra: Any) -> dict[str, Any]:
    kept = [s for s in plan.steps.all() if s.status in PlanStep.DONE_STATUSES]
    agent = plan.agent
    return {"plan": plan, "agent": agent, "rows": rows, "kept": kept, "tools": agent_tool_names(agent),
            "tool_agent": agent.kind in (Agent.Kind.TOOL, Agent.Kind.EXTERNAL),
            "editable": plan.status in EDITABLE_PLAN_STATUSES} | extra


@form_checks_text
@require_http_methods(["GET", "POST"])
@permission_required(DECIDE_PERMISSION, raise_exception=True)
def plan_editor(request: HttpRequest, pk: int) -> HttpResponse:
    plan = get_object_or_404(Plan.objects.select_related("agent"), pk=pk)
    steps = list(plan.steps.all())
    if request.method == "GET":
        rows = [row_from_step(i, s) for i, s in enumerate(s for s in steps if s.status not in PlanStep.DONE_STATUSES)]
        return render(request, "planning/plan_editor.html", editor_context(plan, rows))
    rows = rows_from_post(request.POST)
    op = request.POST.get("op", "")
    kept_keys = {s.key for s in steps if s.status in PlanStep.DONE_STATUSES}
    # The order before moves the operator has not yet said what to do about (keep or update dependencies).
    reordered_from = [k for k in request.POST.get("reordered_from", "").split(",") if k][:100]
    if op in ("deps-keep", "deps-update"):
        if op == "deps-update" and reordered_from:
            kept_order = [s.key for s in steps if s.status in PlanStep.DONE_STATUSES]
            dependencies_follow_order(rows, before=reordered_from, kept=kept_order)
        return render(request, "planning/plan_editor.html#editor", editor_context(plan, rows))
    if op != "save":  # a new step never reuses the id of one of this version's steps, so diffs stay truthful
        order = reordered_from or [r.key for r in rows]
        rows = row_apply(rows, op, {s.key for s in steps})
        moved = op.startswith(("up-", "down-")) or bool(reordered_from)
        asked = order if moved and order != [r.key for r in rows] else []
        return render(request, "planning/plan_editor.html#editor", editor_context(plan, rows, reordered_from=asked))
    edited = rows_parse(rows)
    general: list[str] = []
    status = 400
    seen = request.POST.get("version", "")
    reason = request.POST.get("reason", "").strip()
    if problem := text_problem(reason, max_length=REASON_MAX):
        general = [f"The reason {problem}."]
    if not general and not any(r.errors for r in rows):
        try:
            new = plan_edit_save(plan=plan, user=operator(request), steps=edited,
                                 seen_version=int(seen) if small_number(seen) else -1, reason=reason)
        except PlanEditInvalid as exc:
            general = problems_place(exc.problems, rows, len(kept_keys))
        except StaleVersion as exc:
            return render(request, "planning/plan_editor.html#editor",
                          editor_context(plan, rows, general=[str(exc)], current=exc.current), status=409)
        except services.DecisionError as exc:
            general, status = [str(exc)], 409
        else:
            messages.success(request, f"Saved as version {new.version}.")
            if getattr(request, "htmx", False):
                return HttpResponseClientRedirect(new.get_absolute_url())
            return redirect(new)
    context = editor_context(plan, rows, general=general,
                             invalid="The plan was not saved: fix the marked fields and save again.")
    return render(request, "planning/plan_editor.html#editor", context, status=status)


@require_GET
def plan_versions(request: HttpRequest, pk: int) -> HttpResponse:
    plan = get_object_or_404(Plan.objects.select_related("agent"), pk=pk)
    chain = plan_chain(plan)
    return render(request, "planning/plan_versions.html", {"plan": plan, "agent": plan.agent, "chain": chain})


@require_GET
def plan_compare(request: HttpRequest) -> HttpResponse:
    """Any two versions: ?a=<plan id>&b=<plan id> (older and newer, in either order)."""
    ids = [request.GET.get("a", ""), request.GET.get("b", "")]
    if not all(small_number(i) for i in ids):
        return render(request, "planning/plan_compare.html", {"error": "Choose two versions to compare."}, status=400)
    plans = {p.pk: p for p in Plan.objects.select_related("agent").filter(pk__in=[int(i) for i in ids])}
    if len(plans) != len(set(ids)):
        return render(request, "planning/plan_compare.html", {"error": "No such plan version."}, status=404)
    old, new = sorted((plans[int(i)] for i in ids), key=lambda p: (p.version, p.created_at, p.pk))
    if old.agent_id != new.agent_id:
        return render(request, "planning/plan_compare.html",
                      {"error": "These plans belong to different agents; compare versions of one plan."}, status=400)
    return render(request, "planning/plan_compare.html",
                  {"old": old, "new": new, "agent": new.agent, "chain": plan_chain(new)} | plans_compare(old, new))


@require_GET
def plan_graph_view(request: HttpRequest, pk: int) -> HttpResponse:
    """The plan's graph alone: the plan page refreshes it after live pushes."""
    plan = get_object_or_404(Plan, pk=pk)
    return render(request, "planning/plan_graph_page.html", {"plan": plan, "steps": list(plan.steps.all())})
