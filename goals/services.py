"""The goal system (seed 001) over the database: generate, progress, decay, milestones, samples."""

from __future__ import annotations

import logging
from collections.abc import Mapping

from django.db import transaction
from django.utils import timezone

from agents.llm.gateway import LLMError, llm_complete
from agents.models import Agent
from goals.models import Goal, GoalSample
from goals.system import (
    GENERATION_INTERVAL,
    MAX_GOALS,
    MILESTONE_CHECK_THRESHOLD,
    MILESTONE_SETBACK,
    clamp_unit,
    goal_decay,
    goal_progress_delta,
)
from planning.engine.parse import PlanParseError, plan_parse
from planning.engine.prompts import prompt_goals, prompt_milestone

logger = logging.getLogger("planner.goals")

SAMPLES_KEPT = 240  # per goal: enough for the curve on the agent page


def goals_update(*, agent: Agent, hours: float, need_deltas: Mapping[str, float]) -> list[Goal]:
    """After an experience: decay confidence by horizon, move progress by source-need deltas, sample the curves."""
    now = timezone.now()
    changed: list[Goal] = []
    goals = list(Goal.objects.select_for_update().filter(agent=agent, status=Goal.Status.ACTIVE))
    for goal in goals:
        delta = goal_progress_delta(source_needs=goal.source_needs, need_deltas=need_deltas)
        if delta > 0:
            goal.progress = clamp_unit(goal.progress + delta)
            goal.times_advanced += 1
            goal.last_progressed = now
        elif delta < 0:
            goal.progress = clamp_unit(goal.progress + delta)
            goal.times_regressed += 1
            goal.last_progressed = now
        # A goal that moved forward this cycle was pursued, so it does not lose confidence.
        if delta <= 0:
            goal.confidence, abandoned = goal_decay(confidence=goal.confidence, horizon=goal.horizon, hours=hours)
            if abandoned:
                goal.status = Goal.Status.ABANDONED
        changed.append(goal)
    Goal.objects.bulk_update(changed, ["progress", "confidence", "status", "times_advanced", "times_regressed",
                                       "last_progressed"])
    GoalSample.objects.bulk_create(
        [GoalSample(goal=g, progress=g.progress, confidence=g.confidence) for g in changed]
    )
    return changed


def goal_samples_prune(*, agent: Agent) -> None:
    """Keep the newest SAMPLES_KEPT samples of each goal."""
    for goal_id in Goal.objects.filter(agent=agent).values_list("pk", flat=True):
        old = GoalSample.objects.filter(goal_id=goal_id).order_by("-taken_at", "-pk").values_list("pk", flat=True)[SAMPLES_KEPT:]
        ids = list(old[:1000])
        if ids:
            GoalSample.objects.filter(pk__in=ids).delete()


def goals_due(*, agent: Agent) -> bool:
    active = Goal.objects.filter(agent=agent, status=Goal.Status.ACTIVE).count()
    return active == 0 or (agent.cycle_count > 0 and agent.cycle_count % GENERATION_INTERVAL == 0 and active < MAX_GOALS)


def goals_generate(*, agent: Agent) -> list[Goal]:
    """Ask the fast model for up to 3 new goals from needs, personality, emotions and lessons (seed 001)."""
    needs = {n.name: n.satisfaction for n in agent.needs.all()}
    existing = list(Goal.objects.filter(agent=agent, status=Goal.Status.ACTIVE).values_list("description", flat=True))
    lessons = list(agent.lessons.values_list("description", flat=True)[:10])
    try:
        answer = llm_complete(purpose="goals", agent_id=agent.pk, messages=prompt_goals(
            needs=needs, personality=agent.personality, emotions=agent.emotions, lessons=lessons, existing=existing))
        data = plan_parse(answer.text, allow_single_step=False).data
    except (LLMError, PlanParseError) as exc:
        logger.info("goal generation for %s failed: %s", agent, exc)
        return []
    proposals = data.get("steps") or data.get("goals") or []
    created: list[Goal] = []
    with transaction.atomic():
        room = MAX_GOALS - Goal.objects.filter(agent=agent, status=Goal.Status.ACTIVE).count()
        seen = {e.lower() for e in existing}
        for item in proposals[:3]:
            if room <= 0 or not isinstance(item, dict):
                continue
            description = str(item.get("description", "")).strip()[:500]
            horizon = str(item.get("horizon", Goal.Horizon.SHORT))
            if not description or description.lower() in seen or horizon not in Goal.Horizon.values:
                continue
            needs_named = [str(n) for n in item.get("source_needs", []) if str(n) in needs] if isinstance(item.get("source_needs"), list) else []
            actions = [str(a) for a in item.get("recommended_actions", [])][:5] if isinstance(item.get("recommended_actions"), list) else []
            created.append(Goal.objects.create(
                agent=agent, description=description, horizon=horizon, source_needs=needs_named,
                source_lessons=lessons[:3], recommended_actions=actions,
            ))
            seen.add(description.lower())
            room -= 1
    return created


def goal_milestone_check(*, goal: Goal) -> bool:
    """At progress >= 0.85 ask whether the goal is achieved; yes completes it, no takes some progress back."""
    if goal.progress < MILESTONE_CHECK_THRESHOLD or goal.status != Goal.Status.ACTIVE:
        return False
    agent = goal.agent
    needs = {n.name: n.satisfaction for n in agent.needs.filter(name__in=goal.source_needs)}
    experiences = [f"{e.action}: {e.outcome}" for e in agent.experiences.all()[:5]]
    try:
        answer = llm_complete(purpose="milestone", agent_id=agent.pk, messages=prompt_milestone(
            goal=goal.description, experiences=experiences, needs=needs))
        data = plan_parse(answer.text, allow_single_step=False).data
    except (LLMError, PlanParseError):
        return False
    achieved = data.get("achieved") is True
    with transaction.atomic():
        goal = Goal.objects.select_for_update().get(pk=goal.pk)
        if achieved:
            goal.status = Goal.Status.COMPLETED
            goal.progress = 1.0
        else:
            goal.progress = clamp_unit(goal.progress - MILESTONE_SETBACK)
        goal.save(update_fields=["status", "progress"])
        GoalSample.objects.create(goal=goal, progress=goal.progress, confidence=goal.confidence)
    return achieved
