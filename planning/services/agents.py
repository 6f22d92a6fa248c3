"""Writes to an agent's row and its goals: an operator pauses, resumes or stops it or gives it a goal; the
planner records what it waits for and its earliest automatic retry."""

from __future__ import annotations

from collections.abc import Sequence

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
    """What the agent still waits on (waiting_still_many, for one agent)."""
    return waiting_still_many([agent_id])[agent_id]


def waiting_still_many(agent_ids: Sequence[int]) -> dict[int, str]:
    """What each agent still waits on, as the services word it: a step awaiting approval in an active plan (the
    one waiting longest), else a plan awaiting approval, else a plan's question, else "" (what the inbox counts:
    steer_selectors.inbox_count). Two queries whatever the number of agents. (An expression computing this
    inside the UPDATE cost 8 ms of CPU to build: the scale bench's CPU per cycle.)"""
    still = dict.fromkeys(agent_ids, "")
    # The steps of their active plans, filtered here: a status in the query let PostgreSQL scan every waiting
    # step of the fleet (1,000 at 1,000 agents) when its statistics were young (the scale bench's first minute).
    steps = sorted((updated, pk, agent_id, key) for agent_id, key, status, updated, pk in PlanStep.objects.filter(
        plan__agent_id__in=still, plan__status=Plan.Status.ACTIVE).values_list(
        "plan__agent_id", "key", "status", "updated_at", "pk") if status == PlanStep.Status.AWAITING_APPROVAL)
    for _, _, agent_id, key in reversed(steps):  # the earliest last: it stands
        still[agent_id] = f"step {key} awaits approval"
    rest = [pk for pk, reason in still.items() if not reason]
    plans = (Plan.objects.filter(agent_id__in=rest).waiting()
             .order_by("-status", "-created_at", "-pk")  # "awaiting_approval" sorts before "needs_clarification"
             .only("agent_id", "status", "version", "clarification_question")) if rest else []
    for plan in plans:  # the first in that order last: it stands
        if plan.status == Plan.Status.AWAITING_APPROVAL:
            still[plan.agent_id] = f"plan v{plan.version} awaits approval"
        else:
            still[plan.agent_id] = f"plan v{plan.version} asks: {plan.clarification_question}"
    return still


def agents_waiting_refresh(agent_ids: Sequence[int]) -> None:
    """agent_waiting_set(reason="") for many agents whose rows said something waits (a runner's pass starting
    their plans): each row says what still waits (waiting_still_many), written only where it says otherwise, one
    UPDATE per reason. Per agent, the clear and the reads again were four statements of every planning in the
    scale bench's first minute, where most personas have a step in the inbox."""
    if not agent_ids:
        return
    by_reason: dict[str, list[int]] = {}
    for agent_id, reason in waiting_still_many(agent_ids).items():
        by_reason.setdefault(reason[:300], []).append(agent_id)
    for reason, ids in by_reason.items():
        Agent.objects.filter(pk__in=ids).exclude(waiting_reason=reason).update(waiting_reason=reason)


def agent_retry_earliest(*, agent_id: int) -> Subquery:
    """The earliest automatic retry of the agent's failed plans, as a subquery for an UPDATE of its row."""
    return Subquery(Plan.objects.filter(agent_id=agent_id, status=Plan.Status.FAILED, retry_at__isnull=False)
                    .order_by("retry_at").values("retry_at")[:1])


def agent_retry_sync(*, agent_id: int) -> None:
    """The agent row keeps the earliest automatic retry of its failed plans, so a cycle knows without a query."""
    Agent.objects.filter(pk=agent_id).update(plan_retry_at=agent_retry_earliest(agent_id=agent_id))
