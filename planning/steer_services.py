"""Steering writes: a whole plan edited as version n+1, and decisions refused when made on a stale version.

Like planning/services.py: one transaction, a PlanEvent saying who, what, why and the diff, and a push to the
open pages after commit (planner_site/events.py through `event_record`).
"""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.contrib.auth.models import User
from django.db import transaction

from agents.declared_tools import agent_plan_terms
from agents.models import Agent
from agents.world import ACTIONS, action_needs_permission
from planner_site.validators import text_problem
from planning.engine.diff import plan_diff
from planning.engine.validate import StepSpec, plan_validate, step_plan_data
from planning.models import Plan, PlanEvent, PlanStep
from planning.services import DecisionError, event_record

EDITABLE_PLAN_STATUSES = (Plan.Status.AWAITING_APPROVAL, Plan.Status.ACTIVE)
# Steps that stay as they were in the next version: done work is never redone or undone.
KEPT_STEP_STATUSES = (PlanStep.Status.COMPLETED, PlanStep.Status.SKIPPED)


class StaleVersion(DecisionError):
    """The operator decided or edited what they saw, but the plan has moved on to a newer version."""

    def __init__(self, seen: int, current: Plan) -> None:
        self.current = current
        super().__init__(
            f"You were looking at version {seen}, but the plan is now version {current.version} "
            f"({current.get_status_display().lower()}). Nothing was changed; look at version {current.version} and "
            "decide again."
        )


class PlanEditInvalid(DecisionError):
    """The edited plan did not pass the planner's validator; `problems` says what, step by step."""

    def __init__(self, problems: list[str]) -> None:
        self.problems = problems
        super().__init__("The edited plan is not valid: " + "; ".join(problems) + ". Nothing was saved.")


def edited_step_data(step: StepSpec, kind: str) -> dict[str, Any]:
    """A step as the operator left it in the editor, in the shape the planner's validator reads."""
    data = step_plan_data(step.as_dict() | {"tools_needed": list(step.tools_needed), "loop": dict(step.loop)}, kind)
    if kind == Agent.Kind.TOOL:
        data["estimated_cycles"] = step.estimated_cycles
    return data


def plan_latest(plan: Plan) -> Plan:
    """The newest version of this plan's lineage (itself when it has no next version)."""
    current = plan
    while True:
        nxt = Plan.objects.filter(previous=current).first()
        if nxt is None:
            return current
        current = nxt


def plan_check_seen(*, plan: Plan, seen_version: int | None) -> None:
    """Refuse a decision made on a version that has since been replaced; None: the client sent no version."""
    if seen_version is None:
        return
    if plan.version != seen_version or plan.status == Plan.Status.REPLANNED:
        current = plan_latest(plan)
        if current.pk != plan.pk or plan.version != seen_version:
            raise StaleVersion(seen_version, current)


@transaction.atomic
def plan_edit_save(*, plan: Plan, user: User, steps: list[StepSpec], seen_version: int, reason: str = "") -> Plan:
    """Save the operator's edit of a whole plan as version n+1: the planner's validator judges it first
    (invalid: PlanEditInvalid, nothing saved); completed and skipped steps carry over unchanged."""
    plan = Plan.objects.select_for_update().select_related("agent").get(pk=plan.pk)
    if plan.version != seen_version or Plan.objects.filter(previous=plan).exists():
        raise StaleVersion(seen_version, plan_latest(plan))
    if plan.status not in EDITABLE_PLAN_STATUSES:
        raise DecisionError(f"Plan v{plan.version} is {plan.get_status_display().lower()}; only plans awaiting "
                            "approval or active can be edited. Nothing was changed.")
    old_steps = list(plan.steps.select_for_update().order_by("position"))
    running = [s.key for s in old_steps if s.status == PlanStep.Status.RUNNING]
    if running:
        raise DecisionError(f"Step {', '.join(running)} is running; edit the plan once it has finished. "
                            "Nothing was changed.")
    agent = plan.agent
    kept = [s for s in old_steps if s.status in KEPT_STEP_STATUSES]
    kept_keys = {s.key for s in kept}
    edited = [s for s in steps if s.key not in kept_keys]
    if not edited:
        raise PlanEditInvalid(["the plan has no steps left to do"])
    old_by_key = {s.key: s for s in old_steps}
    for step in edited:
        before = old_by_key.get(step.key)
        if before is not None and before.tool == step.tool:  # what the editor does not show is kept
            step.tools_needed, step.loop = list(before.tools_needed), dict(before.loop)
    kind, tools = agent_plan_terms(agent.kind, agent.declared_tools)  # external agents: their declared tools
    problems = [f"step {position}: '{name}' {problem}"
                for position, step in enumerate(edited, start=len(kept) + 1)
                for name in ("key", "description", "tool", "action_hint", "expected_outcome")
                if (problem := text_problem(getattr(step, name)))]
    if reason_problem := text_problem(reason, max_length=500):
        problems.append(f"the reason {reason_problem}")
    if problems:  # checked here too, so no caller stores what the forms refuse
        raise PlanEditInvalid(problems)
    rows = [step_plan_data(s.as_spec(), kind) for s in kept] + [edited_step_data(s, kind) for s in edited]
    workspace = agent.workspace if agent.kind == Agent.Kind.TOOL else None
    if workspace is not None:
        workspace.mkdir(parents=True, exist_ok=True)
    result = plan_validate({"steps": rows}, kind=kind, workspace=workspace, max_steps=settings.PLAN_MAX_STEPS,
                           allowed_actions=list(ACTIONS), tools=tools)
    if not result.ok or result.plan is None:
        raise PlanEditInvalid(result.problems)
    flags = list(result.flags)
    asked = {s.key: s for s in edited}
    new = Plan.objects.create(
        agent=agent, goal_id=plan.goal_id, goal_text=plan.goal_text, version=plan.version + 1, previous=plan,
        status=plan.status, approval_mode=plan.approval_mode, times_replanned=plan.times_replanned,
        who=plan.who, what=plan.what, when=plan.when, where=plan.where, why=plan.why,
        thinking_summary=plan.thinking_summary, confidence=plan.confidence, risks=list(plan.risks),
        model=plan.model, edited_by=user.get_username(),
    )
    for position, spec in enumerate(result.plan.steps, start=1):
        carried = old_by_key.get(spec.key) if spec.key in kept_keys else None
        requires_permission, risk = spec.requires_permission, spec.risk
        if agent.kind == Agent.Kind.PERSONA and spec.key in asked:
            requires_permission = asked[spec.key].requires_permission
            if action_needs_permission(spec.action_hint) and not requires_permission:
                requires_permission, risk = True, PlanStep.Risk.RISKY
                flags.append(f"step {spec.key}: '{spec.action_hint}' spends money; requires permission raised to true")
        before = old_by_key.get(spec.key)
        unchanged = before is not None and before.status == PlanStep.Status.PENDING and not plan_diff(
            [before.as_spec()], [{**before.as_spec(), "description": spec.description, "tool": spec.tool,
                                  "input": spec.input, "action_hint": spec.action_hint,
                                  "expected_outcome": spec.expected_outcome, "depends_on": spec.depends_on,
                                  "requires_permission": requires_permission}])["changed"]
        PlanStep.objects.create(
            plan=new, key=spec.key, position=position, description=spec.description[:500],
            action_hint=spec.action_hint[:200], tool=spec.tool, tool_input=spec.input,
            expected_outcome=spec.expected_outcome[:500], estimated_cycles=max(1, spec.estimated_cycles),
            depends_on=list(spec.depends_on), requires_permission=requires_permission, risk=risk,
            tools_needed=list(spec.tools_needed), loop=dict(spec.loop),
            status=carried.status if carried else PlanStep.Status.PENDING,
            result=carried.result if carried else "", actual_cycles=carried.actual_cycles if carried else 0,
            elapsed_ms=carried.elapsed_ms if carried else None, carried_over=carried is not None,
            # An approval given to a step carries over only when the operator left that step as it was.
            approved_by=carried.approved_by if carried else (before.approved_by if unchanged and before else None),
        )
    plan.status = Plan.Status.REPLANNED
    plan.replan_reason = ""
    plan.save(update_fields=["status", "replan_reason", "updated_at"])
    why = f"edited by {user.get_username()}" + (f": {reason}" if reason else "")
    diff = plan_diff([s.as_spec() for s in old_steps], [s.as_spec() for s in new.steps.all()])
    event_record(plan=plan, kind=PlanEvent.Kind.PLAN_EDITED, actor=user, reason=why,
                 detail={"next_plan": new.pk, "next_version": new.version, "diff": diff})
    event_record(plan=new, kind=PlanEvent.Kind.CREATED, actor=user, reason=why,
                 detail={"version": new.version, "previous": plan.pk, "edited": True})
    event_record(plan=new, kind=PlanEvent.Kind.VALIDATED, actor=user, reason="; ".join(flags)[:4000],
                 detail={"flags": flags, "steps": len(result.plan.steps), "diff": diff, "edited": True})
    waiting = f"plan v{new.version} awaits approval" if new.status == Plan.Status.AWAITING_APPROVAL else ""
    Agent.objects.filter(pk=agent.pk).update(waiting_reason=waiting)
    return new
