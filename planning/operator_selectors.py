"""Reads for the steering pages: the inbox, versions and their compare view, the plan graph, the audit log
and usage. Each page costs a fixed number of queries whatever its size (query-count tests in tests/operator_pages)."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from decimal import Decimal
from typing import Any

from django.db.models import Avg, Count, F, OuterRef, Prefetch, Q, QuerySet, Subquery, Sum
from django.db.models.functions import Coalesce, TruncDay, TruncHour
from django.utils import timezone

from agents.llm.structured import formats_found
from agents.models import Agent, LLMCall
from goals.models import Goal
from goals.system import goal_priority
from planning.engine.diff import field_changes_shown, plan_diff
from planning.models import Plan, PlanEvent, PlanStep, steps_shown_fingerprint

# --- the approvals inbox ------------------------------------------------------------------------------------


@dataclass
class InboxItem:
    """One thing that waits for a person: a step of an active plan, a whole plan awaiting approval, or a plan
    whose planner asks the operator a question (seed 003) before it can plan."""

    plan: Plan
    step: PlanStep | None
    waiting_since: datetime
    urgent: bool
    steps: list[PlanStep] = field(default_factory=list)  # a plan item's steps
    repeat: int = 0  # a persona's plan of a goal it pursues again: the how-manieth plan of that goal today

    @property
    def repeat_label(self) -> str:
        return repeat_label(self.repeat)

    @property
    def key(self) -> str:
        if self.question:
            return f"question-{self.plan.pk}"
        return f"step-{self.step.pk}" if self.step else f"plan-{self.plan.pk}"

    @property
    def question(self) -> str:
        """What the planner asks, when this item is a question; its answer resumes planning."""
        return self.plan.clarification_question if self.plan.status in (
            Plan.Status.CLARIFYING, Plan.Status.UNVERIFIED) else ""

    @property
    def unverified(self) -> bool:
        """A plan whose steps all ran but whose outcome was not verified: the operator says what next."""
        return self.plan.status == Plan.Status.UNVERIFIED

    @property
    def agent(self) -> Agent:
        return self.plan.agent

    @property
    def fingerprint(self) -> str:
        """The steps as this card shows them, for its approve forms (planning/engine/shown.py)."""
        return steps_shown_fingerprint([self.step] if self.step is not None else self.steps)

    @property
    def risky(self) -> bool:
        if self.step is not None:
            return self.step.risk == PlanStep.Risk.RISKY
        return any(s.risk == PlanStep.Risk.RISKY for s in self.steps) or bool(self.plan.risks)

    @property
    def requires_permission(self) -> bool:
        if self.step is not None:
            return self.step.requires_permission
        return any(s.requires_permission for s in self.steps)

    @property
    def waiting_seconds(self) -> int:
        return max(0, int((timezone.now() - self.waiting_since).total_seconds()))


def waiting_since(*kinds: str, **match: Any) -> Subquery:
    """When the latest event of these kinds happened to the row in OuterRef: when it started to wait."""
    return Subquery(PlanEvent.objects.filter(kind__in=kinds, **match).order_by("-created_at", "-id")
                    .values("created_at")[:1])


def item_urgent(agent: Agent, since: datetime, now: datetime) -> bool:
    """The agent's waiting policy: escalated (urgent, top of the inbox) after its set time; never decided."""
    minutes = agent.escalate_after_minutes
    return minutes is not None and now - since >= timedelta(minutes=minutes)


def escalated_since(row: Plan | PlanStep, since: datetime) -> bool:
    """A policy escalated the item (approval policies: urgent at once) since it started to wait."""
    escalated = getattr(row, "escalated", None)
    return escalated is not None and escalated >= since


def inbox_items(*, now: datetime | None = None) -> list[InboxItem]:
    """Everything that waits for a person (steps, plans, the planner's questions): urgent first, then oldest
    first; a persona's repeats say so (one query more when a persona's item waits)."""
    now = now or timezone.now()
    agent_fields = ("agent__name", "agent__kind", "agent__escalate_after_minutes")
    plan_fields = ("goal_text", "version", "status", "risks", "approval_mode", "agent_id", "updated_at",
                   "clarification_question", "created_at", "model", "edited_by")
    steps = (
        PlanStep.objects.filter(status=PlanStep.Status.AWAITING_APPROVAL, plan__status=Plan.Status.ACTIVE)
        .select_related("plan", "plan__agent")
        .only("key", "position", "description", "tool", "tool_input", "action_hint", "risk", "requires_permission",
              "status", "updated_at", "depends_on", "loop", *(f"plan__{f}" for f in plan_fields),
              *(f"plan__{f}" for f in agent_fields))
        .annotate(since=waiting_since(PlanEvent.Kind.STEP_AWAITING, step=OuterRef("pk")),
                  escalated=waiting_since(PlanEvent.Kind.ESCALATED, step=OuterRef("pk")))
    )
    plans = (
        Plan.objects.waiting()
        .select_related("agent").only(*plan_fields, *agent_fields)
        .annotate(since=waiting_since(PlanEvent.Kind.VALIDATED, PlanEvent.Kind.CLARIFICATION_ASKED,
                                      PlanEvent.Kind.PLAN_UNVERIFIED, plan=OuterRef("pk")),
                  escalated=waiting_since(PlanEvent.Kind.ESCALATED, plan=OuterRef("pk"), step__isnull=True))
        .prefetch_related(Prefetch("steps", queryset=PlanStep.objects.only(
            "plan_id", "key", "position", "description", "risk", "requires_permission", "status", "tool",
            "tool_input", "action_hint", "depends_on", "loop")))
    )
    items = []
    for step in steps:
        since = step.since or step.updated_at  # type: ignore[attr-defined]
        items.append(InboxItem(plan=step.plan, step=step, waiting_since=since,
                               urgent=item_urgent(step.plan.agent, since, now) or escalated_since(step, since)))
    for plan in plans:
        since = plan.since or plan.updated_at  # type: ignore[attr-defined]
        items.append(InboxItem(plan=plan, step=None, waiting_since=since,
                               urgent=item_urgent(plan.agent, since, now) or escalated_since(plan, since),
                               steps=list(plan.steps.all())))
    items.sort(key=lambda i: (not i.urgent, i.waiting_since, i.key))
    return repeats_grouped(items, now)


def ordinal(n: int) -> str:
    return f"{n}{'th' if 10 <= n % 100 <= 20 else {1: 'st', 2: 'nd', 3: 'rd'}.get(n % 10, 'th')}"


def repeat_label(n: int) -> str:
    """"3rd time today" for a plan of a goal the person pursues again; "" for a first."""
    return f"{ordinal(n)} time today" if n >= 2 else ""


def day_start(now: datetime) -> datetime:
    return timezone.localtime(now).replace(hour=0, minute=0, second=0, microsecond=0)


def plans_of_the_day(agent_ids: set[int], now: datetime) -> dict[tuple[int, str], list[datetime]]:
    """When each agent's plans started today (first versions: a replan is no repeat), by agent and goal."""
    started: dict[tuple[int, str], list[datetime]] = {}
    for agent_id, goal_text, created in (Plan.objects.filter(agent_id__in=agent_ids, previous__isnull=True,
                                                             created_at__gte=day_start(now))
                                         .values_list("agent_id", "goal_text", "created_at")):
        started.setdefault((agent_id, goal_text.strip().lower()), []).append(created)
    return started


def plan_repeat_number(plan: Plan, now: datetime | None = None) -> int:
    """Which plan of its goal today this persona's plan is (1 for the first; 0 for a tool or external agent)."""
    if plan.agent.kind != Agent.Kind.PERSONA:
        return 0
    started = plans_of_the_day({plan.agent_id}, now or timezone.now()).get((plan.agent_id, plan.goal_text.strip().lower()), [])
    return sum(1 for created in started if created <= plan.created_at)


def repeats_grouped(items: list[InboxItem], now: datetime) -> list[InboxItem]:
    """A persona's plans of a goal it pursues again say so ("3rd time today"), and the items of one agent's goal
    stand together, where the first of them stands (a repeat looked like an ignored decision). One
    query, none without a persona's item."""
    persona = [i for i in items if i.plan.agent.kind == Agent.Kind.PERSONA]
    if not persona:
        return items
    started = plans_of_the_day({i.plan.agent_id for i in persona}, now)
    for item in persona:
        times = started.get((item.plan.agent_id, item.plan.goal_text.strip().lower()), [])
        item.repeat = sum(1 for created in times if created <= item.plan.created_at)
    groups: dict[tuple[int, str], list[InboxItem]] = {}
    for item in items:
        together = item.repeat >= 1  # a persona's items of one goal; any other item stands alone
        groups.setdefault((item.plan.agent_id, item.plan.goal_text.strip().lower()) if together else (0, item.key),
                          []).append(item)
    return [item for group in groups.values() for item in group]


def inbox_count() -> int:
    """How many things wait for a person (the number in every page's navigation): the plans waiting, and the
    steps awaiting approval in active plans, counted apart: two plain counts on their indexes cost PostgreSQL
    less than one joined count, on every page's load."""
    plans = Plan.objects.waiting().count()
    steps = PlanStep.objects.filter(status=PlanStep.Status.AWAITING_APPROVAL, plan__status=Plan.Status.ACTIVE).count()
    return plans + steps


def goal_queue(goal: Goal) -> tuple[Plan | None, int]:
    """A given goal's place: the open plan it waits behind (if any) and its place among the agent's unplanned
    goals, in the order the runner plans them (short-term first, then more confident)."""
    open_plan = Plan.objects.filter(agent_id=goal.agent_id).open().order_by("-created_at").first()
    planned = Plan.objects.filter(agent_id=goal.agent_id, goal__isnull=False).held().values_list("goal_id", flat=True)
    waiting = sorted(
        Goal.objects.filter(agent_id=goal.agent_id).active().exclude(pk__in=planned),
        key=lambda g: (goal_priority(horizon=g.horizon, confidence=g.confidence), g.created_at, g.pk),
    )
    place = next((i for i, g in enumerate(waiting, start=1) if g.pk == goal.pk), 0)
    return open_plan, place


# --- versions, compare, graph -------------------------------------------------------------------------------


def plan_chain(plan: Plan) -> list[Plan]:
    """Every version of this plan's lineage, oldest first, with why each was made (`reason`, `made_by`).
    Two queries: the agent's plans for the goal (or its text), and their "created" events. An answered
    question changes the goal text of the versions after it: the links between versions, not the text, make
    the chain, so a version outside the two is fetched by its link (one query each, only then)."""
    same_goal = Q(goal_text=plan.goal_text) | (Q(goal_id=plan.goal_id) if plan.goal_id else Q(pk__in=[]))
    candidates = {p.pk: p for p in Plan.objects.filter(same_goal, agent_id=plan.agent_id)}
    candidates[plan.pk] = candidates.get(plan.pk, plan)
    first = candidates[plan.pk]
    seen = {first.pk}
    while first.previous_id is not None and first.previous_id not in seen:
        if first.previous_id not in candidates:
            earlier = Plan.objects.filter(pk=first.previous_id).first()
            if earlier is None:
                break
            candidates[earlier.pk] = earlier
        first = candidates[first.previous_id]
        seen.add(first.pk)
    by_previous = {p.previous_id: p for p in candidates.values() if p.previous_id}
    chain = [first]
    while len(chain) < len(candidates) + 50:
        last = chain[-1]
        later = by_previous.get(last.pk)
        if later is None and last.status == Plan.Status.REPLANNED:  # its next version has another goal text
            later = Plan.objects.filter(previous_id=last.pk).first()
        if later is None or later.pk in {p.pk for p in chain}:
            break
        chain.append(later)
    created = {
        e.plan_id: e for e in PlanEvent.objects.filter(plan__in=[p.pk for p in chain], kind=PlanEvent.Kind.CREATED)
        .order_by("created_at")
    }
    for version in chain:
        event = created.get(version.pk)
        version.reason = (event.reason if event else "") or ("first version" if version.version == 1 else "")  # type: ignore[attr-defined]
        version.made_by = event.actor_label if event else ""  # type: ignore[attr-defined]
    return chain


PLAN_COMPARED = ("status", "model", "confidence", "risks", "approval_mode")


def plans_compare(old: Plan, new: Plan) -> dict[str, Any]:
    """Two versions side by side: steps added, removed and changed field by field; the plan's own fields;
    and the totals of estimated cycles and risky steps."""
    old_steps = [s.diff_values() for s in old.steps.all()]
    new_steps = [s.diff_values() for s in new.steps.all()]
    diff = plan_diff(old_steps, new_steps)
    def shown(plan: Plan, name: str) -> Any:
        display = getattr(plan, f"get_{name}_display", None)
        return display() if display else getattr(plan, name)

    plan_fields = {name.replace("_", " "): [shown(old, name), shown(new, name)] for name in PLAN_COMPARED
                   if getattr(old, name) != getattr(new, name)}
    totals = {
        "estimated cycles": [sum(int(s["estimated_cycles"]) for s in old_steps), sum(int(s["estimated_cycles"]) for s in new_steps)],
        "risky steps": [sum(s["risk"] == "risky" for s in old_steps), sum(s["risk"] == "risky" for s in new_steps)],
        "steps needing permission": [sum(bool(s["requires_permission"]) for s in old_steps),
                                     sum(bool(s["requires_permission"]) for s in new_steps)],
        "steps": [len(old_steps), len(new_steps)],
    }
    return {"diff": diff, "plan_fields": plan_fields, "totals": totals, "steps": compare_steps(diff, new_steps)}


@dataclass
class ComparedStep:
    """One step of the compare view, marked: added, removed, changed (with its changes in words) or unchanged."""

    mark: str
    key: str
    description: str
    tool: str = ""
    changes: list[tuple[str, str, str]] = field(default_factory=list)

    @property
    def mark_label(self) -> str:
        return self.mark.capitalize()


def compare_steps(diff: dict[str, Any], new_steps: list[dict[str, Any]]) -> list[ComparedStep]:
    """The newer version's steps in their order, each marked, then the steps it removed."""
    added = {str(s["key"]) for s in diff["added"]}
    changed = {c["key"]: c["fields"] for c in diff["changed"]}
    steps = []
    for spec in new_steps:
        key = str(spec["key"])
        mark = "added" if key in added else "changed" if key in changed else "unchanged"
        steps.append(ComparedStep(mark=mark, key=key, description=str(spec["description"]), tool=str(spec.get("tool") or ""),
                                  changes=field_changes_shown(changed.get(key, {}))))
    steps.extend(ComparedStep(mark="removed", key=str(s["key"]), description=str(s["description"]),
                              tool=str(s.get("tool") or "")) for s in diff["removed"])
    return steps


GRAPH_COLUMN = 190
GRAPH_ROW = 64
GRAPH_NODE = (160, 40)
GRAPH_PAD = 12


@dataclass
class GraphNode:
    step: PlanStep
    x: int
    y: int
    depth: int


@dataclass
class GraphEdge:
    x1: int
    y1: int
    x2: int
    y2: int


@dataclass
class PlanGraph:
    nodes: list[GraphNode]
    edges: list[GraphEdge]
    width: int
    height: int
    node_width: int = GRAPH_NODE[0]
    node_height: int = GRAPH_NODE[1]


def step_depths(steps: Sequence[PlanStep]) -> dict[str, int]:
    """Depth of each step: 0 without dependencies, else one more than its deepest dependency (cycles cut)."""
    by_key = {s.key: s for s in steps}
    depths: dict[str, int] = {}

    def depth(key: str, trail: frozenset[str]) -> int:
        if key in depths:
            return depths[key]
        deps = [d for d in by_key[key].depends_on if d in by_key and d not in trail]
        value = 1 + max((depth(d, trail | {key}) for d in deps), default=-1)
        depths[key] = value
        return value

    for step in steps:
        depth(step.key, frozenset())
    return depths


def plan_graph(steps: Sequence[PlanStep]) -> PlanGraph:
    """Steps laid out by depth (columns, left to right), in plan order within a column; edges from each
    dependency's right side to the dependent's left side. Pure: no query."""
    depths = step_depths(steps)
    rows: dict[int, int] = defaultdict(int)
    nodes: dict[str, GraphNode] = {}
    for step in steps:
        d = depths[step.key]
        nodes[step.key] = GraphNode(step=step, depth=d, x=GRAPH_PAD + d * GRAPH_COLUMN, y=GRAPH_PAD + rows[d] * GRAPH_ROW)
        rows[d] += 1
    w, h = GRAPH_NODE
    edges = [
        GraphEdge(x1=nodes[d].x + w, y1=nodes[d].y + h // 2, x2=node.x, y2=node.y + h // 2)
        for node in nodes.values() for d in node.step.depends_on if d in nodes
    ]
    width = GRAPH_PAD * 2 + (max(depths.values(), default=0)) * GRAPH_COLUMN + w
    height = GRAPH_PAD * 2 + max(rows.values(), default=1) * GRAPH_ROW - (GRAPH_ROW - h)
    return PlanGraph(nodes=list(nodes.values()), edges=edges, width=width, height=height)


# --- the audit log ------------------------------------------------------------------------------------------


# --- usage and cost -----------------------------------------------------------------------------------------


USAGE_PERIODS = {"24h": timedelta(hours=24), "7d": timedelta(days=7), "30d": timedelta(days=30)}


def usage_totals(calls: QuerySet[LLMCall]) -> dict[str, Any]:
    return calls.aggregate(
        calls=Count("pk"), tokens_in=Coalesce(Sum("tokens_in"), 0), tokens_out=Coalesce(Sum("tokens_out"), 0),
        latency=Avg("latency_ms"), errors=Count("pk", filter=~Q(error="")), cost=Sum("cost"),
    )


def usage_group(calls: QuerySet[LLMCall], by: str) -> list[dict[str, Any]]:
    """Calls, tokens, mean latency, errors and cost per value of `by` (agent name, model or purpose)."""
    rows: Iterable[Any] = (
        calls.values(key=F(by)).annotate(
            calls=Count("pk"), tokens_in=Coalesce(Sum("tokens_in"), 0), tokens_out=Coalesce(Sum("tokens_out"), 0),
            latency=Avg("latency_ms"), errors=Count("pk", filter=~Q(error="")), cost=Sum("cost"),
        ).order_by("-calls", "key")
    )
    return [dict(r) for r in rows]


def usage_fallbacks(calls: QuerySet[LLMCall]) -> dict[str, int]:
    """Fallbacks per model: a call whose previous call for the same agent, plan and purpose used another model
    (the chain moved on after errors or rejections). One query over four narrow columns."""
    counts: dict[str, int] = defaultdict(int)
    last: dict[tuple[Any, Any, str], str] = {}
    rows = calls.order_by("created_at", "pk").values_list("agent_id", "plan_id", "purpose", "model")
    for agent_id, plan_id, purpose, model in rows.iterator(chunk_size=2000):
        key = (agent_id, plan_id, purpose)
        if key in last and last[key] != model:
            counts[model] += 1
        last[key] = model
    return dict(counts)


@dataclass
class Bar:
    label: str
    value: float
    x: int
    y: int
    width: int
    height: int
    title: str


CHART_HEIGHT = 120
CHART_BAR = 14
CHART_GAP = 4


def usage_series(calls: QuerySet[LLMCall], *, per: str, start: datetime, buckets: int) -> list[Bar]:
    """Calls per hour or per day as SVG bars (oldest left); empty buckets are shown as empty."""
    trunc = TruncHour("created_at") if per == "hour" else TruncDay("created_at")
    step = timedelta(hours=1) if per == "hour" else timedelta(days=1)
    rows = calls.filter(created_at__gte=start).annotate(bucket=trunc).values("bucket").annotate(
        n=Count("pk"), tokens=Coalesce(Sum("tokens_in"), 0) + Coalesce(Sum("tokens_out"), 0), cost=Sum("cost"),
    ).order_by("bucket")
    found: dict[datetime, dict[str, Any]] = {r["bucket"]: dict(r) for r in rows}
    first = timezone.localtime(start).replace(minute=0, second=0, microsecond=0)
    if per == "day":
        first = first.replace(hour=0)
    peak = max((r["n"] for r in found.values()), default=0) or 1
    bars = []
    for i in range(buckets):
        moment = first + i * step
        row = found.get(moment, {})
        n = int(row.get("n", 0))
        height = round(CHART_HEIGHT * n / peak)
        label = moment.strftime("%H:00") if per == "hour" else moment.strftime("%d %b")
        cost = row.get("cost")
        title = f"{label}: {n} calls, {row.get('tokens', 0)} tokens" + (f", ${cost:.4f}" if cost else "")
        bars.append(Bar(label=label, value=n, x=i * (CHART_BAR + CHART_GAP), y=CHART_HEIGHT - height,
                        width=CHART_BAR, height=height, title=title))
    return bars


def usage_context(*, period: str = "7d", agent_id: int | None = None) -> dict[str, Any]:
    """Everything the usage page shows: a fixed number of queries whatever the number of calls."""
    now = timezone.now()
    start = now - USAGE_PERIODS.get(period, USAGE_PERIODS["7d"])
    base = LLMCall.objects.all() if agent_id is None else LLMCall.objects.filter(agent_id=agent_id)
    calls = base.filter(created_at__gte=start)
    fallbacks = usage_fallbacks(calls)
    by_model = usage_group(calls, "model")
    for row in by_model:
        row["fallbacks"] = fallbacks.get(row["key"], 0)
    purposes = dict(LLMCall.Purpose.choices)
    by_purpose = usage_group(calls, "purpose")
    for row in by_purpose:
        row["key"] = purposes.get(row["key"], row["key"])
    totals = usage_totals(calls)
    totals["fallbacks"] = sum(fallbacks.values())
    return {
        "period": period if period in USAGE_PERIODS else "7d",
        "periods": list(USAGE_PERIODS),
        "totals": totals,
        "by_agent": usage_group(calls, "agent__name"),
        "by_model": by_model,
        "by_purpose": by_purpose,
        "per_hour": usage_series(base, per="hour", start=now - timedelta(hours=23), buckets=24),
        "per_day": usage_series(base, per="day", start=now - timedelta(days=29), buckets=30),
        "chart_height": CHART_HEIGHT,
        "chart_hour_width": 24 * (CHART_BAR + CHART_GAP),
        "chart_day_width": 30 * (CHART_BAR + CHART_GAP),
        "priced": totals["cost"] is not None,
        "zero": Decimal(0),
        "formats": formats_found(),
        "planners": usage_planners(start=start, agent_id=agent_id),
    }


def usage_planners(*, start: datetime, agent_id: int | None = None) -> list[dict[str, Any]]:
    """The plans accepted in the period by what planned them: each model, "rules" (the rules planner, no call), a
    person in the plan editor; most first. One query."""
    plans = Plan.objects.filter(created_at__gte=start).exclude(model="", edited_by="")
    if agent_id is not None:
        plans = plans.filter(agent_id=agent_id)
    rows = plans.values("model", "edited_by").annotate(plans=Count("pk")).order_by("-plans", "model")
    planners: dict[str, int] = {}
    for row in rows:
        name = f"{row['edited_by']} (plan editor)" if row["edited_by"] else row["model"]
        planners[name] = planners.get(name, 0) + row["plans"]
    return [{"planner": name, "plans": count, "rules": name == "rules"}
            for name, count in sorted(planners.items(), key=lambda item: (-item[1], item[0]))]
