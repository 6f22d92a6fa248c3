"""What the agent page shows of a persona: goals short-term first with the current step's goal marked, the
values the cycle computes (milestone explanations, reasoning, reflections, override counters), and the
curves of needs, progress and confidence drawn from the experiences. A fixed number of queries."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from django.db.models import Case, Exists, F, FloatField, IntegerField, OuterRef, Value, When, Window
from django.db.models.functions import RowNumber
from django.utils import timezone

from agents.llm.context import percent
from agents.models import Agent, Experience, Lesson, LLMCall
from agents.persona import PLAN_NEEDS_BELOW, goal_plan_waits_for
from agents.world import URGENT_BELOW
from goals.models import Goal
from goals.system import ABANDON_BELOW, DECAY_PER_HOUR, HORIZON_ORDER, MILESTONE_CHECK_THRESHOLD
from planning.charts import LineChart, Sample, Series, Threshold, line_chart_kept
from planning.engine.schedule import steps_runnable
from planning.models import Plan, PlanStep

# The experiences the charts are drawn from: the newest HISTORY_EXPERIENCES. Every action takes at least an hour
# of simulated time (agents/world.py), and the slowest decay (a long-term goal's, goals/system.py) takes a goal
# from full confidence to abandonment in 475 simulated hours: a goal's whole unpursued life fits in this window.
# Each chart then keeps ~100 samples of it (planning/charts.py POINTS_LIMIT).
HISTORY_EXPERIENCES = 500
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


@dataclass(frozen=True)
class HistoryPoint:
    """One experience: its cycle, the simulated hours elapsed since the oldest one read (a running sum of the
    hours each action took), its wall clock, and the needs and goals after it."""

    cycle: int
    hours: float
    clock: str
    needs: dict[str, float]
    goals: dict[str, list[float]]


def experiences_history(agent_id: int) -> list[HistoryPoint]:
    """The agent's newest HISTORY_EXPERIENCES experiences, oldest first, with their running simulated hours:
    one query."""
    rows = list(Experience.objects.filter(agent_id=agent_id).order_by("-cycle")
                .values_list("cycle", "hours", "created_at", "needs_after", "goals_after")[:HISTORY_EXPERIENCES])
    rows.reverse()
    history, elapsed = [], 0.0
    for i, (cycle, hours, at, needs, goals) in enumerate(rows):
        if i:  # an experience's values are those after its action: its hours lie between it and the one before
            elapsed += float(hours or 0.0)
        history.append(HistoryPoint(cycle=cycle, hours=elapsed, clock=timezone.localtime(at).strftime("%H:%M:%S"),
                                    needs=needs or {}, goals=goals or {}))
    return history


def needs_chart(history: list[HistoryPoint]) -> LineChart | None:
    """The needs over the sampled history, with the urgency line (agents/world.py URGENT_BELOW)."""
    names = sorted({name for p in history for name in p.needs})
    if not names:
        return None
    start = history[0].hours
    return line_chart_kept(
        title="Needs over time", series=tuple(Series(name=n, key=f"need-{i}") for i, n in enumerate(names, start=1)),
        samples=tuple(Sample(hours=p.hours - start, clock=p.clock, values=tuple(p.needs.get(n) for n in names))
                      for p in history),
        thresholds=(Threshold(label=f"urgent below {percent(URGENT_BELOW)}", value=URGENT_BELOW, key="urgent"),),
        width=360)  # the needs card is the narrow one: a narrower box keeps its text as large as the goal charts'


NEAR_ABANDON_HOURS = 12.0  # a goal this few simulated hours of decay from abandonment is flagged on its page


def goal_abandon_hours(*, horizon: str, confidence: float) -> float:
    """The simulated hours of decay left before a goal at this confidence is abandoned (goals/system.py: its
    confidence falls DECAY_PER_HOUR of its horizon, and it is abandoned below ABANDON_BELOW)."""
    rate = DECAY_PER_HOUR.get(horizon, 0.0)
    return max(confidence - ABANDON_BELOW.get(horizon, 0.0), 0.0) / rate if rate > 0 else float("inf")


def goal_abandon_forecast(*, horizon: str, confidence: float) -> tuple[str, bool]:
    """What the decay rule (goals/system.py) says of an active goal: how fast its confidence falls, how many
    simulated hours of that decay are left before it is abandoned, and whether that is NEAR_ABANDON_HOURS or
    fewer. Confidence never rises: only pursuit's waiting for a person holds it."""
    below, rate = ABANDON_BELOW.get(horizon, 0.0), DECAY_PER_HOUR.get(horizon, 0.0)
    if rate <= 0:
        return f"Abandoned below {percent(below)} confidence.", False
    left = goal_abandon_hours(horizon=horizon, confidence=confidence)
    when = "within the next simulated hour" if left < 1 else f"in about {left:.0f} simulated hours"
    text = (f"Confidence falls {rate * 100:g} points a simulated hour: below {percent(below)} (abandoned) {when} "
            f"unless its plan waits for a person.")
    return text, left <= NEAR_ABANDON_HOURS


def goal_chart(goal: Goal, history: list[HistoryPoint]) -> LineChart | None:
    """A goal's progress and confidence over its whole sampled life, with its horizon's abandonment line
    (goals/system.py ABANDON_BELOW) and the milestone line (MILESTONE_CHECK_THRESHOLD)."""
    key = str(goal.pk)
    points = [(p, p.goals[key]) for p in history if isinstance(p.goals.get(key), list) and len(p.goals[key]) >= 2]
    if not points:
        return None
    abandon = ABANDON_BELOW.get(goal.horizon, 0.0)
    start = points[0][0].hours
    return line_chart_kept(
        title=f"Progress and confidence of “{goal.description}”",
        series=(Series(name="progress", key="progress"), Series(name="confidence", key="confidence")),
        samples=tuple(Sample(hours=p.hours - start, clock=p.clock, values=(float(v[0]), float(v[1]))) for p, v in points),
        thresholds=(Threshold(label=f"milestone check at {percent(MILESTONE_CHECK_THRESHOLD)} progress",
                              value=MILESTONE_CHECK_THRESHOLD, key="milestone"),
                    Threshold(label=f"abandoned below {percent(abandon)} confidence", value=abandon, key="abandon")))


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
    answer. A persona's plan that waits is parked: it keeps its goal, not its horizon (runtime/cycle.py)."""
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

    history = experiences_history(agent.pk)
    for goal in shown:
        goal.chart = goal_chart(goal, history)  # type: ignore[attr-defined]
        goal.chart_id = f"chart-goal-{goal.pk}"  # type: ignore[attr-defined]
        # Only a persona's cycle decays its goals (goals/system.py goal_after_experience): a tool agent's wait.
        forecast = (goal_abandon_forecast(horizon=goal.horizon, confidence=goal.confidence)
                    if agent.kind == Agent.Kind.PERSONA and goal.status == Goal.Status.ACTIVE else ("", False))
        goal.abandon_forecast, goal.near_abandon = forecast  # type: ignore[attr-defined]
        goal.is_current = goal.pk == current_goal_id  # type: ignore[attr-defined]
    calls = list(LLMCall.objects.filter(agent=agent, purpose__in=[LLMCall.Purpose.GOALS, LLMCall.Purpose.MILESTONE])
                 .order_by("-created_at")[:GOAL_CALLS_SHOWN])
    return {
        "goals": shown,
        "open_plans": plans,
        "following": following,
        "needs_chart": needs_chart(history),
        "goal_calls": calls,
    }


# --- the dashboard's glance: each persona's most urgent goal -----------------------------------------------------

GLANCE_CYCLES = 24  # the sparkline of a persona's most urgent goal covers its last cycles


@dataclass
class UrgentGoal:
    """A persona's active goal nearest abandonment (the fewest simulated hours of decay left, goal_abandon_hours), with
    its confidence over the persona's last GLANCE_CYCLES cycles (oldest first)."""

    agent_id: int
    agent_name: str
    goal: Goal
    abandon_below: float
    confidences: list[float] = field(default_factory=list)
    hours_left: float = 0.0

    @property
    def near(self) -> bool:
        return self.hours_left <= NEAR_ABANDON_HOURS


def personas_goal_most_urgent(agent_ids: Iterable[int]) -> list[UrgentGoal]:
    """For each of these agents that is a persona with an active goal, its most urgent goal and the goal's recent
    confidence: two queries for any number of agents (the goals ranked in one, the recent experiences of all the
    agents in the other). Most urgent first."""
    ids = sorted(set(agent_ids))
    if not ids:
        return []
    # goal_abandon_hours in SQL: the simulated hours of decay left before abandonment.
    hours_left = Case(*[When(horizon=h, then=(F("confidence") - Value(ABANDON_BELOW[h])) / Value(rate))
                        for h, rate in DECAY_PER_HOUR.items() if rate > 0],
                      default=Value(1e9), output_field=FloatField())
    rank = Window(RowNumber(), partition_by=[F("agent_id")], order_by=[F("hours_left").asc(), F("pk").asc()])
    goals = list(Goal.objects.filter(agent_id__in=ids, agent__kind=Agent.Kind.PERSONA).active()
                 .annotate(hours_left=hours_left, agent_name=F("agent__name")).annotate(rank=rank).filter(rank=1)
                 .only("id", "agent_id", "description", "horizon", "confidence", "progress"))
    if not goals:
        return []
    # An agent's experiences are numbered by its cycle count: the last GLANCE_CYCLES by the (agent, cycle) index.
    history: dict[int, list[dict[str, Any]]] = {}
    for agent_id, after in (Experience.objects.filter(agent_id__in=[g.agent_id for g in goals],
                                                      cycle__gt=F("agent__cycle_count") - GLANCE_CYCLES)
                            .order_by("agent_id", "cycle").values_list("agent_id", "goals_after")):
        history.setdefault(agent_id, []).append(after or {})
    urgent = []
    for goal in goals:
        key = str(goal.pk)
        values = [float(a[key][1]) for a in history.get(goal.agent_id, [])
                  if isinstance(a.get(key), list) and len(a[key]) >= 2]
        urgent.append(UrgentGoal(agent_id=goal.agent_id, agent_name=goal.agent_name,  # type: ignore[attr-defined]
                                 goal=goal, abandon_below=ABANDON_BELOW.get(goal.horizon, 0.0),
                                 confidences=values or [goal.confidence],
                                 hours_left=goal_abandon_hours(horizon=goal.horizon, confidence=goal.confidence)))
    urgent.sort(key=lambda u: (u.hours_left, u.agent_name))
    return urgent
