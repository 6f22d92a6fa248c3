"""Persona cycles recorded (seeds 000, 001): every row a cycle changes, in one transaction, with the PlanEvents
that say what happened to plans and steps, and one push per plan after commit; a runner's pass and a persona's
own cycle (a list of one) alike. The agents' own rows of a cycle (their counts, needs, goals, lessons) are
written by agents/services.py.

A cycle is numbered: the agent's cycle_count moves from n to n + 1 in the same transaction that records
experience n + 1, so a cycle re-run after a runner died (or driven twice) changes nothing twice.
"""

from __future__ import annotations

import functools
import logging
import operator
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from django.db import transaction
from django.db.models import F, Q
from django.utils import timezone

from agents.fencing import fence_hold
from agents.models import Agent, Experience, Need
from agents.persona import StepVerdict
from agents.services import (
    agents_cycled,
    change_of,
    cycle_next_at,
    goals_write,
    lessons_learn,
    needs_move,
    rows_write,
)
from goals.models import Goal
from goals.system import GoalState
from planner_site.events import publish_changed_on_commit
from planning.engine.schedule import steps_transitions_refused
from planning.models import Plan, PlanEvent, PlanStep
from planning.services.plans import PLAN_CLOSED, plans_closed_steps
from planning.trace_spans import events_traced

logger = logging.getLogger(__name__)


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


# The columns a cycle writes of each goal its experience moved.


def step_written(*, change: StepChange, runner: str, experience_id: int,
                 now: Any) -> tuple[dict[str, Any], list[PlanEvent], list[str]]:
    """The current step's new values after the experience, the events that say so (unsaved; the plan's own
    event apart), and the statuses it goes through on the way, in order (steps_moved checks them by the one
    state machine and writes the last)."""
    step, plan, verdict = change.step, change.plan, change.verdict
    detail = {"experience": experience_id}
    events: list[PlanEvent] = []

    def event(kind: str, reason: str, extra: dict[str, Any] | None = None) -> None:
        events.append(PlanEvent(plan=plan, agent_id=plan.agent_id, step=step, kind=kind, actor_label=runner,
                                reason=reason[:2000], detail=detail | (extra or {})))

    fields: dict[str, Any] = {"actual_cycles": verdict.actual_cycles, "overrides": verdict.overrides,
                              "updated_at": now}
    path: list[str] = []
    if step.status == PlanStep.Status.PENDING:
        event(PlanEvent.Kind.STEP_STARTED, step.description)
        path.append(PlanStep.Status.RUNNING)
    if not change.followed:
        event(PlanEvent.Kind.STEP_OVERRIDDEN, change.override_reason, {"overrides": verdict.overrides})
    if verdict.completed:
        path.append(PlanStep.Status.COMPLETED)
        fields |= {"result": change.result[:20000], "error": ""}
        event(PlanEvent.Kind.STEP_COMPLETED, change.result)
    elif verdict.replan:
        path.append(PlanStep.Status.FAILED)
        fields["failure_reason"] = verdict.failure
        event(PlanEvent.Kind.STEP_FAILED, verdict.failure, {"replan_scheduled": True})
    return fields, events, path


@transaction.atomic
def persona_cycles_record(records: Sequence[CycleRecord]) -> dict[int, Experience]:
    """Record persona cycles in one transaction, in a fixed number of statements whatever their number: the
    scale-out runtime's pass, and a persona's own cycle as a list of one. A cycle is numbered: one already
    recorded (its agent's count moved on, by another runner or an earlier run) is left out and nothing of it is
    written, so a cycle re-run changes nothing twice. What an operator decided meanwhile stands: a plan whose
    status changed keeps it and the cycle's change to it and its step is dropped; a step whose status changed
    keeps it (the experience is recorded, the step and its plan stay as the operator left them, and a plan that
    did not complete gives its goal no bonus). A step moves only as the one state machine allows (steps_moved).
    A goal the cycle finished closes its open plans (plans_to_close), their unfinished steps skipped.
    Returns the experiences recorded, by agent."""
    fence_hold()  # a runner's: only while it holds the job covering these agents (agents/fencing.py)
    now = timezone.now()
    batch = list(records)
    # The services' lock order: plans, agents, steps. First the plans the cycles close (a goal finished), then
    # those they complete (each marked now, only if its status is still the one read: rows_written_if_unchanged),
    # then those they ask to replan (locked, with their status now); a cycle whose plan's status moved on drops
    # its change to it and its step. A plan the cycle closes takes no other change.
    closing = [plan for r in batch for plan, _ in r.plans_to_close]
    closed = rows_written_if_unchanged(Plan, closing, PLAN_CLOSED, now=now)
    plan_values = {r.agent.pk: {} if r.step_change.plan.pk in {p.pk for p, _ in r.plans_to_close}
                   else step_plan_values(r.step_change) for r in batch if r.step_change is not None}
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
    recorded = {r.agent.pk for r in batch}
    plans_unclaimed([p for r in records if r.agent.pk not in recorded for p, _ in r.plans_to_close if p.pk in closed],
                    now=now)
    if not batch:
        plans_unclaimed([p for p in completing if p.pk in claimed], now=now)
        return {}
    changes: dict[int, StepChange] = {}
    for record in batch:
        change = record.step_change
        values = plan_values.get(record.agent.pk)
        if change is not None and (change.plan.pk in closed if not values and change.plan.pk in closing
                                   else not values or (change.plan.pk in claimed if "status" in values
                                                       else plan_status.get(change.plan.pk) == change.plan.status)):
            changes[record.agent.pk] = change
        agent = record.agent
        agent.cycle_count, agent.emotions = record.expected_cycle + 1, record.emotions
        agent.next_cycle_at = cycle_next_at(agent, now)
    agents_cycled([r.agent for r in batch])
    needs_move([(r.need_changes, r.need_rows) for r in batch], now)
    experiences = Experience.objects.bulk_create([
        experience_of(r, step=changes[r.agent.pk].step if r.agent.pk in changes else None) for r in batch])
    by_agent = {r.agent.pk: e for r, e in zip(batch, experiences, strict=True)}
    events: list[PlanEvent] = []
    moved = [(record, change, *step_written(change=change, runner=record.runner,
                                            experience_id=by_agent[record.agent.pk].pk, now=now))
             for record in batch if (change := changes.get(record.agent.pk)) is not None]
    kept = steps_moved([(change.step, fields, path) for _, change, fields, _, path in moved], now=now)
    completed: list[Plan] = []
    replans: list[Plan] = []
    rewarded: set[int] = set()
    for record, change, fields, step_events, path in moved:
        if change.step.pk not in kept:
            continue  # an operator's decision meanwhile stands
        for name, value in fields.items():
            setattr(change.step, name, value)
        if path:
            change.step.status = path[-1]
        events += step_events
        plan, values = change.plan, plan_values[record.agent.pk]
        if values:
            for name, value in values.items():
                setattr(plan, name, value)
            plan.updated_at = now
            (completed if "status" in values else replans).append(plan)
        if change.plan_completed:
            rewarded.add(plan.pk)
            plan.status = Plan.Status.COMPLETED
            events.append(plan_completed_event(plan, runner=record.runner, experience_id=by_agent[record.agent.pk].pk))
    plans_unclaimed([p for p in completing if p.pk in claimed and p.pk not in {c.pk for c in completed}], now=now)
    rows_write(Plan, replans, ["replan_reason", "updated_at"])
    goals = [pair for r in batch for pair in goals_after(
        r, plan_completed=r.step_change is not None and r.step_change.plan.pk in rewarded)]
    abandoned = goals_write(goals=goals, now=now)
    events += [goal_abandoned_event(goal, state, runner=r.runner, experience_id=by_agent[goal.agent_id].pk)
               for r in batch for goal, state in r.goals if goal.pk in abandoned]
    by_runner: dict[str, list[tuple[Plan, str]]] = {}
    for record in batch:
        by_runner.setdefault(record.runner, []).extend((p, why) for p, why in record.plans_to_close if p.pk in closed)
    for runner, plans in by_runner.items():
        if plans:
            events += plans_closed_steps(plans, runner=runner, now=now)
    lessons_learn([(r.agent, r.lesson, by_agent[r.agent.pk]) for r in batch if r.lesson])
    if events:
        events_traced(PlanEvent.objects.bulk_create(events))
    for record in batch:  # the runner publishes the pass's changes together (published_together)
        current = record.step_change.plan.pk if record.step_change is not None else None
        publish_changed_on_commit(agent_id=record.agent.pk, plan_id=current, kind="experience")
        for plan_id in sorted({p.pk for p, _ in record.plans_to_close if p.pk in closed} - {current}):
            publish_changed_on_commit(agent_id=record.agent.pk, plan_id=plan_id, kind="plan_closed")
    return by_agent


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
    """Plans a pass marked (completed, or closed) whose cycle was not recorded after all (another runner recorded
    it, or its step's status moved on meanwhile): each gets back the status and the replan reason its cycle read
    (uncommon)."""
    read: dict[tuple[str, str], list[int]] = {}
    for plan in plans:
        read.setdefault((plan.status, plan.replan_reason), []).append(plan.pk)
    for (status, replan_reason), pks in read.items():
        Plan.objects.filter(pk__in=pks).update(status=status, replan_reason=replan_reason, updated_at=now)


# The step columns a cycle sets to a value of its own (step_written), beside its counters and updated_at.
STEP_SET = ["status", "result", "error", "failure_reason"]


def steps_moved(moves: Sequence[tuple[PlanStep, Mapping[str, Any], Sequence[str]]], *, now: Any) -> set[int]:
    """The pass's steps moved by their cycles (step_written's fields, and the statuses each goes through), each
    only as the one state machine allows (steps_transitions_refused: a move it refuses is not made, the step is
    left as it was, and its cycle's change to it and its plan is dropped, as for an operator's decision) and only
    if its status is still the one the cycle read: what an operator decided meanwhile (a step skipped, declined,
    approved) stands. One UPDATE for all: its counters moved from their values now, each column's change a CASE
    over the steps that make it (most steps of a pass make the same one, a cycle more on their running step),
    its WHERE the status each read (rows_written_if_unchanged). Returns the steps written (`make bench`,
    persona_cycle_queries and scale_*_cpu_per_cycle: reading the steps FOR UPDATE first, to write them by an
    upsert of seven columns, cost a statement more a pass)."""
    refused = steps_transitions_refused([(step.status, path) for step, _, path in moves])
    for (step, _, path), problem in zip(moves, refused, strict=True):
        if problem is not None:
            logger.warning("step %s not moved through %s: %s", step.pk, ", ".join(path), problem)
    moves = [move for move, problem in zip(moves, refused, strict=True) if problem is None]
    if not moves:
        return set()
    cycles: dict[int, list[int]] = {}
    overrides: dict[int, list[int]] = {}
    columns: dict[str, dict[Any, list[int]]] = {name: {} for name in STEP_SET}
    for step, fields, path in moves:
        cycles.setdefault(fields["actual_cycles"] - step.actual_cycles, []).append(step.pk)
        overrides.setdefault(fields["overrides"] - step.overrides, []).append(step.pk)
        for name, groups in columns.items():
            value = path[-1] if name == "status" and path else fields.get(name, F(name))
            groups.setdefault(value, []).append(step.pk)
    values: dict[str, Any] = {"actual_cycles": F("actual_cycles") + change_of(cycles.items())}
    if set(overrides) != {0}:
        values["overrides"] = F("overrides") + change_of(overrides.items())
    for name, groups in columns.items():
        if set(groups) != {F(name)}:
            values[name] = change_of(groups.items(), output_field=PlanStep._meta.get_field(name))
    return rows_written_if_unchanged(PlanStep, [step for step, _, _ in moves], values, now=now)


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
