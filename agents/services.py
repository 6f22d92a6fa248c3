"""The agents' own writes: a cycle counted and its next one due, an operator's decision bringing the next cycle
forward; the rows of a persona pass that are the agents' (their counts and emotions, needs, goals, lessons:
written by planning/services/cycles.py persona_cycles_record, which records the plans, steps and events); the
API tokens, each recorded; and the one bulk write of checked, locked rows (rows_write). The Django admin's
changes are recorded by planning/services/audit.py.

A cycle is numbered: the agent's cycle_count moves from n to n + 1 in the same transaction that records
experience n + 1, so a cycle re-run after a runner died (or driven twice) changes nothing twice.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import transaction
from django.db.models import Case, F, JSONField, QuerySet, Value, When
from django.db.models.functions import Greatest, Least
from django.utils import timezone

from agents.fencing import fence_current, fence_hold
from agents.models import Agent, AgentToken, Experience, Lesson, Need
from goals.models import Goal
from goals.system import GoalState, clamp_unit
from planner_site.events import publish_changed_on_commit
from planning.models import PlanEvent


def cycle_next_at(agent: Agent, now: Any) -> Any:
    """When the agent's next cycle is due: one interval after this one was due, so that a cycle run late keeps
    the agent's pace (cycle_interval is a rate, as the operator set it); never before `now`, and an agent far
    behind (paused, a runner away) starts afresh one interval from now instead of catching up in a burst."""
    interval = timedelta(seconds=agent.cycle_interval)
    due = agent.next_cycle_at
    if due is not None and now - interval < due <= now:
        return due + interval
    return now + interval


def agent_cycle_count(*, agent: Agent, waits: bool = False) -> None:
    """A tool agent's cycle ended (whatever it did, recorded by its own services): count it and set the next
    one's time (agents_cycle_count)."""
    agents_cycle_count(agents=[agent], waits=waits)


def agents_cycle_count(*, agents: Sequence[Agent], waits: bool = False) -> None:
    """Tool agents' cycles ended (a cycle's, or a start pass's: runtime/cycle.py tools_start): each counted and its
    next cycle's time set, one UPDATE per cycle interval among them. No event: the cycle's work has its own, and
    an idle cycle is no news for the timeline.

    Agents that `wait` for a person and nothing else (runtime/cycle.py tool_cycle) come back after
    RUNNER_WAITING_SECONDS when their interval is shorter: an operator's decision brings the next cycle forward
    (agents/signals.py), and 100 agents waiting at the default 2 s kept half a core of the runners busy finding
    nothing to do. A failed planning's automatic retry due sooner keeps its time (never before the interval).
    In a runner's job, counted only while the runner holds it (agents/fencing.py), in one transaction with that
    check."""
    if fence_current() is not None:
        with transaction.atomic():
            fence_hold()
            agents_cycle_counted(agents, waits=waits)
        return
    agents_cycle_counted(agents, waits=waits)


def agents_cycle_counted(agents: Sequence[Agent], *, waits: bool) -> None:
    now = timezone.now()
    by_interval: dict[float, list[int]] = {}
    for agent in agents:
        by_interval.setdefault(agent.cycle_interval, []).append(agent.pk)
    for interval, ids in by_interval.items():
        soon = now + timedelta(seconds=interval)
        next_at: Any = soon
        if waits and interval < settings.RUNNER_WAITING_SECONDS:
            rest = Value(now + timedelta(seconds=settings.RUNNER_WAITING_SECONDS))
            next_at = Case(When(plan_retry_at__isnull=True, then=rest),
                           default=Least(rest, Greatest(F("plan_retry_at"), Value(soon))))
        # One statement, atomic on its own (no transaction around it); the count is moved by the database, not
        # from the value read.
        Agent.objects.filter(pk__in=ids).update(cycle_count=F("cycle_count") + 1, next_cycle_at=next_at)
        for pk in ids:
            publish_changed_on_commit(agent_id=pk, kind="cycle")


def agent_cycle_soon(*, agent_id: int) -> bool:
    """An operator acted on the agent (agents/signals.py): its next cycle is due now rather than at the end of
    its interval, so a decision takes effect at once. Only a running agent that a runner drives, whose next
    cycle was later; False when nothing moved. No event: the operator's write has its own."""
    now = timezone.now()
    return bool(Agent.objects.filter(pk=agent_id, status=Agent.Status.RUNNING, next_cycle_at__gt=now)
                .exclude(kind=Agent.Kind.EXTERNAL).update(next_cycle_at=now))


def cycle_soon_on_decision(sender: object, agent_id: int, **kwargs: Any) -> None:
    """agents/signals.py `operator_acted`, in every process (agents/apps.py): agent_cycle_soon."""
    agent_cycle_soon(agent_id=agent_id)


GOAL_WRITTEN = ["progress", "confidence", "times_advanced", "times_regressed", "status", "last_progressed"]

def rows_write(model: Any, rows: Sequence[Any], fields: Sequence[str]) -> None:
    """Write these fields of existing rows, each row its own values, in one statement: bulk_create's
    update_conflicts (INSERT ... ON CONFLICT (id) DO UPDATE SET those fields), a documented QuerySet method.
    bulk_update builds a CASE WHEN per row and field, whose construction cost the persona batch most of its
    CPU per cycle (`make bench`, scale_*_cpu_per_cycle). The callers hold the rows' locks and write only
    rows they read and checked."""
    if rows:
        model.objects.bulk_create(rows, update_conflicts=True, unique_fields=["id"], update_fields=list(fields))


def agents_cycled(agents: Sequence[Agent]) -> None:
    """A cycle more for each of the pass's agents (their rows locked by the caller, their count checked), with
    their emotions and their next cycle's time as the cycles left them, in one UPDATE: the emotions and times
    the agents share are one branch of a CASE each (`make bench`, scale_*_cpu_per_cycle: an upsert wrote every
    column of every agent's row, its backstory and personality too)."""
    emotions: dict[str, tuple[dict[str, Any], list[int]]] = {}
    due: dict[Any, list[int]] = {}
    for agent in agents:
        emotions.setdefault(json.dumps(agent.emotions, sort_keys=True), (agent.emotions, []))[1].append(agent.pk)
        due.setdefault(agent.next_cycle_at, []).append(agent.pk)
    Agent.objects.filter(pk__in=[a.pk for a in agents]).update(
        cycle_count=F("cycle_count") + 1,
        emotions=change_of((Value(felt, output_field=JSONField()), ids) for felt, ids in emotions.values()),
        next_cycle_at=change_of(due.items()))


def needs_move(moves: Sequence[tuple[Mapping[str, float], Mapping[str, Need]]], now: Any) -> None:
    """Each need of the pass moved by its change (`moves`: a cycle's change to each need by its name, and the need
    rows it read, by name), within 0..1, from its value now: an operator's edit made
    meanwhile is moved, not overwritten. One UPDATE for all, each need's change chosen by a CASE over the needs
    that make it (a persona's decay rate over an action's hours, the action's fixed effect: a pass of 250
    personas moves ~1,200 needs in a few dozen ways). The agents' rows, locked by the caller, keep it the only
    writer of these needs (`make bench`, scale_*_cpu_per_cycle and persona_cycle_queries: reading them FOR
    UPDATE first, to write the needs that moved alone by an upsert, cost a statement more and locked each row
    twice)."""
    changes: dict[float, list[int]] = {}
    for need_changes, need_rows in moves:
        for name, delta in need_changes.items():
            if delta and name in need_rows:
                changes.setdefault(delta, []).append(need_rows[name].pk)
    if not changes:
        return
    Need.objects.filter(pk__in=[pk for ids in changes.values() for pk in ids]).update(
        satisfaction=Least(Greatest(F("satisfaction") + change_of(changes.items()), 0.0), 1.0), updated_at=now)


def change_of(changes: Iterable[tuple[Any, list[int]]], output_field: Any = None) -> Case:
    """A CASE giving each row (by id) its change: `changes` pairs a change (a value, or an expression) with the
    rows that make it. The change most rows make is the CASE's default, its rows unlisted: the rows' ids are
    most of such an UPDATE's cost (`make bench`, scale_*_cpu_per_cycle)."""
    def value(change: Any) -> Any:
        return change if hasattr(change, "resolve_expression") else Value(change)

    pairs = list(changes)
    common = max(range(len(pairs)), key=lambda i: len(pairs[i][1]))
    return Case(*[When(pk__in=ids, then=value(change)) for i, (change, ids) in enumerate(pairs) if i != common],
                default=value(pairs[common][0]), output_field=output_field)


def goals_write(*, goals: list[tuple[Goal, GoalState]], now: Any) -> set[int]:
    """Progress, confidence and counters of the goals the experiences moved; only of goals still active (one an
    operator completed or abandoned meanwhile stays so). A goal whose change is relative (goal_shift: its
    horizon's decay over the action's hours, its source needs' deltas, almost every goal) is moved from its
    values now, all such goals by one UPDATE (goals_shifted); the others (a goal abandoned, or one whose state
    is not its values moved) are written as computed, locked first, in one upsert. Returns the goals these
    cycles abandoned, each of which gets its event."""
    moved = [(g, s) for g, s in goals if s.progressed or s.abandoned or (g.progress, g.confidence, g.times_advanced,
             g.times_regressed) != (s.progress, s.confidence, s.times_advanced, s.times_regressed)]
    shifts: list[tuple[GoalShift, int]] = []
    written: dict[int, tuple[Goal, GoalState]] = {}
    for goal, state in moved:
        shift = None if state.abandoned else goal_shift(goal, state)
        if shift is None:
            written[goal.pk] = (goal, state)
        else:
            shifts.append((shift, goal.pk))
        goal.progress, goal.confidence = state.progress, state.confidence
        goal.times_advanced, goal.times_regressed = state.times_advanced, state.times_regressed
        if state.progressed:
            goal.last_progressed = now
    goals_shifted(shifts, now=now)
    if not written:
        return set()
    active = set(Goal.objects.select_for_update().filter(pk__in=written).active().order_by("pk")
                 .values_list("pk", flat=True))
    abandoned = {pk for pk in active if written[pk][1].abandoned}
    for pk in abandoned:
        written[pk][0].status = Goal.Status.ABANDONED
    rows_write(Goal, [written[pk][0] for pk in sorted(active)], GOAL_WRITTEN)
    return abandoned


# A goal's change in one experience: progress added, confidence lost, advances and setbacks counted, and
# whether it progressed (last_progressed is now).
GoalShift = tuple[float, float, int, int, bool]


def goal_shift(goal: Goal, state: GoalState) -> GoalShift | None:
    """The experience's change to this goal as a relative update, when applying it to the values read gives
    exactly the state computed (None otherwise: the state is written as it is)."""
    advanced, regressed = state.times_advanced - goal.times_advanced, state.times_regressed - goal.times_regressed
    if (clamp_unit(goal.progress + state.progress_delta), clamp_unit(goal.confidence - state.confidence_decay)) != (
            state.progress, state.confidence) or advanced not in (0, 1) or regressed not in (0, 1):
        return None
    return state.progress_delta, state.confidence_decay, advanced, regressed, state.progressed


def goals_shifted(shifts: Sequence[tuple[GoalShift, int]], *, now: Any) -> None:
    """Goals moved by their change (goal_shift), from their values now (within 0..1), in one UPDATE of those still
    active: an operator's edit made meanwhile is moved, not overwritten. Each column's change is a CASE over the
    goals that make it: most goals of a pass move in a few ways (a horizon's decay over an action's hours, its
    source needs' fixed deltas). In the upsert (every column of every row) they were the pass's costliest write
    (`make bench`, scale_*_cpu_per_cycle)."""
    if not shifts:
        return
    progress: dict[float, list[int]] = {}
    decay: dict[float, list[int]] = {}
    advanced: dict[int, list[int]] = {}
    regressed: dict[int, list[int]] = {}
    progressed: dict[bool, list[int]] = {}
    for (delta, lost, advance, regress, progressed_now), pk in shifts:
        progress.setdefault(delta, []).append(pk)
        decay.setdefault(lost, []).append(pk)
        advanced.setdefault(advance, []).append(pk)
        regressed.setdefault(regress, []).append(pk)
        progressed.setdefault(progressed_now, []).append(pk)
    values: dict[str, Any] = {
        "progress": Least(Greatest(F("progress") + change_of(progress.items()), 0.0), 1.0),
        "confidence": Least(Greatest(F("confidence") - change_of(decay.items()), 0.0), 1.0),
    }
    if set(advanced) != {0}:
        values["times_advanced"] = F("times_advanced") + change_of(advanced.items())
    if set(regressed) != {0}:
        values["times_regressed"] = F("times_regressed") + change_of(regressed.items())
    if True in progressed:
        values["last_progressed"] = change_of((now if moved else F("last_progressed"), ids)
                                              for moved, ids in progressed.items())
    Goal.objects.filter(pk__in=[pk for _, pk in shifts]).active().update(**values)


def lessons_learn(learned: Sequence[tuple[Agent, str | None, Experience]]) -> None:
    """Failed actions' lessons, each learned once per agent (the agents' rows, locked by the caller, keep it one
    writer): one read, one insert."""
    wanted = {(agent.pk, text): (agent, experience) for agent, text, experience in learned if text}
    if not wanted:
        return
    known = set(Lesson.objects.filter(agent_id__in={pk for pk, _ in wanted},
                                      description__in={text for _, text in wanted})
                .values_list("agent_id", "description"))
    Lesson.objects.bulk_create([Lesson(agent=agent, description=text, source_experience=experience)
                                for (pk, text), (agent, experience) in wanted.items() if (pk, text) not in known])


# --- API tokens ------------------------------------------------------------------------------------------------


@transaction.atomic
def token_issue(*, agent: Agent, label: str = "", expires_at: datetime | None = None, user: Any = None,
                actor_label: str = "") -> tuple[AgentToken, str]:
    """Issue an API token for an external agent (the raw token is returned once, never stored), recorded: who
    issued which token (its hint and label), for the audit log."""
    token, raw = AgentToken.issue(agent=agent, label=label, expires_at=expires_at)
    known = user is not None and user.is_authenticated
    PlanEvent.objects.create(agent=agent, kind=PlanEvent.Kind.TOKEN_ISSUED, actor=user if known else None,
                             actor_label=(user.get_username() if known else actor_label or "system")[:150],
                             reason=f"API token {token.hint}… issued ({token.label or 'no label'})",
                             detail={"token": token.hint, "label": token.label,
                                     "expires_at": token.expires_at.isoformat() if token.expires_at else None})
    return token, raw


@transaction.atomic
def tokens_revoke(*, tokens: QuerySet[AgentToken], user: Any = None) -> int:
    """Revoke these API tokens (those still active), recording who revoked which; their agents' open API
    sockets and long polls are told after commit, so they close within seconds instead of going on serving a
    revoked token."""
    now = timezone.now()
    active = list(tokens.filter(revoked_at__isnull=True).select_for_update().values_list("pk", "agent_id", "label"))
    count = AgentToken.objects.filter(pk__in=[pk for pk, _, _ in active]).update(revoked_at=now)
    by_agent: dict[int, list[str]] = {}
    for _, agent_id, label in active:
        by_agent.setdefault(agent_id, []).append(label or "(no label)")
    known = user is not None and user.is_authenticated
    PlanEvent.objects.bulk_create([
        PlanEvent(agent_id=agent_id, kind=PlanEvent.Kind.TOKEN_REVOKED, actor=user if known else None,
                  actor_label=user.get_username() if known else "system", reason=", ".join(labels)[:4000],
                  detail={"tokens": labels})
        for agent_id, labels in by_agent.items()])
    for agent_id in by_agent:
        publish_changed_on_commit(agent_id=agent_id, kind="token_revoked")
    return count
