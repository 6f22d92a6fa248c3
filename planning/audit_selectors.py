"""The one audit log: a single selector over every table that records a change, read as one list (a UNION,
newest first, paginated and exported like one table):

- plan events (planning.PlanEvent): decisions, edits, goals, admin edits of the product's rows, API tokens issued
  and revoked, roles changed in the admin;
- policy changes (policies.PolicyChange): policies, rules and budgets, from the page, the admin or the API;
- notification settings (notifications.SettingsChange): channels and subscriptions, by their owner or an admin;
- the admin's own log (django.contrib.admin LogEntry) of every app that records nothing itself (accounts,
  groups, anything added later), so no admin edit is left out.

Each entry: where it comes from, who, what, when, and the diff (as JSON text)."""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from datetime import date, datetime
from typing import Any

from django.contrib.admin.models import ADDITION, CHANGE, DELETION, LogEntry
from django.db.models import CharField, F, IntegerField, QuerySet, TextField, Value
from django.db.models.functions import Cast, Concat

from notifications.models import SettingsChange
from planning.models import PlanEvent
from policies.models import PolicyChange

POLICY_CHANGE = "policy_change"
SETTINGS_CHANGE = "settings_change"
ADMIN_LOG = "admin_log"
OTHER_KINDS = [(POLICY_CHANGE, "Policy, rule or budget changed"), (SETTINGS_CHANGE, "Notification settings changed"),
               (ADMIN_LOG, "Changed in admin (accounts, groups, other)")]
KIND_LABELS = dict(PlanEvent.Kind.choices) | dict(OTHER_KINDS)
# Apps whose admin edits are recorded in their own tables above: their LogEntry rows would say it twice.
SELF_RECORDING_APPS = ("agents", "goals", "planning", "policies", "notifications")
ADMIN_ACTIONS = {ADDITION: "added", CHANGE: "changed", DELETION: "deleted"}

COLUMNS = ("e_source", "e_id", "e_at", "e_kind", "e_actor", "e_agent", "e_plan", "e_version", "e_goal", "e_step",
           "e_text", "e_detail")
# The export's columns (the plan events' names, as before) and the entry's column each is read from.
AUDIT_EXPORT_FIELDS = ("id", "created_at", "kind", "actor_label", "agent__name", "plan_id", "plan__version",
                       "step__key", "reason", "detail", "source")
EXPORT_COLUMNS = dict(zip(AUDIT_EXPORT_FIELDS, ("e_id", "e_at", "e_kind", "e_actor", "e_agent", "e_plan",
                                                "e_version", "e_step", "e_text", "e_detail", "e_source"), strict=True))


def none(field: Any) -> Cast:
    return Cast(Value(None), output_field=field)


def plan_events() -> QuerySet[PlanEvent]:
    return PlanEvent.objects.annotate(
        e_source=Value("plan", output_field=CharField()), e_id=F("pk"), e_at=F("created_at"), e_kind=F("kind"),
        e_actor=F("actor_label"), e_agent=F("agent__name"), e_plan=F("plan_id"), e_version=F("plan__version"),
        e_goal=F("plan__goal_text"), e_step=F("step__key"), e_text=F("reason"),
        e_detail=Cast("detail", output_field=TextField()))


def policy_changes() -> QuerySet[PolicyChange]:
    return PolicyChange.objects.annotate(
        e_source=Value("policies", output_field=CharField()), e_id=F("pk"), e_at=F("created_at"),
        e_kind=Value(POLICY_CHANGE, output_field=CharField()), e_actor=F("actor_label"), e_agent=none(CharField()),
        e_plan=none(IntegerField()), e_version=none(IntegerField()), e_goal=none(TextField()),
        e_step=none(CharField()), e_text=F("what"), e_detail=Cast("diff", output_field=TextField()))


def settings_changes() -> QuerySet[SettingsChange]:
    return SettingsChange.objects.annotate(
        e_source=Value("notifications", output_field=CharField()), e_id=F("pk"), e_at=F("created_at"),
        e_kind=Value(SETTINGS_CHANGE, output_field=CharField()), e_actor=F("user_label"), e_agent=none(CharField()),
        e_plan=none(IntegerField()), e_version=none(IntegerField()), e_goal=none(TextField()),
        e_step=none(CharField()), e_text=Cast("action", output_field=TextField()),
        e_detail=Cast("detail", output_field=TextField()))


def admin_log() -> QuerySet[LogEntry]:
    return LogEntry.objects.exclude(content_type__app_label__in=SELF_RECORDING_APPS).annotate(
        e_source=Value("admin", output_field=CharField()), e_id=F("pk"), e_at=F("action_time"),
        e_kind=Value(ADMIN_LOG, output_field=CharField()), e_actor=Cast("user__username", output_field=CharField()),
        e_agent=none(CharField()), e_plan=none(IntegerField()),
        e_version=Cast("action_flag", output_field=IntegerField()),  # no plan here: the column carries the action
        e_goal=none(TextField()), e_step=none(CharField()),
        e_text=Concat(Cast("content_type__model", output_field=TextField()), Value(" "),
                      Cast("object_repr", output_field=TextField()), output_field=TextField()),
        e_detail=Cast("change_message", output_field=TextField()))


def audit_entries(*, operator: str = "", agent_id: int | None = None, plan_id: int | None = None, kind: str = "",
                  since: date | None = None, until: date | None = None) -> QuerySet[Any]:
    """Every recorded change, newest first, filtered: one query for a page and one for the count. Entries that
    are about no agent or plan (a policy, a channel, an account) are left out when filtering by agent or plan."""
    parts: list[tuple[QuerySet[Any], str, str]] = [
        (plan_events(), "actor_label", "created_at"), (policy_changes(), "actor_label", "created_at"),
        (settings_changes(), "user_label", "created_at"), (admin_log(), "user__username", "action_time")]
    chosen = []
    for queryset, actor, at in parts:
        source_kind = queryset.model is PlanEvent
        if (agent_id is not None or plan_id is not None) and not source_kind:
            continue
        if kind:
            own = {PolicyChange: POLICY_CHANGE, SettingsChange: SETTINGS_CHANGE, LogEntry: ADMIN_LOG}.get(queryset.model)
            if source_kind and kind in KIND_LABELS and kind not in dict(OTHER_KINDS):
                queryset = queryset.filter(kind=kind)
            elif own != kind:
                continue
        lookups: dict[str, Any] = {actor: operator or None, f"{at}__date__gte": since, f"{at}__date__lte": until}
        if source_kind:
            lookups |= {"agent_id": agent_id, "plan_id": plan_id}
        queryset = queryset.filter(**{k: v for k, v in lookups.items() if v is not None})
        chosen.append(queryset.order_by().values(*COLUMNS))
    if not chosen:
        return PlanEvent.objects.none().values()
    first, *rest = chosen
    combined = first.union(*rest, all=True) if rest else first
    return combined.order_by("-e_at", "-e_source", "-e_id")


@dataclass
class AuditEntry:
    """One entry as the page shows it."""

    source: str
    id: int
    created_at: datetime
    kind: str
    actor_label: str
    agent_name: str | None
    plan_id: int | None
    plan_version: int | None
    admin_action: int | None
    plan_goal: str | None
    step_key: str | None
    text: str
    detail: Any

    @property
    def kind_label(self) -> str:
        if self.kind == ADMIN_LOG:
            return f"{ADMIN_ACTIONS.get(self.admin_action or 0, 'changed').capitalize()} in admin"
        return KIND_LABELS.get(self.kind, self.kind)

    @property
    def diff(self) -> str:
        """The change, as the page shows it under "diff"."""
        detail = self.detail
        if self.source == "plan":
            detail = detail.get("diff") if isinstance(detail, dict) else None
        if not detail:
            return ""
        return detail if isinstance(detail, str) else json.dumps(detail, ensure_ascii=False, indent=1)


def detail_read(text: str | None) -> Any:
    if not text:
        return {}
    try:
        return json.loads(text)
    except ValueError:
        return text


def entry_of(row: dict[str, Any]) -> AuditEntry:
    admin = row["e_source"] == "admin"
    return AuditEntry(source=row["e_source"], id=row["e_id"], created_at=row["e_at"], kind=row["e_kind"],
                      actor_label=row["e_actor"] or "", agent_name=row["e_agent"], plan_id=row["e_plan"],
                      plan_version=None if admin else row["e_version"], admin_action=row["e_version"] if admin else None,
                      plan_goal=row["e_goal"], step_key=row["e_step"],
                      text=row["e_text"] or "", detail=detail_read(row["e_detail"]))


def entries_of(rows: Iterable[dict[str, Any]]) -> list[AuditEntry]:
    return [entry_of(r) for r in rows]


def audit_rows(entries: QuerySet[Any]) -> Iterator[dict[str, Any]]:
    """The filtered entries as plain rows for export (the plan events' column names), streamed in chunks."""
    for row in entries.iterator(chunk_size=1000):
        out = {name: row[column] for name, column in EXPORT_COLUMNS.items()}
        out["detail"] = detail_read(out["detail"])
        if row["e_source"] == "admin":  # its plan column carries the admin's action (see admin_log)
            out["detail"] = {"action": ADMIN_ACTIONS.get(out["plan__version"] or 0, "changed"), "change": out["detail"]}
            out["plan__version"] = None
        yield out
