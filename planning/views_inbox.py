"""The approvals inbox: everything that waits for a person, decided in place through the operator services."""

from __future__ import annotations

from collections.abc import Callable

from django.contrib.auth.decorators import permission_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, render
from django.views.decorators.http import require_GET, require_POST

from agents.models import Agent
from planner_site.roles import DECIDE_PERMISSION
from planning import services
from planning.forms import ApproveplanForm, ClarifyForm, DeclineForm, ReasonForm, ReplanForm
from planning.models import Plan, PlanStep
from planning.operator_selectors import inbox_count, inbox_items
from planning.services import StaleVersion, agui, plan_check_seen
from planning.views import approval_note, operator, plan_named, seen_steps


def inbox_context(**extra: object) -> dict[str, object]:
    items = inbox_items()
    return {"items": items, "count": len(items), "urgent": sum(1 for i in items if i.urgent)} | extra


def inbox_announcement(count: int) -> str:
    if count == 0:
        return "Nothing waits for you."
    return f"{count} item{'s' if count != 1 else ''} wait{'s' if count == 1 else ''} for you."


@require_GET
def inbox(request: HttpRequest) -> HttpResponse:
    context = inbox_context()
    if getattr(request, "htmx", False):
        return render(request, "planning/inbox.html#list", context)
    return render(request, "planning/inbox.html", context)


def seen_version(request: HttpRequest) -> int | None:
    """The plan version the operator was looking at when deciding (sent by every inbox and plan form)."""
    raw = request.POST.get("version", "")
    return int(raw) if raw.isascii() and raw.isdigit() and len(raw) <= 9 else None


def inbox_decide(request: HttpRequest, plan: Plan, note: str, decide: Callable[[], object]) -> HttpResponse:
    """Apply a decision; answer with the refreshed inbox, a flash and a polite announcement. A refusal (someone
    else decided first, or the version moved on) is said in the flash, with the current state shown."""
    status, level = 200, "success"
    try:
        plan_check_seen(plan=plan, seen_version=seen_version(request))
        decide()
    except StaleVersion as exc:
        status, level, note = 409, "error", str(exc)
        context = inbox_context(current=exc.current)
    except services.DecisionError as exc:
        status, level, note = 409, "error", str(exc)
        context = inbox_context()
    else:
        context = inbox_context()
    announce = f"{note} {inbox_announcement(int(str(context['count'])))}"
    context |= {"flash": [(level, note)], "announce": announce, "oob": True}
    return render(request, "planning/inbox_decided.html", context, status=status)


@require_POST
@permission_required(DECIDE_PERMISSION, raise_exception=True)
def inbox_step_approve(request: HttpRequest, pk: int) -> HttpResponse:
    step = get_object_or_404(PlanStep.objects.select_related("plan", "plan__agent"), pk=pk)
    return inbox_decide(request, step.plan, f"Approved step {step.key} of {plan_named(step.plan)}.",
                        lambda: agui.step_approve_routed(step=step, user=operator(request),
                                                      seen_steps=seen_steps(request)))


@require_POST
@permission_required(DECIDE_PERMISSION, raise_exception=True)
def inbox_step_decline(request: HttpRequest, pk: int) -> HttpResponse:
    step = get_object_or_404(PlanStep.objects.select_related("plan", "plan__agent"), pk=pk)
    form = DeclineForm(request.POST)
    if not form.is_valid():
        context = inbox_context(flash=[("error", "Feedback is required to decline a step. Nothing was changed.")],
                                announce="Feedback is required to decline a step.", oob=True)
        return render(request, "planning/inbox_decided.html", context, status=400)
    return inbox_decide(
        request, step.plan, f"Declined step {step.key} of {plan_named(step.plan)}; the agent replans with your feedback.",
        lambda: agui.step_decline_routed(step=step, user=operator(request), feedback=form.cleaned_data["feedback"]),
    )


@require_POST
@permission_required(DECIDE_PERMISSION, raise_exception=True)
def inbox_plan_approve(request: HttpRequest, pk: int) -> HttpResponse:
    plan = get_object_or_404(Plan.objects.select_related("agent"), pk=pk)
    form = ApproveplanForm(request.POST)
    if not form.is_valid():
        context = inbox_context(flash=[("error", "Choose Approve all or Step by step. Nothing was changed.")], oob=True)
        return render(request, "planning/inbox_decided.html", context, status=400)
    mode = form.cleaned_data["mode"]
    return inbox_decide(request, plan, approval_note(plan, mode),
                        lambda: services.plan_approve(plan=plan, user=operator(request), mode=mode,
                                                      seen_steps=seen_steps(request)))


@require_POST
@permission_required(DECIDE_PERMISSION, raise_exception=True)
def inbox_plan_cancel(request: HttpRequest, pk: int) -> HttpResponse:
    plan = get_object_or_404(Plan.objects.select_related("agent"), pk=pk)
    form = ReasonForm(request.POST)
    form.is_valid()
    return inbox_decide(
        request, plan, f"Cancelled {plan_named(plan)}.",
        lambda: services.plan_cancel(plan=plan, user=operator(request), reason=form.cleaned_data.get("reason", ""),
                                     seen_status=request.POST.get("seen_status") or None),
    )


@require_POST
@permission_required(DECIDE_PERMISSION, raise_exception=True)
def inbox_plan_decline(request: HttpRequest, pk: int) -> HttpResponse:
    """Send a tool or external agent's plan back with feedback (as the plan page's Decline with feedback): the
    agent makes (a built-in tool agent, next cycle) or submits a new version with it, and the plan leaves the inbox
    meanwhile (it waits for the agent)."""
    plan = get_object_or_404(Plan.objects.select_related("agent"), pk=pk)
    form = ReplanForm(request.POST)
    if not form.is_valid():
        note = "Feedback is required to decline a plan. Nothing was changed."
        context = inbox_context(flash=[("error", note)], announce=note, oob=True)
        return render(request, "planning/inbox_decided.html", context, status=400)
    if plan.agent.kind == Agent.Kind.PERSONA or plan.status != Plan.Status.AWAITING_APPROVAL:
        note = (f"Only a tool or external agent's plan awaiting approval can be declined with feedback; plan v{plan.version} "
                f"of {plan.agent.name} is {plan.get_status_display().lower()}. Nothing was changed.")
        context = inbox_context(flash=[("error", note)], announce=note, oob=True)
        return render(request, "planning/inbox_decided.html", context, status=409)
    return inbox_decide(
        request, plan, f"Declined {plan_named(plan)}; the agent makes a new version with your feedback.",
        lambda: services.plan_replan_request(plan=plan, user=operator(request), reason=form.cleaned_data["reason"],
                                             once=True),
    )


@require_POST
@permission_required(DECIDE_PERMISSION, raise_exception=True)
def inbox_plan_clarify(request: HttpRequest, pk: int) -> HttpResponse:
    """Answer the planner's question in place; the agent plans again with the answer next cycle."""
    plan = get_object_or_404(Plan.objects.select_related("agent"), pk=pk)
    form = ClarifyForm(request.POST)
    if not form.is_valid():
        note = "Write an answer to the planner's question. Nothing was changed."
        context = inbox_context(flash=[("error", note)], announce=note, oob=True)
        return render(request, "planning/inbox_decided.html", context, status=400)
    after = ("it is sent to the remote agent on the same task next cycle" if plan.agent.kind == Agent.Kind.A2A
             else "the agent plans again with it next cycle")
    return inbox_decide(
        request, plan, f"Answer given to {plan.agent.name}; {after}.",
        lambda: services.plan_clarify(plan=plan, user=operator(request), answer=form.cleaned_data["answer"]),
    )


@require_GET
def inbox_count_view(request: HttpRequest) -> HttpResponse:
    """The count alone, for clients without websockets (and the nav's fallback poll)."""
    return HttpResponse(str(inbox_count()), content_type="text/plain; charset=utf-8")
