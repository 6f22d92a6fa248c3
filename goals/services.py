"""The goal system (seed 001) over the database: generation and the milestone check, the two moments that
ask a model. Progress and decay are applied by the persona cycle (agents/services.py) in its transaction.

Model calls happen outside transactions; each write is its own short transaction that pushes after commit.
"""

from __future__ import annotations

import hashlib
import logging
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

from django.core.cache import cache
from django.db import transaction
from django.db.models import F, Window
from django.db.models.functions import RowNumber
from django.utils import timezone

from agents.llm.gateway import LLMError, calls_recorded_together, llm_complete
from agents.llm.schemas import goals_schema, milestone_schema
from agents.models import Agent, Experience, Lesson
from agents.services import rows_write
from goals.models import Goal
from goals.prompts import AnswerUnreadable, goal_proposals, milestone_verdict, prompt_goals, prompt_milestone
from goals.system import (
    GOALS_PER_GENERATION,
    MAX_GOALS,
    RECUR_SHORT_BELOW,
    goal_horizon_placed,
    milestone_after,
)
from planner_site.events import publish_changed_on_commit
from planning.models import PlanEvent
from planning.services.plans import goals_open_plans_locked, goals_plans_closed
from planning.trace_spans import events_traced

logger = logging.getLogger("planner.goals")

LESSONS_IN_PROMPT = 10
LESSONS_PER_GOAL = 3
ACTIONS_PER_GOAL = 5
RECENT_EXPERIENCES = 5


def goals_generate(*, agent: Agent, needs: Mapping[str, float], waiting: Sequence[str] = ()) -> list[Goal]:
    """Ask the fast model for up to 3 new goals from needs, personality, emotions and lessons (seed 001).
    Duplicates of active goals, unknown horizons and goals beyond MAX_GOALS are dropped. `waiting`: active
    goals whose plan waits for an operator, so the model may propose another way to their needs."""
    return goals_generate_many([(agent, needs, waiting)]).get(agent.pk, [])


def goals_generate_many(wanted: Sequence[tuple[Agent, Mapping[str, float], Sequence[str]]]) -> dict[int, list[Goal]]:
    """goals_generate for many agents at once (a pass of persona cycles): their active goals and lessons read
    once for all, each agent's model asked, the calls recorded in one INSERT, the goals created in one
    transaction (goals_create_many). The goals created, by agent."""
    if not wanted:
        return {}
    ids = [agent.pk for agent, _, _ in wanted]
    existing: dict[int, list[str]] = {}
    for agent_id, description in Goal.objects.filter(agent_id__in=ids).active().values_list("agent_id", "description"):
        existing.setdefault(agent_id, []).append(description)
    lessons: dict[int, list[str]] = {}
    for agent_id, description in Lesson.objects.filter(agent_id__in=ids).values_list("agent_id", "description"):
        known = lessons.setdefault(agent_id, [])
        if len(known) < LESSONS_IN_PROMPT:  # the newest (Lesson's ordering)
            known.append(description)
    batch: list[tuple[Agent, Sequence[Proposal], Mapping[str, float], Sequence[str]]] = []
    with calls_recorded_together():
        for agent, needs, waiting in wanted:
            active = existing.get(agent.pk, [])
            try:
                answer = llm_complete(purpose="goals", agent_id=agent.pk, messages=prompt_goals(
                    needs=needs, personality=agent.personality, emotions=agent.emotions,
                    lessons=lessons.get(agent.pk, []), existing=active, waiting=[w for w in waiting if w in active]),
                    schema=goals_schema(list(needs)))
                proposals = goal_proposals(answer.text)
            except (LLMError, AnswerUnreadable) as exc:
                logger.info("goal generation for %s failed: %s", agent, exc)
                continue
            batch.append((agent, proposals[:GOALS_PER_GENERATION], needs, lessons.get(agent.pk, [])))
    return goals_create_many(batch) if batch else {}


RECUR_LOOKBACK = 20  # completed goals searched for one that served a need that is low again

Proposal = Mapping[str, object]


def goals_done_recent(agent_ids: Sequence[int]) -> dict[int, list[dict[str, Any]]]:
    """Each agent's last RECUR_LOOKBACK completed goals, newest first, as the values a proposal needs: one query
    for any number of agents (a window numbers each agent's goals)."""
    rank = Window(RowNumber(), partition_by=[F("agent_id")], order_by=F("pk").desc())
    done: dict[int, list[dict[str, Any]]] = {}
    for row in (Goal.objects.filter(agent_id__in=agent_ids, status=Goal.Status.COMPLETED).annotate(rank=rank)
                .filter(rank__lte=RECUR_LOOKBACK).order_by("agent_id", "-pk")
                .values("agent_id", "description", "horizon", "source_needs", "recommended_actions", "source_lessons")):
        done.setdefault(row["agent_id"], []).append({k: v for k, v in row.items() if k != "agent_id"})
    return done


def recur_proposals(done: Sequence[Mapping[str, Any]], *, needs: Mapping[str, float],
                    room: Sequence[str]) -> list[dict[str, object]]:
    """The goals that recur for the needs in `room` (lowest first): for each, the newest completed goal that
    served it, as a proposal; a need none served is left out (the model is asked for it)."""
    wanted = list(room)
    proposals: list[dict[str, object]] = []
    for goal in done:
        need = next((n for n in wanted if n in goal["source_needs"]), None)
        if need is None:
            continue
        wanted = [n for n in wanted if n not in goal["source_needs"]]
        horizon = Goal.Horizon.SHORT if needs[need] < RECUR_SHORT_BELOW else Goal.Horizon.MID
        proposals.append({**goal, "horizon": horizon, "reasoning": f"{need.capitalize()} is low again at {needs[need]:.0%}; "
                                                f"this goal was achieved before, so it recurs."})
        if not wanted:
            break
    return proposals


def goals_recur_many(wanted: Sequence[tuple[Agent, Mapping[str, float], Sequence[str]]]) -> dict[int, list[Goal]]:
    """A need that drops below the line again brings back the goal that served it last time, without a model
    call: the person knows what to do about hunger once they have done it (docs/seeds.md, "recurring goals").
    For each agent, `room` lists the needs no active goal serves, lowest first; the model is asked only for
    those with no such goal. For any number of agents (a pass of persona cycles, or one): one read of their
    completed goals, one transaction creating what recurs (goals_create_many, like generated goals). The goals
    created, by agent."""
    done = goals_done_recent([agent.pk for agent, _, room in wanted if room])
    batch: list[tuple[Agent, Sequence[Proposal], Mapping[str, float], Sequence[str]]] = [
        (agent, proposals, needs, []) for agent, needs, room in wanted
        if (proposals := recur_proposals(done.get(agent.pk, []), needs=needs, room=room))]
    return goals_create_many(batch) if batch else {}


def goals_create(*, agent: Agent, proposals: Sequence[Proposal], needs: Mapping[str, float],
                 lessons: Sequence[str]) -> list[Goal]:
    """Create an agent's proposed goals (goals_create_many, for one agent)."""
    return goals_create_many([(agent, proposals, needs, lessons)]).get(agent.pk, [])


@transaction.atomic
def goals_create_many(batch: Sequence[tuple[Agent, Sequence[Proposal], Mapping[str, float], Sequence[str]]]
                      ) -> dict[int, list[Goal]]:
    """Create the proposed goals of agents (each with its needs now and lessons), in one transaction whatever
    their number: the agents locked (one generation at a time per agent), their active goals read, each
    proposal kept by goals_from_proposals, one INSERT of the goals and one of their GOALS_GENERATED events
    (which goals, for which needs), pushed after commit. The goals created, by agent."""
    ids = sorted({agent.pk for agent, _, _, _ in batch})
    list(Agent.objects.select_for_update().filter(pk__in=ids).order_by("pk").values_list("pk", flat=True))
    active: dict[int, list[tuple[str, str]]] = {pk: [] for pk in ids}
    for agent_id, description, horizon in Goal.objects.filter(agent_id__in=ids).active().values_list(
            "agent_id", "description", "horizon"):
        active[agent_id].append((description, horizon))
    created: dict[int, list[Goal]] = {}
    for agent, proposals, needs, lessons in batch:
        goals = goals_from_proposals(agent=agent, active=active[agent.pk], proposals=proposals, needs=needs,
                                     lessons=lessons)
        if goals:
            created.setdefault(agent.pk, []).extend(goals)
            active[agent.pk] += [(g.description, g.horizon) for g in goals]
    Goal.objects.bulk_create([goal for goals in created.values() for goal in goals])
    PlanEvent.objects.bulk_create([
        PlanEvent(agent_id=agent_id, kind=PlanEvent.Kind.GOALS_GENERATED, actor_label="goal generation",
                  reason="; ".join(g.description for g in goals)[:4000],
                  detail={"goals": [{"description": g.description, "horizon": g.horizon,
                                     "source_needs": g.source_needs} for g in goals]})
        for agent_id, goals in created.items()])
    for agent_id in created:
        publish_changed_on_commit(agent_id=agent_id, kind=PlanEvent.Kind.GOALS_GENERATED)
    return created


def goals_from_proposals(*, agent: Agent, active: Sequence[tuple[str, str]], proposals: Sequence[Proposal],
                         needs: Mapping[str, float], lessons: Sequence[str]) -> list[Goal]:
    """The goals to create from proposals (unsaved), given the agent's active goals (description, horizon):
    duplicates of active goals, unknown horizons and goals beyond MAX_GOALS are dropped, and each goal's
    horizon follows seed 001's mix (goal_horizon_placed)."""
    seen = {" ".join(d.lower().split()) for d, _ in active}
    room = MAX_GOALS - len(active)
    mix = Counter(h for _, h in active)
    created: list[Goal] = []
    for item in proposals:
        description = " ".join(str(item.get("description", "")).split())[:500]
        proposed = str(item.get("horizon", Goal.Horizon.SHORT))
        if room <= 0 or not description or description.lower() in seen or proposed not in Goal.Horizon.values:
            continue
        horizon = goal_horizon_placed(horizon=proposed, active=mix)  # seed 001's mix: ~3 short, ~4 mid, ~3 long
        if horizon is None:
            continue
        mix[horizon] += 1
        source = item.get("source_needs")
        actions = item.get("recommended_actions")
        known = item.get("source_lessons")  # a recurring goal keeps its own lessons
        goal_lessons = list(lessons) or ([str(x) for x in known] if isinstance(known, list) else [])
        created.append(Goal(
            agent=agent, description=description, horizon=horizon,
            source_needs=[str(n) for n in source if str(n) in needs] if isinstance(source, list) else [],
            source_lessons=goal_lessons[:LESSONS_PER_GOAL],
            recommended_actions=[str(a)[:200] for a in actions][:ACTIONS_PER_GOAL] if isinstance(actions, list) else [],
            reasoning=" ".join(str(item.get("reasoning", "")).split())[:2000],
        ))
        seen.add(description.lower())
        room -= 1
    return created


MILESTONE_KEPT_SECONDS = 6 * 3600  # a verdict stands for its situation this long
MILESTONE_ACTOR = "milestone check"  # who closes a completed goal's plans when no runner asked


def milestone_situation(*, goal: Goal, needs: Mapping[str, float]) -> str:
    """The cache key of a milestone verdict: the agent, the goal in its words, its source needs to the 10%.
    A goal that recurs (goals_recur_many) reaches its milestone again and again at the same levels."""
    levels = ",".join(f"{name}={round(value, 1)}" for name, value in sorted(needs.items()))
    words = " ".join(goal.description.lower().split())
    situation = f"{goal.agent_id}:{goal.agent.created_at.isoformat()}:{words}:{levels}"
    return "goal-milestone:" + hashlib.sha256(situation.encode()).hexdigest()


def goal_milestone_check(*, goal: Goal, runner: str = MILESTONE_ACTOR) -> bool:
    """Progress reached MILESTONE_CHECK_THRESHOLD: ask whether the goal is achieved (goals_milestones_check,
    for one goal, its source needs read now). Returns whether it completed."""
    needs = dict(goal.agent.needs.filter(name__in=goal.source_needs).values_list("name", "satisfaction"))
    return goal.pk in goals_milestones_check([(goal, needs)], runner=runner)


def goals_milestones_check(checks: Sequence[tuple[Goal, Mapping[str, float]]], *,
                           runner: str = MILESTONE_ACTOR) -> set[int]:
    """Goals whose progress reached MILESTONE_CHECK_THRESHOLD, each with its source needs' levels now: ask
    whether each is achieved. Yes completes it and closes its open plans; no takes progress back
    (milestone_after). The explanation is kept, with its event. The verdict for a situation stands: the same
    goal at the same levels is not asked of the model again (one cache read for all). The verdicts are recorded
    in one transaction (a pass's checks together): only of goals still active. Returns the goals completed."""
    keys = {goal.pk: milestone_situation(goal=goal, needs=needs) for goal, needs in checks}
    kept = cache.get_many(list(keys.values()))
    verdicts: dict[int, tuple[bool, str]] = {
        goal.pk: (bool(hit[0]), str(hit[1])) for goal, _ in checks if (hit := kept.get(keys[goal.pk])) is not None}
    asked = [(goal, needs) for goal, needs in checks if goal.pk not in verdicts]
    recent = experiences_recent({goal.agent_id for goal, _ in asked})
    fresh: dict[str, list[object]] = {}
    with calls_recorded_together():  # the checks' calls: one write
        for goal, needs in asked:
            try:
                answer = llm_complete(purpose="milestone", agent_id=goal.agent_id, messages=prompt_milestone(
                    goal=goal.description, experiences=recent.get(goal.agent_id, []), needs=needs),
                    schema=milestone_schema())
                verdicts[goal.pk] = milestone_verdict(answer.text)
            except (LLMError, AnswerUnreadable) as exc:
                logger.info("milestone check of %s failed: %s", goal, exc)
                continue
            fresh[keys[goal.pk]] = list(verdicts[goal.pk])
    if fresh:
        cache.set_many(fresh, MILESTONE_KEPT_SECONDS)
    if not verdicts:
        return set()
    return milestones_record([(goal, needs, verdicts[goal.pk]) for goal, needs in checks if goal.pk in verdicts],
                             runner=runner)


def experiences_recent(agent_ids: set[int]) -> dict[int, list[str]]:
    """Each agent's last RECENT_EXPERIENCES experiences, oldest first, as the milestone prompt lists them: one
    query for any number of agents (a window numbers each agent's experiences)."""
    rank = Window(RowNumber(), partition_by=[F("agent_id")], order_by=F("cycle").desc())
    recent: dict[int, list[str]] = {}
    for agent_id, action, outcome in (Experience.objects.filter(agent_id__in=agent_ids).annotate(rank=rank)
                                      .filter(rank__lte=RECENT_EXPERIENCES).order_by("agent_id", "cycle")
                                      .values_list("agent_id", "action", "outcome")):
        recent.setdefault(agent_id, []).append(f"{action}: {outcome}")
    return recent


MILESTONE_WRITTEN = ["status", "progress", "milestone_explanation", "milestone_checked_at"]


@transaction.atomic
def milestones_record(verdicts: Sequence[tuple[Goal, Mapping[str, float], tuple[bool, str]]], *,
                      runner: str = MILESTONE_ACTOR) -> set[int]:
    """The milestone verdicts of goals, in one transaction: each goal still active (locked) moves by
    milestone_after, with its MILESTONE_CHECKED event and the diff; the callers' goals say what was stored. A
    goal completed closes its open plans (locked first, the services' lock order), its timeline saying "Goal
    completed" by `runner`; all the events in one INSERT (`make bench`, persona_cycle_queries: closing them
    in a transaction of its own cost two statements more). Returns the goals completed."""
    now = timezone.now()
    plans = goals_open_plans_locked([goal.pk for goal, _, (achieved, _) in verdicts if achieved])
    locked = {g.pk: g for g in Goal.objects.select_for_update().filter(pk__in=[g.pk for g, _, _ in verdicts])
              .active().order_by("pk")}
    written: list[Goal] = []
    events: list[PlanEvent] = []
    completed: set[int] = set()
    for goal, needs, (achieved, explanation) in verdicts:
        row = locked.get(goal.pk)
        if row is None:
            continue  # one an operator completed or abandoned meanwhile stays so
        level = sum(needs.values()) / len(needs) if needs else None
        before = row.progress
        row.progress, done = milestone_after(progress=row.progress, achieved=achieved, needs_level=level)
        if done:
            row.status = Goal.Status.COMPLETED
            completed.add(goal.pk)
        row.milestone_explanation, row.milestone_checked_at = explanation, now
        written.append(row)
        events.append(PlanEvent(agent_id=goal.agent_id, kind=PlanEvent.Kind.MILESTONE_CHECKED,
                                actor_label=MILESTONE_ACTOR,
                                reason=f"{goal.description}: {'achieved' if done else 'not yet'} ({explanation})"[:4000],
                                detail={"goal": goal.pk, "achieved": done,
                                        "diff": {"progress": [round(before, 3), round(row.progress, 3)],
                                                 "status": [Goal.Status.ACTIVE, row.status]}}))
        for name in MILESTONE_WRITTEN:  # the caller's goal says what was stored (its plans' closing quotes it)
            setattr(goal, name, getattr(row, name))
    rows_write(Goal, written, MILESTONE_WRITTEN)
    if completed:
        events += goals_plans_closed([(goal, f"goal completed: {goal.description}") for goal, _, _ in verdicts
                                      if goal.pk in completed], plans, runner=runner, completed=True)
    events_traced(PlanEvent.objects.bulk_create(events))
    for agent_id in sorted({goal.agent_id for goal in written}):
        publish_changed_on_commit(agent_id=agent_id, kind=PlanEvent.Kind.MILESTONE_CHECKED)
    return completed
