from __future__ import annotations

from typing import Any

from django.contrib import admin, messages
from django.contrib.auth.admin import UserAdmin
from django.contrib.auth.models import User
from django.db import transaction
from django.db.models import QuerySet
from django.http import HttpRequest

from agents.models import Agent, AgentToken, ApiRequest, Experience, Lesson, LLMCall, Need
from agents.services import token_issue, tokens_revoke
from planner_site.admin_audit import (
    AuditedAdmin,
    LoadedValuesForm,
    ValidatedAdmin,
    ValidatedFieldsMixin,
    form_diff,
)
from planner_site.events import publish_changed_on_commit
from planning.services.audit import admin_rows_save, roles_change_record


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
class ExperienceAdmin(AuditedAdmin):  # an admin edit is recorded like any other
    list_display = ["agent", "cycle", "action", "followed_plan", "outcome", "created_at"]
    list_filter = ["agent", "followed_plan"]
    search_fields = ["action", "outcome"]
    list_select_related = ["agent"]

    def audit_agent_id(self, obj: Any) -> int:
        return int(obj.agent_id)


@admin.register(Lesson)
class LessonAdmin(AuditedAdmin):  # an admin edit is recorded like any other
    list_display = ["agent", "description", "weight", "created_at"]
    list_filter = ["agent"]
    search_fields = ["description"]

    def audit_agent_id(self, obj: Any) -> int:
        return int(obj.agent_id)


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
        token, raw = token_issue(agent=obj.agent, label=obj.label, expires_at=obj.expires_at, user=request.user)
        obj.pk, obj.key_hash, obj.hint, obj.created_at = token.pk, token.key_hash, token.hint, token.created_at
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


def account_roles(account: Any) -> dict[str, Any]:
    """What an account may do: its groups (the roles), its flags and its own permissions."""
    return {"groups": sorted(account.groups.values_list("name", flat=True)), "is_staff": account.is_staff,
            "is_superuser": account.is_superuser, "is_active": account.is_active,
            "permissions": sorted(account.user_permissions.values_list("codename", flat=True))}


class RolesRecordedUserAdmin(UserAdmin):
    """Django's user admin, with every change of an account's role recorded in the audit log with its diff
    (the admin's own log says only which fields changed)."""

    def save_model(self, request: HttpRequest, obj: Any, form: Any, change: bool) -> None:
        request._roles_before = account_roles(User.objects.get(pk=obj.pk)) if change and obj.pk else {}  # type: ignore[attr-defined]
        super().save_model(request, obj, form, change)

    def save_related(self, request: HttpRequest, form: Any, formsets: Any, change: bool) -> None:
        super().save_related(request, form, formsets, change)
        before = getattr(request, "_roles_before", {})
        after = account_roles(form.instance)
        diff = {k: [before.get(k), v] for k, v in after.items() if before.get(k) != v and (before or v)}
        roles_change_record(user=request.user, account=form.instance, diff=diff)

    def delete_model(self, request: HttpRequest, obj: Any) -> None:
        roles_change_record(user=request.user, account=obj,
                            diff={k: [v, None] for k, v in account_roles(obj).items()} | {"account": [obj.get_username(), None]})
        super().delete_model(request, obj)

    def delete_queryset(self, request: HttpRequest, queryset: Any) -> None:
        with transaction.atomic():
            for obj in queryset:
                self.delete_model(request, obj)


admin.site.unregister(User)
admin.site.register(User, RolesRecordedUserAdmin)
