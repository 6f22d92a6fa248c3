"""The admin: every operator's channels and subscriptions, and every notification with its deliveries and each
attempt's answer (read-only: they are a record of what was sent)."""

from __future__ import annotations

from typing import Any, cast

from django import forms
from django.contrib import admin
from django.contrib.auth.models import User
from django.http import HttpRequest

from notifications.models import (
    Channel,
    Delivery,
    DeliveryAttempt,
    Notification,
    SettingsChange,
    SlackAccount,
    SlackMessage,
    Subscription,
)
from planner_site.admin_audit import ValidatedAdmin


class ReadOnlyInline(admin.TabularInline):  # type: ignore[type-arg]
    extra = 0
    can_delete = False

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


class DeliveryAttemptInline(ReadOnlyInline):
    model = DeliveryAttempt
    readonly_fields = ("number", "created_at", "ok", "status_code", "response_excerpt", "error", "duration_ms",
                       "runner")
    fields = readonly_fields


class DeliveryInline(ReadOnlyInline):
    model = Delivery
    readonly_fields = ("channel", "status", "attempts", "next_attempt_at", "delivered_at", "last_error")
    fields = readonly_fields
    show_change_link = True


class SettingsRecordedAdmin(ValidatedAdmin):
    """An administrator's change of someone's settings is recorded like the owner's own."""

    def save_model(self, request: HttpRequest, obj: Any, form: Any, change: bool) -> None:
        super().save_model(request, obj, form, change)
        admin_user = cast(User, request.user)  # the admin site requires a signed-in staff user
        SettingsChange.objects.create(user=admin_user, user_label=admin_user.get_username(),
                                      action=f"admin_{obj._meta.model_name}_{'changed' if change else 'added'}",
                                      detail={"id": obj.pk, "owner": obj.user_id,
                                              "fields": [f for f in form.changed_data
                                                         if f not in ("secret", "bot_token", "signing_secret")]})

    def delete_model(self, request: HttpRequest, obj: Any) -> None:
        admin_user = cast(User, request.user)
        SettingsChange.objects.create(user=admin_user, user_label=admin_user.get_username(),
                                      action=f"admin_{obj._meta.model_name}_removed",
                                      detail={"id": obj.pk, "owner": obj.user_id})
        super().delete_model(request, obj)


class ChannelAdminForm(forms.ModelForm):  # type: ignore[type-arg]
    """A Slack app's bot token and signing secret are typed, never shown back: left empty, they stay as they are."""

    bot_token = forms.CharField(required=False, max_length=255, widget=forms.PasswordInput(render_value=False),
                                help_text="A Slack app's bot token (xoxb-…). Kept, never shown; empty: unchanged.")
    signing_secret = forms.CharField(required=False, max_length=128, widget=forms.PasswordInput(render_value=False),
                                     help_text="A Slack app's signing secret. Kept, never shown; empty: unchanged.")

    class Meta:
        model = Channel
        fields = ["user", "kind", "target", "secret", "bot_token", "signing_secret", "active"]

    def clean_bot_token(self) -> str:
        return self.cleaned_data["bot_token"] or (self.instance.bot_token if self.instance.pk else "")

    def clean_signing_secret(self) -> str:
        return self.cleaned_data["signing_secret"] or (self.instance.signing_secret if self.instance.pk else "")


@admin.register(Channel)
class ChannelAdmin(SettingsRecordedAdmin):
    form = ChannelAdminForm
    list_display = ["user", "kind", "target", "active", "updated_at"]
    list_filter = ["kind", "active"]
    search_fields = ["user__username", "target"]
    list_select_related = ["user"]


@admin.register(Subscription)
class SubscriptionAdmin(SettingsRecordedAdmin):
    list_display = ["user", "kinds", "min_risk", "active", "updated_at"]
    list_filter = ["min_risk", "active"]
    search_fields = ["user__username"]
    list_select_related = ["user"]
    filter_horizontal = ["agents"]


class RecordAdmin(ValidatedAdmin):
    """What was sent: shown, never edited."""

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


@admin.register(Notification)
class NotificationAdmin(RecordAdmin):
    list_display = ["created_at", "user", "kind", "title"]
    list_filter = ["kind"]
    search_fields = ["title", "key", "user__username"]
    list_select_related = ["user"]
    inlines = [DeliveryInline]


@admin.register(Delivery)
class DeliveryAdmin(RecordAdmin):
    list_display = ["created_at", "notification", "channel", "status", "attempts", "delivered_at"]
    list_filter = ["status", "channel__kind"]
    list_select_related = ["notification", "channel"]
    inlines = [DeliveryAttemptInline]


@admin.register(SettingsChange)
class SettingsChangeAdmin(RecordAdmin):
    list_display = ["created_at", "user_label", "action", "detail"]
    list_filter = ["action"]
    search_fields = ["user_label"]


@admin.register(SlackAccount)
class SlackAccountAdmin(SettingsRecordedAdmin):
    """Which Slack user decides as which account (made by the user with a one-time code; an administrator may
    remove one, or connect one for a user)."""

    list_display = ["user", "team_id", "slack_user_id", "created_at"]
    search_fields = ["user__username", "slack_user_id"]
    list_select_related = ["user"]


@admin.register(SlackMessage)
class SlackMessageAdmin(RecordAdmin):
    list_display = ["created_at", "channel", "kind", "plan", "step", "outcome", "escalated", "refresh_due"]
    list_filter = ["kind", "refresh_due"]
    list_select_related = ["channel", "plan", "step"]
