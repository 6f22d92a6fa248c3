"""Writes to an agent's row and its goals: an operator pauses, resumes or stops it or gives it a goal; the
planner records what it waits for and its earliest automatic retry."""

from __future__ import annotations

from django.contrib.auth.models import User
from django.db.models import Subquery

from agents.models import Agent
from goals.models import Goal
from goals.system import MAX_GOALS
from planner_site.validators import text_problem
from planning.models import Plan, PlanEvent, PlanStep
from planning.services.errors import DecisionError
from planning.services.events import event_agent_record, event_record
from planning.services.transactions import atomic_retried


@atomic_retried
def agent_set_status(*, agent: Agent, user: User, status: str) -> Agent:
    """Pause, resume or stop an agent; recorded on its open plan's timeline when it has one."""
    if status not in Agent.Status.values:
        raise DecisionError(f"Unknown status {status!r}.")
    agent = Agent.objects.select_for_update(no_key=True).get(pk=agent.pk)
    if agent.status == status:
        raise DecisionError(f"{agent.name} is already {agent.get_status_display().lower()}.")
    old = agent.status
    agent.status = status
    agent.save(update_fields=["status"])
    plan = Plan.objects.filter(agent=agent).open().order_by("-created_at").first()
    kind = {Agent.Status.RUNNING: PlanEvent.Kind.AGENT_RESUMED, Agent.Status.PAUSED: PlanEvent.Kind.AGENT_PAUSED,
            Agent.Status.STOPPED: PlanEvent.Kind.AGENT_STOPPED}[Agent.Status(status)]
    if plan is not None:
        event_record(plan=plan, kind=kind, actor=user, reason=f"{old} -> {status}")
    else:
        event_agent_record(agent=agent, kind=kind, actor=user, reason=f"{old} -> {status}")
    return agent


@atomic_retried
def agent_give_goal(*, agent: Agent, user: User, description: str, horizon: str = Goal.Horizon.SHORT) -> Goal:
    """Give an agent a goal in words; the runner plans it next cycle."""
    description = " ".join(description.split())
    if not description:
        raise DecisionError("Describe the goal. Nothing was changed.")
    if problem := text_problem(description, max_length=500):
        raise DecisionError(f"The goal {problem}. Nothing was changed.")
    if horizon not in Goal.Horizon.values:
        raise DecisionError(f"Unknown horizon {horizon!r}.")
    agent = Agent.objects.select_for_update(no_key=True).get(pk=agent.pk)
    if agent.kind == Agent.Kind.EXTERNAL:
        raise DecisionError(f"{agent.name} runs elsewhere and submits its own plans over the API; it cannot be "
                            "given a goal here. Nothing was changed.")
    active = Goal.objects.filter(agent=agent).active()
    if active.filter(description__iexact=description).exists():
        raise DecisionError(f"{agent.name} already has this goal.")
    if active.count() >= MAX_GOALS:  # seed 001's cap holds for an operator's goals too
        raise DecisionError(f"{agent.name} already has {MAX_GOALS} active goals, the most an agent pursues at once; "
                            "finish or abandon one first. Nothing was changed.")
    goal = Goal.objects.create(agent=agent, description=description[:500], horizon=horizon, confidence=1.0)
    event_agent_record(agent=agent, kind=PlanEvent.Kind.GOAL_GIVEN, actor=user, reason=goal.description,
                       detail={"goal": goal.pk, "horizon": horizon})
    return goal


def agent_waiting_set(*, agent_id: int, reason: str, retry_sync: bool = False) -> None:
    """What the agent waits for, on its row (the dashboard's "waiting" filter and count); pushed with the
    caller's event. With retry_sync, the earliest automatic retry too, in the same statement (agent_retry_sync).

    An empty `reason` (what it waited for was decided, or it plans afresh) leaves on the row whatever else still
    waits for an operator (waiting_still): a persona plans its next goal while another plan's step awaits
    approval, and that step is still in the inbox. Every wait writes its reason when it starts, so a row that
    says nothing waits is left alone (one UPDATE that matches nothing, the common case, as in every planning),
    and only a row that said something is read again."""
    reason = reason[:300]
    row = Agent.objects.filter(pk=agent_id)
    if retry_sync:
        row.update(waiting_reason=reason, plan_retry_at=agent_retry_earliest(agent_id=agent_id))
        cleared = not reason  # whether it said something before is not known here: read
    else:  # a row that says so already is not written
        cleared = bool(row.exclude(waiting_reason=reason).update(waiting_reason=reason)) and not reason
    if cleared and (still := waiting_still(agent_id=agent_id)):
        row.update(waiting_reason=still[:300])


def waiting_still(*, agent_id: int) -> str:
    """What the agent still waits on, as the services word it: a step awaiting approval in an active plan, else
    a plan awaiting approval, else a plan's question, else "" (what the inbox counts: steer_selectors.inbox_count).
    (An expression computing this inside the UPDATE cost 8 ms of CPU to build: the scale bench's CPU per cycle.)"""
    # The steps of its active plans, filtered here: a status in the query let PostgreSQL scan every waiting
    # step of the fleet (1,000 at 1,000 agents) when its statistics were young (the scale bench's first minute).
    waiting = sorted((updated, pk, key) for key, status, updated, pk in PlanStep.objects.filter(
        plan__agent_id=agent_id, plan__status=Plan.Status.ACTIVE).values_list("key", "status", "updated_at", "pk")
        if status == PlanStep.Status.AWAITING_APPROVAL)
    if waiting:
        return f"step {waiting[0][2]} awaits approval"
    plan = (Plan.objects.filter(agent_id=agent_id).waiting()
            .order_by("status", "created_at", "pk")  # "awaiting_approval" sorts before "needs_clarification"
            .only("status", "version", "clarification_question").first())
    if plan is None:
        return ""
    if plan.status == Plan.Status.AWAITING_APPROVAL:
        return f"plan v{plan.version} awaits approval"
    return f"plan v{plan.version} asks: {plan.clarification_question}"


def agent_retry_earliest(*, agent_id: int) -> Subquery:
    """The earliest automatic retry of the agent's failed plans, as a subquery for an UPDATE of its row."""
    return Subquery(Plan.objects.filter(agent_id=agent_id, status=Plan.Status.FAILED, retry_at__isnull=False)
                    .order_by("retry_at").values("retry_at")[:1])


def agent_retry_sync(*, agent_id: int) -> None:
    """The agent row keeps the earliest automatic retry of its failed plans, so a cycle knows without a query."""
    Agent.objects.filter(pk=agent_id).update(plan_retry_at=agent_retry_earliest(agent_id=agent_id))
