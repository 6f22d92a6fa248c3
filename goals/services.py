"""The goal system (seed 001) over the database: generation and the milestone check, the two moments that
ask a model. Progress and decay are applied by the persona cycle (agents/services.py) in its transaction.

Model calls happen outside transactions; each write is its own short transaction that pushes after commit.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence

from django.db import transaction
from django.utils import timezone

from agents.llm.gateway import LLMError, llm_complete
from agents.models import Agent
from goals.models import Goal
from goals.prompts import AnswerUnreadable, goal_proposals, milestone_verdict, prompt_goals, prompt_milestone
from goals.system import GOALS_PER_GENERATION, MAX_GOALS, RECUR_SHORT_BELOW, milestone_after
from planner_site.events import publish_changed_on_commit

logger = logging.getLogger("planner.goals")

LESSONS_IN_PROMPT = 10
LESSONS_PER_GOAL = 3
ACTIONS_PER_GOAL = 5
RECENT_EXPERIENCES = 5


def goals_generate(*, agent: Agent, needs: Mapping[str, float]) -> list[Goal]:
    """Ask the fast model for up to 3 new goals from needs, personality, emotions and lessons (seed 001).
    Duplicates of active goals, unknown horizons and goals beyond MAX_GOALS are dropped."""
    existing = list(Goal.objects.filter(agent=agent, status=Goal.Status.ACTIVE).values_list("description", flat=True))
    lessons = list(agent.lessons.values_list("description", flat=True)[:LESSONS_IN_PROMPT])
    try:
        answer = llm_complete(purpose="goals", agent_id=agent.pk, messages=prompt_goals(
            needs=needs, personality=agent.personality, emotions=agent.emotions, lessons=lessons, existing=existing))
        proposals = goal_proposals(answer.text)
    except (LLMError, AnswerUnreadable) as exc:
        logger.info("goal generation for %s failed: %s", agent, exc)
        return []
    return goals_create(agent=agent, proposals=proposals[:GOALS_PER_GENERATION], needs=needs, lessons=lessons)


RECUR_LOOKBACK = 20  # completed goals searched for one that served a need that is low again


def goals_recur(*, agent: Agent, needs: Mapping[str, float], room: Sequence[str]) -> list[Goal]:
    """A need that drops below the line again brings back the goal that served it last time, without a model
    call: the person knows what to do about hunger once they have done it (docs/seeds.md, "recurring goals").
    `room` lists the needs no active goal serves, lowest first; the model is asked only for those with no
    such goal. One query; the goals are created by goals_create like generated ones."""
    wanted = list(room)
    proposals: list[dict[str, object]] = []
    done = Goal.objects.filter(agent=agent, status=Goal.Status.COMPLETED).order_by("-pk").values(
        "description", "horizon", "source_needs", "recommended_actions", "source_lessons")[:RECUR_LOOKBACK]
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
    if not proposals:
        return []
    return goals_create(agent=agent, proposals=proposals, needs=needs, lessons=[])


@transaction.atomic
def goals_create(*, agent: Agent, proposals: Sequence[Mapping[str, object]], needs: Mapping[str, float],
                 lessons: Sequence[str]) -> list[Goal]:
    Agent.objects.select_for_update().filter(pk=agent.pk).first()  # one generation at a time per agent
    active = list(Goal.objects.filter(agent=agent, status=Goal.Status.ACTIVE).values_list("description", flat=True))
    seen = {" ".join(d.lower().split()) for d in active}
    room = MAX_GOALS - len(active)
    created: list[Goal] = []
    for item in proposals:
        description = " ".join(str(item.get("description", "")).split())[:500]
        horizon = str(item.get("horizon", Goal.Horizon.SHORT))
        if room <= 0 or not description or description.lower() in seen or horizon not in Goal.Horizon.values:
            continue
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
    Goal.objects.bulk_create(created)
    if created:
        publish_changed_on_commit(agent_id=agent.pk, kind="goals_generated")
    return created


def goal_milestone_check(*, goal: Goal) -> bool:
    """Progress reached MILESTONE_CHECK_THRESHOLD: ask whether the goal is achieved. Yes completes it (the
    caller closes its open plans); no takes MILESTONE_SETBACK of progress back. The explanation is kept."""
    agent = goal.agent
    needs = {n.name: n.satisfaction for n in agent.needs.filter(name__in=goal.source_needs)}
    experiences = [f"{e.action}: {e.outcome}" for e in agent.experiences.order_by("-cycle")[:RECENT_EXPERIENCES]]
    try:
        answer = llm_complete(purpose="milestone", agent_id=agent.pk, messages=prompt_milestone(
            goal=goal.description, experiences=list(reversed(experiences)), needs=needs))
        achieved, explanation = milestone_verdict(answer.text)
    except (LLMError, AnswerUnreadable) as exc:
        logger.info("milestone check of %s failed: %s", goal, exc)
        return False
    with transaction.atomic():
        locked = Goal.objects.select_for_update().get(pk=goal.pk)
        if locked.status != Goal.Status.ACTIVE:
            return False
        locked.progress, completed = milestone_after(progress=locked.progress, achieved=achieved)
        if completed:
            locked.status = Goal.Status.COMPLETED
        locked.milestone_explanation = explanation
        locked.milestone_checked_at = timezone.now()
        fields = ["status", "progress", "milestone_explanation", "milestone_checked_at"]
        locked.save(update_fields=fields)
        publish_changed_on_commit(agent_id=agent.pk, kind="milestone")
    for name in fields:  # the caller's goal says what was stored (its plans' closing quotes the explanation)
        setattr(goal, name, getattr(locked, name))
    return completed
