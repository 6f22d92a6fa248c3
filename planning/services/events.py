"""The PlanEvent every write records (who, what, why and the diff), pushed to the open pages after commit
(planner_site/events.py)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from django.contrib.auth.models import User

from agents.models import Agent
from agents.signals import events_may_notify_on_commit, operator_acted_on_commit
from planner_site.events import publish_changed_on_commit
from planner_site.validators import text_problem
from planning.models import Plan, PlanEvent, PlanStep
from planning.services.errors import DecisionError
from planning.trace_spans import events_traced

REASON_MAX_LENGTH = 2000


def reason_clean(reason: str, *, what: str = "Reason", required: bool = False) -> str:
    """A reason or feedback as stored: trimmed and checked; DecisionError says what is wrong with it."""
    reason = reason.strip()
    if required and not reason:
        raise DecisionError(f"{what} is required. Nothing was changed.")
    if problem := text_problem(reason, max_length=REASON_MAX_LENGTH):
        raise DecisionError(f"{what} {problem}. Nothing was changed.")
    return reason


def actor_name(user: User) -> str:
    return user.get_username()


def event_record(*, plan: Plan, kind: str, actor: User | None = None, actor_label: str = "",
                 step: PlanStep | None = None, reason: str = "", detail: dict[str, Any] | None = None) -> PlanEvent:
    """Record an event and push the plan to open pages once the transaction commits; an operator's (`actor`)
    brings the agent's next cycle forward then (agents/signals.py)."""
    event = PlanEvent.objects.create(
        plan=plan, agent_id=plan.agent_id, step=step, kind=kind, actor=actor,
        actor_label=actor_label or (actor_name(actor) if actor else "system"), reason=reason, detail=detail or {},
    )
    events_written([event])
    return event


def events_record(events: Sequence[PlanEvent]) -> list[PlanEvent]:
    """Record events on their plans in one INSERT (each a PlanEvent with its plan, kind, actor or actor_label,
    reason and detail; `actor_label` defaults as event_record's), and push each plan once the transaction commits.
    For events that no post_save receiver needs (a decision's is saved by event_record, which closes its Slack
    messages): what an outside agent reported, its remote run's state. Returns the events, in order."""
    for event in events:
        if event.plan is None:
            raise ValueError("events_record writes events on plans; event_agent_record, an agent's own")
        event.agent_id = event.plan.agent_id
        event.actor_label = event.actor_label or (actor_name(event.actor) if event.actor else "system")
    written = PlanEvent.objects.bulk_create(events)
    events_written(written)
    if written:
        events_may_notify_on_commit()
    return written


def events_written(events: Sequence[PlanEvent]) -> None:
    """After events are written: traced, each plan pushed to the open pages once the transaction commits, and an
    operator's act (an event with `actor`) brings its agent's next cycle forward then."""
    events_traced(events)
    for agent_id, plan_id, kind in dict.fromkeys((event.agent_id, event.plan_id, event.kind) for event in events):
        if agent_id is not None:
            publish_changed_on_commit(agent_id=agent_id, plan_id=plan_id, kind=kind)
    for agent_id in dict.fromkeys(event.agent_id for event in events if event.actor_id is not None):
        if agent_id is not None:
            operator_acted_on_commit(agent_id)


def event_agent_record(*, agent: Agent, kind: str, actor: User | None = None, actor_label: str = "",
                       reason: str = "", detail: dict[str, Any] | None = None) -> PlanEvent:
    """Record an event about an agent that no plan carries (a goal given, a pause while idle), and push it; an
    operator's brings the agent's next cycle forward, as event_record's."""
    event = PlanEvent.objects.create(agent=agent, kind=kind, actor=actor,
                                     actor_label=actor_label or (actor_name(actor) if actor else "system"),
                                     reason=reason, detail=detail or {})
    publish_changed_on_commit(agent_id=agent.pk, kind=kind)
    if actor is not None:
        operator_acted_on_commit(agent.pk)
    return event
