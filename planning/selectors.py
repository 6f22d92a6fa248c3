"""Reads for the pages and the live pushes: a fixed number of queries per page, whatever its size."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from django.db.models import Count, OuterRef, Prefetch, Q, Subquery

from agents.models import Agent, Experience, LLMCall, Need
from goals.models import Goal, GoalSample
from planning.models import Plan, PlanEvent, PlanStep

TIMELINE_LENGTH = 100


@dataclass
class AgentRow:
    agent: Agent
    plan: Plan | None
    step: PlanStep | None
    done: int = 0
    total: int = 0
    needs: list[Need] = field(default_factory=list)

    @property
    def percent(self) -> int:
        return round(100 * self.done / self.total) if self.total else 0


def plan_current_step(plan: Plan, steps: list[PlanStep]) -> PlanStep | None:
    """The step an operator cares about now: waiting for them, running, or next pending."""
    for status in (PlanStep.Status.AWAITING_APPROVAL, PlanStep.Status.RUNNING, PlanStep.Status.PENDING):
        for step in steps:
            if step.status == status:
                return step
    return None


def dashboard_rows(*, agent_ids: list[int] | None = None) -> list[AgentRow]:
    """One row per agent with its latest plan, current step and progress: four queries in all."""
    latest = Plan.objects.filter(agent=OuterRef("pk")).order_by("-created_at", "-pk").values("pk")[:1]
    # Only the columns a row shows: building model instances (and decoding JSON) is this page's main cost.
    agents_qs = (
        Agent.objects.only("name", "kind", "status", "waiting_reason", "cycle_count")
        .annotate(latest_plan_id=Subquery(latest))
        .prefetch_related(Prefetch("needs", queryset=Need.objects.only("agent_id", "name", "satisfaction").order_by("name")))
    )
    if agent_ids is not None:
        agents_qs = agents_qs.filter(pk__in=agent_ids)
    agents = list(agents_qs)
    plan_ids = [a.latest_plan_id for a in agents if a.latest_plan_id]  # type: ignore[attr-defined]
    steps = PlanStep.objects.only("plan_id", "key", "position", "description", "status")
    plans = {
        p.pk: p
        for p in Plan.objects.filter(pk__in=plan_ids).only("agent_id", "goal_text", "version", "status")
        .prefetch_related(Prefetch("steps", queryset=steps))
    }
    rows = []
    for agent in agents:
        plan = plans.get(agent.latest_plan_id)  # type: ignore[attr-defined]
        plan_steps = list(plan.steps.all()) if plan else []
        rows.append(AgentRow(
            agent=agent, plan=plan, step=plan_current_step(plan, plan_steps) if plan else None,
            done=sum(1 for s in plan_steps if s.status == PlanStep.Status.COMPLETED), total=len(plan_steps), needs=list(agent.needs.all()),
        ))
    return rows


def dashboard_counts() -> dict[str, int]:
    return Agent.objects.aggregate(
        agents=Count("pk"),
        running=Count("pk", filter=Q(status=Agent.Status.RUNNING)),
        waiting=Count("pk", filter=~Q(waiting_reason="")),
    )


def agent_context(agent_id: int) -> dict[str, Any]:
    """Everything the agent page shows."""
    agent = Agent.objects.get(pk=agent_id)
    goals = list(
        Goal.objects.filter(agent=agent).prefetch_related(
            Prefetch("samples", queryset=GoalSample.objects.order_by("taken_at", "pk"))
        ).order_by("status", "horizon", "-confidence")
    )
    for goal in goals:
        goal.curve = goal_curve(list(goal.samples.all()))  # type: ignore[attr-defined]
    plans = list(Plan.objects.filter(agent=agent).annotate(
        steps_total=Count("steps"), steps_done=Count("steps", filter=Q(steps__status=PlanStep.Status.COMPLETED)),
    ).order_by("-created_at")[:20])
    return {
        "agent": agent,
        "needs": list(agent.needs.order_by("name")),
        "goals": goals,
        "plans": plans,
        "experiences": list(Experience.objects.filter(agent=agent).select_related("step").order_by("-cycle")[:15]),
        "lessons": list(agent.lessons.all()[:10]),
    }


def goal_curve(samples: list[GoalSample], width: int = 160, height: int = 36) -> dict[str, str]:
    """SVG polyline points for the progress and confidence curves of a goal."""
    samples = samples[-60:]
    if len(samples) < 2:
        return {"progress": "", "confidence": ""}
    step = width / (len(samples) - 1)

    def points(attr: str) -> str:
        return " ".join(f"{i * step:.1f},{height - getattr(s, attr) * height:.1f}" for i, s in enumerate(samples))

    return {"progress": points("progress"), "confidence": points("confidence")}


def plan_versions(plan: Plan) -> list[Plan]:
    """All versions of this plan, oldest first."""
    chain = [plan]
    seen = {plan.pk}
    cursor = plan
    while cursor.previous_id and cursor.previous_id not in seen:
        cursor = Plan.objects.get(pk=cursor.previous_id)
        chain.insert(0, cursor)
        seen.add(cursor.pk)
    nxt = Plan.objects.filter(previous=chain[-1]).first()
    while nxt is not None and nxt.pk not in seen:
        chain.append(nxt)
        seen.add(nxt.pk)
        nxt = Plan.objects.filter(previous=nxt).first()
    return chain


def plan_context(plan_id: int) -> dict[str, Any]:
    """Everything the plan page shows."""
    plan = Plan.objects.select_related("agent", "goal", "previous").get(pk=plan_id)
    steps = list(plan.steps.select_related("approved_by").all())
    events = list(plan.events.select_related("step")[:TIMELINE_LENGTH])
    attempts = [e for e in events if e.kind == PlanEvent.Kind.ATTEMPT_REJECTED]
    validated = next((e for e in events if e.kind == PlanEvent.Kind.VALIDATED), None)
    calls = list(LLMCall.objects.filter(plan=plan).order_by("created_at", "pk"))
    return {
        "plan": plan,
        "agent": plan.agent,
        "steps": steps,
        "step_keys": {s.key: s for s in steps},
        "current": plan_current_step(plan, steps),
        "events": events,
        "attempts": list(reversed(attempts)),
        "flags": (validated.detail.get("flags", []) if validated else []),
        "diff": (validated.detail.get("diff") if validated else None),
        "calls": calls,
        "versions": plan_versions(plan),
        "done": sum(1 for s in steps if s.status == PlanStep.Status.COMPLETED),  # skipped is not done
    }
