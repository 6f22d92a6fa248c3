"""What the agent page shows of a persona: goals short-term first with the current step's goal marked, the
values the cycle computes (milestone explanations, reasoning, reflections, override counters), and the
curves of needs, progress and confidence drawn from the experiences. A fixed number of queries."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from django.db.models import Case, Exists, F, IntegerField, OuterRef, Value, When, Window
from django.db.models.functions import RowNumber

from agents.llm.context import percent
from agents.models import Agent, Experience, Lesson, LLMCall
from agents.persona import PLAN_NEEDS_BELOW, goal_plan_waits_for
from goals.models import Goal
from goals.system import HORIZON_ORDER
from planning.engine.schedule import steps_runnable
from planning.models import Plan, PlanStep

CURVE_POINTS = 60  # experiences drawn in each curve
CURVE_WIDTH = 160
CURVE_HEIGHT = 36
FINISHED_GOALS_SHOWN = 10
GOAL_CALLS_SHOWN = 10


def lessons_recent(agent_ids: Iterable[int], *, limit: int) -> dict[int, list[str]]:
    """Each agent's `limit` newest lessons, newest first (as a decision prompt quotes them): one query for any
    number of agents, a window numbering each agent's lessons."""
    rank = Window(RowNumber(), partition_by=[F("agent_id")], order_by=[F("created_at").desc(), F("pk").desc()])
    lessons: dict[int, list[str]] = {}
    for agent_id, description in (Lesson.objects.filter(agent_id__in=set(agent_ids)).annotate(rank=rank)
                                  .filter(rank__lte=limit).order_by("agent_id", "rank")
                                  .values_list("agent_id", "description")):
        lessons.setdefault(agent_id, []).append(description)
    return lessons


@dataclass
class OpenPlan:
    plan: Plan
    steps: list[PlanStep] = field(default_factory=list)
    current: PlanStep | None = None


def curve_points(values: list[float | None], *, width: int = CURVE_WIDTH, height: int = CURVE_HEIGHT) -> str:
    """SVG polyline points for values in 0..1, oldest first; a missing value breaks nothing, it is skipped."""
    if len(values) < 2:
        return ""
    step = width / (len(values) - 1)
    return " ".join(f"{i * step:.1f},{height - max(0.0, min(1.0, v)) * height:.1f}"
                    for i, v in enumerate(values) if v is not None)


def plan_step_now(steps: list[PlanStep]) -> PlanStep | None:
    """The step a persona's plan is on (the cycle's rule): running or waiting, else the next runnable one."""
    for step in steps:
        if step.status in (PlanStep.Status.RUNNING, PlanStep.Status.AWAITING_APPROVAL):
            return step
    keys = steps_runnable([(s.key, s.status, s.depends_on) for s in steps], limit=1)
    return next((s for s in steps if s.key in keys), None)


def ordinal(n: int) -> str:
    """1st, 2nd, 3rd, 4th, ..., 11th, 12th, 13th, 21st."""
    suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"


def plan_waits_for_a_person(plan: Plan, steps: list[PlanStep]) -> bool:
    """A plan that waits for a person: a step awaiting approval, or the plan itself awaiting approval or an
    answer. A persona's plan that waits is parked: it keeps its goal, not its horizon (agents/cycle.py)."""
    return plan.status in (Plan.Status.AWAITING_APPROVAL, Plan.Status.CLARIFYING) or any(
        s.status == PlanStep.Status.AWAITING_APPROVAL for s in steps)


def goals_plan_waits(*, goals: list[Goal], needs: Mapping[str, float], open_horizons: set[str]) -> None:
    """Why each active goal without a plan has none yet, and its place in the line (the persona cycle's rule:
    goals in priority order; a horizon with an open plan takes no second one; mid- and long-term goals wait
    for a source need below PLAN_NEEDS_BELOW; the first goal free of both is planned next cycle). Each goal
    gets `plan_wait` (empty when it has a plan)."""
    line = [g for g in goals if not g.plan_open and not g.plan_failed]  # type: ignore[attr-defined]
    first_free = True
    for goal in goals:
        goal.plan_wait = (  # type: ignore[attr-defined]
            "its plan failed: waits for the automatic retry or an operator's replan"
            if goal.plan_failed and not goal.plan_open else "")  # type: ignore[attr-defined]
    for place, goal in enumerate(line, start=1):
        waits_for = goal_plan_waits_for(horizon=goal.horizon, source_needs=goal.source_needs, needs=needs)
        if goal.horizon in open_horizons:
            why = f"waits: the open {goal.get_horizon_display().lower()} plan comes first (one plan per horizon)"
        elif waits_for:
            levels = " or ".join(f"{name} {percent(level)}" for name, level in sorted(waits_for.items()))
            why = f"waits: {levels} must drop below {percent(PLAN_NEEDS_BELOW)}"
        elif first_free:
            why, first_free = "to be planned next cycle", False
        else:
            why = "waits for the goals before it to be planned"
        goal.plan_wait = f"{why}; {ordinal(place)} in line"  # type: ignore[attr-defined]


def persona_page(agent: Agent, need_levels: Mapping[str, float]) -> dict[str, Any]:
    """The persona parts of the agent page (five queries)."""
    priority = Case(*[When(horizon=h, then=Value(n)) for h, n in HORIZON_ORDER.items()], output_field=IntegerField())
    goal_plans = Plan.objects.filter(goal=OuterRef("pk"))
    active: list[Goal] = list(Goal.objects.filter(agent=agent).active().alias(p=priority).annotate(
        plan_open=Exists(goal_plans.open()),
        plan_failed=Exists(goal_plans.filter(status=Plan.Status.FAILED)),
    ).order_by("p", "-confidence", "pk"))
    shown = list(active)
    shown += list(Goal.objects.filter(agent=agent).exclude(status=Goal.Status.ACTIVE)
                  .order_by("-milestone_checked_at", "-pk")[:FINISHED_GOALS_SHOWN])

    open_plans: dict[int, OpenPlan] = {}
    for step in (PlanStep.objects.filter(plan__agent=agent, plan__status__in=Plan.OPEN_STATUSES)
                 .select_related("plan", "plan__goal").order_by("plan__created_at", "plan_id", "position")):
        open_plans.setdefault(step.plan_id, OpenPlan(plan=step.plan)).steps.append(step)
    for entry in open_plans.values():
        entry.current = plan_step_now(entry.steps)
    plans = sorted(open_plans.values(), key=lambda e: (
        HORIZON_ORDER.get(e.plan.goal.horizon, len(HORIZON_ORDER)) if e.plan.goal else len(HORIZON_ORDER),
        e.plan.created_at))
    following = next((e for e in plans if e.plan.status == Plan.Status.ACTIVE and not e.plan.replan_reason
                      and e.current is not None and e.current.status != PlanStep.Status.AWAITING_APPROVAL), None)
    current_goal_id = following.plan.goal_id if following else None
    if agent.kind == Agent.Kind.PERSONA:
        # A plan with steps holds its horizon unless it waits for a person (parked); one without steps holds it.
        with_steps = {e.plan.goal_id for e in plans}
        open_horizons = {g.horizon for g in active if g.plan_open and g.pk not in with_steps}  # type: ignore[attr-defined]
        open_horizons |= {e.plan.goal.horizon for e in plans
                          if e.plan.goal is not None and not plan_waits_for_a_person(e.plan, e.steps)}
        goals_plan_waits(goals=active, needs=need_levels, open_horizons=open_horizons)

    history = list(reversed(Experience.objects.filter(agent=agent).order_by("-cycle")
                            .values_list("needs_after", "goals_after")[:CURVE_POINTS]))
    names = sorted({name for needs, _ in history for name in needs})
    need_curves = [{"name": name, "points": curve_points([needs.get(name) for needs, _ in history])} for name in names]
    for goal in shown:
        points = [after.get(str(goal.pk)) for _, after in history]
        goal.curve = {  # type: ignore[attr-defined]
            "progress": curve_points([p[0] if p else None for p in points]),
            "confidence": curve_points([p[1] if p else None for p in points]),
        }
        goal.is_current = goal.pk == current_goal_id  # type: ignore[attr-defined]
    calls = list(LLMCall.objects.filter(agent=agent, purpose__in=[LLMCall.Purpose.GOALS, LLMCall.Purpose.MILESTONE])
                 .order_by("-created_at")[:GOAL_CALLS_SHOWN])
    return {
        "goals": shown,
        "open_plans": plans,
        "following": following,
        "need_curves": need_curves,
        "goal_calls": calls,
    }
