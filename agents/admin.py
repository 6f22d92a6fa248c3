from __future__ import annotations

from typing import Any

from django.contrib import admin, messages
from django.db import transaction
from django.db.models import QuerySet
from django.http import HttpRequest

from agents.models import Agent, AgentToken, ApiRequest, Experience, Lesson, LLMCall, Need
from agents.services import admin_event_record, admin_rows_save, tokens_revoke
from planner_site.admin_audit import (
    AuditedAdmin,
    LoadedValuesForm,
    ValidatedAdmin,
    ValidatedFieldsMixin,
    form_diff,
)
from planner_site.events import publish_changed_on_commit


class NeedInline(ValidatedFieldsMixin, admin.TabularInline):
    model = Need
    extra = 0
    form = LoadedValuesForm  # a need the runner moved on since the form loaded is not put back


@admin.register(Agent)
class AgentAdmin(AuditedAdmin):
    list_display = ["name", "kind", "status", "cycle_count", "waiting_reason"]
    list_filter = ["kind", "status"]
    search_fields = ["name", "backstory"]
    # Written by the runner every cycle: shown, never saved back from a form loaded earlier.
    readonly_fields = ["cycle_count", "waiting_reason", "emotions", "next_cycle_at", "plan_retry_at",
                       "created_at"]
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
class ExperienceAdmin(ValidatedAdmin):
    list_display = ["agent", "cycle", "action", "followed_plan", "outcome", "created_at"]
    list_filter = ["agent", "followed_plan"]
    search_fields = ["action", "outcome"]
    list_select_related = ["agent"]


@admin.register(Lesson)
class LessonAdmin(ValidatedAdmin):
    list_display = ["agent", "description", "weight", "created_at"]
    list_filter = ["agent"]
    search_fields = ["description"]


@admin.register(LLMCall)
class LLMCallAdmin(ValidatedAdmin):
    list_display = ["created_at", "purpose", "model", "agent", "plan", "tokens_in", "tokens_out", "latency_ms", "error"]
    list_filter = ["purpose", "model", "agent"]
    search_fields = ["response", "error"]
    list_select_related = ["agent", "plan"]

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False  # the call log is a record, not a draft

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False


@admin.register(AgentToken)
class AgentTokenAdmin(ValidatedAdmin):
    """API tokens of external agents: issued here (the token is shown once), revoked here, never shown again."""

    list_display = ["agent", "hint", "label", "created_at", "last_used_at", "expires_at", "revoked_at"]
    list_filter = ["agent"]
    list_select_related = ["agent"]
    search_fields = ["agent__name", "label", "hint"]
    readonly_fields = ["hint", "created_at", "last_used_at"]
    actions = ["revoke"]

    def get_fields(self, request: HttpRequest, obj: Any = None) -> Any:
        return (["agent", "label", "expires_at"] if obj is None
                else ["agent", "label", "hint", "created_at", "last_used_at", "expires_at", "revoked_at"])

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> list[str]:
        return [] if obj is None else ["agent", "hint", "created_at", "last_used_at"]

    def formfield_for_foreignkey(self, db_field: Any, request: HttpRequest, **kwargs: Any) -> Any:
        if db_field.name == "agent":
            kwargs["queryset"] = Agent.objects.filter(kind=Agent.Kind.EXTERNAL)
        return super().formfield_for_foreignkey(db_field, request, **kwargs)

    @transaction.atomic
    def save_model(self, request: HttpRequest, obj: Any, form: Any, change: bool) -> None:
        if change:  # recorded like any admin edit; open API sockets and long polls re-check the token now
            admin_rows_save(user=request.user, agent_id=obj.agent_id, plan_id=None, what=f"API token {obj.hint}… changed in admin",
                            rows=[(obj, form.changed_data)], diff=form_diff(form))
            if {"revoked_at", "expires_at"} & set(form.changed_data):
                publish_changed_on_commit(agent_id=obj.agent_id, kind="token_revoked")
            return
        token, raw = AgentToken.issue(agent=obj.agent, label=obj.label, expires_at=obj.expires_at)
        obj.pk, obj.key_hash, obj.hint, obj.created_at = token.pk, token.key_hash, token.hint, token.created_at
        admin_event_record(user=request.user, agent_id=obj.agent_id, plan_id=None, what=f"API token {token.hint}… issued in admin",
                           diff={"token": ["", f"{token.hint}… ({token.label or 'no label'})"]})
        messages.warning(request, f"The new token for {obj.agent} is {raw} — copy it now, it is not shown again.")

    @admin.action(description="Revoke the selected tokens")
    def revoke(self, request: HttpRequest, queryset: QuerySet[AgentToken]) -> None:
        count = tokens_revoke(tokens=queryset, user=request.user)
        messages.success(request, f"{count} token(s) revoked; they stop working at once.")


@admin.register(ApiRequest)
class ApiRequestAdmin(ValidatedAdmin):
    list_display = ["created_at", "agent", "request_id", "operation"]
    list_filter = ["agent"]
    list_select_related = ["agent"]
    search_fields = ["request_id", "operation"]

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False  # the record of what was applied once

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False
