"""The persona cycle's writes (seeds 000, 001): every row one cycle changes, in one transaction, with the
PlanEvents that say what happened to plans and steps, and one push per plan after commit.

A cycle is numbered: the agent's cycle_count moves from n to n + 1 in the same transaction that records
experience n + 1, so a cycle re-run after a runner died (or driven twice) changes nothing twice.
"""

from __future__ import annotations

import functools
import json
import operator
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.core import serializers
from django.db import transaction
from django.db.models import Case, F, JSONField, Q, QuerySet, Value, When
from django.db.models.functions import Greatest, Least
from django.utils import timezone

from agents.fencing import fence_current, fence_hold
from agents.models import Agent, AgentToken, Experience, Lesson, Need
from agents.persona import StepVerdict, routine_keeps
from agents.signals import operator_acted_on_commit
from agents.world import ACTIONS
from goals.models import Goal
from goals.system import GoalState, clamp_unit
from planner_site.events import publish_changed_on_commit
from planning.models import Plan, PlanEvent, PlanStep
from planning.trace_spans import events_traced

# A routine repeats a step that serves another need only while that need is below this (work while money is short).
ROUTINE_FINE_ABOVE = 0.8


class CycleAlreadyDone(Exception):
    """Another runner (or an earlier run of this one) already recorded this cycle; nothing was changed."""


@dataclass
class StepChange:
    """The current step after this cycle's experience."""

    step: PlanStep
    plan: Plan
    verdict: StepVerdict
    followed: bool
    override_reason: str
    result: str
    plan_completed: bool  # it was the plan's last unfinished step


@dataclass
class CycleRecord:
    agent: Agent
    expected_cycle: int  # the agent's cycle_count when the cycle began
    runner: str
    action: str
    outcome: str
    succeeded: bool
    hours: float
    need_deltas: dict[str, float]  # the action's effect, what moves goal progress
    need_changes: dict[str, float]  # effect and decay together, applied to the stored values
    needs_after: dict[str, float]
    followed: bool
    override_reason: str
    step_change: StepChange | None
    goals: list[tuple[Goal, GoalState]]
    plans_to_close: list[tuple[Plan, str]] = field(default_factory=list)  # open plans of finished goals, and why
    emotions: dict[str, float] = field(default_factory=dict)
    lesson: str | None = None
    goal_unrewarded: GoalState | None = None  # the completing plan's goal without the completion bonus
    need_rows: dict[str, Need] = field(default_factory=dict)  # the need rows the cycle read, by name (written by id)


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


@transaction.atomic
def persona_cycle_record(record: CycleRecord) -> Experience:
    """Record one persona cycle in one transaction; raises CycleAlreadyDone (and nothing is written) when the
    cycle was already recorded."""
    fence_hold()  # a runner's: only while it holds the job covering this agent (agents/fencing.py)
    agent = record.agent
    now = timezone.now()
    cycle = record.expected_cycle + 1
    change, plan_written, plans_to_close = cycle_plans_claim(record, now)
    # First write after the plans', so PostgreSQL locks the agent row at once: a second runner on this agent
    # waits here and then finds cycle_count moved on.
    updated = Agent.objects.filter(pk=agent.pk, cycle_count=record.expected_cycle).update(
        cycle_count=cycle, emotions=record.emotions, next_cycle_at=cycle_next_at(agent, now))
    if not updated:
        raise CycleAlreadyDone(f"{agent} cycle {cycle} was already recorded")
    needs_move([record], now)
    experience = experience_of(record, step=change.step if change else None)
    experience.save()
    events: list[PlanEvent] = []
    pushed: set[int] = set()
    if change is not None:
        events += step_apply(change=change, runner=record.runner, experience_id=experience.pk, now=now,
                             plan_written=plan_written)
        pushed.add(change.plan.pk)
    goals = goals_after(record, plan_completed=any(e.kind == PlanEvent.Kind.PLAN_COMPLETED for e in events))
    abandoned = goals_write(goals=goals, now=now)
    events += [goal_abandoned_event(goal, state, runner=record.runner, experience_id=experience.pk)
               for goal, state in goals if goal.pk in abandoned]
    events += plans_closed_steps(plans_to_close, runner=record.runner, now=now)
    pushed |= {plan.pk for plan, _ in plans_to_close}
    lessons_learn([(agent, record.lesson, experience)])  # a failed action's lesson, learned once
    if events:
        events_traced(PlanEvent.objects.bulk_create(events))
    # One push for the cycle (the agent, and the plan of its step); a closed plan's page hears of it too.
    current = change.plan.pk if change is not None else None
    publish_changed_on_commit(agent_id=agent.pk, plan_id=current, kind="experience")
    for plan_id in sorted(pushed - {current}):
        publish_changed_on_commit(agent_id=agent.pk, plan_id=plan_id, kind="plan_closed")
    return experience


def experience_of(record: CycleRecord, *, step: PlanStep | None) -> Experience:
    """The cycle's experience row (unsaved): what the person did, on which step, and where needs and goals
    stood after it."""
    return Experience(
        agent=record.agent, cycle=record.expected_cycle + 1, action=record.action, need_deltas=record.need_deltas,
        step=step, followed_plan=record.followed, override_reason=record.override_reason[:300],
        outcome=record.outcome, hours=record.hours, needs_after=record.needs_after,
        goals_after={str(g.pk): [round(s.progress, 4), round(s.confidence, 4)] for g, s in record.goals})


def goals_after(record: CycleRecord, *, plan_completed: bool) -> list[tuple[Goal, GoalState]]:
    """The goals as the cycle's experience moved them; should its plan not have completed after all (an
    operator cancelled it or changed its step meanwhile), the plan's goal without the completion bonus."""
    if record.goal_unrewarded is None or plan_completed or record.step_change is None:
        return record.goals
    rewarded = record.step_change.plan.goal_id
    return [(g, record.goal_unrewarded if g.pk == rewarded else s) for g, s in record.goals]


def goal_abandoned_event(goal: Goal, state: GoalState, *, runner: str, experience_id: int) -> PlanEvent:
    """The event of a goal a cycle abandoned (unsaved)."""
    return PlanEvent(agent_id=goal.agent_id, kind=PlanEvent.Kind.GOAL_ABANDONED, actor_label=runner,
                     reason=f"{goal.description}: confidence {state.confidence:.0%} fell below its horizon's line",
                     detail={"goal": goal.pk, "horizon": goal.horizon, "experience": experience_id})


def cycle_plans_claim(record: CycleRecord, now: Any) -> tuple[StepChange | None, dict[str, Any], list[tuple[Plan, str]]]:
    """The cycle's plan changes, written first and each only over the status the cycle read, so that what an
    operator decided since (a plan cancelled, or completed by a skip) stands: a plan whose UPDATE finds another
    status keeps it, and the cycle's change to it (its step's too) is dropped. Plan before steps, the services'
    lock order: on PostgreSQL each UPDATE locks its plan row, in id order. The common cycle changes only its
    step, which step_apply writes only if its status is still the one read (no plan write, no extra query).

    Returns the step change still to write (None if dropped), the values its plan had before this cycle wrote
    it for the step (completed, or a replan asked for; for step_apply to put back should the step have
    changed meanwhile), and the plans to close whose row is now closed (their steps remain to skip)."""
    change = record.step_change
    writes: dict[int, tuple[Plan, dict[str, Any]]] = {p.pk: (p, dict(PLAN_CLOSED)) for p, _ in record.plans_to_close}
    for_step: dict[str, Any] = {}
    if change is not None and change.plan.pk not in writes:
        for_step = step_plan_values(change)
        if for_step:
            writes[change.plan.pk] = (change.plan, for_step)
    claimed = {pk for pk, (plan, values) in sorted(writes.items())
               if Plan.objects.filter(pk=pk, status=plan.status).update(**values, updated_at=now)}
    if change is not None and change.plan.pk in writes and change.plan.pk not in claimed:
        change, for_step = None, {}
    before = {name: getattr(change.plan, name) for name in for_step} if change is not None else {}
    return change, before, [(p, why) for p, why in record.plans_to_close if p.pk in claimed]


# The columns a cycle writes of each goal its experience moved.
GOAL_WRITTEN = ["progress", "confidence", "times_advanced", "times_regressed", "status", "last_progressed"]


def step_written(*, change: StepChange, runner: str, experience_id: int,
                 now: Any) -> tuple[dict[str, Any], list[PlanEvent]]:
    """The current step's new values after the experience, and the events that say so (unsaved; the plan's
    own event apart)."""
    step, plan, verdict = change.step, change.plan, change.verdict
    detail = {"experience": experience_id}
    events: list[PlanEvent] = []

    def event(kind: str, reason: str, extra: dict[str, Any] | None = None) -> None:
        events.append(PlanEvent(plan=plan, agent_id=plan.agent_id, step=step, kind=kind, actor_label=runner,
                                reason=reason[:2000], detail=detail | (extra or {})))

    fields: dict[str, Any] = {"actual_cycles": verdict.actual_cycles, "overrides": verdict.overrides,
                              "updated_at": now}
    if step.status == PlanStep.Status.PENDING:
        event(PlanEvent.Kind.STEP_STARTED, step.description)
        fields["status"] = PlanStep.Status.RUNNING
    if not change.followed:
        event(PlanEvent.Kind.STEP_OVERRIDDEN, change.override_reason, {"overrides": verdict.overrides})
    if verdict.completed:
        fields |= {"status": PlanStep.Status.COMPLETED, "result": change.result[:20000], "error": ""}
        event(PlanEvent.Kind.STEP_COMPLETED, change.result)
    elif verdict.replan:
        fields |= {"status": PlanStep.Status.FAILED, "failure_reason": verdict.failure}
        event(PlanEvent.Kind.STEP_FAILED, verdict.failure, {"replan_scheduled": True})
    return fields, events


def step_apply(*, change: StepChange, runner: str, experience_id: int, now: Any,
               plan_written: Mapping[str, Any]) -> list[PlanEvent]:
    """The current step's counters and status after the experience; the events that say so (unsaved).
    `plan_written`: the plan's values before cycle_plans_claim wrote it for this step (completed, replan)."""
    step, plan, verdict = change.step, change.plan, change.verdict
    fields, events = step_written(change=change, runner=runner, experience_id=experience_id, now=now)
    # Only over the status this cycle read: a step an operator skipped or declined meanwhile stays so, and
    # so does its plan (written first for this step, it gets its values back).
    if not PlanStep.objects.filter(pk=step.pk, status=step.status).update(**fields):
        if plan_written:
            Plan.objects.filter(pk=plan.pk).update(**plan_written, updated_at=now)
        return []
    for name, value in fields.items():
        setattr(step, name, value)
    if verdict.replan and not verdict.completed:
        plan.replan_reason = verdict.failure
    if change.plan_completed:
        plan.status = Plan.Status.COMPLETED
        events.append(plan_completed_event(plan, runner=runner, experience_id=experience_id))
    return events


@transaction.atomic
def persona_cycles_record(records: Sequence[CycleRecord]) -> dict[int, Experience]:
    """Record many persona cycles in one transaction (the scale-out runtime's pass), with what
    persona_cycle_record writes for each, in a fixed number of statements whatever their number. A cycle
    already recorded (its agent's count moved on) is left out and nothing of it is written. What an operator
    decided meanwhile stands, as in a single cycle: a plan whose status changed keeps it and the cycle's change
    to it and its step is dropped; a step whose status changed keeps it (the experience is recorded, the step
    and its plan stay as the operator left them, and a plan that did not complete gives its goal no bonus). A
    cycle that closes plans (a goal abandoned) is recorded on its own, by persona_cycle_record (uncommon).
    Returns the experiences recorded, by agent."""
    fence_hold()  # a runner's pass: only while it holds the shard's job (agents/fencing.py)
    done: dict[int, Experience] = {}
    for record in (r for r in records if r.plans_to_close):
        try:
            with transaction.atomic():
                done[record.agent.pk] = persona_cycle_record(record)
        except CycleAlreadyDone:
            pass
    now = timezone.now()
    batch = [r for r in records if not r.plans_to_close]
    # The services' lock order: plans, agents, steps. First the plans the cycles complete (marked completed now,
    # each only if its status is still the one read: plans_claimed) or ask to replan (locked, with their status
    # now); a cycle whose plan's status moved on drops its change (cycle_plans_claim's rule).
    plan_values = {r.agent.pk: step_plan_values(r.step_change) for r in batch if r.step_change is not None}
    completing = [r.step_change.plan for r in batch
                  if r.step_change is not None and "status" in plan_values[r.agent.pk]]
    claimed = plans_claimed(completing, now=now)
    replanning = [r.step_change.plan.pk for r in batch
                  if r.step_change is not None and "replan_reason" in plan_values[r.agent.pk]]
    plan_status = dict(Plan.objects.select_for_update().filter(pk__in=replanning).order_by("pk")
                       .values_list("pk", "status")) if replanning else {}
    # The agents' rows, locked in id order (the lock a second runner on one of them waits on), then only the
    # cycles whose count is still the one read.
    counts = dict(Agent.objects.select_for_update().filter(pk__in=[r.agent.pk for r in batch]).order_by("pk")
                  .values_list("pk", "cycle_count"))
    batch = [r for r in batch if counts.get(r.agent.pk) == r.expected_cycle]
    if not batch:
        plans_unclaimed([p for p in completing if p.pk in claimed], now=now)
        return done
    changes: dict[int, StepChange] = {}
    for record in batch:
        change = record.step_change
        values = plan_values.get(record.agent.pk)
        if change is not None and (not values or (change.plan.pk in claimed if "status" in values
                                                  else plan_status.get(change.plan.pk) == change.plan.status)):
            changes[record.agent.pk] = change
        agent = record.agent
        agent.cycle_count, agent.emotions = record.expected_cycle + 1, record.emotions
        agent.next_cycle_at = cycle_next_at(agent, now)
    agents_cycled([r.agent for r in batch])
    needs_move(batch, now)
    experiences = Experience.objects.bulk_create([
        experience_of(r, step=changes[r.agent.pk].step if r.agent.pk in changes else None) for r in batch])
    by_agent = {r.agent.pk: e for r, e in zip(batch, experiences, strict=True)}
    events: list[PlanEvent] = []
    moved = [(record, change, *step_written(change=change, runner=record.runner,
                                            experience_id=by_agent[record.agent.pk].pk, now=now))
             for record in batch if (change := changes.get(record.agent.pk)) is not None]
    kept = steps_moved([(change.step, fields) for _, change, fields, _ in moved], now=now)
    completed: list[Plan] = []
    replans: list[Plan] = []
    for record, change, fields, step_events in moved:
        if change.step.pk not in kept:
            continue  # an operator's decision meanwhile stands
        for name, value in fields.items():
            setattr(change.step, name, value)
        events += step_events
        plan, values = change.plan, plan_values[record.agent.pk]
        if values:
            for name, value in values.items():
                setattr(plan, name, value)
            plan.updated_at = now
            (completed if "status" in values else replans).append(plan)
        if change.plan_completed:
            events.append(plan_completed_event(plan, runner=record.runner, experience_id=by_agent[record.agent.pk].pk))
    rewarded = {p.pk for p in completed}
    plans_unclaimed([p for p in completing if p.pk in claimed and p.pk not in rewarded], now=now)
    rows_write(Plan, replans, ["replan_reason", "updated_at"])
    goals = [pair for r in batch for pair in goals_after(
        r, plan_completed=r.step_change is not None and r.step_change.plan.pk in rewarded)]
    abandoned = goals_write(goals=goals, now=now)
    events += [goal_abandoned_event(goal, state, runner=r.runner, experience_id=by_agent[goal.agent_id].pk)
               for r in batch for goal, state in r.goals if goal.pk in abandoned]
    lessons_learn([(r.agent, r.lesson, by_agent[r.agent.pk]) for r in batch if r.lesson])
    if events:
        events_traced(PlanEvent.objects.bulk_create(events))
    for record in batch:  # the runner publishes the pass's changes together (published_together)
        change = record.step_change
        publish_changed_on_commit(agent_id=record.agent.pk, plan_id=change.plan.pk if change else None,
                                  kind="experience")
    return done | by_agent


def plans_claimed(plans: Sequence[Plan], *, now: Any) -> set[int]:
    """The plans a pass's cycles complete, marked completed in one UPDATE, each only if its status is still the
    one its cycle read (rows_written_if_unchanged: an operator's decision meanwhile stands); the rows stay locked
    to the end of the pass. Returns the plans marked (`make bench`, persona_cycle_queries: locking them first, to
    mark them later, cost a statement more a pass that completes a plan)."""
    return rows_written_if_unchanged(Plan, plans, {"status": Plan.Status.COMPLETED}, now=now)


def rows_written_if_unchanged(model: Any, rows: Sequence[Any], values: Mapping[str, Any], *, now: Any) -> set[int]:
    """`values` (and updated_at = `now`) written in one UPDATE to each of `rows` whose status is still the one read
    (its WHERE, one term for each status read). Returns the ids written: all of them unless the row count says
    otherwise, when the rows stamped with `now` (the caller's own time) are those written."""
    if not rows:
        return set()
    read: dict[str, list[int]] = {}
    for row in rows:
        read.setdefault(row.status, []).append(row.pk)
    still = functools.reduce(operator.or_, (Q(pk__in=pks, status=status) for status, pks in read.items()))
    ids = [row.pk for row in rows]
    if model.objects.filter(still).update(**values, updated_at=now) == len(ids):
        return set(ids)
    return set(model.objects.filter(pk__in=ids, updated_at=now).values_list("pk", flat=True))


def plans_unclaimed(plans: Sequence[Plan], *, now: Any) -> None:
    """Plans plans_claimed marked whose cycle was not recorded after all (another runner recorded it, or its
    step's status moved on meanwhile): each gets back the status its cycle read (uncommon)."""
    read: dict[str, list[int]] = {}
    for plan in plans:
        read.setdefault(plan.status, []).append(plan.pk)
    for status, pks in read.items():
        Plan.objects.filter(pk__in=pks).update(status=status, updated_at=now)


# The step columns a cycle sets to a value of its own (step_written), beside its counters and updated_at.
STEP_SET = ["status", "result", "error", "failure_reason"]


def steps_moved(moves: Sequence[tuple[PlanStep, Mapping[str, Any]]], *, now: Any) -> set[int]:
    """The pass's steps moved by their cycles (step_written's fields), each only if its status is still the one
    the cycle read: what an operator decided meanwhile (a step skipped, declined, approved) stands. One UPDATE
    for all: its counters moved from their values now, each column's change a CASE over the steps that make it
    (most steps of a pass make the same one, a cycle more on their running step), its WHERE the status each
    read (rows_written_if_unchanged). Returns the steps written (`make bench`, persona_cycle_queries and
    scale_*_cpu_per_cycle: reading the steps FOR UPDATE first, to write them by an upsert of seven columns, cost
    a statement more a pass)."""
    if not moves:
        return set()
    cycles: dict[int, list[int]] = {}
    overrides: dict[int, list[int]] = {}
    columns: dict[str, dict[Any, list[int]]] = {name: {} for name in STEP_SET}
    for step, fields in moves:
        cycles.setdefault(fields["actual_cycles"] - step.actual_cycles, []).append(step.pk)
        overrides.setdefault(fields["overrides"] - step.overrides, []).append(step.pk)
        for name, groups in columns.items():
            groups.setdefault(fields.get(name, F(name)), []).append(step.pk)
    values: dict[str, Any] = {"actual_cycles": F("actual_cycles") + change_of(cycles.items())}
    if set(overrides) != {0}:
        values["overrides"] = F("overrides") + change_of(overrides.items())
    for name, groups in columns.items():
        if set(groups) != {F(name)}:
            values[name] = change_of(groups.items(), output_field=PlanStep._meta.get_field(name))
    return rows_written_if_unchanged(PlanStep, [step for step, _ in moves], values, now=now)


def step_plan_values(change: StepChange | None) -> dict[str, Any]:
    """What a cycle's step change writes to its plan: completed (the plan's last step done), or a replan asked
    for (the step is stuck); nothing for the common step."""
    if change is None:
        return {}
    if change.plan_completed:
        return {"status": Plan.Status.COMPLETED}
    if change.verdict.replan:
        return {"replan_reason": change.verdict.failure}
    return {}


def plan_completed_event(plan: Plan, *, runner: str, experience_id: int) -> PlanEvent:
    """The event of a plan whose last step a cycle completed (unsaved): its goal gets the completion bonus."""
    return PlanEvent(plan=plan, agent_id=plan.agent_id, kind=PlanEvent.Kind.PLAN_COMPLETED, actor_label=runner,
                     reason="all steps done", detail={"experience": experience_id, "goal_progress_bonus": True})


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


def needs_move(batch: Sequence[CycleRecord], now: Any) -> None:
    """Each need of the batch moved by its change, within 0..1, from its value now: an operator's edit made
    meanwhile is moved, not overwritten. One UPDATE for all, each need's change chosen by a CASE over the needs
    that make it (a persona's decay rate over an action's hours, the action's fixed effect: a pass of 250
    personas moves ~1,200 needs in a few dozen ways). The agents' rows, locked by the caller, keep it the only
    writer of these needs (`make bench`, scale_*_cpu_per_cycle and persona_cycle_queries: reading them FOR
    UPDATE first, to write the needs that moved alone by an upsert, cost a statement more and locked each row
    twice)."""
    changes: dict[float, list[int]] = {}
    for record in batch:
        for name, delta in record.need_changes.items():
            if delta and name in record.need_rows:
                changes.setdefault(delta, []).append(record.need_rows[name].pk)
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


PLAN_CLOSED = {"status": Plan.Status.CANCELLED, "replan_reason": ""}


UNFINISHED_STEP_STATUSES = [PlanStep.Status.PENDING, PlanStep.Status.RUNNING, PlanStep.Status.AWAITING_APPROVAL]


def plans_closed_steps(closed: Sequence[tuple[Plan, str]], *, runner: str, now: Any) -> list[PlanEvent]:
    """The rest of closing plans once their rows say closed: their unfinished steps skipped (one read, one
    UPDATE), an event each (unsaved)."""
    skipped = PlanStep.objects.filter(plan__in=[plan for plan, _ in closed], status__in=UNFINISHED_STEP_STATUSES)
    rows: dict[int, list[tuple[str, str]]] = {}
    for plan_id, key, status in skipped.order_by("plan_id", "position").values_list("plan_id", "key", "status"):
        rows.setdefault(plan_id, []).append((key, status))
    if rows:
        skipped.update(status=PlanStep.Status.SKIPPED, updated_at=now)
    events = []
    for plan, reason in closed:
        plan.status, plan.replan_reason = PLAN_CLOSED["status"], PLAN_CLOSED["replan_reason"]
        keys = [key for key, _ in rows.get(plan.pk, [])]
        detail: dict[str, Any] = {"skipped": keys, "goal_finished": True}
        # A request that waited for an operator leaves the inbox with nobody's decision on it: the audit and the
        # plan page say so, and why.
        withdrawn = [key for key, status in rows.get(plan.pk, []) if status == PlanStep.Status.AWAITING_APPROVAL]
        if withdrawn:
            detail["withdrawn"] = withdrawn
            reason = f"{reason}; step {', '.join(withdrawn)} left the inbox with nobody's decision"
        events.append(PlanEvent(plan=plan, agent_id=plan.agent_id, kind=PlanEvent.Kind.PLAN_CANCELLED,
                                actor_label=runner, reason=reason[:2000], detail=detail))
    return events


@transaction.atomic
def goals_plans_close(closing: Sequence[tuple[Goal, str]], *, runner: str) -> None:
    """Close every open plan of goals that just finished, each with its reason, in one transaction."""
    plans = goals_open_plans_locked([goal.pk for goal, _ in closing])
    events_traced(PlanEvent.objects.bulk_create(goals_plans_closed(closing, plans, runner=runner)))


def goals_open_plans_locked(goal_ids: Sequence[int]) -> list[Plan]:
    """The open plans of these goals, locked in id order (plans first: the services' lock order)."""
    return list(Plan.objects.select_for_update().filter(goal_id__in=goal_ids).open().order_by("pk")) if goal_ids else []


def goals_plans_closed(closing: Sequence[tuple[Goal, str]], plans: Sequence[Plan], *, runner: str,
                       completed: bool = False) -> list[PlanEvent]:
    """The open plans of goals that just finished (`plans`, locked by the caller: those of other goals are left
    alone) closed, each with its goal's reason; their events (unsaved), pushed after commit. `completed`: the
    milestone check said yes just now, which the agent's timeline records as "Goal completed" with its
    explanation."""
    reasons = {goal.pk: reason for goal, reason in closing}
    plans = [plan for plan in plans if plan.goal_id in reasons]
    now = timezone.now()
    if plans:
        Plan.objects.filter(pk__in=[p.pk for p in plans]).update(**PLAN_CLOSED, updated_at=now)
    events = plans_closed_steps([(plan, reasons[plan.goal_id or 0]) for plan in plans], runner=runner, now=now)
    if completed:
        events += [PlanEvent(agent_id=goal.agent_id, kind=PlanEvent.Kind.GOAL_COMPLETED, actor_label=runner,
                             reason=f"{goal.description}: {goal.milestone_explanation}"[:2000],
                             detail={"goal": goal.pk, "milestone": True}) for goal, _ in closing]
        for agent_id in sorted({goal.agent_id for goal, _ in closing}):
            publish_changed_on_commit(agent_id=agent_id, kind="goal_completed")
    for plan in plans:
        publish_changed_on_commit(agent_id=plan.agent_id, plan_id=plan.pk, kind="plan_closed")
    return events


# --- the Django admin -----------------------------------------------------------------------------------------


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


@dataclass
class Routine:
    """A goal's routine to start: the completed plan it repeats, that plan's steps, the needs now."""

    goal: Goal
    source: Plan
    steps: Sequence[PlanStep]
    needs: Mapping[str, float]


def plan_repeat(*, goal: Goal, source: Plan, needs: Mapping[str, float],
                runner: str) -> tuple[Plan, list[PlanStep]] | None:
    """A goal whose plan (or a plan for the same goal in the same words) completed does the same again: a
    new plan with the completed plan's steps, made without a model call (the person's routine). Steps
    that only served needs that are fine now are left out; none left: None, the caller asks the model.
    Steps that spend money wait for an operator's yes again. Returns the plan and its steps, as created."""
    started = routines_start([Routine(goal=goal, source=source, steps=list(source.steps.all()), needs=needs)],
                             runner=runner)
    return started.get(goal.pk)


@transaction.atomic
def routines_start(routines: Sequence[Routine], *, runner: str) -> dict[int, tuple[Plan, list[PlanStep]]]:
    """plan_repeat for many goals at once (a batch of persona cycles): one INSERT for the plans, one for their
    steps, one for their events, pushed after commit. By goal; a goal none of whose steps is kept is left out."""
    kept: list[tuple[Routine, list[PlanStep]]] = []
    for routine in routines:
        steps = [s for s in routine.steps if s.status == PlanStep.Status.COMPLETED and routine_keeps(
            effects=ACTIONS[s.action_hint].effects if s.action_hint in ACTIONS else {},
            source_needs=routine.goal.source_needs, needs=routine.needs, fine_above=ROUTINE_FINE_ABOVE)]
        if steps:
            kept.append((routine, steps))
    if not kept:
        return {}
    plans = Plan.objects.bulk_create([
        Plan(agent_id=r.goal.agent_id, goal=r.goal, goal_text=r.source.goal_text, status=Plan.Status.ACTIVE,
             approval_mode=Plan.ApprovalMode.ALL, thinking_summary=r.source.thinking_summary,
             confidence=r.source.confidence, risks=list(r.source.risks), model=r.source.model)
        for r, _ in kept])
    made = PlanStep.objects.bulk_create([
        PlanStep(plan=plan, key=s.key, position=position, description=s.description, action_hint=s.action_hint,
                 expected_outcome=s.expected_outcome, estimated_cycles=s.estimated_cycles,
                 depends_on=[d for d in s.depends_on if d in {t.key for t in steps}],
                 requires_permission=s.requires_permission, risk=s.risk)
        for plan, (_, steps) in zip(plans, kept, strict=True) for position, s in enumerate(steps, start=1)])
    PlanEvent.objects.bulk_create([
        PlanEvent(plan=plan, agent_id=plan.agent_id, kind=PlanEvent.Kind.CREATED, actor_label=runner,
                  reason=f"repeats plan #{r.source.pk}, which completed; no model call",
                  detail={"repeats": r.source.pk, "version": plan.version})
        for plan, (r, _) in zip(plans, kept, strict=True)])
    by_plan: dict[int, list[PlanStep]] = {}
    for step in made:
        by_plan.setdefault(step.plan_id, []).append(step)
    for plan in plans:
        publish_changed_on_commit(agent_id=plan.agent_id, plan_id=plan.pk, kind="plan_created")
    return {routine.goal.pk: (plan, by_plan[plan.pk]) for plan, (routine, _) in zip(plans, kept, strict=True)}


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
def roles_change_record(*, user: Any, account: Any, diff: dict[str, list[Any]]) -> PlanEvent | None:
    """A change of an account's role (its groups, its staff or superuser flag, its permissions) made in the admin:
    an event with who, whose and the diff. Nothing changed: nothing recorded."""
    if not diff:
        return None
    return PlanEvent.objects.create(kind=PlanEvent.Kind.ROLES_CHANGED, actor=user if user.is_authenticated else None,
                                    actor_label=user.get_username(), reason=f"roles of {account.get_username()} changed",
                                    detail={"account": account.pk, "diff": diff})


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
