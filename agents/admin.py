from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.http import HttpRequest

from agents.models import Agent, Experience, Lesson, LLMCall, Need
from planner_site.admin_audit import AuditedAdmin


class NeedInline(admin.TabularInline):
    model = Need
    extra = 0


@admin.register(Agent)
class AgentAdmin(AuditedAdmin):
    list_display = ["name", "kind", "status", "cycle_count", "waiting_reason", "lease_owner"]
    list_filter = ["kind", "status"]
    search_fields = ["name", "backstory"]
    readonly_fields = ["cycle_count", "lease_owner", "lease_expires_at", "created_at"]
    inlines = [NeedInline]

    def audit_agent_id(self, obj: Any) -> int:
        return obj.pk


@admin.register(Need)
class NeedAdmin(AuditedAdmin):
    list_display = ["agent", "name", "satisfaction", "decay_per_hour"]
    list_filter = ["agent", "name"]

    def audit_agent_id(self, obj: Any) -> int:
        return obj.agent_id


@admin.register(Experience)
class ExperienceAdmin(admin.ModelAdmin):
    list_display = ["agent", "cycle", "action", "followed_plan", "outcome", "created_at"]
    list_filter = ["agent", "followed_plan"]
    search_fields = ["action", "outcome"]
    list_select_related = ["agent"]


@admin.register(Lesson)
class LessonAdmin(admin.ModelAdmin):
    list_display = ["agent", "description", "weight", "created_at"]
    list_filter = ["agent"]
    search_fields = ["description"]


@admin.register(LLMCall)
class LLMCallAdmin(admin.ModelAdmin):
    list_display = ["created_at", "purpose", "model", "agent", "plan", "tokens_in", "tokens_out", "latency_ms", "error"]
    list_filter = ["purpose", "model", "agent"]
    search_fields = ["response", "error"]
    list_select_related = ["agent", "plan"]

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False  # the call log is a record, not a draft

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False
