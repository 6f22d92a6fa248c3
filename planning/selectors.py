"""Reads for the pages and the live pushes: a fixed number of queries per page, whatever its size."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any, NamedTuple, overload

from django.conf import settings
from django.core.paginator import Page, Paginator
from django.db.models import Case, CharField, Count, Exists, OuterRef, Q, QuerySet, Subquery, Sum, Value, When
from django.db.models.functions import Coalesce, TruncMinute
from django.utils import timezone

from agents.models import Agent, Experience, LLMCall, Need
from agents.selectors import persona_page, personas_goal_most_urgent
from agents.tools import undo_dir_for, workspace_files
from agents.world import URGENT_BELOW
from planning.charts import Series, bar_strip, sparkline
from planning.charts import percent as charts_percent
from planning.models import Plan, PlanEvent, PlanStep, step_current, steps_done, steps_done_q
from planning.operator_selectors import plan_repeat_number, repeat_label

DASHBOARD_PAGE_SIZE = 50
TIMELINE_PAGE_SIZE = 50
CALLS_PAGE_SIZE = 20
# Attempts are read from the timeline's events; at most this many rejected attempts are shown.
ATTEMPTS_SHOWN = 20


LOW_BELOW = 0.4  # a need this low shows as "low" on the dashboard (below URGENT_BELOW, "urgent")


class NeedLevel(NamedTuple):
    """A need as a dashboard row shows it: its name, its level in percent, and how low it is ("urgent" below
    the world's URGENT_BELOW, "low" below LOW_BELOW, else "")."""

    name: str
    percent: int
    level: str

    @classmethod
    def of(cls, name: str, satisfaction: float) -> NeedLevel:
        level = "urgent" if satisfaction < URGENT_BELOW else "low" if satisfaction < LOW_BELOW else ""
        return cls(name, round(satisfaction * 100), level)


@dataclass
class AgentRow:
    agent: Agent
    plan: Plan | None
    step: PlanStep | None
    done: int = 0
    total: int = 0
    needs: list[NeedLevel] = field(default_factory=list)
    steps: list[PlanStep] = field(default_factory=list)  # the row plan's (see agents_row_plan)

    @property
    def percent(self) -> int:
        return round(100 * self.done / self.total) if self.total else 0


# Only the columns a row shows (`only`): building whole model instances (and decoding JSON) was the page's main cost.
ROW_AGENT_FIELDS = ("id", "name", "kind", "status", "waiting_reason", "cycle_count")
ROW_PLAN_FIELDS = ("id", "agent_id", "goal_text", "version", "status")
ROW_STEP_FIELDS = ("id", "plan_id", "key", "position", "description", "status", "retries", "depends_on")


def dashboard_rows(*, agent_ids: list[int]) -> list[AgentRow]:
    """One row per agent (in the order asked for; gone ones left out) with the plan it works on or waits on
    (agents_row_plan), its current step and progress: four queries in all."""
    ids = list(dict.fromkeys(agent_ids))
    if not ids:
        return []
    agents = {a.pk: a for a in agents_row_plan().filter(pk__in=ids).only(*ROW_AGENT_FIELDS)}
    # The needs as (agent, name, level) rows, not models, and their levels worked out here, not in the template:
    # a page shows a few needs for each of its rows, on every load and push.
    needs: dict[int, list[NeedLevel]] = defaultdict(list)
    for agent_id, name, satisfaction in (Need.objects.filter(agent_id__in=ids).order_by("name")
                                         .values_list("agent_id", "name", "satisfaction")):
        needs[agent_id].append(NeedLevel.of(name, satisfaction))
    plan_ids = sorted({a.row_plan_id for a in agents.values() if a.row_plan_id})  # type: ignore[attr-defined]
    plans: dict[int, Plan] = {}
    steps: dict[int, list[PlanStep]] = defaultdict(list)
    if plan_ids:
        plans = {p.pk: p for p in Plan.objects.filter(pk__in=plan_ids).only(*ROW_PLAN_FIELDS)}
        # By plan id, not "plan" (the plan's own ordering): that joined every plan of the table to sort 100 steps.
        for step in PlanStep.objects.filter(plan_id__in=plan_ids).order_by("plan_id", "position").only(*ROW_STEP_FIELDS):
            steps[step.plan_id].append(step)
    rows = []
    for pk in ids:
        if pk not in agents:
            continue
        agent = agents[pk]
        plan = plans.get(agent.row_plan_id)  # type: ignore[attr-defined]
        plan_steps = steps[plan.pk] if plan else []
        rows.append(AgentRow(
            agent=agent, plan=plan,
            step=step_current(plan_steps) if plan else None,
            done=steps_done((s.status for s in plan_steps), plan_status=plan.status) if plan else 0,
            total=len(plan_steps),
            needs=needs[pk], steps=plan_steps,
        ))
    return rows


def agents_row_plan() -> QuerySet[Agent]:
    """Agents annotated with the plan their dashboard row shows (`row_plan_id`): the plan that waits for an
    operator (the one "Waiting: ..." is about), else the open plan the agent works on, else its latest plan.
    A later plan that was cancelled or failed does not hide the plan still waiting or under way."""
    awaiting_step = PlanStep.objects.filter(plan=OuterRef("pk"), status=PlanStep.Status.AWAITING_APPROVAL)
    rank = Case(
        When(Q(status__in=[Plan.Status.AWAITING_APPROVAL, Plan.Status.CLARIFYING])
             | (Q(status=Plan.Status.ACTIVE) & Q(Exists(awaiting_step))), then=Value(0)),
        default=Value(1),
    )
    # The open plans ranked, else the latest: two subqueries on the agent's indexes, whose cost stays flat as an
    # agent's closed plans pile up. Ranking every plan of the agent grew with its history.
    shown = (Plan.objects.filter(agent=OuterRef("pk")).open().annotate(rank=rank)
             .order_by("rank", "-created_at", "-pk").values("pk")[:1])
    latest = Plan.objects.filter(agent=OuterRef("pk")).order_by("-created_at", "-pk").values("pk")[:1]
    return Agent.objects.annotate(row_plan_id=Coalesce(Subquery(shown), Subquery(latest)))


def failing_agent_ids() -> set[int]:
    """The agents whose latest plan failed, or has a step that failed or is being retried.

    First the candidates: agents with a failed plan or a troubled step at all (two reads of the partial indexes
    plan_failed_idx and step_troubled_idx, a handful of rows); with none, the common case, that is all. Then,
    for those alone, whether their latest plan is the failing one. Written as one nested expression inside the
    dashboard's counts (an Exists over a Subquery of the latest plan, from inside the count's filter), Django's
    compiling of it cost more than the query itself, on every dashboard load and push."""
    troubled = Q(status=PlanStep.Status.FAILED) | Q(retries__gt=0)
    failed = Plan.objects.filter(status=Plan.Status.FAILED).order_by().values_list("agent_id", flat=True)
    stepped = PlanStep.objects.filter(troubled).order_by().values_list("plan__agent_id", flat=True)
    candidates = set(failed.union(stepped).order_by())
    if not candidates:
        return set()
    latest = Plan.objects.filter(agent=OuterRef("agent_id")).order_by("-created_at", "-pk").values("pk")[:1]
    troubled_step = PlanStep.objects.filter(plan=OuterRef("pk")).filter(troubled)
    return set(Plan.objects.filter(agent_id__in=candidates, pk=Subquery(latest))
               .filter(Q(status=Plan.Status.FAILED) | Q(Exists(troubled_step))).values_list("agent_id", flat=True))


@dataclass(frozen=True)
class DashboardFilter:
    """What the dashboard shows: by status, kind, waiting for an operator, failing; one page of 50."""

    status: str = ""
    kind: str = ""
    waiting: bool = False
    failing: bool = False
    page: int = 1

    @classmethod
    def from_query(cls, query: Any) -> DashboardFilter:
        """From request.GET (or a websocket's query string); unknown values are ignored, not errors."""
        status = query.get("status", "")
        kind = query.get("kind", "")
        try:
            page = max(1, min(int(query.get("page", "1")), 1_000_000))
        except (TypeError, ValueError):
            page = 1
        return cls(
            status=status if status in Agent.Status.values else "",
            kind=kind if kind in Agent.Kind.values else "",
            waiting=query.get("waiting", "") in ("1", "on", "true"),
            failing=query.get("failing", "") in ("1", "on", "true"),
            page=page,
        )

    def query(self, *, page: int | None = None) -> str:
        """The query string of this filter (and page), for links and the websocket."""
        from urllib.parse import urlencode

        params: dict[str, Any] = {k: v for k, v in (("status", self.status), ("kind", self.kind)) if v}
        if self.waiting:
            params["waiting"] = "1"
        if self.failing:
            params["failing"] = "1"
        number = self.page if page is None else page
        if number > 1:
            params["page"] = number
        return urlencode(params)

    @property
    def active(self) -> bool:
        return bool(self.status or self.kind or self.waiting or self.failing)


def dashboard_agents(filters: DashboardFilter, *, failing: set[int] | None = None) -> QuerySet[Agent]:
    """The dashboard's agents as filtered; `failing`: failing_agent_ids, when the caller read it already."""
    agents = Agent.objects.order_by("name", "pk")
    if filters.status:
        agents = agents.filter(status=filters.status)
    if filters.kind:
        agents = agents.filter(kind=filters.kind)
    if filters.waiting:
        agents = agents.exclude(waiting_reason="")
    if filters.failing:
        agents = agents.filter(pk__in=failing_agent_ids() if failing is None else failing)
    return agents


class CountKnown:
    """The agents' ids for the paginator when the counts above the table say how many there are already: it asks
    no COUNT(*) of its own: one statement fewer on every page."""

    def __init__(self, ids: QuerySet[Agent, int], count: int) -> None:
        self.ids = ids
        self.known = count

    def __len__(self) -> int:  # the paginator's count
        return self.known

    def __iter__(self) -> Iterator[int]:
        return iter(self.ids)

    @overload
    def __getitem__(self, index: int, /) -> int: ...
    @overload
    def __getitem__(self, index: slice, /) -> QuerySet[Agent, int]: ...
    def __getitem__(self, index: int | slice, /) -> int | QuerySet[Agent, int]:
        return self.ids[index]


def count_known(filters: DashboardFilter, counts: Mapping[str, int]) -> int | None:
    """How many agents the filter shows, when one of the counts above the table is exactly that."""
    criteria = [name for name, on in (("status", filters.status), ("kind", filters.kind), ("waiting", filters.waiting),
                                      ("failing", filters.failing)) if on]
    if not criteria:
        return counts["agents"]
    if criteria == ["status"] and filters.status in counts:
        return counts[filters.status]
    if criteria in (["waiting"], ["failing"]):
        return counts[criteria[0]]
    return None


def dashboard_page(filters: DashboardFilter, *, failing: set[int] | None = None,
                   count: int | None = None) -> tuple[list[AgentRow], Page[Any]]:
    """One page of the dashboard: a count (unless `count` says it), the page's agent ids, then dashboard_rows
    (six queries)."""
    ids_query = dashboard_agents(filters, failing=failing).values_list("pk", flat=True)
    paginator = Paginator(ids_query if count is None else CountKnown(ids_query, count), DASHBOARD_PAGE_SIZE)
    page = paginator.get_page(filters.page)
    ids = list(page.object_list)
    rows = dashboard_rows(agent_ids=ids) if ids else []
    return rows, page


def dashboard_page_counted(filters: DashboardFilter) -> tuple[list[AgentRow], Page[Any], dict[str, int]]:
    """A page of the dashboard and the counts above it, the failing agents read once for both, and the
    paginator's count taken from the counts when one of them is it."""
    failing = failing_agent_ids()
    totals = dashboard_totals(failing=failing)
    rows, page = dashboard_page(filters, failing=failing, count=count_known(filters, totals))
    return rows, page, totals


COUNT_NAMES = ("agents", "running", "paused", "waiting", "failing")


def dashboard_counts(*, failing: set[int] | None = None) -> dict[str, int]:
    """The counts above the table (and the filter badges): one row of counts over all agents (grouped by a
    constant, which makes no GROUP BY at all), and the failing agents (failing_agent_ids, unless given)."""
    row = Agent.objects.order_by().values(everyone=Value(1)).annotate(
        agents=Count("pk"),
        running=Count("pk", filter=Q(status=Agent.Status.RUNNING)),
        paused=Count("pk", filter=Q(status=Agent.Status.PAUSED)),
        waiting=Count("pk", filter=~Q(waiting_reason="")),
    ).values_list(*COUNT_NAMES[:-1]).get()
    return dict(zip(COUNT_NAMES, (*row, len(failing_agent_ids() if failing is None else failing)), strict=True))


def dashboard_totals(*, failing: set[int] | None = None) -> dict[str, int]:
    """What the dashboard counts: its agents (dashboard_counts), and the items in the inbox counted as the
    navigation's "Inbox N" counts them, so the two never disagree."""
    from planning.operator_selectors import (
        inbox_count,  # operator_selectors reads plans; it imports nothing from here
    )

    return dashboard_counts(failing=failing) | {"inbox": inbox_count()}


def step_rollback_possible(step: PlanStep, *, agent_id: int) -> bool:
    """Whether "Roll back" has something to undo: a completed tool step that kept undo copies (the runner keeps
    them for the steps it ran; an external agent's step, run elsewhere, kept nothing)."""
    if step.status != PlanStep.Status.COMPLETED or not step.tool:
        return False
    workspace = Path(settings.AGENT_WORKSPACES) / str(agent_id)
    return (undo_dir_for(workspace, str(step.pk)) / "manifest.json").is_file()


def agent_context(agent_id: int) -> dict[str, Any]:
    """Everything the agent page shows."""
    agent = Agent.objects.get(pk=agent_id)
    plans = list(Plan.objects.filter(agent=agent).annotate(
        steps_total=Count("steps"), steps_done=Count("steps", filter=steps_done_q()),
    ).order_by("-created_at")[:20])
    needs = list(agent.needs.order_by("name"))
    return {
        "agent": agent,
        "needs": needs,
        "plans": plans,
        # Open plans without steps (a question waits, planning runs, a replan is due): the open-plans section,
        # built from steps, would not show them.
        "open_without_steps": [p for p in plans if p.is_open and not p.steps_total],  # type: ignore[attr-defined]
        "experiences": list(Experience.objects.filter(agent=agent).select_related("step").order_by("-cycle")[:15]),
        "lessons": list(agent.lessons.all()[:10]),
        # A tool agent's workspace as its tools see it (the agent page's Workspace section, live).
        "workspace": workspace_files(agent.workspace) if agent.kind == Agent.Kind.TOOL else None,
    } | persona_page(agent, {n.name: n.satisfaction for n in needs})  # goals short-term first, curves, what the cycle computed


def plan_versions(plan: Plan) -> list[Plan]:
    """All versions of this plan, oldest first: one query over the agent's plans, the chain walked here."""
    plans = {p.pk: p for p in Plan.objects.filter(agent_id=plan.agent_id).only("pk", "previous_id", "version", "status",
                                                                                "agent_id", "edited_by")}
    plans[plan.pk] = plan
    following = {p.previous_id: p for p in plans.values() if p.previous_id}
    chain = [plan]
    seen = {plan.pk}
    cursor = plan
    while cursor.previous_id in plans and cursor.previous_id not in seen:
        cursor = plans[cursor.previous_id]
        chain.insert(0, cursor)
        seen.add(cursor.pk)
    nxt = following.get(chain[-1].pk)
    while nxt is not None and nxt.pk not in seen:
        chain.append(nxt)
        seen.add(nxt.pk)
        nxt = following.get(nxt.pk)
    for version in chain:
        version.status_shown = plan_status_shown(version, following.get(version.pk))  # type: ignore[attr-defined]
    return chain


def plan_status_shown(plan: Plan, following: Plan | None) -> str:
    """A version's status in words: a version an operator rewrote in the plan editor reads "edited by olga", not
    "Replanned" (no planner made the next version)."""
    if plan.status == Plan.Status.REPLANNED and following is not None and following.edited_by:
        return f"Edited by {following.edited_by} (v{following.version})"
    return plan.get_status_display()


def plan_feedback(plan: Plan) -> list[str]:
    """The operators' words on a plan and on every earlier version of it, oldest first, each once: each declined
    step's feedback and each replan an operator asked for. None is forgotten by a replan. The one reader for the
    built-in planner (runtime/cycle.py) and for agents outside (planning/services/external.py)."""
    ids = [plan.pk]
    cursor = plan.previous_id
    while cursor is not None and cursor not in ids:
        ids.append(cursor)
        cursor = Plan.objects.filter(pk=cursor).values_list("previous_id", flat=True).first()
    words = PlanEvent.objects.filter(plan_id__in=ids, kind__in=[PlanEvent.Kind.STEP_DECLINED,
                                                               PlanEvent.Kind.REPLAN_REQUESTED])
    return list(dict.fromkeys(r for r in words.order_by("created_at", "pk").values_list("reason", flat=True) if r))


def plan_steps(plan: Plan) -> list[PlanStep]:
    """The steps of a plan as its page shows them: one query, whatever their number."""
    return list(plan.steps.select_related("approved_by").order_by("position"))


def plan_events_page(plan: Plan, number: Any = 1) -> Page[Any]:
    """One page of the timeline, newest first."""
    events = plan.events.select_related("step").order_by("-created_at", "-id")
    return Paginator(events, TIMELINE_PAGE_SIZE).get_page(number)


def plan_calls_page(plan: Plan, number: Any = 1) -> Page[Any]:
    """One page of the plan's model calls, oldest first (the order they were made)."""
    calls = LLMCall.objects.filter(plan=plan).order_by("created_at", "pk")
    return Paginator(calls, CALLS_PAGE_SIZE).get_page(number)


def policy_approvals_undoable(plan: Plan, steps: list[PlanStep]) -> dict[int, int]:
    """{step id: the policy's approval event} for the steps a policy approved that have not started, on an
    active plan: an operator may undo those approvals (policies.services.decision_undo). At most one query, and
    none unless a step is approved and not started."""
    waiting = [s.pk for s in steps if s.status == PlanStep.Status.PENDING and not s.actual_cycles
               and s.approved_by_id is not None]
    if plan.status != Plan.Status.ACTIVE or not waiting:
        return {}
    latest: dict[int, tuple[int, bool]] = {}
    for step_id, event_id, detail in (PlanEvent.objects.filter(step_id__in=waiting, kind=PlanEvent.Kind.STEP_APPROVED)
                                      .order_by("step_id", "-created_at", "-id")
                                      .values_list("step_id", "pk", "detail")):
        latest.setdefault(step_id, (event_id, isinstance(detail, dict) and "policy" in detail))
    return {step_id: event_id for step_id, (event_id, by_policy) in latest.items() if by_policy}


def plan_context(plan_id: int, *, events_page: Any = 1, calls_page: Any = 1) -> dict[str, Any]:
    """Everything the plan page shows: a fixed number of queries, whatever the number of steps or events."""
    plan = Plan.objects.select_related("agent", "goal", "previous").get(pk=plan_id)
    steps = plan_steps(plan)
    events = plan_events_page(plan, events_page)
    special = list(plan.events.filter(kind__in=[PlanEvent.Kind.ATTEMPT_REJECTED, PlanEvent.Kind.VALIDATED])
                   .order_by("-created_at", "-id")[:ATTEMPTS_SHOWN + 1])
    attempts = [e for e in special if e.kind == PlanEvent.Kind.ATTEMPT_REJECTED][:ATTEMPTS_SHOWN]
    validated = next((e for e in special if e.kind == PlanEvent.Kind.VALIDATED), None)
    calls = plan_calls_page(plan, calls_page)
    versions = plan_versions(plan)
    later = [v for v in versions if v.version > plan.version and v.previous_id == plan.pk]
    return {
        "plan": plan,
        "agent": plan.agent,
        "steps": steps,
        "step_keys": {s.key: s for s in steps},
        "current": step_current(steps),
        "events": events.object_list,
        "events_page": events,
        "attempts": list(reversed(attempts)),
        "flags": (validated.detail.get("flags", []) if validated else []),
        "diff": (validated.detail.get("diff") if validated else None),
        "calls": calls.object_list,
        "calls_page": calls,
        "versions": versions,
        "next_version": later[0] if later else None,
        "status_shown": plan_status_shown(plan, later[0] if later else None),
        "repeat_label": repeat_label(plan_repeat_number(plan)),
        "done": steps_done((s.status for s in steps), plan_status=plan.status),
        "total": len(steps),
        "withdrawn": plan_withdrawn(plan),
        "planning_cost": plan_planning_cost(plan),
        "policy_undo": policy_approvals_undoable(plan, steps),
    }


def plan_planning_cost(plan: Plan) -> dict[str, Any]:
    """What planning this version took: its model calls, their seconds, the answers cut off (one query)."""
    totals = LLMCall.objects.filter(plan=plan).aggregate(
        calls=Count("pk"), ms=Sum("latency_ms"), truncated=Count("pk", filter=Q(finish_reason="length")))
    return {"calls": totals["calls"] or 0, "seconds": (totals["ms"] or 0) / 1000, "truncated": totals["truncated"] or 0}


def plan_withdrawn(plan: Plan) -> PlanEvent | None:
    """The event saying why a request of this plan left the inbox with nobody's decision on it (the runner
    closed the plan: its goal finished meanwhile); None for any other plan (no query unless cancelled)."""
    if plan.status != Plan.Status.CANCELLED:
        return None
    return (plan.events.filter(kind=PlanEvent.Kind.PLAN_CANCELLED, detail__has_key="withdrawn")
            .order_by("-created_at", "-id").first())


# --- the dashboard's glance: the fleet over the last hour -----------------------------------------------------------

FLEET_BUCKET_MINUTES = 5
FLEET_BUCKETS = 12  # an hour
# What each row of the fleet strip counts, from the event log (PlanEvent):
# - new waiting items (came to wait for a person): a step asked for approval, the planner asked a question, a tool agent's plan was
#   validated (it then waits for approval, unless a policy decides at once);
# - plans made: a plan or a new version created;
# - decisions taken: approvals, declines, skips, cancellations, answers and replans asked for, by a person or a
#   policy (events with an actor; the runner's own cancellations are not decisions).
FLEET_WAITING_KINDS = (PlanEvent.Kind.STEP_AWAITING, PlanEvent.Kind.CLARIFICATION_ASKED)
FLEET_DECISION_KINDS = (PlanEvent.Kind.STEP_APPROVED, PlanEvent.Kind.STEP_DECLINED, PlanEvent.Kind.STEP_SKIPPED,
                        PlanEvent.Kind.PLAN_APPROVED, PlanEvent.Kind.PLAN_CANCELLED, PlanEvent.Kind.CLARIFIED,
                        PlanEvent.Kind.REPLAN_REQUESTED)
FLEET_ROWS = (("waiting", "new waiting items"), ("plans", "plans made"), ("decisions", "decisions taken"))


@dataclass
class FleetHour:
    """Counts per FLEET_BUCKET_MINUTES over the last hour: bucket starts (aware datetimes, oldest first) and, per
    row of FLEET_ROWS, a count per bucket. The last bucket is the one under way (it ends now)."""

    starts: list[datetime]
    now: datetime
    counts: dict[str, list[int]]


def fleet_last_hour(*, now: datetime | None = None) -> FleetHour:
    """The fleet strip's counts: one query (events of the last hour by minute and row, planevent_audit_idx)."""
    now = now or timezone.now()
    step = timedelta(minutes=FLEET_BUCKET_MINUTES)
    last = now.replace(second=0, microsecond=0) - timedelta(minutes=now.minute % FLEET_BUCKET_MINUTES)
    starts = [last - step * (FLEET_BUCKETS - 1 - i) for i in range(FLEET_BUCKETS)]
    row = Case(
        When(kind__in=FLEET_WAITING_KINDS, then=Value("waiting")),
        When(kind=PlanEvent.Kind.VALIDATED, plan__agent__kind=Agent.Kind.TOOL, then=Value("waiting")),
        When(kind=PlanEvent.Kind.CREATED, then=Value("plans")),
        When(kind__in=FLEET_DECISION_KINDS, actor__isnull=False, then=Value("decisions")),
        default=Value(""), output_field=CharField())
    counts = {name: [0] * FLEET_BUCKETS for name, _ in FLEET_ROWS}
    kinds = [*FLEET_WAITING_KINDS, PlanEvent.Kind.VALIDATED, PlanEvent.Kind.CREATED, *FLEET_DECISION_KINDS]
    for minute, name, n in (PlanEvent.objects.filter(created_at__gte=starts[0], created_at__lte=now, kind__in=kinds)
                            .annotate(row=row, minute=TruncMinute("created_at")).exclude(row="")
                            .values_list("minute", "row").annotate(n=Count("pk")).order_by()):
        index = int((minute - starts[0]) // step)
        if 0 <= index < FLEET_BUCKETS:
            counts[name][index] += n
    return FleetHour(starts=starts, now=now, counts=counts)


def dashboard_glance(agent_ids: list[int], *, now: datetime | None = None) -> dict[str, Any]:
    """The dashboard's glance: the fleet strip of the last hour, and a sparkline of the most urgent goal of each
    persona among these agents (most urgent first). Three queries."""
    fleet = fleet_last_hour(now=now)
    clock = [timezone.localtime(s).strftime("%H:%M") for s in fleet.starts]
    ends = [*clock[1:], "now"]
    buckets = [f"{a}–{b}" for a, b in zip(clock, ends, strict=True)]
    minutes = FLEET_BUCKET_MINUTES * FLEET_BUCKETS
    ticks = [(i, f"-{minutes - i * FLEET_BUCKET_MINUTES} min", clock[i]) for i in range(0, FLEET_BUCKETS, 3)]
    strip = bar_strip(title="The fleet over the last hour, per 5 minutes", buckets=buckets, ticks=ticks,
                      series=[(Series(name=label, key=name), fleet.counts[name]) for name, label in FLEET_ROWS])
    goals = []
    for urgent in personas_goal_most_urgent(agent_ids):
        goal = urgent.goal
        title = (f"Confidence of “{goal.description}” over {urgent.agent_name}'s last {len(urgent.confidences)} "
                 f"experiences: {charts_percent(goal.confidence)} now; abandoned below "
                 f"{charts_percent(urgent.abandon_below)}")
        goals.append({"urgent": urgent, "spark": sparkline(urgent.confidences, threshold=urgent.abandon_below, title=title)})
    return {"strip": strip, "urgent_goals": goals, "personas_asked": len(agent_ids)}
