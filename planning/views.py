"""Pages and operator decisions. Views read through selectors and change things only through services."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any, cast
from urllib.parse import urlencode

from django.conf import settings
from django.contrib import messages
from django.contrib.auth.decorators import permission_required
from django.contrib.auth.models import User
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.http import require_GET, require_http_methods, require_POST
from django_htmx.http import HttpResponseClientRedirect, reswap, retarget

from agents.models import Agent
from goals.models import Goal
from planner_site.roles import DECIDE_PERMISSION
from planning import services
from planning.forms import (
    A2AAgentAddForm,
    AcceptDoneForm,
    AgentCreateForm,
    AgentStatusForm,
    AguiAgentForm,
    ApproveplanForm,
    ClarifyForm,
    DeclineForm,
    GoalForm,
    ReasonForm,
    ReplanForm,
    StepEditForm,
    WorkspaceUploadForm,
    agent_tool_names,
)
from planning.models import Plan, PlanEvent, PlanStep
from planning.operator_selectors import goal_queue
from planning.selectors import (
    DASHBOARD_PAGE_SIZE,
    DashboardFilter,
    agent_context,
    dashboard_glance,
    dashboard_page_counted,
    plan_context,
)
from planning.services import a2a as a2a_services
from planning.services import agui
from policies import services as policy_services


@require_GET
def dashboard(request: HttpRequest) -> HttpResponse:
    filters = DashboardFilter.from_query(request.GET)
    rows, page, counts = dashboard_page_counted(filters)
    return render(request, "planning/dashboard.html", {
        "rows": rows, "page": page, "counts": counts, "filters": filters,
        "live_query": filters.query(page=page.number),
        "prev_query": filters.query(page=page.number - 1) if page.has_previous() else "",
        "next_query": filters.query(page=page.number + 1) if page.has_next() else "",
        "statuses": Agent.Status.choices, "kinds": Agent.Kind.choices,
        "glance_query": urlencode({"agents": ",".join(str(r.agent.pk) for r in rows)}),
    })


GLANCE_AGENTS_MAX = DASHBOARD_PAGE_SIZE
GLANCE_REFRESH_SECONDS = 15  # the glance is no part of the pushes (see docs/charts.md): htmx asks for it again


@require_GET
def dashboard_glance_view(request: HttpRequest) -> HttpResponse:
    """The dashboard's glance (the fleet's last hour, the personas' most urgent goals), loaded after the page and
    refreshed every GLANCE_REFRESH_SECONDS by htmx. `agents`: the ids of the rows the page shows."""
    ids = [int(v) for v in request.GET.get("agents", "").split(",") if v.strip().isdigit()][:GLANCE_AGENTS_MAX]
    return render(request, "planning/dashboard_glance.html", dashboard_glance(ids) | {
        "glance_query": urlencode({"agents": ",".join(map(str, ids))}), "refresh": GLANCE_REFRESH_SECONDS})


@require_GET
def agent_detail(request: HttpRequest, pk: int) -> HttpResponse:
    get_object_or_404(Agent, pk=pk)
    return render(request, "planning/agent_detail.html", agent_context(pk) | {
        "goal_form": GoalForm(), "upload_form": WorkspaceUploadForm(),
        "upload_max": services.size_shown(settings.WORKSPACE_UPLOAD_MAX_BYTES),
        "a2a_push": bool(settings.A2A_PUSH_BASE_URL), "a2a_push_poll": f"{settings.A2A_PUSH_POLL_SECONDS:g}",
    })


@require_http_methods(["GET", "POST"])
@permission_required("agents.add_agent", raise_exception=True)
def agent_new(request: HttpRequest) -> HttpResponse:
    """The dashboard's New agent: a tool agent with the built-in tools the operator chooses."""
    form = AgentCreateForm(request.POST if request.method == "POST" else None)
    if request.method == "POST" and form.is_valid():
        try:
            agent = services.agent_create(user=operator(request), name=form.cleaned_data["name"],
                                          backstory=form.cleaned_data["backstory"], tools=form.cleaned_data["tools"])
        except services.DecisionError as exc:
            form.add_error(None, str(exc))
        else:
            messages.success(request, f"Created the tool agent {agent.name}. Upload its files, then give it a goal.")
            return redirect(agent)
    return render(request, "planning/agent_new.html",
                  {"form": form, "a2a_form": A2AAgentAddForm(), "agui_form": AguiAgentForm()},
                  status=400 if request.method == "POST" else 200)


@require_POST
@permission_required("agents.add_agent", raise_exception=True)
def agent_a2a_new(request: HttpRequest) -> HttpResponse:
    """Add a remote A2A agent by its agent card's address (read now, through the outbound guard)."""
    a2a_form = A2AAgentAddForm(request.POST)
    if a2a_form.is_valid():
        try:
            agent = a2a_services.agent_a2a_add(user=operator(request), url=a2a_form.cleaned_data["url"],
                                               credential=a2a_form.cleaned_data["credential"])
        except services.DecisionError as exc:
            a2a_form.add_error(None, str(exc))
        else:
            messages.success(request, f"Added the remote A2A agent {agent.name}. Give it a goal: it is sent to the "
                                      "agent as a message.")
            return redirect(agent)
    return render(request, "planning/agent_new.html", {"form": AgentCreateForm(), "a2a_form": a2a_form, "agui_form": AguiAgentForm()}, status=400)


@require_POST
@permission_required("agents.change_agent", raise_exception=True)
def agent_upload_view(request: HttpRequest, pk: int) -> HttpResponse:
    """Upload files: into the tool agent's workspace, the outcome shown on its page after the redirect."""
    agent = get_object_or_404(Agent, pk=pk)
    form = WorkspaceUploadForm(request.POST)
    if not form.is_valid():
        messages.error(request, f"{form_errors(form)} Nothing was changed.")
        return redirect(agent)
    uploads = [services.Upload(name=str(f.name or ""), data=f.read()) for f in request.FILES.getlist("files")]
    try:
        paths = services.workspace_upload(agent=agent, user=operator(request), uploads=uploads,
                                          folder=form.cleaned_data["folder"], replace=form.cleaned_data["replace"])
    except services.DecisionError as exc:
        messages.error(request, str(exc))
        return redirect(agent)
    messages.success(request, f"Uploaded {', '.join(paths)} into {agent.name}'s workspace.")
    return redirect(agent)


@require_GET
def plan_detail(request: HttpRequest, pk: int) -> HttpResponse:
    get_object_or_404(Plan, pk=pk)
    context = plan_context(pk, events_page=request.GET.get("events", 1), calls_page=request.GET.get("calls", 1))
    live_query = urlencode({k: context[f"{k}_page"].number for k in ("events", "calls") if context[f"{k}_page"].number > 1})
    return render(request, "planning/plan_detail.html", context | {"live_query": live_query})


def decision_refused(request: HttpRequest, message: str, *, status: int = 409) -> HttpResponse:
    """A clear error, shown where the operator looks; nothing was changed."""
    if getattr(request, "htmx", False):
        response = render(request, "partials/flash.html", {"flash": [("error", message)]}, status=status)
        return reswap(retarget(response, "#flash"), "innerHTML")
    return HttpResponse(message, status=status, content_type="text/plain; charset=utf-8")


def plan_sections(request: HttpRequest, plan: Plan, note: str) -> HttpResponse:
    """After a decision: the plan page's live sections (swapped by id) and a confirmation."""
    if not getattr(request, "htmx", False):
        messages.success(request, note)
        return redirect(plan)
    context = plan_context(plan.pk) | {"flash": [("success", note)]}
    return render(request, "planning/plan_live.html", context)


def decision_apply(request: HttpRequest, plan: Plan, note: str, decide: Callable[[], object]) -> HttpResponse:
    """Apply one operator decision through its service: the refreshed plan, or a clear refusal."""
    try:
        decide()
    except services.DecisionError as exc:
        return decision_refused(request, str(exc))
    return plan_sections(request, plan, note)


def plan_named(plan: Plan) -> str:
    """How a confirmation names a plan: whose, which goal, which version."""
    return f"{plan.agent.name}'s plan “{plan.goal_text}” (v{plan.version})"


def seen_steps(request: HttpRequest) -> str | None:
    """The fingerprint of the steps the operator saw when approving (planning/engine/shown.py), sent by every
    approve form; None when the client sent none (an older page, a script: the version check still applies)."""
    raw = request.POST.get("seen_steps", "").strip()
    return raw[:64] if raw else None


def approval_note(plan: Plan, mode: str) -> str:
    how = "every step approved" if mode == Plan.ApprovalMode.ALL else "you approve it step by step"
    return f"Approved {plan_named(plan)}: {how}."


AGENT_STATUS_VERBS = {Agent.Status.RUNNING: "Resumed", Agent.Status.PAUSED: "Paused", Agent.Status.STOPPED: "Stopped"}


def operator(request: HttpRequest) -> User:
    """The signed-in operator (login and the decide permission are checked before any view runs)."""
    return cast(User, request.user)


def form_errors(form: Any) -> str:
    """The form's errors in one line, each after its field's label (a field without one: its name, prettified)."""
    return " ".join(f"{form[f].label}: {' '.join(e)}" if f in form.fields else " ".join(e)
                    for f, e in form.errors.items())


@require_POST
@permission_required(DECIDE_PERMISSION, raise_exception=True)
def plan_approve_view(request: HttpRequest, pk: int) -> HttpResponse:
    plan = get_object_or_404(Plan.objects.select_related("agent"), pk=pk)
    form = ApproveplanForm(request.POST)
    if not form.is_valid():
        return decision_refused(request, form_errors(form), status=400)
    return decision_apply(
        request, plan, approval_note(plan, form.cleaned_data["mode"]),
        lambda: services.plan_approve(plan=plan, user=operator(request), mode=form.cleaned_data["mode"],
                                      seen_steps=seen_steps(request)),
    )


@require_POST
@permission_required(DECIDE_PERMISSION, raise_exception=True)
def plan_cancel_view(request: HttpRequest, pk: int) -> HttpResponse:
    plan = get_object_or_404(Plan.objects.select_related("agent"), pk=pk)
    form = ReasonForm(request.POST)
    if not form.is_valid():
        return decision_refused(request, form_errors(form) + " Nothing was changed.", status=400)
    return decision_apply(
        request, plan, f"Cancelled {plan_named(plan)}.",
        lambda: services.plan_cancel(plan=plan, user=operator(request), reason=form.cleaned_data.get("reason", ""),
                                     seen_status=request.POST.get("seen_status") or None),
    )


@require_POST
@permission_required(DECIDE_PERMISSION, raise_exception=True)
def plan_replan_view(request: HttpRequest, pk: int) -> HttpResponse:
    plan = get_object_or_404(Plan.objects.select_related("agent"), pk=pk)
    form = ReplanForm(request.POST)
    if not form.is_valid():
        return decision_refused(request, form_errors(form), status=400)
    return decision_apply(
        request, plan, f"Replan requested for {plan_named(plan)}; the agent makes a new version next cycle.",
        lambda: services.plan_replan_request(plan=plan, user=operator(request), reason=form.cleaned_data["reason"]),
    )


@require_POST
@permission_required(DECIDE_PERMISSION, raise_exception=True)
def step_approve_view(request: HttpRequest, pk: int) -> HttpResponse:
    step = get_object_or_404(PlanStep.objects.select_related("plan", "plan__agent"), pk=pk)
    return decision_apply(
        request, step.plan, f"Approved step {step.key} of {plan_named(step.plan)}.",
        lambda: agui.step_approve_routed(step=step, user=operator(request), seen_steps=seen_steps(request)),
    )


@require_POST
@permission_required(DECIDE_PERMISSION, raise_exception=True)
def step_decline_view(request: HttpRequest, pk: int) -> HttpResponse:
    step = get_object_or_404(PlanStep.objects.select_related("plan", "plan__agent"), pk=pk)
    form = DeclineForm(request.POST)
    if not form.is_valid():
        message = form_errors(form) if form.data.get("feedback", "").strip() else "Feedback is required to decline a step."
        return decision_refused(request, message + " Nothing was changed.", status=400)
    return decision_apply(
        request, step.plan, f"Declined step {step.key} of {plan_named(step.plan)}; the agent replans with your feedback.",
        lambda: agui.step_decline_routed(step=step, user=operator(request), feedback=form.cleaned_data["feedback"]),
    )


@require_POST
@permission_required(DECIDE_PERMISSION, raise_exception=True)
def step_skip_view(request: HttpRequest, pk: int) -> HttpResponse:
    step = get_object_or_404(PlanStep.objects.select_related("plan", "plan__agent"), pk=pk)
    form = ReasonForm(request.POST)
    if not form.is_valid():
        return decision_refused(request, form_errors(form) + " Nothing was changed.", status=400)
    return decision_apply(
        request, step.plan, f"Skipped step {step.key} of {plan_named(step.plan)}.",
        lambda: services.step_skip(step=step, user=operator(request), reason=form.cleaned_data.get("reason", "")),
    )


@require_http_methods(["GET", "POST"])
@permission_required(DECIDE_PERMISSION, raise_exception=True)
def step_edit_view(request: HttpRequest, pk: int) -> HttpResponse:
    step = get_object_or_404(PlanStep.objects.select_related("plan", "plan__agent"), pk=pk)
    if request.method == "POST":
        form = StepEditForm(request.POST, tools=agent_tool_names(step.plan.agent))
        if form.is_valid():
            changes = {k: v for k, v in form.cleaned_data.items() if k != "reason"}
            try:
                services.step_edit(step=step, user=operator(request), changes=changes,
                                   reason=form.cleaned_data["reason"])
            except services.DecisionError as exc:
                form.add_error(None, str(exc))
            else:
                if getattr(request, "htmx", False):
                    return HttpResponseClientRedirect(step.plan.get_absolute_url())
                messages.success(request, f"Step {step.key} edited.")
                return redirect(step.plan)
        status = 400
    else:
        form = StepEditForm(tools=agent_tool_names(step.plan.agent), initial={
            "description": step.description, "action_hint": step.action_hint, "tool": step.tool,
            "tool_input": json.dumps(step.tool_input), "expected_outcome": step.expected_outcome,
            "requires_permission": step.requires_permission,
        })
        status = 200
    return render(request, "planning/step_edit.html", {"step": step, "plan": step.plan, "form": form}, status=status)


@require_POST
@permission_required(DECIDE_PERMISSION, raise_exception=True)
def agent_status_view(request: HttpRequest, pk: int) -> HttpResponse:
    agent = get_object_or_404(Agent, pk=pk)
    form = AgentStatusForm(request.POST)
    if not form.is_valid():
        return decision_refused(request, form_errors(form), status=400)
    try:
        services.agent_set_status(agent=agent, user=operator(request), status=form.cleaned_data["status"])
    except services.DecisionError as exc:
        return decision_refused(request, str(exc))
    note = f"{AGENT_STATUS_VERBS.get(form.cleaned_data['status'], 'Changed')} {agent.name}."
    if getattr(request, "htmx", False):
        return render(request, "partials/flash_oob.html", {"flash": [("success", note)]})
    messages.success(request, note)
    return redirect(agent)


@require_POST
@permission_required(DECIDE_PERMISSION, raise_exception=True)
def agent_goal_view(request: HttpRequest, pk: int) -> HttpResponse:
    agent = get_object_or_404(Agent, pk=pk)
    form = GoalForm(request.POST)
    # A plain form on the agent page: the outcome, good or bad, is shown there after the redirect.
    if not form.is_valid():
        messages.error(request, form_errors(form))
        return redirect(agent)
    if agent.kind == Agent.Kind.AGUI:
        return agui_goal_view(request, agent, form.cleaned_data["description"])
    try:
        goal = services.agent_give_goal(agent=agent, user=operator(request),
                                        description=form.cleaned_data["description"], horizon=form.cleaned_data["horizon"])
    except services.DecisionError as exc:
        messages.error(request, str(exc))
        return redirect(agent)
    messages.success(request, goal_given_note(goal))
    return redirect(agent)


def agui_goal_view(request: HttpRequest, agent: Agent, description: str) -> HttpResponse:
    """A goal for a remote AG-UI agent: its run starts at the agent's next cycle (the runner reads it)."""
    try:
        plan = agui.agui_goal_give(agent=agent, user=operator(request), description=description)
    except services.DecisionError as exc:
        messages.error(request, str(exc))
        return redirect(agent)
    messages.success(request, f"Goal given; {agent.name}'s run starts now and shows here as it streams.")
    return redirect(plan)


@require_http_methods(["POST"])
@permission_required("agents.add_agent", raise_exception=True)
def agui_agent_new(request: HttpRequest) -> HttpResponse:
    """The New agent page's second form: a remote AG-UI agent by its URL (checked by the outbound guard)."""
    form = AguiAgentForm(request.POST)
    if form.is_valid():
        try:
            agent = agui.agui_agent_create(user=operator(request), name=form.cleaned_data["name"],
                                           url=form.cleaned_data["url"])
        except services.DecisionError as exc:
            form.add_error(None, str(exc))
        else:
            messages.success(request, f"Added the AG-UI agent {agent.name}. Give it a goal to start a run.")
            return redirect(agent)
    return render(request, "planning/agent_new.html", {"form": AgentCreateForm(), "a2a_form": A2AAgentAddForm(), "agui_form": form}, status=400)


def goal_given_note(goal: Goal) -> str:
    """What happens to a given goal now: planned next cycle, or queued behind the open plan, with its place."""
    open_plan, place = goal_queue(goal)
    if open_plan is None and place <= 1:
        return "Goal given; the agent plans it next cycle."
    behind = f" behind the open plan “{open_plan.goal_text}” (v{open_plan.version})" if open_plan else ""
    return f"Goal given; it is queued{behind}, number {place} in the agent's queue of goals."


@require_POST
@permission_required(DECIDE_PERMISSION, raise_exception=True)
def plan_accept_done_view(request: HttpRequest, pk: int) -> HttpResponse:
    """Take a "Done, not verified" plan as done: closed as this person's decision, never shown as verified."""
    plan = get_object_or_404(Plan.objects.select_related("agent"), pk=pk)
    form = AcceptDoneForm(request.POST)
    if not form.is_valid():
        return decision_refused(request, f"{form_errors(form)} Nothing was changed.", status=400)
    return decision_apply(
        request, plan, f"Accepted {plan_named(plan)} as done; its outcome stays not verified.",
        lambda: services.plan_accept_done(plan=plan, user=operator(request), note=form.cleaned_data.get("note", "")),
    )


@require_POST
@permission_required(DECIDE_PERMISSION, raise_exception=True)
def plan_clarify_view(request: HttpRequest, pk: int) -> HttpResponse:
    plan = get_object_or_404(Plan.objects.select_related("agent"), pk=pk)
    form = ClarifyForm(request.POST)
    if not form.is_valid():
        if "answer" in form.errors and form.data.get("answer", "").strip():
            return decision_refused(request, f"{form_errors(form)} Nothing was changed.", status=400)
        return decision_refused(request, "Write an answer to the planner's question. Nothing was changed.", status=400)
    remote = plan.agent.kind == Agent.Kind.A2A
    after = ("Answered the agent's question on {}; it is sent to the remote agent on the same task next cycle."
             if remote else "Answered the planner's question on {}; the agent plans again with it next cycle.")
    return decision_apply(
        request, plan, after.format(plan_named(plan)),
        lambda: services.plan_clarify(plan=plan, user=operator(request), answer=form.cleaned_data["answer"]),
    )


@require_POST
@permission_required(DECIDE_PERMISSION, raise_exception=True)
def step_rollback_view(request: HttpRequest, pk: int) -> HttpResponse:
    step = get_object_or_404(PlanStep.objects.select_related("plan", "plan__agent"), pk=pk)
    return decision_apply(
        request, step.plan, f"Rolled back step {step.key} of {plan_named(step.plan)}.",
        lambda: services.step_rollback(step=step, user=operator(request)),
    )


@require_POST
@permission_required(DECIDE_PERMISSION, raise_exception=True)
def step_policy_undo_view(request: HttpRequest, pk: int) -> HttpResponse:
    """Undo a policy's approval of a step that has not started (the same service as the inbox's and the policies
    page's Undo): the step waits for a person again. `event` is the approval the operator saw on the page."""
    step = get_object_or_404(PlanStep.objects.select_related("plan", "plan__agent"), pk=pk)
    seen = request.POST.get("event", "")
    if not (seen.isascii() and seen.isdigit() and len(seen) <= 18) or not step.events.filter(pk=int(seen), kind=PlanEvent.Kind.STEP_APPROVED).exists():
        return decision_refused(request, f"That is not an approval of step {step.key}. Nothing was changed.",
                                status=400)
    return decision_apply(
        request, step.plan, f"Approval undone: step {step.key} of {plan_named(step.plan)} waits for you again.",
        lambda: policy_services.decision_undo(event_id=int(seen), user=operator(request)),
    )
