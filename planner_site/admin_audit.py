"""Admin edits are changes like any other: recorded as a PlanEvent (who, what, the diff) and pushed live."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

from django import forms
from django.contrib import admin
from django.db import models, transaction
from django.forms import BaseInlineFormSet, ModelForm
from django.http import HttpRequest

from planner_site.events import publish_changed_on_commit
from planner_site.formfields import JSONValueField, text_validate

# Every JSON field of the admin refuses what the services refuse (too deep, too big, NUL...) with a message.
VALIDATED_FORMFIELDS: dict[type[models.Field[Any, Any]], dict[str, Any]] = {models.JSONField: {"form_class": JSONValueField}}


class ValidatedFieldsMixin:
    """For a ModelAdmin or an inline: every text field refuses what the operator's forms refuse (NUL, control
    and bidirectional characters) and every JSON field what the services refuse, each with a message."""

    formfield_overrides: ClassVar[Mapping[type[models.Field[Any, Any]], Mapping[str, Any]]] = VALIDATED_FORMFIELDS

    def formfield_for_dbfield(self, db_field: models.Field[Any, Any], request: HttpRequest | None,
                              **kwargs: Any) -> forms.Field | None:
        field: forms.Field | None = super().formfield_for_dbfield(db_field, request, **kwargs)  # type: ignore[misc]
        # A JSONField is a CharField too: its value is checked whole, by JSONValueField.
        if (isinstance(field, forms.CharField) and not isinstance(field, forms.JSONField)
                and text_validate not in field.validators):
            field.validators.append(text_validate)
        return field


class ValidatedAdmin(ValidatedFieldsMixin, admin.ModelAdmin):  # type: ignore[type-arg]
    """A ModelAdmin whose text and JSON fields are checked like the operator's forms."""


def form_diff(form: ModelForm) -> dict[str, list[str]]:
    """Changed fields as [old, new] strings."""
    return {
        name: [str(form.initial.get(name, "")), str(form.cleaned_data.get(name, ""))]
        for name in form.changed_data
    }


def admin_event(*, request: HttpRequest, agent_id: int, plan_id: int | None, what: str, diff: dict[str, Any],
                step_id: int | None = None) -> None:
    from planning.models import Plan, PlanEvent

    if plan_id is None:
        plan_id = (
            Plan.objects.filter(agent_id=agent_id, status__in=Plan.OPEN_STATUSES).order_by("-created_at")
            .values_list("pk", flat=True).first()
        )
    # An agent without an open plan still gets its admin change recorded, as an agent-only event.
    PlanEvent.objects.create(
        plan_id=plan_id, agent_id=agent_id, step_id=step_id, kind=PlanEvent.Kind.ADMIN_EDIT,
        actor=request.user if request.user.is_authenticated else None,
        actor_label=request.user.get_username(), reason=what, detail={"diff": diff},
    )
    publish_changed_on_commit(agent_id=agent_id, plan_id=plan_id, kind="admin_edit")


def plan_lock_first(plan_id: int | None) -> None:
    """Lock the plan before its steps are written, in the one lock order of the services (plan, then steps)."""
    from planning.models import Plan

    if plan_id is not None:
        list(Plan.objects.select_for_update(no_key=True).filter(pk=plan_id).values_list("pk", flat=True))


class AuditedAdmin(ValidatedAdmin):
    """Subclasses say which agent (and plan) an object belongs to."""

    def audit_agent_id(self, obj: Any) -> int:
        raise NotImplementedError

    def audit_plan_id(self, obj: Any) -> int | None:
        return None

    @transaction.atomic
    def save_model(self, request: HttpRequest, obj: Any, form: Any, change: bool) -> None:
        plan_lock_first(self.audit_plan_id(obj))
        super().save_model(request, obj, form, change)
        diff = form_diff(form) if change else {"created": ["", str(obj)]}
        if diff:
            admin_event(request=request, agent_id=self.audit_agent_id(obj), plan_id=self.audit_plan_id(obj),
                        what=f"{obj._meta.verbose_name} '{obj}' {'changed' if change else 'added'} in admin", diff=diff)

    @transaction.atomic
    def save_formset(self, request: HttpRequest, form: Any, formset: BaseInlineFormSet, change: bool) -> None:
        super().save_formset(request, form, formset, change)
        diff: dict[str, Any] = {}
        for inline_form in formset.forms:
            if inline_form.instance.pk and inline_form.changed_data:
                diff[str(inline_form.instance)] = form_diff(inline_form)
        if diff:
            obj = form.instance
            admin_event(request=request, agent_id=self.audit_agent_id(obj), plan_id=self.audit_plan_id(obj),
                        what=f"{formset.model._meta.verbose_name_plural} of '{obj}' changed in admin",  # type: ignore[union-attr]
                        diff=diff)

    @transaction.atomic
    def delete_model(self, request: HttpRequest, obj: Any) -> None:
        agent_id = self.audit_agent_id(obj)
        super().delete_model(request, obj)
        publish_changed_on_commit(agent_id=agent_id, kind="admin_delete")
