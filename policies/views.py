"""The policies page: policies and their rules, budgets, the latest automatic decisions (undo) and the dry run.
Everyone signed in may read it; editing needs the policies' change permission (operators), undoing a decision
the decide permission, both checked on the server."""

from __future__ import annotations

from django.contrib import messages
from django.contrib.auth.decorators import permission_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.http import require_GET, require_POST
from django_htmx.http import HttpResponseClientRedirect

from planner_site.roles import DECIDE_PERMISSION, user_can_decide
from planning.services import DecisionError
from planning.views import form_errors, operator
from policies import selectors, services
from policies.forms import BudgetForm, PolicyForm, RuleForm
from policies.models import Budget, Policy, Rule

EDIT_PERMISSION = "policies.change_policy"
BUDGET_PERMISSION = "policies.change_budget"


def can_edit(request: HttpRequest) -> bool:
    return request.user.is_active and request.user.has_perm(EDIT_PERMISSION)


@require_GET
def policies(request: HttpRequest) -> HttpResponse:
    from django.conf import settings

    return render(request, "policies/index.html", {
        "policies": selectors.policies_list(), "budgets": selectors.budgets_list(),
        "decisions": selectors.decisions_recent(), "changes": selectors.changes_recent(),
        "policy_form": PolicyForm(), "budget_form": BudgetForm(), "can_edit": can_edit(request),
        "can_budget": request.user.has_perm(BUDGET_PERMISSION), "can_undo": user_can_decide(request.user),
        "priced": bool(settings.LLM_PRICES),
    })


@require_GET
def policy_detail(request: HttpRequest, pk: int) -> HttpResponse:
    policy = get_object_or_404(Policy, pk=pk)
    rules = selectors.policy_rules(policy)
    scopes = selectors.rule_tool_scopes(rules)
    return render(request, "policies/policy.html", {
        "policy": policy, "rules": [(rule, services.rule_summary(rule), RuleForm(instance=rule, prefix=f"rule{rule.pk}"),
                                     scopes[rule.pk]) for rule in rules],
        "policy_form": PolicyForm(initial={"name": policy.name, "description": policy.description,
                                           "position": policy.position}),
        "rule_form": RuleForm(prefix="new"), "can_edit": can_edit(request),
    })


@require_GET
def policy_dry_run(request: HttpRequest, pk: int) -> HttpResponse:
    policy = get_object_or_404(Policy, pk=pk)
    rows = selectors.dry_run(policy)
    rules = selectors.policy_rules(policy)
    scopes = selectors.rule_tool_scopes(rules)
    return render(request, "policies/dry_run.html", {
        "policy": policy, "rows": rows, "rule_scopes": [(rule, scopes[rule.pk]) for rule in rules], "summary": selectors.dry_run_summary(rows),
        "limit": selectors.DRY_RUN_DECISIONS, "can_edit": can_edit(request)})


def refused(request: HttpRequest, note: str, to: str, *args: object) -> HttpResponse:
    messages.error(request, note)
    return redirect(to, *args)


@require_POST
@permission_required(EDIT_PERMISSION, raise_exception=True)
def policy_create(request: HttpRequest) -> HttpResponse:
    form = PolicyForm(request.POST)
    if not form.is_valid():
        return refused(request, form_errors(form) + " Nothing was changed.", "policies")
    try:
        policy = services.policy_save(user=operator(request), policy=None, **form.cleaned_data)
    except services.PolicyError as exc:
        return refused(request, str(exc), "policies")
    messages.success(request, f"Policy '{policy.name}' created. It is off: add rules, try a dry run, then switch it on.")
    return redirect("policy-detail", policy.pk)


@require_POST
@permission_required(EDIT_PERMISSION, raise_exception=True)
def policy_edit(request: HttpRequest, pk: int) -> HttpResponse:
    policy = get_object_or_404(Policy, pk=pk)
    form = PolicyForm(request.POST)
    if not form.is_valid():
        return refused(request, form_errors(form) + " Nothing was changed.", "policy-detail", pk)
    try:
        services.policy_save(user=operator(request), policy=policy, **form.cleaned_data)
    except services.PolicyError as exc:
        return refused(request, str(exc), "policy-detail", pk)
    messages.success(request, "Policy saved.")
    return redirect("policy-detail", pk)


@require_POST
@permission_required(EDIT_PERMISSION, raise_exception=True)
def policy_switch(request: HttpRequest, pk: int) -> HttpResponse:
    policy = get_object_or_404(Policy, pk=pk)
    enabled = request.POST.get("enabled") == "on"
    try:
        services.policy_switch(user=operator(request), policy=policy, enabled=enabled)
    except services.PolicyError as exc:
        return refused(request, str(exc), "policy-detail", pk)
    messages.success(request, f"Policy '{policy.name}' is {'on: it decides from now on' if enabled else 'off'}.")
    return redirect("policy-detail", pk)


@require_POST
@permission_required(EDIT_PERMISSION, raise_exception=True)
def policy_delete(request: HttpRequest, pk: int) -> HttpResponse:
    policy = get_object_or_404(Policy, pk=pk)
    services.policy_delete(user=operator(request), policy=policy)
    messages.success(request, f"Policy '{policy.name}' deleted.")
    return redirect("policies")


@require_POST
@permission_required(EDIT_PERMISSION, raise_exception=True)
def rule_add(request: HttpRequest, pk: int) -> HttpResponse:
    policy = get_object_or_404(Policy, pk=pk)
    form = RuleForm(request.POST, prefix="new")
    if not form.is_valid():
        return refused(request, form_errors(form) + " Nothing was changed.", "policy-detail", pk)
    try:
        rule = services.rule_save(user=operator(request), policy=policy, rule=None, values=form.values())
    except services.PolicyError as exc:
        return refused(request, str(exc), "policy-detail", pk)
    messages.success(request, f"Rule {rule.position} added.")
    return redirect("policy-detail", pk)


@require_POST
@permission_required(EDIT_PERMISSION, raise_exception=True)
def rule_edit(request: HttpRequest, pk: int, rule_pk: int) -> HttpResponse:
    rule = get_object_or_404(Rule.objects.select_related("policy"), pk=rule_pk, policy_id=pk)
    form = RuleForm(request.POST, instance=Rule.objects.get(pk=rule.pk), prefix=f"rule{rule.pk}")
    if not form.is_valid():
        return refused(request, form_errors(form) + " Nothing was changed.", "policy-detail", pk)
    try:
        saved = services.rule_save(user=operator(request), policy=rule.policy, rule=rule, values=form.values())
    except services.PolicyError as exc:
        return refused(request, str(exc), "policy-detail", pk)
    messages.success(request, f"Rule {saved.position} saved.")
    return redirect("policy-detail", pk)


@require_POST
@permission_required(EDIT_PERMISSION, raise_exception=True)
def rule_delete(request: HttpRequest, pk: int, rule_pk: int) -> HttpResponse:
    rule = get_object_or_404(Rule, pk=rule_pk, policy_id=pk)
    services.rule_delete(user=operator(request), rule=rule)
    messages.success(request, f"Rule {rule.position} removed.")
    return redirect("policy-detail", pk)


@require_POST
@permission_required(BUDGET_PERMISSION, raise_exception=True)
def budget_set(request: HttpRequest) -> HttpResponse:
    form = BudgetForm(request.POST)
    if not form.is_valid():
        return refused(request, form_errors(form) + " Nothing was changed.", "policies")
    try:
        budget = services.budget_save(user=operator(request), **form.cleaned_data)
    except services.PolicyError as exc:
        return refused(request, str(exc), "policies")
    messages.success(request, f"Budget of {budget.agent.name if budget.agent else 'every agent'} saved.")
    return redirect("policies")


@require_POST
@permission_required(BUDGET_PERMISSION, raise_exception=True)
def budget_remove(request: HttpRequest, pk: int) -> HttpResponse:
    budget = get_object_or_404(Budget, pk=pk)
    services.budget_delete(user=operator(request), budget=budget)
    messages.success(request, "Budget removed.")
    return redirect("policies")


@require_POST
@permission_required(DECIDE_PERMISSION, raise_exception=True)
def decision_undo(request: HttpRequest, event_pk: int) -> HttpResponse:
    back = request.POST.get("next") or ""
    to = "inbox" if back == "inbox" else "policies"
    try:
        event = services.decision_undo(event_id=event_pk, user=operator(request))
    except DecisionError as exc:
        response = refused(request, str(exc), to)
    else:
        messages.success(request, f"Approval undone: step {event.step.key if event.step else ''} waits for you again.")
        response = redirect(to)
    if getattr(request, "htmx", False):  # the live list's form, sent by the page: the browser goes there itself
        return HttpResponseClientRedirect(response["Location"])
    return response
