from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.http import HttpRequest

from planner_site.admin_audit import AuditedAdmin
from planning.models import Plan, PlanEvent, PlanStep


class PlanStepInline(admin.StackedInline):
    model = PlanStep
    extra = 0
    fieldsets = [(None, {"fields": [
        ("key", "position", "status"), "description", ("action_hint", "tool"), "tool_input", "expected_outcome",
        ("estimated_cycles", "actual_cycles"), "depends_on", ("requires_permission", "risk"),
        ("retries", "max_retries"), "result", "error", "failure_reason",
    ]})]


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
    list_display = ["goal_text", "agent", "version", "status", "approval_mode", "times_replanned", "model", "created_at"]
    list_filter = ["status", "agent", "goal__horizon", "approval_mode"]
    search_fields = ["goal_text", "thinking_summary"]
    list_select_related = ["agent"]
    raw_id_fields = ["goal", "previous"]
    inlines = [PlanStepInline, PlanEventInline]

    def audit_agent_id(self, obj: Any) -> int:
        return obj.agent_id

    def audit_plan_id(self, obj: Any) -> int | None:
        return obj.pk


@admin.register(PlanStep)
class PlanStepAdmin(AuditedAdmin):
    list_display = ["__str__", "key", "status", "tool", "action_hint", "requires_permission", "risk"]
    list_filter = ["status", "risk", "requires_permission", "plan__agent"]
    search_fields = ["description", "key"]
    list_select_related = ["plan"]

    def audit_agent_id(self, obj: Any) -> int:
        return obj.plan.agent_id

    def audit_plan_id(self, obj: Any) -> int | None:
        return obj.plan_id


@admin.register(PlanEvent)
class PlanEventAdmin(admin.ModelAdmin):
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
