"""Making plans: restate the goal, ask the model chain, parse, repair, validate, retry with reasons.

LLM calls happen outside transactions (they take seconds); each write is its own short transaction,
so the plan page shows "validating" and every rejected attempt while the planner works.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from django.conf import settings
from django.db import IntegrityError, transaction

from agents.llm.gateway import LLMError, llm_complete, model_chain
from agents.models import Agent
from agents.tools import TOOLS, workspace_listing
from agents.world import ACTIONS, action_needs_permission
from goals.models import Goal
from planner_site.events import publish_changed_on_commit
from planning.engine.diff import plan_diff
from planning.engine.parse import PlanParseError, plan_parse
from planning.engine.prompts import prompt_plan, prompt_reflect, prompt_replan, prompt_restate
from planning.engine.validate import PlanSpec, plan_validate
from planning.models import Plan, PlanEvent, PlanStep

logger = logging.getLogger("planner.planner")

MAX_REPLANS = 3  # seed 000: a plan replanned this often is abandoned
REJECTED_OUTPUT_SHOWN = 4000  # characters of a rejected output kept in the event


class PlanAlreadyReplanned(Exception):
    """Another runner or operator already made the next version of this plan."""


def plan_generate(
    *,
    agent: Agent,
    goal_text: str,
    goal: Goal | None = None,
    previous: Plan | None = None,
    reason: str = "",
    feedback: Sequence[str] = (),
    actor_label: str = "runner",
    situation: Sequence[str] = (),
) -> Plan:
    """Make a validated plan (or a failed one with every reason) for a goal; a replan when `previous` is given.
    `situation`: lines the prompt adds to who the agent is (a persona's emotions and lessons, seed 000)."""
    plan = plan_start(agent=agent, goal_text=goal_text, goal=goal, previous=previous, reason=reason, actor_label=actor_label)
    kept = list(previous.steps.filter(status__in=[PlanStep.Status.COMPLETED, PlanStep.Status.SKIPPED])) if previous else []

    restatement = plan_restate(agent=agent, plan=plan, goal_text=goal_text) if agent.kind == Agent.Kind.TOOL else {}
    reasons_all: list[str] = []
    recent_reasons: list[str] = []
    hints: list[str] = []
    last_output = ""
    chain = model_chain("plan", agent_models=agent.planner_models)
    for index, model in enumerate(chain):
        for attempt in range(1, settings.PLAN_ATTEMPTS_PER_MODEL + 1):
            messages = plan_messages(
                agent=agent, goal_text=goal_text, restatement=restatement, previous=previous, kept=kept,
                reason=reason, feedback=feedback, recent_reasons=recent_reasons[-6:], last_output=last_output, hints=hints,
                situation=situation,
            )
            try:
                answer = llm_complete(purpose="replan" if previous else "plan", messages=messages, models=[model],
                                      agent_id=agent.pk, plan_id=plan.pk)
            except LLMError as exc:
                attempt_reject(plan=plan, model=model, reasons=[f"model error: {exc}"], output="", hints=[],
                               actor_label=actor_label)
                reasons_all.append(f"{model}: model error: {exc}")
                break  # an error hands over to the next model at once
            problems, spec, flags, repairs = plan_check(agent=agent, text=answer.text, kept=kept)
            if spec is not None:
                return plan_accept(plan=plan, spec=spec, flags=[*repairs, *flags], model=model, kept=kept,
                                   actor_label=actor_label)
            hints = plan_reflect(agent=agent, plan=plan, output=answer.text, reasons=problems)
            attempt_reject(plan=plan, model=model, reasons=problems, output=answer.text, hints=hints, actor_label=actor_label)
            reasons_all.extend(f"{model}: {p}" for p in problems)
            recent_reasons.extend(problems)
            last_output = answer.text
            # Every attempt that reaches here was rejected, so the attempt number counts rejections in a row;
            # the last model of the chain has nobody to hand over to and uses all its attempts.
            if attempt >= settings.PLAN_REJECTIONS_BEFORE_FALLBACK and index < len(chain) - 1:
                break  # seed 002: after repeated rejections, the next model in the chain
    return plan_fail(plan=plan, reasons=reasons_all or ["no model answered"], actor_label=actor_label)


@transaction.atomic
def plan_start(*, agent: Agent, goal_text: str, goal: Goal | None, previous: Plan | None, reason: str,
               actor_label: str) -> Plan:
    """Create the new version in status "validating"; refuse a second next version of the same plan."""
    if previous is not None:
        previous = Plan.objects.select_for_update().get(pk=previous.pk)
        if Plan.objects.filter(previous=previous).exists():
            raise PlanAlreadyReplanned(previous)
    try:
        with transaction.atomic():
            plan = Plan.objects.create(
                agent=agent, goal=goal, goal_text=goal_text[:500], status=Plan.Status.VALIDATING,
                version=previous.version + 1 if previous else 1, previous=previous,
                times_replanned=previous.times_replanned + 1 if previous else 0,
            )
    except IntegrityError as exc:
        raise PlanAlreadyReplanned(previous) from exc
    if previous is not None:
        previous.status = Plan.Status.REPLANNED
        previous.replan_reason = ""
        previous.save(update_fields=["status", "replan_reason", "updated_at"])
        PlanEvent.objects.create(plan=previous, kind=PlanEvent.Kind.REPLANNED, actor_label=actor_label, reason=reason,
                                 detail={"next_plan": plan.pk, "next_version": plan.version})
        publish_changed_on_commit(agent_id=agent.pk, plan_id=previous.pk, kind="replanned")
    PlanEvent.objects.create(plan=plan, kind=PlanEvent.Kind.CREATED, actor_label=actor_label, reason=reason,
                             detail={"version": plan.version, "previous": previous.pk if previous else None})
    publish_changed_on_commit(agent_id=agent.pk, plan_id=plan.pk, kind="plan_created")
    return plan


def plan_restate(*, agent: Agent, plan: Plan, goal_text: str) -> dict[str, str]:
    """WHO/WHAT/WHEN/WHERE/WHY by the fast model (seed 002); a failure here only loses the restatement."""
    try:
        answer = llm_complete(purpose="restate", messages=prompt_restate(goal=goal_text, agent_name=agent.name,
                                                                          backstory=agent.backstory),
                              agent_id=agent.pk, plan_id=plan.pk)
        data = plan_parse(answer.text, allow_single_step=False).data
    except (LLMError, PlanParseError) as exc:
        logger.info("restatement failed for plan %s: %s", plan.pk, exc)
        return {}
    raw = data.get("restatement", data)
    fields = ("who", "what", "when", "where", "why")
    restatement = {k: str(raw.get(k, ""))[:300] for k in fields if isinstance(raw, dict)}
    Plan.objects.filter(pk=plan.pk).update(**restatement)
    return restatement


def plan_messages(*, agent: Agent, goal_text: str, restatement: dict[str, str], previous: Plan | None,
                  kept: list[PlanStep], reason: str, feedback: Sequence[str], recent_reasons: list[str],
                  last_output: str, hints: list[str], situation: Sequence[str] = ()) -> list[dict[str, str]]:
    needs = {n.name: n.satisfaction for n in agent.needs.all()}
    backstory = "\n".join([agent.backstory, *situation]).strip()
    kind = agent.kind
    tools = list(TOOLS.values()) if kind == Agent.Kind.TOOL else None
    files = workspace_listing(agent.workspace) if kind == Agent.Kind.TOOL else []
    if previous is not None:
        failed = previous.steps.filter(status__in=[PlanStep.Status.FAILED, PlanStep.Status.DECLINED]).first()
        return prompt_replan(
            kind=kind, goal=goal_text, agent_name=agent.name, backstory=backstory, tools=tools,
            allowed_actions=list(ACTIONS), needs=needs, completed_steps=[s.as_spec() for s in kept],
            failed_step=failed.as_spec() | {"failure_reason": failed.failure_reason} if failed else None,
            reason=reason, feedback=[*feedback, *recent_reasons], max_steps=settings.PLAN_MAX_STEPS,
            workspace_files=files,
        )
    return prompt_plan(
        kind=kind, goal=goal_text, restatement=restatement or None, agent_name=agent.name, backstory=backstory,
        tools=tools, allowed_actions=list(ACTIONS), needs=needs, rejection_reasons=recent_reasons,
        last_rejected_output=last_output, feedback=list(feedback), retry_hints=hints, max_steps=settings.PLAN_MAX_STEPS,
        workspace_files=files,
    )


def kept_as_data(step: PlanStep, kind: str) -> dict[str, Any]:
    if kind == Agent.Kind.TOOL:
        return {"id": step.key, "tool": step.tool, "intent": step.description, "input": step.tool_input,
                "requiresPermission": step.requires_permission, "dependsOn": list(step.depends_on),
                "expects": step.expected_outcome}
    return {"id": step.key, "description": step.description, "action_hint": step.action_hint,
            "expected_outcome": step.expected_outcome, "estimated_cycles": step.estimated_cycles,
            "depends_on": list(step.depends_on)}


def plan_check(*, agent: Agent, text: str, kept: list[PlanStep]) -> tuple[list[str], PlanSpec | None, list[str], list[str]]:
    """Parse and validate one model answer: (problems, plan, flags, repairs). Never raises on bad output."""
    try:
        parsed = plan_parse(text)
    except PlanParseError as exc:
        return [f"unparseable output: {exc.reason}"], None, [], []
    data = dict(parsed.data)
    steps = data.get("steps")
    if kept and isinstance(steps, list):
        kept_keys = {s.key for s in kept}
        # The model may repeat completed steps; they are kept as they were, never redone.
        new = [s for s in steps if not (isinstance(s, dict) and str(s.get("id", "")) in kept_keys)]
        data["steps"] = [kept_as_data(s, agent.kind) for s in kept] + new
        if not new:
            return ["replan has no remaining steps"], None, [], []
    workspace = agent.workspace if agent.kind == Agent.Kind.TOOL else None
    if workspace is not None:
        workspace.mkdir(parents=True, exist_ok=True)
    result = plan_validate(data, kind=agent.kind, workspace=workspace, max_steps=settings.PLAN_MAX_STEPS,
                           allowed_actions=list(ACTIONS))
    repairs = [f"repaired: {r}" for r in parsed.repaired]
    if parsed.method not in ("json_tag", "fenced", "balanced"):
        repairs.append(f"parsed from {parsed.method.replace('_', ' ')}")
    if not result.ok or result.plan is None:
        return result.problems, None, [], repairs
    return [], result.plan, result.flags, repairs


def plan_reflect(*, agent: Agent, plan: Plan, output: str, reasons: list[str]) -> list[str]:
    """Seed 002's failure reflection: the fast model turns rejection reasons into fix hints (RETRY_HINTS)."""
    try:
        answer = llm_complete(purpose="reflect", messages=prompt_reflect(output=output[:3000], reasons=reasons),
                              agent_id=agent.pk, plan_id=plan.pk)
        data = plan_parse(answer.text, allow_single_step=False).data
    except (LLMError, PlanParseError):
        return []
    hints = data.get("hints") if isinstance(data, dict) else None
    if not isinstance(hints, list):
        steps = data.get("steps") if isinstance(data, dict) else None
        hints = steps if isinstance(steps, list) else []
    return [str(h)[:300] for h in hints if isinstance(h, str | int | float)][:6]


@transaction.atomic
def attempt_reject(*, plan: Plan, model: str, reasons: list[str], output: str, hints: list[str], actor_label: str) -> None:
    Plan.objects.filter(pk=plan.pk).update(retry_hints=hints)
    PlanEvent.objects.create(
        plan=plan, kind=PlanEvent.Kind.ATTEMPT_REJECTED, actor_label=actor_label, reason="; ".join(reasons)[:4000],
        detail={"model": model, "reasons": reasons, "hints": hints, "output": output[:REJECTED_OUTPUT_SHOWN],
                "output_chars": len(output)},
    )
    publish_changed_on_commit(agent_id=plan.agent_id, plan_id=plan.pk, kind="attempt_rejected")


@transaction.atomic
def plan_accept(*, plan: Plan, spec: PlanSpec, flags: list[str], model: str, kept: list[PlanStep],
                actor_label: str) -> Plan:
    """Store the validated steps; tool plans wait for the operator, persona plans start at once."""
    plan = Plan.objects.select_for_update(of=("self",)).select_related("agent", "previous").get(pk=plan.pk)
    kept_by_key = {s.key: s for s in kept}
    persona = plan.agent.kind == Agent.Kind.PERSONA
    for step in spec.steps:
        if persona and step.key not in kept_by_key and action_needs_permission(step.action_hint) and not step.requires_permission:
            # Spending real money is the persona world's risky act: an operator says yes first.
            step.requires_permission = True
            step.risk = "risky"
            flags.append(f"step {step.key}: '{step.action_hint}' spends money; requires permission raised to true")
    for position, step in enumerate(spec.steps, start=1):
        carried = kept_by_key.get(step.key)
        PlanStep.objects.create(
            plan=plan, key=step.key, position=position, description=step.description[:500],
            action_hint=step.action_hint[:200], tool=step.tool, tool_input=step.input,
            expected_outcome=step.expected_outcome[:500], estimated_cycles=max(1, step.estimated_cycles),
            depends_on=list(step.depends_on), requires_permission=step.requires_permission, risk=step.risk,
            status=carried.status if carried else PlanStep.Status.PENDING,
            result=carried.result if carried else "", actual_cycles=carried.actual_cycles if carried else 0,
            carried_over=carried is not None, approved_by=carried.approved_by if carried else None,
        )
    plan.status = Plan.Status.ACTIVE if persona else Plan.Status.AWAITING_APPROVAL
    plan.approval_mode = Plan.ApprovalMode.ALL if persona else Plan.ApprovalMode.PENDING
    plan.thinking_summary = spec.thinking_summary[:4000]
    plan.confidence = max(0.0, min(1.0, spec.confidence))
    plan.risks = list(spec.risks)
    plan.model = model
    plan.save()
    detail: dict[str, Any] = {"model": model, "flags": flags, "steps": len(spec.steps)}
    if plan.previous is not None:
        detail["diff"] = plan_diff([s.as_spec() for s in plan.previous.steps.all()], [s.as_spec() for s in plan.steps.all()])
    PlanEvent.objects.create(plan=plan, kind=PlanEvent.Kind.VALIDATED, actor_label=actor_label,
                             reason="; ".join(flags)[:4000], detail=detail)
    waiting = "" if persona else f"plan v{plan.version} awaits approval"
    Agent.objects.filter(pk=plan.agent_id).update(waiting_reason=waiting)
    publish_changed_on_commit(agent_id=plan.agent_id, plan_id=plan.pk, kind="plan_validated")
    return plan


@transaction.atomic
def plan_fail(*, plan: Plan, reasons: list[str], actor_label: str) -> Plan:
    """Every model rejected or failed: the plan fails with all reasons, and the agent waits for an operator."""
    plan = Plan.objects.select_for_update().get(pk=plan.pk)
    plan.status = Plan.Status.FAILED
    plan.failure_reason = "\n".join(reasons)[:20000]
    plan.save(update_fields=["status", "failure_reason", "updated_at"])
    PlanEvent.objects.create(plan=plan, kind=PlanEvent.Kind.PLAN_FAILED, actor_label=actor_label,
                             reason="planning failed: every model's output was rejected", detail={"reasons": reasons})
    Agent.objects.filter(pk=plan.agent_id).update(waiting_reason=f"planning failed for '{plan.goal_text[:80]}'")
    publish_changed_on_commit(agent_id=plan.agent_id, plan_id=plan.pk, kind="plan_failed")
    return plan


def plan_validate_edit(*, step: PlanStep, changes: dict[str, Any]) -> tuple[list[str], list[str]]:
    """Validate the whole plan as it would be after an operator's edit of one step: (problems, flags)."""
    agent = step.plan.agent
    rows = []
    for s in step.plan.steps.all():
        if s.pk == step.pk:
            for key, value in changes.items():
                setattr(s, key, value)
        rows.append(kept_as_data(s, agent.kind))
    result = plan_validate({"steps": rows}, kind=agent.kind,
                           workspace=agent.workspace if agent.kind == Agent.Kind.TOOL else None,
                           max_steps=settings.PLAN_MAX_STEPS, allowed_actions=list(ACTIONS))
    return result.problems, result.flags
