"""One cycle of one agent: what the runner does each time an agent's turn comes.

Persona agents (seeds 000, 001): up to three open plans, one per horizon, carry the person. A plan whose step
waits for a person is parked: it stays in the inbox and its goal is held (no decay) until someone answers, while
the person goes on with the next plan, even of the same horizon. Each cycle the
current step (short-term plan first, then mid, then long) gives the action without a model call, unless a
need is urgent and the rules would override it (a decision taken for the same situation is not asked again); the world applies the action, needs and goals decay by the
hours it took, and the experience advances or stalls the step, the plan and the goals. The model is asked
only on the uncommon paths: a goal to plan, a plan to replan, a goal re-evaluation that found room, a goal
whose progress crossed the milestone line, an urgent need.
Tool agents (seeds 002, 003): a given goal is planned, the operator approves, then runnable steps
execute in the agent's workspace, respecting dependencies.
"""

from __future__ import annotations

import functools
import hashlib
import logging
from collections.abc import Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from django.conf import settings
from django.core.cache import cache
from django.db.models import Exists, OuterRef, Q, QuerySet, Subquery
from django.utils import timezone

from agents.fencing import fence_lease_check
from agents.llm.extract import ExtractError, json_extract
from agents.llm.gateway import Deadline, LLMError, answers_at_once, calls_recorded_together, llm_complete
from agents.llm.limits import calls_for
from agents.llm.placeholders import junk_problem, placeholder_or_example
from agents.llm.schemas import decide_schema
from agents.models import Agent, Need
from agents.persona import MAX_ACTIVE_PLANS, goal_plannable, step_evaluate
from agents.selectors import lessons_recent, plan_waits_for_a_person
from agents.services import agent_cycle_count, agents_cycle_count
from agents.tools import (
    ToolError,
    tool_began,
    tool_began_mark,
    tool_effect_found,
    tool_has_effects,
    tool_run,
    undo_dir_for,
)
from agents.world import (
    ACTIONS,
    action_apply,
    action_choose,
    action_hours,
    action_lesson,
    action_needs_permission,
    emotions_update,
    idle_hours,
    needs_changes,
    urgent_need,
)
from goals.models import Goal
from goals.services import goals_generate_many, goals_milestones_check, goals_recur_many
from goals.system import (
    PLAN_COMPLETION_BONUS,
    GoalState,
    goal_after_experience,
    goal_priority,
    goals_reevaluation_due,
    goals_room,
)
from planning.engine.prompts import plan_step_directive, prompt_decide_action
from planning.engine.schedule import steps_blocked, steps_runnable
from planning.models import Plan, PlanEvent, PlanStep, step_current
from planning.planner import (
    MAX_REPLANS,
    First,
    firsts_each,
    plan_continue,
    plan_generate,
    plan_interrupted_fail,
    plan_retry_due,
    plans_first,
    plans_interrupted_fail,
)
from planning.selectors import plan_feedback
from planning.services import (
    GoalAlreadyPlanned,
    PlanAlreadyReplanned,
    Routine,
    plan_abandon,
    plan_repeat,
    plan_replan_schedule,
    routines_start,
    step_finish,
    step_outcome_unknown,
    step_start,
    steps_request_approval,
)
from planning.services.a2a import a2a_cycle
from planning.services.agui import agui_cycle
from planning.services.cycles import CycleRecord, StepChange, persona_cycles_record
from planning.services.plans import goals_plans_close

logger = logging.getLogger("planner.cycle")

TOOL_STEPS_PER_CYCLE = 2  # independent tool steps may run side by side, bounded
LESSONS_IN_DECISION_PROMPT = 5
GOALS_IN_DECISION_PROMPT = 5


def agent_cycle(*, agent_id: int, runner: str, kind: str = "") -> str:
    """Drive one cycle; returns a short description of what happened (for logs and tests). `kind`: what the
    caller knows of the agent's kind (the runner, from its claim): a tool agent's cycle then reads only its
    row, not the persona read as well; a wrong guess costs that one read.

    A tool agent's model calls are an operator's (its plan, a replan after a decline, the plan after an answered
    question: first in line for the model); a persona's are background ones that wait no longer than its cycle
    for their turn, after which its rules decide (agents/llm/limits.py)."""
    rows = persona_rows(agent_id) if kind not in (Agent.Kind.TOOL, Agent.Kind.A2A, Agent.Kind.AGUI) else None
    agent = rows.agent if rows is not None else agent_read(agent_id)
    if agent.status != Agent.Status.RUNNING:
        return "not running"
    if agent.kind == Agent.Kind.A2A:  # a remote agent: its task is followed, nothing planned here
        return a2a_cycle(agent=agent, runner=runner)
    if agent.kind == Agent.Kind.AGUI:  # a remote AG-UI agent: its runs are started and read, nothing planned here
        return agui_cycle(agent=agent, runner=runner)
    if agent.kind == Agent.Kind.TOOL:
        with calls_for(operator=True):
            return agent_cycle_run(agent=agent, agent_id=agent_id, rows=rows, runner=runner, kind=kind)
    with calls_for(wait_limit=max(float(agent.cycle_interval), PERSONA_MIN_WAIT_SECONDS)):
        return agent_cycle_run(agent=agent, agent_id=agent_id, rows=rows, runner=runner, kind=kind)


PERSONA_MIN_WAIT_SECONDS = 1.0  # a persona's call waits at least this long for its turn, however short its cycle


def agent_cycle_run(*, agent: Agent, agent_id: int, rows: PersonaRows | None, runner: str, kind: str) -> str:
    if agent.kind == Agent.Kind.PERSONA:
        if kind == Agent.Kind.TOOL:  # a wrong guess: the caller left the check for dead planning to tool_open_plan
            plans_interrupted_fail(agent_ids=[agent_id], runner=runner)
        return persona_cycle(agent=agent, rows=rows or persona_rows(agent_id), runner=runner)
    waits = False
    try:
        plan_retry_due(agent=agent, runner=runner)  # a failed planning whose automatic retry is due
        plan = tool_open_plan(agent, runner=runner)
        if plan is not None and plan.replan_reason:
            what = plan_replan(agent=agent, plan=plan, runner=runner)
        else:
            what, waits = tool_cycle(agent=agent, plan=plan, runner=runner)
    finally:
        agent_cycle_count(agent=agent, waits=waits)
    return what


def agent_read(agent_id: int) -> Agent:
    """The agent row (a tool agent has no needs to read it with)."""
    return Agent.objects.get(pk=agent_id)


def tool_open_plan(agent: Agent, *, runner: str | None = None) -> Plan | None:
    """A tool agent's open plan: by its goal's priority (short-term first), newest first. With `runner`, at the
    start of its cycle: a plan found "validating" was left by a cycle that died, and fails first
    (plan_interrupted_fail; the read saves a statement a tool cycle, round_100_agents)."""
    plans = list(Plan.objects.filter(agent_id=agent.pk).open().select_related("goal").order_by())
    interrupted = [p for p in plans if p.status == Plan.Status.VALIDATING]
    if runner is not None and interrupted:
        for p in interrupted:
            plan_interrupted_fail(plan=p, runner=runner)
        plans = list(Plan.objects.filter(agent_id=agent.pk).open().select_related("goal").order_by())
    if not plans:
        return None
    # A plan that can move on comes before one that waits for a person's approval or answer (a tool
    # agent may have several plans waiting for a person, and its other work goes on meanwhile).
    return min(plans, key=lambda p: (
        p.status in (Plan.Status.AWAITING_APPROVAL, Plan.Status.CLARIFYING) and not p.replan_reason,
        goal_priority(horizon=p.goal.horizon, confidence=p.goal.confidence) if p.goal else (3, 0.0),
        -p.created_at.timestamp(),
    ))


def plan_was_abandoned(plan: Plan) -> bool:
    return plan.events.filter(kind=PlanEvent.Kind.PLAN_FAILED, detail__abandoned=True).exists()


def plan_replan(*, agent: Agent, plan: Plan, runner: str) -> str:
    """Make the next version of a plan after a decline, failure, stuck step or operator request.

    At MAX_REPLANS the plan is abandoned instead (its goal loses confidence, once). An operator who asks
    again for a replan of an abandoned plan gets one: the cap limits the agent, not the operator."""
    if plan.times_replanned >= MAX_REPLANS and not plan_was_abandoned(plan):
        plan_abandon(plan=plan, runner=runner, reason=f"replanned {plan.times_replanned} times; {plan.replan_reason}")
        return "plan abandoned"
    try:
        new = plan_generate(agent=agent, goal_text=plan.goal_text, goal=plan.goal, previous=plan,
                            reason=plan.replan_reason,
                            feedback=[words for words in plan_feedback(plan) if words != plan.replan_reason],
                            actor_label=runner)
    except PlanAlreadyReplanned:
        return "already replanned"
    return f"replanned to v{new.version} ({new.status})"


# --- persona agents -----------------------------------------------------------------------------------------


@dataclass
class PersonaState:
    """What one persona cycle reads: needs, active goals, open plans with their steps (one statement)."""

    agent: Agent
    needs: dict[str, float]
    rates: dict[str, float]
    need_rows: dict[str, Need]
    goals: list[Goal]  # active, short-term first; each with .planned (an open or failed plan exists)
    plans: list[Plan] = field(default_factory=list)  # open, short-term goal first
    steps: dict[int, list[PlanStep]] = field(default_factory=dict)
    reevaluated: bool = False  # the goals were re-evaluated this cycle (a pass did it for all its personas)
    at_once: bool = False  # every model its calls may reach answers at once (answers_at_once)
    lessons: PassLessons | None = None  # in a pass: its agents' lessons, read once for all


@dataclass
class PassLessons:
    """The lessons a pass's decision prompts quote, read with the first decision asked for every agent of the
    pass that may ask one (`agent_ids`: those with an urgent need, persona_action): one query, not one for each
    decision, which in a young fleet, deciding often, adds up. Another agent's
    are read on their own. Lessons are learned when the pass is recorded, after every decision, so the one read
    holds for the whole pass."""

    agent_ids: frozenset[int]
    read: dict[int, list[str]] | None = None

    def of(self, agent_id: int) -> list[str]:
        if agent_id not in self.agent_ids:  # not the pass's: read on its own
            return lessons_recent([agent_id], limit=LESSONS_IN_DECISION_PROMPT).get(agent_id, [])
        if self.read is None:
            self.read = lessons_recent(self.agent_ids, limit=LESSONS_IN_DECISION_PROMPT)
        return self.read.get(agent_id, [])


@dataclass
class PersonaRows:
    """The rows of the persona read, as models: the agent, its needs by name (each with that agent), its
    active goals (each with .planned), its open plans (each with its goal) and their steps in order (each with
    its plan)."""

    agent: Agent
    needs: list[Need]
    goals: Sequence[Goal]
    plans: list[Plan]
    steps: list[PlanStep]


def persona_rows(agent_id: int) -> PersonaRows:
    """The reads of one agent's cycle (of any agent's: it tells the runner the agent's kind and status), as
    persona_rows_many reads them; raises Agent.DoesNotExist for an agent deleted meanwhile."""
    rows = persona_rows_many([agent_id]).get(agent_id)
    if rows is None:
        raise Agent.DoesNotExist(f"agent {agent_id} does not exist")
    return rows


def persona_rows_many(agent_ids: Sequence[int]) -> dict[int, PersonaRows]:
    """The reads of persona cycles, for one agent or a batch of them (the runtimes' passes), five queries
    whatever their number, four for one agent (a tool agent's: its row and its needs; its cycle reads its plans
    itself): the agents and their needs (one agent's needs read with it); the active goals, each with whether a
    plan holds it (`planned`); the open plans, each given its goal from those goals; their steps in order, each
    with its plan (plan_steps_read: of a plan parked in the inbox, its awaiting steps). In a pass each row is
    built once: read with their needs, or plans with their goals, an agent was built again for each need and a
    goal again for each plan, a cost paid for every cycle of a pass.
    An open plan whose goal is not active (an operator completed or abandoned it) has its goal read apart, in
    one more query when there is one. Agents that do not exist are left out."""
    agents: dict[int, Agent] = {}
    if len(agent_ids) > 1:  # a pass: the agents apart, each built once
        agents = {a.pk: a for a in Agent.objects.filter(pk__in=agent_ids).order_by("pk")}
        needs = list(Need.objects.filter(agent_id__in=agents).order_by("agent_id", "name"))
    else:  # one cycle: its needs with their agent, one query (`make bench`, persona_cycle_queries)
        needs = list(Need.objects.filter(agent_id__in=agent_ids).select_related("agent").order_by("agent_id", "name"))
        agents = {n.agent_id: n.agent for n in needs[:1]} or {a.pk: a for a in Agent.objects.filter(pk__in=agent_ids)}
    by_agent: dict[int, list[Need]] = {}
    for need in needs:
        need.agent = agents[need.agent_id]  # one agent for every need, as the cycle changes it
        by_agent.setdefault(need.agent_id, []).append(need)
    personas = [pk for pk, a in agents.items() if a.kind == Agent.Kind.PERSONA]
    goals: dict[int, list[Goal]] = {}
    plans: dict[int, list[Plan]] = {}
    steps: dict[int, list[PlanStep]] = {}
    if personas:
        active: dict[int, Goal] = {}
        for goal in (Goal.objects.filter(agent_id__in=personas).active()
                     .annotate(planned=Exists(Plan.objects.filter(goal=OuterRef("pk")).held())).order_by()):
            goals.setdefault(goal.agent_id, []).append(goal)
            active[goal.pk] = goal
        by_pk = {p.pk: p for p in Plan.objects.filter(agent_id__in=personas).open().order_by("created_at", "pk")}
        ended = {p.goal_id for p in by_pk.values() if p.goal_id is not None and p.goal_id not in active}
        others = Goal.objects.in_bulk(ended) if ended else {}
        for plan in by_pk.values():
            if plan.goal_id is not None:
                plan.goal = active.get(plan.goal_id) or others.get(plan.goal_id)
            plans.setdefault(plan.agent_id, []).append(plan)
        for step in plan_steps_read(by_pk):
            step.plan = by_pk[step.plan_id]
            steps.setdefault(step.plan.agent_id, []).append(step)
    return {pk: PersonaRows(agent=agent, needs=by_agent.get(pk, []), goals=goals.get(pk, []),
                            plans=plans.get(pk, []), steps=steps.get(pk, [])) for pk, agent in agents.items()}


def plan_steps_read(plans: Iterable[int]) -> QuerySet[PlanStep]:
    """The steps of these open plans a cycle uses, by plan and position: every step of a plan that can act, and
    of a plan parked in the inbox (a step of it awaits an operator) only its steps that await. A parked plan
    neither acts nor completes until the operator answers; its awaiting step is all that says it waits
    (plan_waits_for_a_person, step_current). Parked plans pile up while nobody answers, so their steps are not
    read again on every cycle."""
    plans = list(plans)
    awaiting = PlanStep.Status.AWAITING_APPROVAL
    parked = PlanStep.objects.filter(plan_id__in=plans, status=awaiting).values("plan_id")
    return (PlanStep.objects.filter(plan_id__in=plans).filter(Q(status=awaiting) | ~Q(plan_id__in=parked))
            .order_by("plan_id", "position"))


def persona_state(agent: Agent, rows: PersonaRows, *, at_once: bool | None = None) -> PersonaState:
    """The state a cycle works on. `at_once`: whether the agent's models answer at once, when the caller knows."""
    goals = goals_by_priority(rows.goals)
    state = PersonaState(agent=agent, needs={n.name: n.satisfaction for n in rows.needs},
                         rates={n.name: n.decay_per_hour for n in rows.needs},
                         need_rows={n.name: n for n in rows.needs}, goals=goals,
                         at_once=answers_at_once(agent_models=agent.planner_models) if at_once is None else at_once)
    for step in rows.steps:
        state.steps.setdefault(step.plan_id, []).append(step)
    # Every open plan, also one without steps (planning, or a failed planning whose retry is due): it holds its
    # horizon and must be replanned like any other.
    state.plans = sorted(rows.plans, key=plan_order)
    return state


def goals_by_priority(goals: Sequence[Goal]) -> list[Goal]:
    """Short-term first, then by confidence (seed 001's priority)."""
    return sorted(goals, key=lambda g: goal_priority(horizon=g.horizon, confidence=g.confidence))


def plan_order(plan: Plan) -> tuple[int, object]:
    """Open plans in the order their steps may act: short-term goal first, then mid, then long; oldest first."""
    return goal_priority(horizon=plan.goal.horizon, confidence=0.0)[0] if plan.goal else 3, plan.created_at


def persona_state_add(state: PersonaState, *, goal: Goal, plan: Plan, steps: list[PlanStep]) -> None:
    """A plan this cycle made (a routine), added to what the cycle read, as persona_state would read it."""
    plan.goal = goal
    goal.planned = True  # type: ignore[attr-defined]
    state.steps[plan.pk] = sorted(steps, key=lambda s: s.position)
    for step in state.steps[plan.pk]:
        step.plan = plan
    state.plans = sorted([*state.plans, plan], key=plan_order)


def persona_reload(agent: Agent) -> PersonaState:
    rows = persona_rows(agent.pk)
    return persona_state(rows.agent, rows)


def plans_finished(state: PersonaState) -> list[Plan]:
    """Open plans whose goal finished since (milestone, operator): they stop."""
    return [p for p in state.plans if p.goal is not None and p.goal.status != Goal.Status.ACTIVE]


def persona_goal_room(state: PersonaState) -> list[str]:
    """The needs that call for a new goal when goals are re-evaluated this cycle (empty otherwise). A need whose
    goal waits for a person is room for another goal: the person finds another way meanwhile."""
    if state.reevaluated or not goals_reevaluation_due(state.agent.cycle_count):
        return []
    waiting = plans_waiting(state)
    served = [n for g in state.goals if g.pk not in waiting for n in g.source_needs]
    return goals_room(needs=state.needs, served=served, active=len(state.goals))


def plans_held(state: PersonaState, finished: Sequence[Plan]) -> dict[int, str | None]:
    """The open plans that hold their horizon, with it. Seed 000: at most MAX_ACTIVE_PLANS open plans, one per
    horizon; a plan without steps (still planning, or retrying a failed planning) holds its horizon like any
    other. A plan that waits for a person is parked in the inbox: it keeps its goal, but the person goes on with
    the next goal of its horizon meanwhile."""
    return {p.pk: p.goal.horizon if p.goal else None for p in state.plans
            if p not in finished and not plan_waits_for_a_person(p, state.steps.get(p.pk, []))}


def persona_goal_to_plan(state: PersonaState, held: Mapping[int, str | None]) -> Goal | None:
    """The most urgent active goal without a plan whose horizon is free and which may be planned now."""
    if len(held) >= MAX_ACTIVE_PLANS:
        return None
    open_horizons = set(held.values())
    for goal in state.goals:
        if goal.planned or goal.horizon in open_horizons:  # type: ignore[attr-defined]
            continue
        if goal_plannable(horizon=goal.horizon, source_needs=goal.source_needs, needs=state.needs):
            return goal
    return None


def persona_prepare_work(state: PersonaState) -> str | Goal:
    """What persona_prepare has to do this cycle (it writes, and may ask the model), reading nothing: "stop"
    or "replan" a plan, re-evaluate "goals" with room for one, or the goal to plan; "" for nothing."""
    finished = plans_finished(state)
    if finished:
        return "stop"
    if any(p.replan_reason for p in state.plans):
        return "replan"
    if persona_goal_room(state):
        return "goals"
    return persona_goal_to_plan(state, plans_held(state, finished)) or ""


def persona_prepare(*, state: PersonaState, runner: str) -> bool:
    """The uncommon paths, each its own service call (and at most one model call each): replan a plan that
    asks for it, re-evaluate goals when due and there is room, plan the most urgent unplanned goal.
    Returns whether anything was written (the state must then be read again)."""
    if not persona_prepare_work(state):
        return False
    agent = state.agent
    changed = False
    finished = plans_finished(state)
    if finished:  # goals finished since (milestone, operator): their plans stop
        ended = {p.goal.pk: p.goal for p in finished if p.goal is not None}
        goals_plans_close([(g, f"goal {g.get_status_display().lower()}") for g in ended.values()], runner=runner)
        changed = True
    for plan in state.plans:
        if plan.replan_reason and plan not in finished:
            plan_replan(agent=agent, plan=plan, runner=runner)
            changed = True
            break  # one replan per cycle: a model call each
    if persona_goal_room(state):  # goals re-evaluated: what recurs, then the model for the needs left
        known = len(state.goals)
        persona_goals_reevaluate([state])
        changed = changed or len(state.goals) > known
    held = plans_held(state, finished)
    if changed:  # a plan begun since the read (this cycle's replan, another runner's planning)
        held |= dict(Plan.objects.filter(agent=agent).open()
                     .exclude(status__in=[Plan.Status.AWAITING_APPROVAL, Plan.Status.CLARIFYING])
                     .exclude(steps__status=PlanStep.Status.AWAITING_APPROVAL)
                     .exclude(pk__in=[p.pk for p in finished]).values_list("pk", "goal__horizon"))
    goal = persona_goal_to_plan(state, held)
    if goal is None:
        return changed
    # A plan that completed for a goal in the same words is the person's routine for it: seed 000 plans a goal
    # once.
    source = routine_sources([goal]).get(goal.pk)
    routine = None
    if source is not None:
        routine = plan_repeat(goal=goal, source=source, needs=state.needs, runner=runner)
    if routine is None:
        plan_generate(agent=agent, goal_text=goal.description, goal=goal, actor_label=runner)
        return True
    if changed:
        return True
    persona_state_add(state, goal=goal, plan=routine[0], steps=routine[1])
    return False  # the state in hand is current: no need to read it again


def plans_waiting(state: PersonaState) -> set[int | None]:
    """The goals whose plan waits for a person. Such a goal is being pursued: it is held until the person
    answers (goal_after_experience), and its plan stays in the inbox."""
    return {p.goal_id for p in state.plans if plan_waits_for_a_person(p, state.steps.get(p.pk, []))}


def persona_step_choose(state: PersonaState, runner: str,
                        approvals: list[PlanStep] | None = None) -> tuple[Plan | None, PlanStep | None]:
    """Seed 000's get_current_step: the current step of the highest-priority plan that can act now
    (short-term first, then mid, then long). A step that waits for an operator lets the next plan act; a
    pending step that must first ask for an operator's yes is put in the inbox on the way (with `approvals`,
    a pass's list, it is added there, for the pass to put them all in the inbox together)."""
    for plan in state.plans:
        if plan.status != Plan.Status.ACTIVE or plan.replan_reason:
            continue
        step = step_current(state.steps.get(plan.pk, []))
        if step is None or step.status == PlanStep.Status.AWAITING_APPROVAL:
            continue
        if step.status == PlanStep.Status.PENDING and step.needs_approval(plan):
            if approvals is None:
                steps_request_approval([step], runner=runner)
            else:
                approvals.append(step)
            step.status = PlanStep.Status.AWAITING_APPROVAL  # as stored now: its goal waits from this cycle on
            continue
        return plan, step
    return None, None


def persona_action(state: PersonaState, plan: Plan | None, step: PlanStep | None, *,
                   asking: bool = True) -> tuple[str, str] | None:
    """The action this cycle and why it leaves the step (empty when it follows it): the step's action hint,
    unless a need is urgent and the rules would override it, which the model decides (a decision taken for
    the same situation stands). `asking=False`: None instead of a model call."""
    suggested = step.action_hint if step is not None else None
    action, override_reason = action_choose(suggested=suggested, needs=state.needs)
    if urgent_need(state.needs) is not None and action != suggested:
        # The uncommon case asks the model: a need pressing enough that the rules would leave the step.
        decided = action_decide(state=state, plan=plan, step=step, fallback=(action, override_reason), asking=asking)
        if decided is None:
            return None
        action, override_reason = decided
        if suggested is not None and action == suggested:
            override_reason = ""
    return action, override_reason


def persona_cycle(*, agent: Agent, rows: PersonaRows, runner: str) -> str:
    expected = agent.cycle_count
    state = persona_state(agent, rows)
    retry = agent.plan_retry_at is not None and agent.plan_retry_at <= timezone.now()
    if retry:
        plan_retry_due(agent=agent, runner=runner)  # a failed planning whose automatic retry is due
        state = persona_reload(agent)  # the retried plan is open now: this cycle replans it
    if persona_prepare(state=state, runner=runner) or retry:
        state = persona_reload(agent)
        if state.agent.cycle_count != expected or state.agent.status != Agent.Status.RUNNING:
            return "cycle already done"
    plan, step = persona_step_choose(state, runner)
    chosen = persona_action(state, plan, step)
    assert chosen is not None  # asking, the model or the rules always decide
    record = persona_record(state=state, plan=plan, step=step, chosen=chosen, expected=expected, runner=runner)
    if record.agent.pk not in persona_cycles_record([record]):  # recorded already, by another runner
        return "cycle already done"
    persona_milestones_check([record], runner=runner)
    return f"{record.action}: {record.outcome}"


def persona_milestones_check(records: Sequence[CycleRecord], *, runner: str) -> None:
    """Seed 001: a goal whose progress crossed the milestone line asks the model whether it is achieved, with its
    source needs' levels as the cycle left them (the record's: not read again, `make bench`,
    persona_cycle_queries); the checks of a pass together, their verdicts recorded in one transaction, in which
    a goal completed closes its open plans."""
    crossed = [(record, goal) for record in records for goal, state in record.goals if state.crossed_milestone]
    if not crossed:
        return
    for record, goal in crossed:
        goal.agent = record.agent  # the agent in hand: its row is not read again
    goals_milestones_check([(goal, {n: v for n, v in record.needs_after.items() if n in goal.source_needs})
                            for record, goal in crossed], runner=runner)


def persona_record(*, state: PersonaState, plan: Plan | None, step: PlanStep | None, chosen: tuple[str, str],
                   expected: int, runner: str) -> CycleRecord:
    """What one experience does (seeds 000, 001), computed from what the cycle read, without writing: the world
    applies the action, needs and goals decay by the hours it took, and the experience advances or stalls the
    step, the plan and the goals."""
    agent = state.agent
    action, override_reason = chosen
    suggested = step.action_hint if step is not None else None
    needs = state.needs
    outcome = action_apply(action, needs)
    hours = idle_hours(needs=needs, rates=state.rates) if outcome.action == "idle" else action_hours(outcome.action)
    followed = suggested is not None and outcome.action == suggested
    changes = needs_changes(needs=needs, rates=state.rates, deltas=outcome.need_deltas, hours=hours)
    after = {name: round(value + changes[name], 4) for name, value in needs.items()}

    change = None
    if plan is not None and step is not None:
        verdict = step_evaluate(key=step.key, actual_cycles=step.actual_cycles, estimated_cycles=step.estimated_cycles,
                                overrides=step.overrides, followed=followed, succeeded=outcome.succeeded,
                                improved=any(delta > 0 for delta in outcome.need_deltas.values()),
                                override_reason=override_reason, outcome=outcome.outcome)
        others_done = all(s.is_done for s in state.steps.get(plan.pk, []) if s.pk != step.pk)
        change = StepChange(step=step, plan=plan, verdict=verdict, followed=followed, override_reason=override_reason,
                            result=outcome.outcome, plan_completed=verdict.completed and others_done)
    bonus_goal = change.plan.goal_id if change is not None and change.plan_completed else None
    waiting = plans_waiting(state)

    def goal_after(goal: Goal, bonus: float) -> GoalState:
        # Seed 001: progress from what the action did to the source needs, not from their passive decay.
        return goal_after_experience(
            state=GoalState(progress=goal.progress, confidence=goal.confidence, times_advanced=goal.times_advanced,
                            times_regressed=goal.times_regressed),
            horizon=goal.horizon, source_needs=goal.source_needs, need_deltas=outcome.need_deltas, hours=hours,
            bonus=bonus, waiting=goal.pk in waiting)

    goals = [(goal, goal_after(goal, PLAN_COMPLETION_BONUS if goal.pk == bonus_goal else 0.0)) for goal in state.goals]
    # Should an operator's decision meanwhile keep the plan from completing, its goal gets no bonus.
    unrewarded = next((goal_after(g, 0.0) for g in state.goals if g.pk == bonus_goal), None)
    abandoned = {g.pk for g, s in goals if s.abandoned}
    return CycleRecord(
        agent=agent, expected_cycle=expected, runner=runner, action=outcome.action, outcome=outcome.outcome,
        succeeded=outcome.succeeded, hours=hours, need_deltas=outcome.need_deltas, need_changes=changes,
        needs_after=after, followed=followed, override_reason=override_reason if not followed else "",
        step_change=change, goals=goals, goal_unrewarded=unrewarded,
        plans_to_close=[(p, "goal abandoned: its confidence decayed below the threshold") for p in state.plans
                        if p.goal_id in abandoned and not (change is not None and change.plan_completed and p == plan)],
        emotions=emotions_update(agent.emotions, needs=after, succeeded=outcome.succeeded, followed_plan=followed),
        lesson=None if outcome.succeeded else action_lesson(outcome.action, needs),
        need_rows=state.need_rows,
    )


def persona_cycles(agent_ids: Sequence[int], *, runner: str) -> tuple[dict[int, str], list[int]]:
    """One cycle of each of many persona agents, as the runtimes drive them: one read for all
    (persona_rows_many), the routines their goals call for started together (routines_start), the uncommon
    work (a plan to stop or replan, goals to re-evaluate, a goal the model plans) done by the services a single
    cycle calls (persona_prepare) and the agents it changed read again together (a plan the model made at once
    joins the state in hand: persona_goals_plan), each experience computed by
    the rules the single cycle uses (persona_record), and every cycle recorded in one transaction
    (persona_cycles_record); a step that must ask an operator first is put in the inbox on the way, and a
    milestone crossed is checked once the pass is recorded. A cycle whose automatic planning retry is due runs
    as the agent's own cycle (persona_cycle). Only models that answer at once (the offline ones) are asked in a
    pass: a cycle that may wait on a model server is returned to run apart (agent_cycle), so that no pass waits
    on one. Returns what happened to each agent whose cycle ran here, and the agents returned."""
    rows = persona_rows_many(agent_ids)
    now = timezone.now()
    records: list[CycleRecord] = []
    checks: list[CycleRecord] = []
    apart: list[int] = []
    done: dict[int, str] = {}
    routines: list[tuple[PersonaState, Goal]] = []
    prepare: list[PersonaState] = []
    retries: list[PersonaRows] = []
    reevaluating: list[PersonaState] = []
    approvals: list[PlanStep] = []  # steps to put in the inbox before they may act
    lessons = PassLessons(agent_ids=frozenset(  # only an urgent need asks the model (persona_action)
        pk for pk, row in rows.items() if urgent_need({n.name: n.satisfaction for n in row.needs}) is not None))

    # Whether a planner chain's models answer at once, once a pass for each chain: the answer is the same for
    # every agent of the chain.
    at_once_of = functools.cache(lambda models: answers_at_once(agent_models=models))

    def dispatch(state: PersonaState, work: str | Goal) -> None:
        if isinstance(work, Goal):  # a goal to plan: its routine, when it has one, is started below
            routines.append((state, work))
        elif work:
            prepare.append(state) if state.at_once else apart.append(state.agent.pk)
        else:
            persona_common(state, runner=runner, records=records, apart=apart, checks=checks,
                           approvals=approvals)

    # The decisions the model takes for the pass's cycles (a situation not met before) are logged in one INSERT
    # for each part of the pass that asks them, not one INSERT a call (a young fleet asks often). A planning's calls are not in these parts: its services log them.
    with calls_recorded_together():
        for agent_id in agent_ids:
            row = rows.get(agent_id)
            if row is None or row.agent.status != Agent.Status.RUNNING or row.agent.kind != Agent.Kind.PERSONA:
                continue
            agent = row.agent
            at_once = at_once_of(agent.planner_models)
            if agent.plan_retry_at is not None and agent.plan_retry_at <= now:
                if at_once:
                    retries.append(row)
                else:
                    apart.append(agent_id)
                continue
            state = persona_state(agent, row, at_once=at_once)
            state.lessons = lessons
            work = persona_prepare_work(state)
            if work == "goals":  # goals re-evaluated: what recurs is created below, for all together
                reevaluating.append(state)
            else:
                dispatch(state, work)
    try:
        persona_goals_reevaluate(reevaluating)
    except Exception:  # a broken batch must never stop the rest of the pass: each re-evaluates on its own
        logger.exception("goals re-evaluation of a pass failed")
    planning: list[tuple[PersonaState, Goal]] = []
    with calls_recorded_together():  # routines start without a model call
        for state in reevaluating:  # a new goal to plan, or the step to follow
            dispatch(state, persona_prepare_work(state))
        started = persona_routines_start(routines, runner=runner)
        for state, goal in routines:
            if goal.pk in started:
                persona_state_add(state, goal=goal, plan=started[goal.pk][0], steps=started[goal.pk][1])
                persona_common(state, runner=runner, records=records, apart=apart, checks=checks,
                               approvals=approvals)
            elif state.at_once:
                planning.append((state, goal))  # no routine to repeat: the model plans it, below
            else:
                apart.append(state.agent.pk)
    # The uncommon work, each agent's by the services a single cycle calls (their own transactions); a plan the
    # model made at once joins its state in hand, the other agents it changed are read again together, and their
    # cycles go on with the others.
    changed: dict[int, int] = {}
    planned = persona_goals_plan(planning, runner=runner, changed=changed)
    for state in prepare:
        try:
            if persona_prepare(state=state, runner=runner):
                changed[state.agent.pk] = state.agent.cycle_count
            else:
                persona_common(state, runner=runner, records=records, apart=apart, checks=checks,
                               approvals=approvals)
        except Exception:  # one agent's broken cycle must never stop the others'
            logger.exception("cycle of agent %s failed", state.agent.pk)
    with calls_recorded_together():
        for state in planned:
            persona_common(state, runner=runner, records=records, apart=apart, checks=checks, approvals=approvals)
        for agent_id, row in persona_rows_many(list(changed)).items():
            if row.agent.cycle_count == changed[agent_id] and row.agent.status == Agent.Status.RUNNING:
                state = persona_state(row.agent, row, at_once=at_once_of(row.agent.planner_models))
                state.lessons = lessons
                persona_common(state, runner=runner, records=records, apart=apart, checks=checks, approvals=approvals)
            else:
                done[agent_id] = "cycle already done"
    try:
        steps_request_approval(approvals, runner=runner)
    except Exception:  # broken requests must never stop the rest of the pass: the steps ask again next cycle
        logger.exception("approval requests of a pass failed")
    recorded = persona_cycles_record(records) if records else {}
    done |= {r.agent.pk: f"{r.action}: {r.outcome}" for r in records if r.agent.pk in recorded}
    try:  # seed 001: a milestone crossed is checked once its experience is recorded
        persona_milestones_check([r for r in checks if r.agent.pk in recorded], runner=runner)
    except Exception:  # broken checks must never stop the rest of the pass
        logger.exception("milestone checks of a pass failed")
    for row in retries:  # a failed planning whose automatic retry is due: the agent's own cycle
        try:
            done[row.agent.pk] = persona_cycle(agent=row.agent, rows=row, runner=runner)
        except Exception:  # one agent's broken cycle must never stop the others'
            logger.exception("cycle of agent %s failed", row.agent.pk)
    return done, apart


def persona_goals_plan(planning: Sequence[tuple[PersonaState, Goal]], *, runner: str,
                       changed: dict[int, int]) -> list[PersonaState]:
    """The goals a pass's personas plan with the model (no routine to repeat), planned together
    (plans_first); a planning whose first answer is not a plan goes on alone (plan_continue). Returns
    the states whose plan was accepted at once, with that plan added as a routine's is (persona_state_add):
    nothing else of them was written, so their cycle goes on with the state in hand rather than reading it
    again. Each other agent
    whose planning ran is added to `changed` (its state is read again), with the cycle count read."""
    if not planning:
        return []
    try:
        accepted, rest = plans_first([(state.agent, goal) for state, goal in planning], actor_label=runner,
                                     needs={state.agent.pk: state.needs for state, _ in planning})
    except Exception:  # a broken batch must never stop the rest of the pass; what it left "validating" is failed
        logger.exception("plannings of a pass failed")  # by the sweep (plans_orphaned_fail)
        return []
    ready: list[PersonaState] = []
    for state, goal in planning:
        if goal.pk in accepted:
            plan, steps = accepted[goal.pk]
            persona_state_add(state, goal=goal, plan=plan, steps=steps)
            ready.append(state)
        else:
            changed[state.agent.pk] = state.agent.cycle_count
    for first in rest:
        plan_first_continue(first, runner=runner)
    return ready


def plan_first_continue(first: First, *, runner: str) -> None:
    """A first plan whose first ask (plans_first) was no plan, planned on to its end (plan_continue): a rejection,
    a question, a model error."""
    try:
        plan_continue(agent=first.agent, plan=first.plan, goal_text=first.goal.description, goal=first.goal,
                      actor_label=runner, deadline=Deadline.after(float(settings.PLAN_DEADLINE_SECONDS)),
                      first=first.asked, restatement=first.restatement if first.agent.kind == Agent.Kind.TOOL else None)
    except Exception:  # one agent's broken planning must never stop the others'
        logger.exception("planning of agent %s failed", first.agent.pk)


def persona_goals_reevaluate(states: Sequence[PersonaState]) -> None:
    """Seed 001's goal re-evaluation of personas (a pass's together, or one in persona_prepare): for each need that calls for a goal, the goal that served it last time recurs
    (goals_recur_many); the needs still without one are the model's (goals_generate_many). Each state gets its
    new goals, unplanned, in priority order, and is marked re-evaluated for this cycle."""
    def add(created: Mapping[int, list[Goal]]) -> None:
        for state in states:
            new = created.get(state.agent.pk, [])
            for goal in new:
                goal.planned = False  # type: ignore[attr-defined]
            if new:
                state.goals = goals_by_priority([*state.goals, *new])

    add(goals_recur_many([(state.agent, state.needs, persona_goal_room(state)) for state in states]))
    generating = [state for state in states if persona_goal_room(state)]  # needs no recurring goal serves
    add(goals_generate_many([(state.agent, state.needs, [g.description for g in state.goals
                                                         if g.pk in plans_waiting(state)]) for state in generating]))
    for state in states:
        state.reevaluated = True


def persona_common(state: PersonaState, *, runner: str, records: list[CycleRecord], apart: list[int],
                   checks: list[CycleRecord], approvals: list[PlanStep]) -> None:
    """The rest of a cycle in a pass, once its plans are prepared: the step followed (a step that must first
    ask an operator goes to `approvals`, which the pass puts in the inbox together), the action chosen (an urgent need's
    decision asked of the model when it answers at once) and the experience computed, added to `records`; a
    goal's milestone crossed is checked after the pass is recorded (`checks`). The agent goes to `apart` when
    its cycle needs a model that may wait on a server: a decision, or a milestone check."""
    plan, step = persona_step_choose(state, runner, approvals)
    chosen = persona_action(state, plan, step, asking=state.at_once)
    if chosen is None:
        apart.append(state.agent.pk)
        return
    record = persona_record(state=state, plan=plan, step=step, chosen=chosen, expected=state.agent.cycle_count,
                            runner=runner)
    if any(goal_state.crossed_milestone for _, goal_state in record.goals):
        if not state.at_once:
            apart.append(state.agent.pk)
            return
        checks.append(record)
    records.append(record)


def persona_routines_start(wanted: Sequence[tuple[PersonaState, Goal]], *,
                           runner: str) -> dict[int, tuple[Plan, list[PlanStep]]]:
    """The routines of goals to plan (seed 000 plans a goal once: a plan that completed for a goal in the same
    words is done again), started together; by goal. A goal without one is left out (the model plans it)."""
    if not wanted:
        return {}
    # The sources' completed steps with their plans joined, the sources chosen in the same statement: a pass plans
    # at most one goal of each agent, whose source is the one plan of that agent read (`make bench`,
    # persona_cycle_queries: the goals' sources and the source plans were read apart, two statements more a pass
    # that starts routines).
    goals = [goal for _, goal in wanted]
    ids: dict[int, int] | None = None
    if len({goal.agent_id for goal in goals}) == len(goals):
        sources = Q(plan_id__in=Goal.objects.filter(pk__in=[g.pk for g in goals]).annotate(source=routine_source())
                    .exclude(source=None).values("source"))
    else:  # not a pass's: the sources by goal first
        ids = routine_source_ids(goals)
        sources = Q(plan_id__in=set(ids.values()))
    steps: dict[int, list[PlanStep]] = {}
    for source_step in (PlanStep.objects.filter(sources, status=PlanStep.Status.COMPLETED).select_related("plan")
                        .order_by("plan_id", "position")):
        steps.setdefault(source_step.plan_id, []).append(source_step)
    if ids is None:
        goal_of = {goal.agent_id: goal.pk for goal in goals}
        ids = {goal_of[rows[0].plan.agent_id]: plan_id for plan_id, rows in steps.items()}
    return routines_start([Routine(goal=goal, source=steps[ids[goal.pk]][0].plan, steps=steps[ids[goal.pk]],
                                   needs=state.needs) for state, goal in wanted if ids.get(goal.pk) in steps],
                          runner=runner)


def routine_source() -> Subquery:
    """A goal's routine source: the id of the newest plan that completed for a goal in the same words (the
    agent's), to annotate goals with."""
    return Subquery(Plan.objects.filter(agent_id=OuterRef("agent_id"), goal_text__iexact=OuterRef("description"),
                                        status=Plan.Status.COMPLETED).order_by("-created_at", "-pk").values("pk")[:1])


def routine_source_ids(goals: Sequence[Goal]) -> dict[int, int]:
    """Each goal's routine source (routine_source), goals without one left out: one query for all."""
    return dict(Goal.objects.filter(pk__in=[g.pk for g in goals]).annotate(source=routine_source())
                .exclude(source=None).values_list("pk", "source"))


def routine_sources(goals: Sequence[Goal]) -> dict[int, Plan]:
    """For each goal, the newest plan that completed for a goal in the same words (the agent's), if any."""
    ids = routine_source_ids(goals)
    plans = Plan.objects.in_bulk(set(ids.values()))
    return {goal_pk: plans[plan_pk] for goal_pk, plan_pk in ids.items() if plan_pk in plans}


DECISION_KEPT_SECONDS = 6 * 3600  # a decision stands for its situation this long


def decision_situation(*, agent: Agent, needs: Mapping[str, float], step: PlanStep | None) -> str:
    """The cache key of an urgent decision: what it depends on. The urgent need, the step's action, and which
    actions cannot work now (what the person's lessons say); the levels of the needs only through these."""
    blocked = ",".join(sorted(name for name in ACTIONS if not action_apply(name, needs).succeeded))
    situation = (f"{agent.pk}:{agent.created_at.isoformat()}:{urgent_need(needs)}:"
                 f"{step.action_hint if step is not None else ''}:{blocked}")
    return "persona-decision:" + hashlib.sha256(situation.encode()).hexdigest()


def action_decide(*, state: PersonaState, plan: Plan | None, step: PlanStep | None,
                  fallback: tuple[str, str], asking: bool = True) -> tuple[str, str] | None:
    """Seed 000's action decision by the fast model: the plan step is a strong suggestion, urgent needs may
    override. An unusable answer (no JSON, an unknown action) falls back to the world's rules. A decision taken
    for a situation stands: the same situation again is not asked of the model (decision_situation).
    `asking=False`: None when no decision stands for the situation, instead of asking."""
    key = decision_situation(agent=state.agent, needs=state.needs, step=step)
    kept = cache.get(key)
    if kept is not None:
        return kept[0], kept[1]
    if not asking:
        return None
    try:
        decision = action_decide_asked(state=state, plan=plan, step=step, fallback=fallback)
    except LLMError as exc:  # no answer: nothing was decided, the next cycle asks again
        logger.info("action decision for %s fell back to rules: %s", state.agent, exc)
        return fallback
    cache.set(key, list(decision), DECISION_KEPT_SECONDS)
    return decision


def action_decide_asked(*, state: PersonaState, plan: Plan | None, step: PlanStep | None,
                        fallback: tuple[str, str]) -> tuple[str, str]:
    """The model's decision, checked; raises LLMError when no model answered."""
    agent = state.agent
    directive = ""
    if plan is not None and step is not None:
        steps = state.steps.get(plan.pk, [])
        directive = plan_step_directive(goal=plan.goal_text, number=step.position, total=len(steps),
                                        description=step.description, action_hint=step.action_hint)
    goals = [g.description for g in state.goals[:GOALS_IN_DECISION_PROMPT]]
    lessons = (state.lessons or PassLessons(agent_ids=frozenset())).of(agent.pk)
    try:
        answer = llm_complete(purpose="decide", agent_id=agent.pk, plan_id=plan.pk if plan else None,
                              messages=prompt_decide_action(agent_name=agent.name, needs=state.needs,
                                                            current_step=directive, goals=goals, lessons=lessons,
                                                            actions=list(ACTIONS)),
                              schema=decide_schema(list(ACTIONS)))
        data = json_extract(answer.text).value
    except ExtractError as exc:
        logger.info("action decision for %s fell back to rules: %s", agent, exc)
        return fallback
    action = str(data.get("action", "")).strip().lower() if isinstance(data, dict) else ""
    if action not in ACTIONS:
        logger.info("action decision for %s named unknown action %r; rules decide", agent, action)
        return fallback
    if action_needs_permission(action) and not (step is not None and step.action_hint == action):
        # The model may not do on its own what a plan step may only do after an operator's yes.
        logger.info("action decision for %s chose %r, which needs permission; rules decide", agent, action)
        return fallback
    if not action_apply(action, state.needs).succeeded and action_apply(fallback[0], state.needs).succeeded:
        # The person already knows (a lesson) that this cannot work now; the rules' choice can.
        logger.info("action decision for %s chose %r, which cannot succeed now; rules decide", agent, action)
        return fallback
    reason = str(data.get("reason", ""))[:300] if isinstance(data, dict) else ""
    if placeholder_or_example(reason) or junk_problem(reason, max_words=40):
        reason = ""  # "..." or an essay is no reason: the rules' words stand in
    return action, reason or fallback[1]


# --- tool agents --------------------------------------------------------------------------------------------


def unplanned_goals(agent_id: int) -> list[Goal]:
    """A tool agent's active goals that no open or failed plan holds, the most pressing first."""
    return unplanned_goals_many([agent_id]).get(agent_id, [])


def unplanned_goals_many(agent_ids: Sequence[int]) -> dict[int, list[Goal]]:
    """unplanned_goals of many tool agents in one read, by agent (agents with none are left out)."""
    planned = Plan.objects.filter(agent_id__in=list(agent_ids), goal__isnull=False).held().values("goal_id")
    goals: dict[int, list[Goal]] = {}
    for goal in Goal.objects.filter(agent_id__in=list(agent_ids)).active().exclude(pk__in=planned).order_by():
        goals.setdefault(goal.agent_id, []).append(goal)
    for agent_goals in goals.values():
        agent_goals.sort(key=lambda g: goal_priority(horizon=g.horizon, confidence=g.confidence))
    return goals


def plan_for_next_goal(*, agent: Agent, runner: str) -> str:
    """A tool agent plans its most pressing active goal that has no plan yet."""
    for goal in unplanned_goals(agent.pk):
        try:
            plan = plan_generate(agent=agent, goal_text=goal.description, goal=goal, actor_label=runner,
                                 exclusive=True)
        except GoalAlreadyPlanned:  # a start pass began it meanwhile (tools_start)
            return f"'{goal.description}' already being planned"
        return f"planned '{goal.description}' ({plan.status})"
    return ""


def tools_start(agent_ids: Sequence[int], *, runner: str) -> tuple[list[int], list[int]]:
    """The first cycles of tool agents whose chains start (runtime/tasks.py, a start pass), as agent_cycle
    would run them: each running agent whose cycle would only plan its most pressing goal (no open plan, no
    automatic retry due, a goal no plan holds: plan_for_next_goal) plans it here with the others (plans_first:
    their models asked side by side, the plans written together; a start pass and a cycle of the same agent that
    meet plan a goal once, `exclusive`), and that cycle is counted; any other running agent's cycle runs on its
    own. Returns the agents planned here and the running agents left to their own cycle."""
    now = timezone.now()
    agents = list(Agent.objects.filter(pk__in=list(agent_ids), status=Agent.Status.RUNNING, kind=Agent.Kind.TOOL)
                  .order_by("pk"))
    ids = [agent.pk for agent in agents]
    # An agent whose open plans all wait for a person's approval or answer is not busy: its new goal is planned.
    busy = set(Plan.objects.filter(agent_id__in=ids).open()
               .exclude(status__in=[Plan.Status.AWAITING_APPROVAL, Plan.Status.CLARIFYING])
               .values_list("agent_id", flat=True))
    goals = unplanned_goals_many(ids)
    wanted = [(agent, goals[agent.pk][0]) for agent in agents if agent.pk not in busy and agent.pk in goals
              and (agent.plan_retry_at is None or agent.plan_retry_at > now)]
    if not wanted:
        return [], ids
    with calls_for(operator=True):  # a tool agent's plan is an operator's work: first in line for the model
        accepted, rest = plans_first(wanted, actor_label=runner, exclusive=True)
        # Each planning may wait on its models again: side by side, as their first asks were.
        firsts_each(functools.partial(plan_first_continue, runner=runner), rest)
    began = set(accepted) | {first.goal.pk for first in rest}
    planned = [agent for agent, goal in wanted if goal.pk in began]
    agents_cycle_count(agents=planned)  # what tool_cycle counts after plan_for_next_goal: its interval, no wait
    done = {agent.pk for agent in planned}
    return sorted(done), [pk for pk in ids if pk not in done]


def tool_call(step: PlanStep, workspace: Path) -> tuple[bool, str]:
    """Run one tool step: (True, result) or (False, the error an operator can act on). A tool with effects marks
    its try first (tool_began_mark), so that should this runner stop before the step ends, the runner that takes
    the agent over knows the tool may have run (steps_interrupted)."""
    undo_dir = undo_dir_for(workspace, str(step.pk))
    try:
        if tool_has_effects(step.tool):
            tool_began_mark(undo_dir, step.actual_cycles)
        return True, tool_run(step.tool, step.tool_input, workspace=workspace, loop=step.loop or None,
                              undo_dir=undo_dir)
    except ToolError as exc:
        return False, str(exc)
    except Exception as exc:  # a tool bug must fail the step, never the cycle
        logger.exception("tool %s crashed", step.tool)
        return False, f"the tool crashed: {type(exc).__name__}: {exc}"


INTERRUPTED_BEFORE = "interrupted: the runner driving this step stopped before its tool began"
INTERRUPTED_UNKNOWN = ("outcome unknown, interrupted: the runner driving this step stopped while its tool ran, "
                       "and its effect could not be confirmed. Approve to run it again, or decline it.")


def steps_interrupted(*, plan: Plan, runner: str) -> None:
    """Tool steps run inside one cycle; a step still running when a cycle starts was cut off by a runner
    that stopped (killed, or cut off: its lease ran out, so it starts no tool any more). A step with effects is
    never run again blindly: one whose tool never began (no mark of this try) counts as a failed try (retried,
    then replanned); one whose tool began is completed when its effect is found (the output it declared, checked
    against its undo copies), or else waits for an operator, "outcome unknown", to approve running it again.
    A step without effects (a read) counts as a failed try, as it never changed anything."""
    for step in plan.steps.filter(status=PlanStep.Status.RUNNING):
        workspace = plan.agent.workspace
        undo_dir = undo_dir_for(workspace, str(step.pk))
        if not tool_has_effects(step.tool) or not tool_began(undo_dir, step.actual_cycles):
            step_finish(step=step, runner=runner, succeeded=False,
                        error=INTERRUPTED_BEFORE if tool_has_effects(step.tool) else
                        "interrupted: the runner driving this step stopped before it finished")
        elif not step.loop and tool_effect_found(step.tool, step.tool_input, workspace, undo_dir):
            step_finish(step=step, runner=runner, succeeded=True,
                        result=f"{step.tool}: its effect was found in the workspace after the runner driving it "
                               "stopped (not run again)")
        else:
            step_outcome_unknown(step=step, runner=runner, reason=INTERRUPTED_UNKNOWN)


def tool_cycle(*, agent: Agent, plan: Plan | None, runner: str) -> tuple[str, bool]:
    """What the cycle did, and whether the agent now waits for a person and nothing else: its plan awaits
    approval or an answer, or its steps still to do wait behind a step awaiting approval. Such an agent's next
    cycle comes after RUNNER_WAITING_SECONDS rather than its interval: only a decision moves it on, and a decision
    brings that cycle forward (agents/signals.py)."""
    if plan is None:
        return plan_for_next_goal(agent=agent, runner=runner) or "idle: no goal", False
    if plan.status != Plan.Status.ACTIVE:
        # Its plans wait for a person: a goal given meanwhile is planned now, not queued behind them in silence.
        planned = plan_for_next_goal(agent=agent, runner=runner)
        if planned:
            return planned, False
        return f"waiting: plan {plan.get_status_display().lower()}", plan_waits_for_a_person(plan, [])
    steps_interrupted(plan=plan, runner=runner)
    steps = list(plan.steps.all())
    table = [(s.key, s.status, s.depends_on) for s in steps]
    keys = steps_runnable(table, limit=TOOL_STEPS_PER_CYCLE)
    if not keys:
        blocked = steps_blocked(table)
        if blocked and not any(s.status in (PlanStep.Status.RUNNING, PlanStep.Status.AWAITING_APPROVAL) for s in steps):
            plan_replan_schedule(plan=plan, runner=runner, reason=f"steps {', '.join(blocked)} can never run")
            return "waiting", False
        waits = plan_waits_for_a_person(plan, steps)
        if waits:
            planned = plan_for_next_goal(agent=agent, runner=runner)
            if planned:
                return planned, False
        return "waiting", waits
    done: list[str] = []
    agent.workspace.mkdir(parents=True, exist_ok=True)
    started: list[PlanStep] = []
    now = timezone.now()
    asking = [s for s in steps if s.key in keys and s.needs_approval(plan)]
    steps_request_approval(asking, runner=runner)
    for step in (s for s in steps if s.key in keys):
        if step in asking:
            done.append(f"{step.key} awaits approval")
            continue
        if step.start_after is not None and step.start_after > now:
            # A policy approved it: it starts once the operator's window to undo that approval has passed.
            done.append(f"{step.key} starts after {timezone.localtime(step.start_after):%H:%M:%S} (undo window)")
            continue
        running = step_start(step=step, runner=runner)
        if running is not None:
            started.append(running)
    # Independent steps released together run side by side, bounded by TOOL_STEPS_PER_CYCLE; none starts once
    # this runner's lease ran out (agents/fencing.py): another runner may take the agent over.
    if started:
        fence_lease_check()
    with ThreadPoolExecutor(max_workers=TOOL_STEPS_PER_CYCLE, thread_name_prefix="tool") as pool:
        outcomes = list(pool.map(lambda st: tool_call(st, agent.workspace), started))
    for step, (succeeded, text) in zip(started, outcomes, strict=True):
        step_finish(step=step, runner=runner, succeeded=succeeded, result=text if succeeded else "",
                    error="" if succeeded else text)
        done.append(f"{step.key} {'done' if succeeded else 'failed: ' + text}")
    return "; ".join(done), False
