"""Changes made in the Django admin, each recorded: a row added, the fields an operator changed, rows deleted,
an account's roles changed. The admin's pages (planner_site/admin_audit.py, agents/admin.py) call these; each
writes its rows and one event naming the operator and the diff, pushed after commit."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Any

from django.core import serializers
from django.db import transaction

from agents.models import Agent
from agents.signals import operator_acted_on_commit
from planner_site.events import publish_changed_on_commit
from planning.models import Plan, PlanEvent


def admin_event_record(*, user: Any, agent_id: int, plan_id: int | None, what: str, diff: dict[str, Any]) -> PlanEvent:
    """An ADMIN_EDIT event naming the operator and the diff, on the agent's open plan when it has one (else on
    the agent alone), pushed after commit."""
    if plan_id is None:
        plan_id = (Plan.objects.filter(agent_id=agent_id).open().order_by("-created_at")
                   .values_list("pk", flat=True).first())
    event = PlanEvent.objects.create(
        plan_id=plan_id, agent_id=agent_id, kind=PlanEvent.Kind.ADMIN_EDIT,
        actor=user if user.is_authenticated else None, actor_label=user.get_username(), reason=what,
        detail={"diff": diff},
    )
    publish_changed_on_commit(agent_id=agent_id, plan_id=plan_id, kind="admin_edit")
    if event.actor_id is not None:
        operator_acted_on_commit(agent_id)
    return event


@transaction.atomic
def admin_rows_save(*, user: Any, agent_id: int, plan_id: int | None, what: str,
                    rows: Sequence[tuple[Any, Sequence[str]]], diff: dict[str, Any]) -> PlanEvent | None:
    """An operator's change made in the Django admin: each row writes only the fields the operator changed, so
    what the runner moved on since the form loaded (needs, counters, the waiting reason) stays as it is now.
    The plan is locked first (the services' lock order). One event names the operator and the diff.
    Nothing changed: nothing is written or recorded (None)."""
    changed = [(row, list(fields)) for row, fields in rows if fields]
    if not changed:
        return None
    if plan_id is not None:
        list(Plan.objects.select_for_update(no_key=True).filter(pk=plan_id).values_list("pk", flat=True))
    for row, fields in changed:
        if any(f.name == "updated_at" and f.concrete for f in row._meta.get_fields()):
            fields.append("updated_at")
        row.save(update_fields=fields)
    return admin_event_record(user=user, agent_id=agent_id, plan_id=plan_id, what=what, diff=diff)


@transaction.atomic
def admin_rows_delete(*, user: Any, rows: Sequence[Any], audit: Callable[[Any], tuple[int, int | None]]) -> int:
    """Rows deleted in the Django admin (one, or the "delete selected" action), each recorded with the operator's
    name and what it held, on its agent (not on a plan being deleted: its events go with it). Deleting an agent
    takes its own events with it; Django's admin log keeps that deletion."""
    events = []
    for row in rows:
        agent_id, plan_id = audit(row)
        name, text = row._meta.verbose_name, str(row)
        held = json.loads(serializers.serialize("json", [row]))[0]["fields"]  # what it held stays in the audit
        gone_with_row = isinstance(row, Agent)
        row.delete()
        if gone_with_row:
            continue
        plan_id = None if isinstance(row, Plan) else plan_id
        known = user is not None and user.is_authenticated
        events.append(PlanEvent(agent_id=agent_id, plan_id=plan_id, kind=PlanEvent.Kind.ADMIN_DELETE,
                                actor=user if known else None, actor_label=user.get_username() if known else "system",
                                reason=f"{name} '{text}' deleted in admin"[:4000], detail={"deleted": held, "diff": {"deleted": [text, ""]}}))
        publish_changed_on_commit(agent_id=agent_id, plan_id=plan_id, kind="admin_delete")
    PlanEvent.objects.bulk_create(events)
    return len(rows)


@transaction.atomic
def admin_row_create(*, user: Any, obj: Any, what: str,
                     audit: Callable[[Any], tuple[int, int | None]]) -> PlanEvent:
    """A row added in the Django admin, recorded with the operator's name."""
    obj.save()
    agent_id, plan_id = audit(obj)
    return admin_event_record(user=user, agent_id=agent_id, plan_id=plan_id, what=what,
                              diff={"created": ["", str(obj)]})


@transaction.atomic
def roles_change_record(*, user: Any, account: Any, diff: dict[str, list[Any]]) -> PlanEvent | None:
    """A change of an account's role (its groups, its staff or superuser flag, its permissions) made in the admin:
    an event with who, whose and the diff. Nothing changed: nothing recorded."""
    if not diff:
        return None
    return PlanEvent.objects.create(kind=PlanEvent.Kind.ROLES_CHANGED, actor=user if user.is_authenticated else None,
                                    actor_label=user.get_username(), reason=f"roles of {account.get_username()} changed",
                                    detail={"account": account.pk, "diff": diff})
