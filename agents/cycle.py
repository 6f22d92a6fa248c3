"""One cycle of one agent: what the runner does each time an agent's turn comes.

Persona agents (seeds 000, 001): needs decay, goals are generated and planned, the plan's current step
suggests the action (urgent needs override), the world applies it, the experience advances or stalls
steps and goals. The common case, following a step with no urgent need, makes no LLM call.
Tool agents (seeds 002, 003): a given goal is planned, the operator approves, then runnable steps
execute in the agent's workspace, respecting dependencies.
"""

from __future__ import annotations

import logging
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from pathlib import Path

from django.db import transaction
from django.db.models import F
from django.utils import timezone

from agents.llm.extract import json_extract
from agents.llm.gateway import LLMError, llm_complete
from agents.models import Agent, Experience, Lesson, Need
from agents.tools import ToolError, tool_run, undo_dir_for
from agents.world import (
    ACTIONS,
    SIM_HOURS_PER_CYCLE,
    action_apply,
    action_choose,
    action_lesson,
    action_needs_permission,
    emotions_update,
    needs_decay,
    urgent_need,
)
from goals.models import Goal
from goals.services import goal_milestone_check, goal_samples_prune, goals_due, goals_generate, goals_update
from goals.system import goal_priority
from planner_site.events import publish_changed_on_commit
from planning.engine.parse import PlanParseError
from planning.engine.prompts import plan_step_directive, prompt_decide_action
from planning.engine.schedule import steps_blocked, steps_runnable
from planning.models import Plan, PlanEvent, PlanStep
from planning.planner import MAX_REPLANS, PlanAlreadyReplanned, plan_generate, plan_retry_due
from planning.services import event_record, plan_abandon, step_finish, step_move, step_request_approval

logger = logging.getLogger("planner.cycle")

STUCK_MULTIPLIER = 2.0  # seed 000: replan when a step takes twice its estimate
MAX_OVERRIDES = 3  # seed 000: replan when urgent needs override the step this many cycles in a row
TOOL_STEPS_PER_CYCLE = 2  # independent tool steps may run side by side, bounded


def agent_cycle(*, agent_id: int, runner: str) -> str:
    """Drive one cycle; returns a short description of what happened (for logs and tests)."""
    agent = Agent.objects.get(pk=agent_id)
    if agent.status != Agent.Status.RUNNING:
        return "not running"
    try:
        plan_retry_due(agent=agent, runner=runner)  # a failed planning whose automatic retry is due
        plan = agent_open_plan(agent)
        if plan is not None and plan.replan_reason:
            what = plan_replan(agent=agent, plan=plan, runner=runner)
        elif agent.kind == Agent.Kind.PERSONA:
            what = persona_cycle(agent=agent, plan=plan, runner=runner)
        else:
            what = tool_cycle(agent=agent, plan=plan, runner=runner)
    finally:
        with transaction.atomic():
            Agent.objects.filter(pk=agent.pk).update(
                cycle_count=F("cycle_count") + 1,
                next_cycle_at=timezone.now() + timedelta(seconds=agent.cycle_interval),
            )
            publish_changed_on_commit(agent_id=agent.pk, kind="cycle")
    return what


def agent_open_plan(agent: Agent) -> Plan | None:
    """The plan the agent pursues now: open plans by their goal's priority (short-term first), newest first."""
    plans = list(Plan.objects.filter(agent=agent, status__in=Plan.OPEN_STATUSES).select_related("goal"))
    if not plans:
        return None
    return min(plans, key=lambda p: (
        goal_priority(horizon=p.goal.horizon, confidence=p.goal.confidence) if p.goal else (3, 0.0),
        -p.created_at.timestamp(),
    ))


def plan_replan(*, agent: Agent, plan: Plan, runner: str) -> str:
    """Make the next version of a plan after a decline, failure, stuck step or operator request."""
    if plan.times_replanned >= MAX_REPLANS:
        plan_abandon(plan=plan, runner=runner, reason=f"replanned {plan.times_replanned} times; {plan.replan_reason}")
        return "plan abandoned"
    feedback = [r for r in plan.events.filter(kind=PlanEvent.Kind.STEP_DECLINED).values_list("reason", flat=True) if r]
    try:
        new = plan_generate(agent=agent, goal_text=plan.goal_text, goal=plan.goal, previous=plan,
                            reason=plan.replan_reason, feedback=feedback, actor_label=runner)
    except PlanAlreadyReplanned:
        return "already replanned"
    return f"replanned to v{new.version} ({new.status})"


def plan_for_next_goal(*, agent: Agent, runner: str) -> str:
    """Plan the most pressing active goal that has no plan yet (seed 000: short-term at once,
    mid and long term once their source needs drop below half)."""
    needs = {n.name: n.satisfaction for n in agent.needs.all()}
    # A goal whose plan is open, or failed and waiting for an operator, is not planned again; a goal
    # still active after its plan completed gets a fresh plan (the person keeps pursuing it).
    planned = Plan.objects.filter(
        agent=agent, goal__isnull=False, status__in=[*Plan.OPEN_STATUSES, Plan.Status.FAILED]
    ).values_list("goal_id", flat=True)
    goals = sorted(
        Goal.objects.filter(agent=agent, status=Goal.Status.ACTIVE).exclude(pk__in=planned),
        key=lambda g: goal_priority(horizon=g.horizon, confidence=g.confidence),
    )
    for goal in goals:
        if goal.horizon != Goal.Horizon.SHORT and goal.source_needs and \
                min((needs.get(n, 1.0) for n in goal.source_needs), default=1.0) >= 0.5:
            continue
        plan = plan_generate(agent=agent, goal_text=goal.description, goal=goal, actor_label=runner)
        return f"planned '{goal.description}' ({plan.status})"
    return ""


def step_needs_approval(step: PlanStep, plan: Plan) -> bool:
    """Steps flagged requires-permission always wait for an operator; in step-by-step mode every step does."""
    return step.approved_by_id is None and (step.requires_permission or plan.approval_mode == Plan.ApprovalMode.STEP)


def current_step(plan: Plan) -> PlanStep | None:
    steps = list(plan.steps.all())
    running = [s for s in steps if s.status in (PlanStep.Status.RUNNING, PlanStep.Status.AWAITING_APPROVAL)]
    if running:
        return running[0]
    keys = steps_runnable([(s.key, s.status, s.depends_on) for s in steps], limit=1)
    return next((s for s in steps if s.key in keys), None)


def persona_cycle(*, agent: Agent, plan: Plan | None, runner: str) -> str:
    hours = SIM_HOURS_PER_CYCLE
    with transaction.atomic():
        needs_rows = list(Need.objects.select_for_update().filter(agent=agent))
        decayed = needs_decay({n.name: (n.satisfaction, n.decay_per_hour) for n in needs_rows}, hours)
        for n in needs_rows:
            n.satisfaction = decayed[n.name]
        Need.objects.bulk_update(needs_rows, ["satisfaction", "updated_at"])
    if goals_due(agent=agent):
        goals_generate(agent=agent)
    if plan is None:
        plan_for_next_goal(agent=agent, runner=runner)
        plan = agent_open_plan(agent)

    # Without a plan the person still lives: the world model picks what relieves the lowest need.
    step = current_step(plan) if plan is not None and plan.status == Plan.Status.ACTIVE else None
    if plan is not None and step is not None and step.status == PlanStep.Status.PENDING and step_needs_approval(step, plan):
        step_request_approval(step=step, runner=runner)
        step.refresh_from_db()
    suggested = step.action_hint if step is not None and step.status in (PlanStep.Status.PENDING, PlanStep.Status.RUNNING) else None

    needs = {n.name: n.satisfaction for n in needs_rows}
    action, override_reason = action_choose(suggested=suggested, needs=needs)
    if suggested is None or urgent_need(needs) is not None:
        # Only the uncommon cases ask the model: no step to follow, or a need pressing enough to override.
        action, override_reason = action_decide(agent=agent, plan=plan, step=step if suggested else None, needs=needs,
                                                fallback=(action, override_reason))
        if suggested is not None and action == suggested:
            override_reason = ""
    outcome = action_apply(action, needs)
    followed = suggested is not None and action == suggested
    # action_apply's deltas already keep every need within 0..1; this is what the person now feels.
    after = {name: value + outcome.need_deltas.get(name, 0.0) for name, value in needs.items()}
    with transaction.atomic():
        # Re-read under lock: an operator may have edited a need since the decay at the top of the cycle.
        for n in Need.objects.select_for_update().filter(agent=agent, name__in=list(outcome.need_deltas)):
            n.satisfaction = max(0.0, min(1.0, n.satisfaction + outcome.need_deltas[n.name]))
            n.save(update_fields=["satisfaction", "updated_at"])
        experience = Experience.objects.create(
            agent=agent, cycle=agent.cycle_count + 1, action=action, need_deltas=outcome.need_deltas,
            step=step if suggested else None, followed_plan=followed, override_reason=override_reason,
            outcome=outcome.outcome,
        )
        goals_update(agent=agent, hours=hours, need_deltas=outcome.need_deltas)
        lesson = None if outcome.succeeded else action_lesson(action, needs)
        if lesson and not Lesson.objects.filter(agent=agent, description=lesson).exists():
            Lesson.objects.create(agent=agent, description=lesson, source_experience=experience)
        Agent.objects.filter(pk=agent.pk).update(emotions=emotions_update(
            agent.emotions, needs=after, succeeded=outcome.succeeded, followed_plan=followed))
        if plan is not None and step is not None and suggested is not None:
            step_progress(step=step, plan=plan, runner=runner, followed=followed, succeeded=outcome.succeeded,
                          outcome=outcome.outcome, override_reason=override_reason, experience_id=experience.pk)
        publish_changed_on_commit(agent_id=agent.pk, plan_id=plan.pk if plan else None, kind="experience")
    for goal in Goal.objects.filter(agent=agent, status=Goal.Status.ACTIVE, progress__gte=0.85):
        goal_milestone_check(goal=goal)
    if agent.cycle_count % 50 == 0:
        goal_samples_prune(agent=agent)
    return f"{action}: {outcome.outcome}"


def action_decide(*, agent: Agent, plan: Plan | None, step: PlanStep | None, needs: dict[str, float],
                  fallback: tuple[str, str]) -> tuple[str, str]:
    """Seed 000's action decision by the fast model: the plan step is a strong suggestion, urgent needs may
    override. An unusable answer (no JSON, an unknown action) falls back to the world's rules."""
    directive = ""
    if plan is not None and step is not None:
        directive = plan_step_directive(goal=plan.goal_text, number=step.position, total=plan.steps.count(),
                                        description=step.description, action_hint=step.action_hint)
    goals = list(Goal.objects.filter(agent=agent, status=Goal.Status.ACTIVE).values_list("description", flat=True)[:5])
    lessons = list(agent.lessons.values_list("description", flat=True)[:5])
    try:
        answer = llm_complete(purpose="decide", agent_id=agent.pk, plan_id=plan.pk if plan else None,
                              messages=prompt_decide_action(agent_name=agent.name, needs=needs, current_step=directive,
                                                            goals=goals, lessons=lessons, actions=list(ACTIONS)))
        data = json_extract(answer.text).value
    except (LLMError, PlanParseError) as exc:
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
    reason = str(data.get("reason", ""))[:300] if isinstance(data, dict) else ""
    return action, reason or fallback[1]


def step_progress(*, step: PlanStep, plan: Plan, runner: str, followed: bool, succeeded: bool, outcome: str,
                  override_reason: str, experience_id: int) -> None:
    """Seed 000's evaluate_step and check_for_replan, for one experience."""
    step = PlanStep.objects.select_for_update().get(pk=step.pk)
    if step.status == PlanStep.Status.PENDING:
        step_move(step=step, status=PlanStep.Status.RUNNING)
        event_record(plan=plan, step=step, kind=PlanEvent.Kind.STEP_STARTED, actor_label=runner, reason=step.description)
    step.actual_cycles += 1
    if followed:
        step.overrides = 0
    else:
        step.overrides += 1
        event_record(plan=plan, step=step, kind=PlanEvent.Kind.STEP_OVERRIDDEN, actor_label=runner,
                     reason=override_reason, detail={"experience": experience_id})
    step.save(update_fields=["status", "actual_cycles", "overrides", "updated_at"])
    if followed and succeeded:
        step_finish(step=step, runner=runner, succeeded=True, result=outcome, experience_id=experience_id)
        return
    stuck = step.actual_cycles > step.estimated_cycles * STUCK_MULTIPLIER
    if stuck or step.overrides >= MAX_OVERRIDES:
        why = (f"step {step.key} stuck: {step.actual_cycles} cycles, estimate {step.estimated_cycles}" if stuck
               else f"step {step.key} overridden {step.overrides} cycles in a row: {override_reason}")
        step_move(step=step, status=PlanStep.Status.FAILED)
        step.failure_reason = why
        step.save(update_fields=["status", "failure_reason", "updated_at"])
        Plan.objects.filter(pk=plan.pk).update(replan_reason=why)
        event_record(plan=plan, step=step, kind=PlanEvent.Kind.STEP_FAILED, actor_label=runner, reason=why)


def tool_call(step: PlanStep, workspace: Path) -> tuple[bool, str]:
    """Run one tool step: (True, result) or (False, the error an operator can act on)."""
    try:
        return True, tool_run(step.tool, step.tool_input, workspace=workspace, loop=step.loop or None,
                              undo_dir=undo_dir_for(workspace, str(step.pk)))
    except ToolError as exc:
        return False, str(exc)
    except Exception as exc:  # a tool bug must fail the step, never the cycle
        logger.exception("tool %s crashed", step.tool)
        return False, f"the tool crashed: {type(exc).__name__}: {exc}"


def steps_interrupted(*, plan: Plan, runner: str) -> None:
    """Tool steps run inside one cycle; a step still running when a cycle starts was cut off by a runner
    that died. It counts as a failed try (retried, then replanned), so it is neither lost nor run twice
    at once."""
    for step in plan.steps.filter(status=PlanStep.Status.RUNNING):
        step_finish(step=step, runner=runner, succeeded=False,
                    error="interrupted: the runner driving this step stopped before it finished")


def tool_cycle(*, agent: Agent, plan: Plan | None, runner: str) -> str:
    if plan is None:
        return plan_for_next_goal(agent=agent, runner=runner) or "idle: no goal"
    if plan.status != Plan.Status.ACTIVE:
        return f"waiting: plan {plan.get_status_display().lower()}"
    steps_interrupted(plan=plan, runner=runner)
    steps = list(plan.steps.all())
    table = [(s.key, s.status, s.depends_on) for s in steps]
    keys = steps_runnable(table, limit=TOOL_STEPS_PER_CYCLE)
    if not keys:
        blocked = steps_blocked(table)
        if blocked and not any(s.status in (PlanStep.Status.RUNNING, PlanStep.Status.AWAITING_APPROVAL) for s in steps):
            Plan.objects.filter(pk=plan.pk).update(replan_reason=f"steps {', '.join(blocked)} can never run")
        return "waiting"
    done: list[str] = []
    agent.workspace.mkdir(parents=True, exist_ok=True)
    started: list[PlanStep] = []
    for step in (s for s in steps if s.key in keys):
        if step_needs_approval(step, plan):
            step_request_approval(step=step, runner=runner)
            done.append(f"{step.key} awaits approval")
            continue
        with transaction.atomic():
            step = PlanStep.objects.select_for_update().get(pk=step.pk)
            if step.status != PlanStep.Status.PENDING:
                continue
            step_move(step=step, status=PlanStep.Status.RUNNING)
            step.actual_cycles += 1
            step.save(update_fields=["status", "actual_cycles", "updated_at"])
            event_record(plan=plan, step=step, kind=PlanEvent.Kind.STEP_STARTED, actor_label=runner,
                         reason=f"{step.tool} {step.tool_input}"[:500])
        started.append(step)
    # Independent steps released together run side by side, bounded by TOOL_STEPS_PER_CYCLE.
    with ThreadPoolExecutor(max_workers=TOOL_STEPS_PER_CYCLE, thread_name_prefix="tool") as pool:
        outcomes = list(pool.map(lambda st: tool_call(st, agent.workspace), started))
    for step, (succeeded, text) in zip(started, outcomes, strict=True):
        step_finish(step=step, runner=runner, succeeded=succeeded, result=text if succeeded else "",
                    error="" if succeeded else text)
        done.append(f"{step.key} {'done' if succeeded else 'failed: ' + text}")
    return "; ".join(done)
