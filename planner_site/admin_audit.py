"""Admin edits are changes like any other: written by a service (planning/services/audit.py `admin_rows_save`), recorded
as a PlanEvent (who, what, the diff) and pushed live.

No lost updates: every admin form remembers the values it loaded (a hidden initial value per field), so a save
writes only the fields the operator really changed, and refuses, with the current value, a field that someone
else (the runner, another operator) changed since the form loaded. Fields only the runner writes (needs'
counters, waiting reason, cycle times, goal progress and confidence...) are read-only in the admin."""

from __future__ import annotations

from collections.abc import Mapping
from functools import cached_property
from typing import Any, ClassVar

from django import forms
from django.contrib import admin
from django.core.exceptions import ValidationError
from django.db import models, transaction
from django.forms import BaseInlineFormSet, ModelForm
from django.http import HttpRequest

from planner_site.formfields import JSONValueField, text_validate

# Every JSON field of the admin refuses what the services refuse (too deep, too big, NUL...) with a message.
VALIDATED_FORMFIELDS: dict[type[models.Field[Any, Any]], dict[str, Any]] = {models.JSONField: {"form_class": JSONValueField}}

NOTHING_SAVED = "Nothing was saved."


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

    def delete_queryset(self, request: HttpRequest, queryset: Any) -> None:
        """The "delete selected" action: an admin that records its deletes (its own `delete_model`) records each
        row's here too, in one transaction; the others delete in one statement, as Django does."""
        if type(self).delete_model is admin.ModelAdmin.delete_model:
            super().delete_queryset(request, queryset)
            return
        with transaction.atomic():
            for obj in queryset:
                self.delete_model(request, obj)


def form_diff(form: ModelForm) -> dict[str, list[str]]:
    """Changed fields as [old, new] strings."""
    return {
        name: [str(form.initial.get(name, "")), str(form.cleaned_data.get(name, ""))]
        for name in form.changed_data
    }


class LoadedValuesForm(forms.ModelForm):
    """An admin form that knows what it loaded. `changed_data` is what the operator changed since the form was
    loaded (not what differs from the row now, which the runner may have moved on: that is never written back),
    and a field the operator changed that someone else changed meanwhile is refused with its current value.

    A post without the loaded values (a script) is compared with the row as it is now, as Django does."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        for field in self.fields.values():
            field.show_hidden_initial = True  # renders the loaded value beside the field

    def loaded_value(self, name: str) -> tuple[bool, Any]:
        """(True, the raw value the form loaded) or (False, None) when the post did not carry it."""
        field, bound = self.fields[name], self[name]
        hidden = field.hidden_widget()
        if not field.show_hidden_initial or hidden.value_omitted_from_data(self.data, self.files, bound.html_initial_name):
            return False, None
        return True, hidden.value_from_datadict(self.data, self.files, bound.html_initial_name)

    @cached_property
    def changed_data(self) -> list[str]:
        changed = []
        for name, field in self.fields.items():
            bound = self[name]
            posted, raw = self.loaded_value(name)
            if not posted:
                if field.has_changed(bound.initial, bound.data):
                    changed.append(name)
                continue
            try:
                loaded = field.to_python(raw)
            except ValidationError:
                changed.append(name)
                continue
            if field.has_changed(loaded, bound.data):
                changed.append(name)
        return changed

    def clean(self) -> dict[str, Any]:
        cleaned = super().clean() or {}
        if self.instance.pk is not None and self.changed_data:
            self.moved_on_refuse()
        return cleaned

    def moved_on_refuse(self) -> None:
        """Lock the row (its plan first) for the rest of the admin's transaction and refuse each changed field
        that no longer holds the value the form loaded, unless it already holds the operator's new value."""
        plan_lock_first(getattr(self.instance, "plan_id", None))
        model = type(self.instance)
        row = model._default_manager.select_for_update(no_key=True).filter(pk=self.instance.pk).first()
        if row is None:
            self.add_error(None, f"This {model._meta.verbose_name} was deleted since you opened this form. {NOTHING_SAVED}")
            return
        now = type(self)(instance=row)
        for name in self.changed_data:
            posted, raw = self.loaded_value(name)
            if not posted or name not in now.fields:
                continue
            field, current = self.fields[name], now[name].initial
            if field.has_changed(current, raw) and field.has_changed(current, self[name].data):
                label = str(field.label or name)
                self.add_error(None, f"{label} was changed by someone else since you opened this form (it is now "
                                     f"{now[name].value()!s:.200}). Reload the page to see the current values. "
                                     f"{NOTHING_SAVED}")


def plan_lock_first(plan_id: int | None) -> None:
    """Lock the plan before its steps are written, in the one lock order of the services (plan, then steps)."""
    from planning.models import Plan

    if plan_id is not None:
        list(Plan.objects.select_for_update(no_key=True).filter(pk=plan_id).values_list("pk", flat=True))


class AuditedAdmin(ValidatedAdmin):
    """Subclasses say which agent (and plan) an object belongs to."""

    form = LoadedValuesForm

    def audit_agent_id(self, obj: Any) -> int:
        raise NotImplementedError

    def audit_plan_id(self, obj: Any) -> int | None:
        return None

    @transaction.atomic
    def save_model(self, request: HttpRequest, obj: Any, form: Any, change: bool) -> None:
        from planning.services.audit import admin_row_create, admin_rows_save

        name = obj._meta.verbose_name
        if not change:
            admin_row_create(user=request.user, obj=obj, what=f"{name} '{obj}' added in admin",
                             audit=lambda row: (self.audit_agent_id(row), self.audit_plan_id(row)))
            return
        admin_rows_save(user=request.user, agent_id=self.audit_agent_id(obj), plan_id=self.audit_plan_id(obj),
                        what=f"{name} '{obj}' changed in admin", rows=[(obj, form.changed_data)], diff=form_diff(form))

    @transaction.atomic
    def save_formset(self, request: HttpRequest, form: Any, formset: BaseInlineFormSet, change: bool) -> None:
        from planning.services.audit import admin_rows_delete, admin_rows_save

        formset.save(commit=False)  # builds the rows; only the changed fields of changed rows are written below
        parent = form.instance
        if formset.deleted_objects:
            admin_rows_delete(user=request.user, rows=formset.deleted_objects,
                              audit=lambda row: (self.audit_agent_id(parent), self.audit_plan_id(parent)))
        for created in formset.new_objects:
            created.save()
        changed = [(row, fields) for row, fields in formset.changed_objects if fields]
        if changed:
            obj = form.instance
            admin_rows_save(user=request.user, agent_id=self.audit_agent_id(obj), plan_id=self.audit_plan_id(obj),
                            what=f"{formset.model._meta.verbose_name_plural} of '{obj}' changed in admin",  # type: ignore[union-attr]
                            rows=changed,
                            diff={str(f.instance): form_diff(f) for f in formset.forms
                                  if f.instance.pk and f.changed_data and f not in formset.deleted_forms})
        formset.save_m2m()

    def log_change(self, request: HttpRequest, obj: Any, message: Any) -> Any:
        if not message:
            return None  # an unchanged save changed nothing: nothing to record
        return super().log_change(request, obj, message)

    def delete_model(self, request: HttpRequest, obj: Any) -> None:
        from planning.services.audit import admin_rows_delete

        admin_rows_delete(user=request.user, rows=[obj], audit=lambda row: (self.audit_agent_id(row), self.audit_plan_id(row)))

    def delete_queryset(self, request: HttpRequest, queryset: Any) -> None:
        from planning.services.audit import admin_rows_delete

        admin_rows_delete(user=request.user, rows=list(queryset),
                          audit=lambda row: (self.audit_agent_id(row), self.audit_plan_id(row)))
