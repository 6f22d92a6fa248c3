from __future__ import annotations

from typing import Any

from django import forms
from django.contrib import admin
from django.http import HttpRequest

from planner_site.admin_audit import (
    NOTHING_SAVED,
    AuditedAdmin,
    LoadedValuesForm,
    ValidatedAdmin,
    ValidatedFieldsMixin,
)
from planning.engine.schedule import IllegalTransition, step_transition_check
from planning.models import Plan, PlanEvent, PlanStep
from planning.services import EDITABLE_STEP_FIELDS, PLAN_FINAL, UNSTARTED, step_changes_problems

# Written by the runner as a step runs: shown, never saved back from a form loaded earlier.
STEP_RUNNER_FIELDS = ["actual_cycles", "overrides", "retries", "result", "error", "failure_reason", "elapsed_ms",
                      "precheck", "carried_over"]


class PlanStepAdminForm(LoadedValuesForm):
    """The admin obeys the rules the services obey: the step state machine (a completed step never runs
    again), only steps not yet started change their content, and the whole plan is validated again
    (a path outside the workspace is refused when saved, not when run)."""

    def clean(self) -> dict[str, Any]:
        cleaned = super().clean() or {}
        step: PlanStep = self.instance
        old_status = self.initial.get("status") if step.pk else None
        new_status = cleaned.get("status")
        if old_status and new_status and new_status != old_status:
            try:
                step_transition_check(old_status, new_status)
            except IllegalTransition as exc:
                self.add_error("status", f"{str(exc).capitalize()}. {NOTHING_SAVED}")
        content = [*EDITABLE_STEP_FIELDS, "depends_on"]
        changes = {k: cleaned[k] for k in content if k in cleaned and (not step.pk or k in self.changed_data)}
        if not changes or self.errors:
            return cleaned
        if step.pk and old_status not in UNSTARTED:
            self.add_error(None, f"Step {step.key} is {old_status}; only steps not yet started can be edited. {NOTHING_SAVED}")
            return cleaned
        plan = cleaned.get("plan") or getattr(step, "plan", None)
        if plan is None or plan.pk is None:
            return cleaned  # a plan being created: its steps are checked when they are edited
        probe = PlanStep(**{f.attname: getattr(step, f.attname) for f in PlanStep._meta.get_fields() if f.concrete})
        probe.key = cleaned.get("key", step.key)
        problems, _ = step_changes_problems(step=probe, plan=plan, changes=changes)
        for problem in problems:
            self.add_error(None, f"The plan would not be valid: {problem}. {NOTHING_SAVED}")
        return cleaned


class PlanAdminForm(LoadedValuesForm):
    def clean_status(self) -> str:
        old, new = self.initial.get("status"), self.cleaned_data["status"]
        if self.instance.pk and old in PLAN_FINAL and new != old:
            raise forms.ValidationError(
                f"A {old} plan is final and cannot become {new}; ask for a replan instead. {NOTHING_SAVED}")
        return str(new)


class PlanStepInline(ValidatedFieldsMixin, admin.StackedInline):
    model = PlanStep
    form = PlanStepAdminForm
    extra = 0
    fieldsets = [(None, {"fields": [
        ("key", "position", "status"), "description", ("action_hint", "tool"), "tool_input", "expected_outcome",
        ("estimated_cycles", "actual_cycles"), "depends_on", ("requires_permission", "risk"),
        ("retries", "max_retries"), "result", "error", "failure_reason",
    ]})]
    readonly_fields = STEP_RUNNER_FIELDS


class PlanEventInline(admin.TabularInline):
    model = PlanEvent
    extra = 0
    fields = ["created_at", "kind", "step", "actor_label", "reason"]
    readonly_fields = ["created_at", "kind", "step", "actor_label", "reason"]
    can_delete = False
    show_change_link = True

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


@admin.register(Plan)
class PlanAdmin(AuditedAdmin):
    form = PlanAdminForm
    list_display = ["goal_text", "agent", "version", "status", "approval_mode", "times_replanned", "model", "created_at"]
    list_filter = ["status", "agent", "goal__horizon", "approval_mode"]
    search_fields = ["goal_text", "thinking_summary"]
    list_select_related = ["agent"]
    raw_id_fields = ["goal", "previous"]
    readonly_fields = ["times_replanned", "planning_retry", "retry_at", "retry_hints", "model", "created_at"]
    inlines = [PlanStepInline, PlanEventInline]

    def audit_agent_id(self, obj: Any) -> int:
        return obj.agent_id

    def audit_plan_id(self, obj: Any) -> int | None:
        return obj.pk


@admin.register(PlanStep)
class PlanStepAdmin(AuditedAdmin):
    form = PlanStepAdminForm
    list_display = ["__str__", "key", "status", "tool", "action_hint", "requires_permission", "risk"]
    list_filter = ["status", "risk", "requires_permission", "plan__agent"]
    search_fields = ["description", "key"]
    list_select_related = ["plan"]
    readonly_fields = STEP_RUNNER_FIELDS

    def audit_agent_id(self, obj: Any) -> int:
        return obj.plan.agent_id

    def audit_plan_id(self, obj: Any) -> int | None:
        return obj.plan_id


@admin.register(PlanEvent)
class PlanEventAdmin(ValidatedAdmin):
    """The audit log: read-only."""

    list_display = ["created_at", "plan", "step", "kind", "actor_label", "reason"]
    list_filter = ["kind", "plan__agent"]
    search_fields = ["reason", "actor_label"]
    list_select_related = ["plan", "step"]

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False
