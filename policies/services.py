"""Policies at work, and every change to them.

- `policies_step_waiting` / `policies_plan_waiting`: called where an item starts to wait for a person (inside the
  transaction that wrote the waiting state), by the receivers of planning/signals.py (`steps_waiting_decide`,
  `plans_waiting_decide`, connected in policies/apps.py); the first matching rule of the policies switched on
  decides through the operators' own decision services, with the policy as the actor. No rule matches: a person
  decides.
- `decision_undo`: an operator takes back a policy's approval of a step that has not started.
- `budget_after_call`: after each model call is recorded, the agent's budget (per day, per plan) is checked; a
  budget reached pauses the agent, with an event.
- `policy_*`, `rule_*`, `budget_*`: the edits of the policies page and the admin, each recorded (PolicyChange).
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, time, timedelta
from decimal import Decimal
from pathlib import Path
from time import time_ns
from typing import Any

from django.conf import settings
from django.contrib.auth.models import User
from django.core.cache import caches
from django.core.exceptions import ImproperlyConfigured
from django.db import IntegrityError, transaction
from django.db.models import QuerySet, Sum
from django.utils import timezone

from agents.models import Agent, LLMCall
from agents.tools import TOOLS
from planner_site.validators import text_problem
from planning import services as planning
from planning.models import Plan, PlanEvent, PlanStep
from policies.engine import Item, Match, item_of_agent, rule_problems, rules_decide
from policies.models import Budget, Policy, PolicyChange, Rule

logger = logging.getLogger("planner.policies")

# The account policies decide as: it cannot log in (inactive, no usable password); it is what a step's
# "approved by" names, so the runner knows the step was approved.
POLICY_USERNAME = "policy-engine"


class PolicyError(Exception):
    """An edit that cannot apply as asked; the message says why, and nothing changed."""


def policy_user() -> User:
    user, created = User.objects.get_or_create(
        username=POLICY_USERNAME, defaults={"is_active": False, "first_name": "Approval", "last_name": "policies"})
    if created:
        user.set_unusable_password()
        user.save(update_fields=["password"])
    if user.is_active or user.has_usable_password():
        raise ImproperlyConfigured(f"The user {POLICY_USERNAME!r} must be inactive without a password: policies "
                                   "decide as that account. Rename the person's account that uses this name.")
    return user


# --- evaluation ---------------------------------------------------------------------------------------------


# What the runner needs to know at every waiting item and model call: the rules of the policies switched on and
# every budget's limits. Kept in this process only while it is current: each use first reads the policies'
# version, a value every change bumps (policies_forget, after its commit) where every process of the stack sees it:
# Redis on the scale-out stack (one GET), a small file beside the SQLite database on the embedded stack (one
# stat, no SQL: a runner started apart with `runagents` shares it), the newest PolicyChange row on PostgreSQL
# without Redis; with an in-memory database there is one process and the change itself drops the state. A policy
# switched off therefore binds every process at once; no time window, no query per model call.
POLICY_VERSION_KEY = "policies:version"


@dataclass(frozen=True)
class PolicyState:
    rules: list[Rule]
    budgets: dict[int | None, tuple[Decimal | None, Decimal | None]]


@dataclass
class KeptState:
    state: PolicyState | None = None
    version: object = None  # the policies' version the state was read at
    dropped: int = 0  # how many times it was dropped: a read begun before a drop is not kept after it
    lock: threading.Lock = field(default_factory=threading.Lock)


KEPT = KeptState()
_SHARED: dict[str, Any] = {}  # the shared cache client, made once for every thread of the process


def shared_cache() -> Any | None:
    """Django's cache when every process shares it (Redis), else None. One client for the whole process: a
    client per thread made a runner open and tear down clients on every thread it starts."""
    if "cache" not in _SHARED:
        backend = str(settings.CACHES.get("default", {}).get("BACKEND", ""))
        _SHARED["cache"] = caches.create_connection("default") if "redis" in backend.lower() else None
    return _SHARED["cache"]


def version_file() -> Path | None:
    """The file beside the SQLite database that holds the policies' version (None: not SQLite on a file)."""
    database = settings.DATABASES["default"]
    name = str(database.get("NAME") or "")
    if "sqlite" not in str(database.get("ENGINE", "")) or not name or name == ":memory:" or name.startswith("file:"):
        return None
    return Path(name).with_name(Path(name).name + ".policies-version")


def policies_version() -> object:
    """The policies' current version, as every process sees it."""
    cache = shared_cache()
    if cache is not None:
        try:
            return ("cache", cache.get(POLICY_VERSION_KEY, 0))
        except Exception:  # Redis away: the database answers, never a stale state
            logger.warning("policies' version not readable from the cache; read from the database")
            return ("db", PolicyChange.objects.order_by("-id").values_list("id", flat=True).first())
    path = version_file()
    if path is not None:
        try:
            return ("file", path.read_text())
        except OSError:
            return ("file", "")
    if connection_vendor() != "sqlite":
        return ("db", PolicyChange.objects.order_by("-id").values_list("id", flat=True).first())
    return ("process", 0)  # an in-memory database: this process alone, whose changes drop the state


def connection_vendor() -> str:
    from django.db import connection

    return str(connection.vendor)


def policy_state() -> PolicyState:
    version = policies_version()
    with KEPT.lock:
        if KEPT.state is not None and KEPT.version == version:
            return KEPT.state
        dropped = KEPT.dropped
    rules = list(Rule.objects.filter(policy__enabled=True).select_related("policy")
                 .order_by("policy__position", "policy__name", "position"))
    budgets = {b.agent_id: (b.daily_limit, b.plan_limit)
               for b in Budget.objects.only("agent_id", "daily_limit", "plan_limit")}
    state = PolicyState(rules=rules, budgets=budgets)
    with KEPT.lock:
        if KEPT.dropped == dropped:  # else a change came meanwhile: the next use reads again
            KEPT.state, KEPT.version = state, version
    return state


def policy_state_drop() -> None:
    with KEPT.lock:
        KEPT.state = None
        KEPT.dropped += 1


def policies_version_bump() -> None:
    """Every process reads the policies again at its next use."""
    policy_state_drop()
    cache = shared_cache()
    if cache is not None:
        try:
            cache.set(POLICY_VERSION_KEY, time_ns(), timeout=None)
        except Exception:
            logger.exception("policies' version not written to the cache")
    path = version_file()
    if path is not None:
        try:
            written = path.with_name(f"{path.name}.{os.getpid()}.tmp")
            written.write_text(str(time_ns()))
            os.replace(written, path)  # whole, never half-written, for a reader in another process
        except OSError:
            logger.exception("policies' version not written to %s", path)


def policies_forget() -> None:
    """After a change to policies, rules or budgets: read again at the next use, in this process and (after the
    commit) in every other."""
    policy_state_drop()
    transaction.on_commit(policies_version_bump)


def rules_enabled() -> list[Rule]:
    """The rules of the policies switched on, in order (cached: see policy_state)."""
    return policy_state().rules


def now_time() -> time:
    return timezone.localtime().time()


def step_tools(step: PlanStep) -> tuple[str, ...]:
    name = step.tool or step.action_hint
    return (name,) if name else ()


def step_item(step: PlanStep, agent_id: int, at: time) -> Item:
    return Item(kind="step", agent_id=agent_id, tools=step_tools(step), risky=step.risk == PlanStep.Risk.RISKY,
                requires_permission=step.requires_permission, estimated_cycles=step.estimated_cycles, at=at)


def plan_item(plan: Plan, steps: Iterable[PlanStep], at: time) -> Item:
    """A plan as the inbox shows it: risky when a step is risky or the planner named risks; its steps still to do."""
    todo = [s for s in steps if not s.carried_over]  # a replan keeps the steps done before: not to decide again
    return Item(kind="plan", agent_id=plan.agent_id, tools=tuple(dict.fromkeys(t for s in todo for t in step_tools(s))),
                risky=any(s.risk == PlanStep.Risk.RISKY for s in todo) or bool(plan.risks),
                requires_permission=any(s.requires_permission for s in todo),
                estimated_cycles=sum(s.estimated_cycles for s in todo), at=at)


def decided_safely(decide: Any, what: str) -> Match | None:
    """A policy that cannot apply (a bug, a refused decision) leaves the item waiting for a person; it never
    breaks the runner's cycle or the agent's request that made the item wait."""
    try:
        with transaction.atomic():  # a savepoint: a failed decision undoes only itself
            return decide()  # type: ignore[no-any-return]
    except Exception:
        logger.exception("policy could not decide %s; it waits for a person", what)
        return None


def operator_chose_step_by_step(plan: Plan) -> bool:
    """The operator chose "Step by step" for this plan: each of its steps is theirs to decide, never a policy's
   . A policy's own approval of a plan is "all steps", so step-by-step is always a person's choice."""
    return plan.approval_mode == Plan.ApprovalMode.STEP


def policies_step_waiting(*, step: PlanStep) -> Match | None:
    """A step has just started to wait for approval (its plan locked, in the same transaction): the first
    matching rule decides it, unless the operator chose to decide this plan step by step. One query when no
    policy is on."""
    if operator_chose_step_by_step(step.plan):
        return None
    rules = rules_enabled()
    if not rules:
        return None
    match = rules_decide(rules, item_of_agent(step_item(step, step.plan.agent_id, now_time()),
                                              agent_kind=step.plan.agent.kind))
    if match is None:
        return None
    return decided_safely(lambda: step_decide(step=step, match=match), f"step {step.pk}")


def steps_waiting_decide(sender: object, *, steps: Sequence[PlanStep], **kwargs: Any) -> None:
    """Receiver of planning.signals.steps_await_approval: the policies decide each step that now waits (nothing
    more than one cached read when no policy is on)."""
    if rules_enabled():
        for step in steps:
            policies_step_waiting(step=step)


def step_decide(*, step: PlanStep, match: Match) -> Match:
    rule = match.rule
    if match.action == Rule.Action.APPROVE:
        start_after = step_undo_window(step)
        planning.step_approve(step=step, user=policy_user(), actor_label=match.label,
                              detail=match.detail | ({"start_after": start_after.isoformat()} if start_after else {}))
        if start_after is not None:
            PlanStep.objects.filter(pk=step.pk).update(start_after=start_after)
            step.start_after = start_after
    elif match.action == Rule.Action.DECLINE:
        planning.step_decline(step=step, user=policy_user(), feedback=rule.reason, actor_label=match.label,
                              detail=match.detail)
    else:
        planning.event_record(plan=step.plan, step=step, kind=PlanEvent.Kind.ESCALATED, actor_label=match.label,
                              reason=rule.reason or f"step {step.key} escalated: urgent",
                              detail=match.detail | {"item": "step"})
    return match


def step_writes_or_is_risky(step: PlanStep) -> bool:
    """A built-in tool agent's step that writes (or reaches the network) or is risky: its runner honours the
    undo window (a persona's steps and an external agent's are not held; docs/operator-decisions.md)."""
    spec = TOOLS.get(step.tool) if step.tool else None
    if spec is None or step.plan.agent.kind != Agent.Kind.TOOL:
        return False
    return step.risk == PlanStep.Risk.RISKY or spec.risky


def step_undo_window(step: PlanStep) -> datetime | None:
    """When a step a policy approves may start: after POLICY_UNDO_SECONDS when it writes or is risky, so that an
    operator can still undo the approval; None when it may start at once."""
    seconds = float(getattr(settings, "POLICY_UNDO_SECONDS", 10))
    if seconds <= 0 or not step_writes_or_is_risky(step):
        return None
    return timezone.now() + timedelta(seconds=seconds)


def policies_plan_waiting(*, plan: Plan, rules: Sequence[Rule]) -> Match | None:
    """A plan has just been validated and awaits approval (locked, in the same transaction): the first of `rules`
    (the rules switched on, rules_enabled) that matches decides it. An external agent whose own approval policy
    starts its plans at once is left to it."""
    agent = plan.agent
    if agent.kind == Agent.Kind.EXTERNAL and agent.approval_policy == Agent.ApprovalPolicy.PERMISSION:
        return None
    steps = list(plan.steps.only("key", "tool", "action_hint", "risk", "requires_permission", "estimated_cycles",
                                 "carried_over"))
    match = rules_decide(rules, item_of_agent(plan_item(plan, steps, now_time()), agent_kind=agent.kind))
    if match is None:
        return None
    return decided_safely(lambda: plan_decide(plan=plan, match=match), f"plan {plan.pk}")


def plans_waiting_decide(sender: object, *, plans: Sequence[Plan], **kwargs: Any) -> set[int]:
    """Receiver of planning.signals.plans_await_approval: the pks of the plans the policies decided. The rules are
    read once for the list (a plan's decision changes no policy)."""
    rules = rules_enabled()
    if not rules:
        return set()
    return {plan.pk for plan in plans if policies_plan_waiting(plan=plan, rules=rules) is not None}


def plan_decide(*, plan: Plan, match: Match) -> Match:
    rule = match.rule
    if match.action == Rule.Action.APPROVE:
        # Every step approved, except those that require permission unless the rule names them: they wait, each
        # decided on its own (by a person, or by a rule for steps).
        event = planning.plan_approve(plan=plan, user=policy_user(), mode=Plan.ApprovalMode.ALL,
                                      actor_label=match.label, detail=match.detail,
                                      approve_permission_steps=rule.approve_permission)
        plan_steps_hold(plan=plan, match=match, keys=event.detail.get("approved_steps", []), approval=event)
    elif match.action == Rule.Action.DECLINE:
        planning.plan_replan_request(plan=plan, user=policy_user(), reason=rule.reason, actor_label=match.label,
                                     detail=match.detail)
    else:
        planning.event_record(plan=plan, kind=PlanEvent.Kind.ESCALATED, actor_label=match.label,
                              reason=rule.reason or f"plan v{plan.version} escalated: urgent",
                              detail=match.detail | {"item": "plan"})
    return match


def plan_steps_hold(*, plan: Plan, match: Match, keys: list[str], approval: PlanEvent) -> list[str]:
    """A policy approved a whole plan: each of its steps it approved that writes or is risky (a built-in tool
    agent's) is held for POLICY_UNDO_SECONDS, as a step a policy approves on its own is, and its approval is
    recorded on the step, so the same Undo (plan page, inbox's decided-by-policies list) takes it back."""
    held: list[str] = []
    for step in plan.steps.filter(key__in=keys).select_related("plan__agent").order_by("position"):
        start_after = step_undo_window(step)
        if start_after is None:
            continue
        PlanStep.objects.filter(pk=step.pk).update(start_after=start_after)
        planning.event_record(
            plan=plan, step=step, kind=PlanEvent.Kind.STEP_APPROVED, actor=policy_user(), actor_label=match.label,
            reason=(f"approved step {step.key} with plan v{plan.version}: {step.description}; starts after "
                    f"{timezone.localtime(start_after):%H:%M:%S} unless undone"),
            detail=match.detail | {"start_after": start_after.isoformat(), "with_plan_approval": approval.pk})
        held.append(step.key)
    return held


# --- undo ---------------------------------------------------------------------------------------------------


@planning.atomic_retried
def decision_undo(*, event_id: int, user: User) -> PlanEvent:
    """Take back a policy's approval of a step that has not started: the step waits for a person again (and no
    policy decides it again)."""
    event = (PlanEvent.objects.filter(pk=event_id, kind=PlanEvent.Kind.STEP_APPROVED, step__isnull=False)
             .only("pk", "step_id", "actor_label", "detail").first())
    if event is None or "policy" not in event.detail:
        raise planning.DecisionError("Only a policy's approval of a step can be undone. Nothing was changed.")
    assert event.step_id is not None
    step = planning.step_lock(event.step_id)
    if PlanEvent.objects.filter(kind=PlanEvent.Kind.DECISION_UNDONE, step_id=step.pk,
                                detail__undone_event=event.pk).exists():
        raise planning.DecisionError(f"This approval of step {step.key} was already undone. Nothing was changed.")
    latest = (PlanEvent.objects.filter(step_id=step.pk, kind=PlanEvent.Kind.STEP_APPROVED)
              .order_by("-created_at", "-id").values_list("pk", flat=True).first())
    if (step.status != PlanStep.Status.PENDING or step.actual_cycles or step.plan.status != Plan.Status.ACTIVE
            or latest != event.pk):
        state = "has started" if step.actual_cycles or step.status != PlanStep.Status.PENDING else "was decided again since"
        if step.plan.status != Plan.Status.ACTIVE:
            state = f"belongs to a plan that is {step.plan.get_status_display().lower()}"
        raise planning.DecisionError(f"Step {step.key} {state}; only a policy's approval of a step that has not "
                                     "started can be undone. Nothing was changed.")
    planning.step_move(step=step, status=PlanStep.Status.AWAITING_APPROVAL)
    step.approved_by = None
    step.start_after = None
    step.save(update_fields=["status", "approved_by", "start_after", "updated_at"])
    Agent.objects.filter(pk=step.plan.agent_id).update(waiting_reason=f"step {step.key} awaits approval")
    return planning.event_record(
        plan=step.plan, step=step, kind=PlanEvent.Kind.DECISION_UNDONE, actor=user,
        reason=f"undid the approval by {event.actor_label}: step {step.key} waits for a person again",
        detail={"undone_event": event.pk, "undone_policy": event.detail.get("policy"),
                "undone_rule": event.detail.get("rule")})


# --- budgets ------------------------------------------------------------------------------------------------

def budgets_known() -> dict[int | None, tuple[Decimal | None, Decimal | None]]:
    """Every budget's limits by agent (None: every agent's), cached: no query per model call."""
    return policy_state().budgets


def price_of(model: str) -> tuple[Decimal, Decimal] | None:
    price = settings.LLM_PRICES.get(model)
    if not price:
        return None
    return Decimal(str(price[0])), Decimal(str(price[1]))


def calls_spend(calls: QuerySet[LLMCall]) -> Decimal:
    """What these calls cost in USD: their tokens by model, at LLM_PRICES (a model without a price costs 0)."""
    return calls_spend_by_agent(calls).get("all", Decimal("0.000000"))


def calls_spend_by_agent(calls: QuerySet[LLMCall], *, by_agent: bool = False) -> dict[Any, Decimal]:
    """The cost of these calls, in one query: in all (under "all"), or per agent id."""
    totals: dict[Any, Decimal] = {}
    fields = ("agent_id", "model") if by_agent else ("model",)
    for row in calls.order_by().values(*fields).annotate(i=Sum("tokens_in"), o=Sum("tokens_out")):
        price = price_of(row["model"])
        group = row["agent_id"] if by_agent else "all"
        cost = Decimal(0) if price is None else (price[0] * (row["i"] or 0) + price[1] * (row["o"] or 0)) / Decimal(1_000_000)
        totals[group] = totals.get(group, Decimal(0)) + cost
    return {k: v.quantize(Decimal("0.000001")) for k, v in totals.items()}


def day_start() -> datetime:
    """Midnight today, server time: where an agent's day of spending starts."""
    return timezone.localtime().replace(hour=0, minute=0, second=0, microsecond=0)


@dataclass(frozen=True)
class Spend:
    scope: str  # "day" or "plan"
    spent: Decimal
    limit: Decimal


def budget_limits(agent_id: int) -> tuple[Decimal | None, Decimal | None] | None:
    known = budgets_known()
    if not known:
        return None
    return known.get(agent_id) or known.get(None)


def budget_reached(*, agent_id: int, plan_id: int | None) -> Spend | None:
    """The limit this agent has reached, if any (the day's first, then the plan's)."""
    limits = budget_limits(agent_id)
    if limits is None:
        return None
    daily, per_plan = limits
    if daily is not None:
        spent = calls_spend(LLMCall.objects.filter(agent_id=agent_id, created_at__gte=day_start()))
        if spent >= daily:
            return Spend("day", spent, daily)
    if per_plan is not None and plan_id is not None:
        spent = calls_spend(LLMCall.objects.filter(plan_id=plan_id))
        if spent >= per_plan:
            return Spend("plan", spent, per_plan)
    return None


def budget_after_call(*, agent_id: int | None, plan_id: int | None) -> Spend | None:
    """After a model call is recorded: pause the agent when it has reached its budget. No query when no budget
    is set (the limits come from the cache)."""
    if agent_id is None:
        return None
    try:
        reached = budget_reached(agent_id=agent_id, plan_id=plan_id)
        if reached is not None:
            with transaction.atomic():
                budget_pause(agent_id=agent_id, plan_id=plan_id, reached=reached)
        return reached
    except Exception:  # a budget check never fails the model call it follows
        logger.exception("budget check of agent %s failed", agent_id)
        return None


def budgets_after_calls(calls: Iterable[tuple[int | None, int | None]]) -> None:
    """budget_after_call for the (agent, plan) of each of many model calls recorded together (a runner's
    pass), each pair once; the limits read once, and nothing more when no budget is set."""
    if not budgets_known():
        return
    for agent_id, plan_id in dict.fromkeys(calls):
        budget_after_call(agent_id=agent_id, plan_id=plan_id)


def budget_label(agent_id: int) -> str:
    return "budget: " + ("this agent's" if agent_id in budgets_known() else "every agent's")


@planning.atomic_retried
def budget_pause(*, agent_id: int, plan_id: int | None, reached: Spend) -> PlanEvent | None:
    """Pause a running agent whose budget is reached, with the event that says so; None when it is not running."""
    agent = Agent.objects.select_for_update(no_key=True).get(pk=agent_id)
    if agent.status != Agent.Status.RUNNING:
        return None
    agent.status = Agent.Status.PAUSED
    agent.save(update_fields=["status"])
    plan = Plan.objects.filter(pk=plan_id).first() if plan_id else None
    if plan is None:
        plan = Plan.objects.open().filter(agent=agent).order_by("-created_at").first()
    where = "today" if reached.scope == "day" else f"for plan v{plan.version if plan else '?'}"
    reason = (f"budget reached: ${reached.spent:.6f} of ${reached.limit:.6f} {where}; paused. Raise the budget "
              f"or wait{' for tomorrow' if reached.scope == 'day' else ''}, then resume.")
    label = budget_label(agent.pk)
    detail = {"scope": reached.scope, "spent": str(reached.spent), "limit": str(reached.limit), "plan": plan_id}
    for kind in (PlanEvent.Kind.AGENT_PAUSED, PlanEvent.Kind.BUDGET_REACHED):
        if plan is not None:
            event = planning.event_record(plan=plan, kind=kind, actor_label=label, reason=reason, detail=detail)
        else:
            event = planning.event_agent_record(agent=agent, kind=kind, actor_label=label, reason=reason, detail=detail)
    return event


# --- edits of policies, rules and budgets -------------------------------------------------------------------

POLICY_FIELDS = ("name", "description", "position")
RULE_FIELDS = ("position", "applies_to", "agent", "tools", "risk", "requires_permission", "max_estimated_cycles",
               "active_from", "active_until", "action", "reason", "approve_risky", "approve_permission")


def change_record(*, user: User, policy: Policy | None, what: str, diff: Mapping[str, Any] | None = None) -> PolicyChange:
    return PolicyChange.objects.create(policy=policy, actor=user, actor_label=user.get_username(), what=what[:500],
                                       diff={k: [shown(v[0]), shown(v[1])] for k, v in (diff or {}).items()})


def shown(value: Any) -> str:
    if isinstance(value, Agent):
        return value.name
    return "" if value is None else str(value)


def text_check(name: str, value: str, max_length: int) -> None:
    if problem := text_problem(value, max_length=max_length):
        raise PolicyError(f"{name} {problem}. Nothing was changed.")


@transaction.atomic
def policy_save(*, user: User, policy: Policy | None, name: str, description: str = "", position: int = 1) -> Policy:
    """Create a policy (switched off) or change its name, description and order."""
    name = " ".join(name.split())
    if not name:
        raise PolicyError("Name the policy. Nothing was changed.")
    text_check("The name", name, 100)
    text_check("The description", description, 500)
    values = {"name": name, "description": description.strip(), "position": position}
    if policy is None:
        try:
            with transaction.atomic():
                policy = Policy.objects.create(**values)
        except IntegrityError as exc:
            raise PolicyError(f"A policy named {name!r} exists already. Nothing was changed.") from exc
        change_record(user=user, policy=policy, what=f"policy '{policy.name}' created (off)")
        policies_forget()
        return policy
    policy = Policy.objects.select_for_update().get(pk=policy.pk)
    diff = {k: [getattr(policy, k), v] for k, v in values.items() if getattr(policy, k) != v}
    if not diff:
        return policy
    if Policy.objects.filter(name=name).exclude(pk=policy.pk).exists():
        raise PolicyError(f"A policy named {name!r} exists already. Nothing was changed.")
    for k, v in values.items():
        setattr(policy, k, v)
    policy.save()
    change_record(user=user, policy=policy, what=f"policy '{policy.name}' changed", diff=diff)
    policies_forget()
    return policy


@transaction.atomic
def policy_switch(*, user: User, policy: Policy, enabled: bool) -> Policy:
    """Switch a policy on (it decides from now on) or off."""
    policy = Policy.objects.select_for_update().get(pk=policy.pk)
    if policy.enabled == enabled:
        raise PolicyError(f"Policy '{policy.name}' is already {'on' if enabled else 'off'}. Nothing was changed.")
    if enabled and not policy.rules.exists():
        raise PolicyError(f"Policy '{policy.name}' has no rules yet: add one before switching it on. "
                          "Nothing was changed.")
    policy.enabled = enabled
    policy.save(update_fields=["enabled", "updated_at"])
    change_record(user=user, policy=policy, what=f"policy '{policy.name}' switched {'on' if enabled else 'off'}",
                  diff={"enabled": [not enabled, enabled]})
    policies_forget()
    return policy


@transaction.atomic
def policy_delete(*, user: User, policy: Policy) -> None:
    policy = Policy.objects.select_for_update().get(pk=policy.pk)
    change_record(user=user, policy=None, what=f"policy '{policy.name}' deleted with its {policy.rules.count()} rules")
    policy.delete()
    policies_forget()


def rule_values_check(rule: Rule) -> None:
    text_check("The tools", rule.tools, 500)
    text_check("The reason", rule.reason, 500)
    problems = rule_problems(rule)
    if problems:
        raise PolicyError(" ".join(problems) + " Nothing was changed.")


@transaction.atomic
def rule_save(*, user: User, policy: Policy, rule: Rule | None, values: Mapping[str, Any]) -> Rule:
    """Add a rule to a policy or change one; a rule that contradicts itself is refused with the reason."""
    policy = Policy.objects.select_for_update().get(pk=policy.pk)
    values = {k: v for k, v in values.items() if k in RULE_FIELDS}
    if "tools" in values:
        values["tools"] = ", ".join(t.strip() for t in str(values["tools"]).split(",") if t.strip())
    if "reason" in values:
        values["reason"] = " ".join(str(values["reason"]).split())
    if rule is None:
        values.setdefault("position", (max(policy.rules.values_list("position", flat=True), default=0) + 1))
        new = Rule(policy=policy, **values)
        rule_values_check(new)
        if policy.rules.filter(position=new.position).exists():
            raise PolicyError(f"Rule {new.position} exists already in this policy. Nothing was changed.")
        new.save()
        change_record(user=user, policy=policy, what=f"rule {new.position} added to '{policy.name}': {rule_summary(new)}")
        policies_forget()
        return new
    rule = Rule.objects.select_for_update().get(pk=rule.pk, policy=policy)
    diff = {k: [getattr(rule, k), v] for k, v in values.items() if getattr(rule, k) != v}
    if not diff:
        return rule
    for k, v in values.items():
        setattr(rule, k, v)
    rule_values_check(rule)
    if policy.rules.filter(position=rule.position).exclude(pk=rule.pk).exists():
        raise PolicyError(f"Rule {rule.position} exists already in this policy. Nothing was changed.")
    rule.save()
    change_record(user=user, policy=policy, what=f"rule {rule.position} of '{policy.name}' changed", diff=diff)
    policies_forget()
    return rule


@transaction.atomic
def rule_delete(*, user: User, rule: Rule) -> None:
    policy = Policy.objects.select_for_update().get(pk=rule.policy_id)
    rule = Rule.objects.get(pk=rule.pk)
    change_record(user=user, policy=policy, what=f"rule {rule.position} removed from '{policy.name}': {rule_summary(rule)}")
    rule.delete()
    policies_forget()


def rule_summary(rule: Rule) -> str:
    """A rule in words: its conditions and what it does."""
    parts = [rule.get_applies_to_display().lower()]
    if rule.agent is not None:
        parts.append(f"of {rule.agent.name}")
    if rule.tool_names:
        parts.append(f"using {', '.join(rule.tool_names)}")
    if rule.risk != Rule.Risk.ANY:
        parts.append(rule.get_risk_display().lower())
    if rule.requires_permission == Rule.Permission.YES:
        parts.append("requiring permission")
    elif rule.requires_permission == Rule.Permission.NO:
        parts.append("not requiring permission")
    if rule.max_estimated_cycles is not None:
        parts.append(f"estimated at most {rule.max_estimated_cycles} cycles")
    if rule.active_from or rule.active_until:
        start = rule.active_from.strftime("%H:%M") if rule.active_from else "00:00"
        end = rule.active_until.strftime("%H:%M") if rule.active_until else "24:00"
        parts.append(f"between {start} and {end}")
    action = {"approve": "approve", "decline": "decline", "escalate": "escalate"}[rule.action]
    if rule.action == Rule.Action.APPROVE:
        named = [w for w, on in (("risky", rule.approve_risky), ("requiring permission", rule.approve_permission)) if on]
        if named:
            action += f" (including {' and '.join(named)})"
    text = f"{' '.join(parts)} → {action}"
    return text + (f": “{rule.reason}”" if rule.reason else "")


@transaction.atomic
def budget_save(*, user: User, agent: Agent | None, daily_limit: Decimal | None, plan_limit: Decimal | None) -> Budget:
    """Set the budget of one agent, or of every agent without its own."""
    for name, value in (("daily limit", daily_limit), ("plan limit", plan_limit)):
        if value is not None and (value < 0 or value >= Decimal(10**6)):
            raise PolicyError(f"The {name} must be between 0 and 999,999 USD. Nothing was changed.")
    if daily_limit is None and plan_limit is None:
        raise PolicyError("Set a daily limit, a plan limit or both. Nothing was changed.")
    budget = Budget.objects.select_for_update().filter(agent=agent).first()
    whose = agent.name if agent else "every agent"
    if budget is None:
        budget = Budget.objects.create(agent=agent, daily_limit=daily_limit, plan_limit=plan_limit)
        change_record(user=user, policy=None, what=f"budget of {whose} set",
                      diff={"daily_limit": [None, daily_limit], "plan_limit": [None, plan_limit]})
    else:
        diff = {k: [getattr(budget, k), v] for k, v in (("daily_limit", daily_limit), ("plan_limit", plan_limit))
                if getattr(budget, k) != v}
        if diff:
            budget.daily_limit, budget.plan_limit = daily_limit, plan_limit
            budget.save()
            change_record(user=user, policy=None, what=f"budget of {whose} changed", diff=diff)
    policies_forget()
    return budget


@transaction.atomic
def budget_delete(*, user: User, budget: Budget) -> None:
    budget = Budget.objects.select_related("agent").get(pk=budget.pk)
    change_record(user=user, policy=None, what=f"budget of {budget.agent.name if budget.agent else 'every agent'} removed")
    budget.delete()
    policies_forget()


