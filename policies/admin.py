"""Policies, their rules and budgets in the admin: checked like the policies page (a rule that contradicts
itself is refused with the reason), and every change recorded as a PolicyChange."""

from __future__ import annotations

from typing import Any

from django import forms
from django.contrib import admin
from django.db import transaction
from django.forms import BaseInlineFormSet
from django.http import HttpRequest

from planner_site.admin_audit import ValidatedAdmin, ValidatedFieldsMixin, form_diff
from policies.engine import rule_problems
from policies.models import Budget, Policy, PolicyChange, Rule
from policies.services import change_record, policies_forget


class RuleAdminForm(forms.ModelForm):
    class Meta:
        model = Rule
        fields = ["position", "applies_to", "agent", "tools", "risk", "requires_permission", "max_estimated_cycles",
                  "active_from", "active_until", "action", "reason", "approve_risky", "approve_permission"]

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        probe = Rule(**{k: v for k, v in data.items() if k not in ("policy", "agent", "id", "DELETE")})
        for problem in rule_problems(probe):
            self.add_error(None, problem)
        return data


class RuleInline(ValidatedFieldsMixin, admin.TabularInline):  # type: ignore[type-arg]
    model = Rule
    form = RuleAdminForm
    extra = 0
    ordering = ["position"]


@admin.register(Policy)
class PolicyAdmin(ValidatedAdmin):
    list_display = ["name", "position", "enabled", "updated_at"]
    list_filter = ["enabled"]
    search_fields = ["name"]
    inlines = [RuleInline]

    @transaction.atomic
    def save_model(self, request: HttpRequest, obj: Any, form: Any, change: bool) -> None:
        super().save_model(request, obj, form, change)
        if not change:
            change_record(user=request.user, policy=obj, what=f"policy '{obj.name}' added in admin"  # type: ignore[arg-type]
                          + (" (on)" if obj.enabled else " (off)"))
        elif form.changed_data:
            change_record(user=request.user, policy=obj, what=f"policy '{obj.name}' changed in admin",  # type: ignore[arg-type]
                          diff=form_diff(form))
        policies_forget()

    @transaction.atomic
    def save_formset(self, request: HttpRequest, form: Any, formset: BaseInlineFormSet, change: bool) -> None:
        super().save_formset(request, form, formset, change)
        policy = form.instance
        for rule in formset.new_objects:
            change_record(user=request.user, policy=policy, what=f"rule {rule.position} added to '{policy.name}' in admin")  # type: ignore[arg-type]
        for rule in formset.deleted_objects:
            change_record(user=request.user, policy=policy, what=f"rule {rule.position} removed from '{policy.name}' in admin")  # type: ignore[arg-type]
        for f in formset.forms:
            if f.instance.pk and f.changed_data and f not in formset.deleted_forms and f.instance not in formset.new_objects:
                change_record(user=request.user, policy=policy,  # type: ignore[arg-type]
                              what=f"rule {f.instance.position} of '{policy.name}' changed in admin", diff=form_diff(f))
        policies_forget()

    @transaction.atomic
    def delete_model(self, request: HttpRequest, obj: Any) -> None:
        change_record(user=request.user, policy=None, what=f"policy '{obj.name}' deleted in admin")  # type: ignore[arg-type]
        super().delete_model(request, obj)
        policies_forget()


@admin.register(Budget)
class BudgetAdmin(ValidatedAdmin):
    list_display = ["__str__", "daily_limit", "plan_limit", "updated_at"]

    @transaction.atomic
    def save_model(self, request: HttpRequest, obj: Any, form: Any, change: bool) -> None:
        super().save_model(request, obj, form, change)
        if not change or form.changed_data:
            change_record(user=request.user, policy=None,  # type: ignore[arg-type]
                          what=f"{obj} {'changed' if change else 'set'} in admin", diff=form_diff(form))
        policies_forget()

    @transaction.atomic
    def delete_model(self, request: HttpRequest, obj: Any) -> None:
        change_record(user=request.user, policy=None, what=f"{obj} removed in admin")  # type: ignore[arg-type]
        super().delete_model(request, obj)
        policies_forget()


@admin.register(PolicyChange)
class PolicyChangeAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
    list_display = ["created_at", "what", "actor_label"]
    readonly_fields = ["policy", "actor", "actor_label", "what", "diff", "created_at"]

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False
