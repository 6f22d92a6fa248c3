"""Reads for the policies page: policies and their rules, budgets with today's spend, the latest automatic
decisions (with what can still be undone), the record of changes, and the dry run."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, time
from decimal import Decimal

from django.db.models import Exists, OuterRef, Prefetch, Q, QuerySet, Subquery
from django.utils import timezone

from agents.models import Agent, LLMCall
from agents.tools import TOOLS
from agents.world import ACTIONS
from planning.models import Plan, PlanEvent, PlanStep
from policies.engine import Item, Match, ToolScope, item_of_agent, ordered, rule_tool_scope, rules_decide
from policies.models import Budget, Policy, PolicyChange, Rule
from policies.services import POLICY_USERNAME, calls_spend_by_agent, day_start, plan_item, step_item

DRY_RUN_DECISIONS = 100
DECISIONS_SHOWN = 20

AUTOMATIC_KINDS = (PlanEvent.Kind.STEP_APPROVED, PlanEvent.Kind.STEP_DECLINED, PlanEvent.Kind.PLAN_APPROVED,
                   PlanEvent.Kind.REPLAN_REQUESTED, PlanEvent.Kind.ESCALATED)


def policies_list() -> list[Policy]:
    """Every policy with its rules (and their agents) in order: two queries."""
    rules = Rule.objects.select_related("agent").only(*(f.name for f in Rule._meta.concrete_fields), "agent__name")
    return list(Policy.objects.prefetch_related(Prefetch("rules", queryset=rules.order_by("position"))))


def rule_tool_scopes(rules: Sequence[Rule]) -> dict[int, ToolScope]:
    """Which agents' tools each rule would match (the built-in registry and persona actions, or the declared
    tools of the external agent it is scoped to), by rule id."""
    builtin = set(TOOLS) | set(ACTIONS)
    return {rule.pk: rule_tool_scope(rule, builtin=builtin, agent_kind=rule.agent.kind if rule.agent else None,
                                     declared=[t.get("name", "") for t in (rule.agent.declared_tools or [])]
                                     if rule.agent else ())
            for rule in rules}


def policy_rules(policy: Policy) -> list[Rule]:
    rules = list(policy.rules.select_related("agent").order_by("position"))
    for rule in rules:
        rule.policy = policy  # the label and the dry run name it without reading it again
    return rules


@dataclass
class BudgetRow:
    budget: Budget
    spent_today: Decimal | None  # an agent's own budget: what it spent today


def budgets_list() -> list[BudgetRow]:
    """Every budget, the default first, with what its agent spent today: two queries."""
    budgets = list(Budget.objects.select_related("agent").order_by("agent__name"))
    budgets.sort(key=lambda b: b.agent_id is not None)
    ids = [b.agent_id for b in budgets if b.agent_id]
    spent = calls_spend_by_agent(LLMCall.objects.filter(agent_id__in=ids, created_at__gte=day_start()),
                                 by_agent=True) if ids else {}
    return [BudgetRow(b, spent.get(b.agent_id, Decimal("0.000000")) if b.agent_id else None) for b in budgets]


def changes_recent(limit: int = 20) -> list[PolicyChange]:
    return list(PolicyChange.objects.order_by("-created_at", "-id")[:limit])


@dataclass
class Decision:
    event: PlanEvent
    undoable: bool


def decisions_recent(limit: int = DECISIONS_SHOWN) -> list[Decision]:
    """The latest decisions made by policies, newest first; a step's approval can be undone while the step has
    not started. Two queries."""
    events = list(
        PlanEvent.objects.filter(kind__in=AUTOMATIC_KINDS, detail__has_key="policy")
        .select_related("plan", "agent", "step")
        .only("kind", "actor_label", "reason", "detail", "created_at", "plan__version", "plan__goal_text",
              "plan__status", "agent__name", "step__key", "step__status", "step__actual_cycles")
        .order_by("-created_at", "-id")[:limit])
    approvals = [e for e in events if e.kind == PlanEvent.Kind.STEP_APPROVED and e.step is not None]
    undone: set[int] = set()
    if approvals:
        for detail in PlanEvent.objects.filter(kind=PlanEvent.Kind.DECISION_UNDONE,
                                               step_id__in=[e.step_id for e in approvals]).values_list("detail", flat=True):
            undone.add(int(detail.get("undone_event") or 0))
    return [Decision(e, e in approvals and e.pk not in undone and e.step is not None
                     and e.step.status == PlanStep.Status.PENDING and not e.step.actual_cycles
                     and e.plan is not None and e.plan.status == Plan.Status.ACTIVE) for e in events]


def budget_notice(agent: Agent) -> PlanEvent | None:
    """Why a paused agent is paused, when a budget paused it: the budget event since its last resume."""
    if agent.status != Agent.Status.PAUSED:
        return None
    latest = (PlanEvent.objects.filter(agent=agent, kind__in=[PlanEvent.Kind.BUDGET_REACHED, PlanEvent.Kind.AGENT_RESUMED,
                                                              PlanEvent.Kind.AGENT_PAUSED])
              .exclude(kind=PlanEvent.Kind.AGENT_PAUSED, detail__has_key="scope")
              .order_by("-created_at", "-id").only("kind", "reason", "created_at").first())
    return latest if latest is not None and latest.kind == PlanEvent.Kind.BUDGET_REACHED else None


# --- the dry run ----------------------------------------------------------------------------------------------

PERSON_DECISIONS = (PlanEvent.Kind.STEP_APPROVED, PlanEvent.Kind.STEP_DECLINED, PlanEvent.Kind.PLAN_APPROVED,
                    PlanEvent.Kind.PLAN_CANCELLED)


@dataclass
class DryRunRow:
    event: PlanEvent
    item: Item
    person: str  # "approved", "declined"
    match: Match | None

    @property
    def verdict(self) -> str:
        return self.match.action if self.match else "person"

    @property
    def agrees(self) -> bool | None:
        """Whether the policy would have done what the person did (None: it would have left it to a person, or
        escalated it)."""
        if self.match is None or self.match.action == Rule.Action.ESCALATE:
            return None
        return (self.match.action == Rule.Action.APPROVE) == (self.person == "approved")


def person_decisions(limit: int = DRY_RUN_DECISIONS) -> QuerySet[PlanEvent]:
    """The latest decisions people made on items that waited for them: a step approved or declined, a plan
    approved, or cancelled while it awaited approval. Each with when the item started to wait."""
    step_waited = Subquery(PlanEvent.objects.filter(
        kind=PlanEvent.Kind.STEP_AWAITING, step_id=OuterRef("step_id"), created_at__lte=OuterRef("created_at"))
        .order_by("-created_at", "-id").values("created_at")[:1])
    plan_waited = Subquery(PlanEvent.objects.filter(
        kind=PlanEvent.Kind.VALIDATED, plan_id=OuterRef("plan_id"), created_at__lte=OuterRef("created_at"))
        .order_by("-created_at", "-id").values("created_at")[:1])
    approved_before = PlanEvent.objects.filter(kind=PlanEvent.Kind.PLAN_APPROVED, plan_id=OuterRef("plan_id"),
                                               created_at__lte=OuterRef("created_at"))
    steps = PlanStep.objects.only("plan_id", "key", "tool", "action_hint", "risk", "requires_permission",
                                  "estimated_cycles", "status", "description", "carried_over")
    return (PlanEvent.objects.filter(kind__in=PERSON_DECISIONS, actor__isnull=False, plan__isnull=False)
            .exclude(actor__username=POLICY_USERNAME)
            .filter(Q(kind__in=[PlanEvent.Kind.STEP_APPROVED, PlanEvent.Kind.STEP_DECLINED], step__isnull=False)
                    | Q(kind=PlanEvent.Kind.PLAN_APPROVED)
                    | Q(kind=PlanEvent.Kind.PLAN_CANCELLED, plan__agent__kind__in=[Agent.Kind.TOOL, Agent.Kind.EXTERNAL]))
            .annotate(step_waited=step_waited, plan_waited=plan_waited, approved_before=Exists(approved_before))
            .exclude(kind=PlanEvent.Kind.PLAN_CANCELLED, approved_before=True)
            .select_related("plan", "plan__agent", "agent", "step")
            .prefetch_related(Prefetch("plan__steps", queryset=steps))
            .order_by("-created_at", "-id")[:limit])


def local_time(moment: datetime | None, fallback: datetime) -> time:
    return timezone.localtime(moment or fallback).time()


def dry_run(policy: Policy, *, limit: int = DRY_RUN_DECISIONS) -> list[DryRunRow]:
    """What `policy` (on or off) would have decided, alone, on the latest decisions people made: four queries."""
    rules = ordered(policy_rules(policy))
    rows = []
    for event in person_decisions(limit):
        plan = event.plan
        assert plan is not None
        if event.step is not None:
            waited = getattr(event, "step_waited", None)
            if waited is None:  # a step approved without having waited (seen through a plan's approval)
                continue
            item = step_item(event.step, plan.agent_id, local_time(waited, event.created_at))
        else:
            item = plan_item(plan, plan.steps.all(), local_time(getattr(event, "plan_waited", None), event.created_at))
        item = item_of_agent(item, agent_kind=plan.agent.kind)
        person = "approved" if event.kind in (PlanEvent.Kind.STEP_APPROVED, PlanEvent.Kind.PLAN_APPROVED) else "declined"
        rows.append(DryRunRow(event=event, item=item, person=person, match=rules_decide(rules, item)))
    return rows


def dry_run_summary(rows: Sequence[DryRunRow]) -> dict[str, int]:
    return {
        "decisions": len(rows),
        "approve": sum(1 for r in rows if r.verdict == Rule.Action.APPROVE),
        "decline": sum(1 for r in rows if r.verdict == Rule.Action.DECLINE),
        "escalate": sum(1 for r in rows if r.verdict == Rule.Action.ESCALATE),
        "person": sum(1 for r in rows if r.verdict == "person"),
        "agree": sum(1 for r in rows if r.agrees is True),
        "disagree": sum(1 for r in rows if r.agrees is False),
    }
