"""What one live page shows, rendered incrementally: the state last pushed, and only what changed since.

A **page** (the dashboard, plan 12, agent 3) renders on a change, once per audience (operator or viewer),
only what changed (the step rows, the new timeline entries, the counts, the sections whose HTML differs).
The hub's feeds call it (planning/live/hub.py); it knows nothing of sockets or of the hub.

The browser side (static/js/live.js) morphs each pushed element into the element of the same id, so a
form being filled in keeps its text and the focus stays where it was.
"""

from __future__ import annotations

from typing import Any

from django.contrib.auth.models import User
from django.db.models import Count, Max
from django.template.loader import render_to_string

from agents.models import LLMCall
from planning.models import Plan, PlanEvent, PlanStep, steps_done
from planning.selectors import (
    AgentRow,
    agent_context,
    dashboard_rows,
    dashboard_totals,
    plan_calls_page,
    plan_status_shown,
    plan_steps,
    plan_versions,
    plan_withdrawn,
    policy_approvals_undoable,
)
from planning.templatetags.operator_pages import GRAPH_FIELDS, plan_graph_svg
from planning.templatetags.plan_rows import step_rows_html, steps_rollback_possible

OPERATOR, VIEWER = "operator", "viewer"


# --- pages: what one page shows, rendered incrementally --------------------------------------------------------


class LivePage:
    """The state of one page as this process last pushed it; renders only what changed since.

    `baseline` and `render_changes` run on the database thread, one at a time per feed.
    """

    def __init__(self, key: str) -> None:
        self.key = key

    def concerns(self, message: dict[str, Any]) -> set[int]:
        """The ids this page must re-render for this message (empty: not this page's business)."""
        raise NotImplementedError

    def baseline(self) -> None:
        """Take the current state as already shown (the clients get it in full on connect)."""

    def render_changes(self, ids: set[int], audiences: set[str]) -> dict[str, str]:
        """The push for each audience: the changed elements, each with its id; "" when nothing changed."""
        raise NotImplementedError


def render_for(template: str, context: dict[str, Any], audience: str) -> str:
    return render_to_string(template, context | {"can_decide": audience == OPERATOR, "live": True})


class DashboardLivePage(LivePage):
    """Changed rows, and the counts when a changed row may have moved them (one aggregate less per push)."""

    def __init__(self, key: str) -> None:
        super().__init__(key)
        self.row_states: dict[int, tuple[Any, ...]] = {}

    def concerns(self, message: dict[str, Any]) -> set[int]:
        return set(message["agents"])

    @staticmethod
    def row_state(row: AgentRow) -> tuple[Any, ...]:
        steps = row.steps
        return (row.agent.status, bool(row.agent.waiting_reason), row.plan.pk if row.plan else None,
                row.plan.status if row.plan else None,
                tuple((s.status, s.retries) for s in steps if s.status == PlanStep.Status.FAILED or s.retries))

    def render_changes(self, ids: set[int], audiences: set[str]) -> dict[str, str]:
        # Rows carry no decisions: one render serves every audience.
        rows = dashboard_rows(agent_ids=sorted(ids))
        removed = sorted(ids - {r.agent.pk for r in rows})
        moved = bool(removed)
        for row in rows:
            state = self.row_state(row)
            if self.row_states.get(row.agent.pk) != state:
                self.row_states[row.agent.pk] = state
                moved = True
        for pk in removed:
            self.row_states.pop(pk, None)
        context: dict[str, Any] = {"rows": rows, "removed": removed}
        if moved:
            context["counts"] = dashboard_totals()
        html = render_to_string("planning/dashboard_live.html", context)
        return dict.fromkeys(audiences, html)


STEP_FIELDS = tuple(f.attname for f in PlanStep._meta.get_fields() if f.concrete)
PLAN_FIELDS = tuple(f.attname for f in Plan._meta.get_fields() if f.concrete)
GRAPH_AT = [STEP_FIELDS.index(f) for f in GRAPH_FIELDS]  # where the graph's fields are in a step's columns
# What a timeline entry shows (its step is taken from the steps read in the same push).
EVENT_FIELDS = ("id", "plan_id", "step_id", "kind", "actor_label", "reason", "created_at")
# Events after which the versions, the attempts and the model calls of a plan may have changed.
PLANNING_KINDS = {PlanEvent.Kind.CREATED, PlanEvent.Kind.ATTEMPT_REJECTED, PlanEvent.Kind.VALIDATED,
                  PlanEvent.Kind.REPLANNED, PlanEvent.Kind.PLAN_FAILED}


class PlanLivePage(LivePage):
    """Step rows that changed, new timeline entries, and the sections whose content changed.

    A push costs three queries in the common case (the plan's columns, the steps' columns, the new
    events), whatever the number of steps; the other sections are read and rendered only when what they show may have changed.
    """

    def __init__(self, key: str, plan_id: int) -> None:
        super().__init__(key)
        self.plan_id = plan_id
        self.last_event_id = 0
        self.steps: dict[int, tuple[Any, ...]] = {}
        self.step_order: list[int] = []
        self.plan_state: tuple[Any, ...] = ()
        self.calls_state: tuple[Any, ...] = ()
        self.graph_state: tuple[Any, ...] | None = None  # what the graph last pushed showed (GRAPH_FIELDS of each step)
        self.sections: dict[tuple[str, str], Any] = {}
        self.flags: list[str] = []
        self.diff: Any = None
        self.versions: list[Plan] = []
        self.next_version: Plan | None = None

    def steps_read(self) -> list[tuple[Any, ...]]:
        """The plan's steps as their columns, in order (a push compares them with the last ones it sent)."""
        return list(PlanStep.objects.filter(plan_id=self.plan_id).order_by("position").values_list(*STEP_FIELDS))

    def concerns(self, message: dict[str, Any]) -> set[int]:
        return {self.plan_id} if self.plan_id in message["plans"] else set()

    def events_new(self) -> list[PlanEvent]:
        """The timeline entries added since the last push, each with its step (from the steps just read)."""
        events = list(PlanEvent.objects.filter(plan_id=self.plan_id, pk__gt=self.last_event_id)
                      .order_by("created_at", "id").only(*EVENT_FIELDS))
        if events:
            self.last_event_id = max(e.pk for e in events)
        others = {e.step_id for e in events if e.step_id and e.step_id not in self.steps}
        elsewhere = PlanStep.objects.in_bulk(others) if others else {}  # a step moved to another plan
        for e in events:
            if e.step_id in self.steps:
                e.step = PlanStep.from_db("default", list(STEP_FIELDS), self.steps[e.step_id])
            elif e.step_id:
                e.step = elsewhere.get(e.step_id)
        return events

    def versions_refresh(self, plan: Plan) -> None:
        self.versions = plan_versions(plan)
        later = [v for v in self.versions if v.version > plan.version and v.previous_id == plan.pk]
        self.next_version = later[0] if later else None

    def baseline(self) -> None:
        plan = Plan.objects.get(pk=self.plan_id)
        rows = self.steps_read()
        self.steps = {r[0]: r for r in rows}
        self.step_order = [r[0] for r in rows]
        self.plan_state = (plan.status, plan.approval_mode)
        self.last_event_id = plan.events.aggregate(m=Max("pk"))["m"] or 0
        self.calls_state = self.calls_now(plan)
        self.validated_refresh(plan)
        self.versions_refresh(plan)

    def calls_now(self, plan: Plan) -> tuple[Any, ...]:
        agg = LLMCall.objects.filter(plan=plan).aggregate(n=Count("pk"), m=Max("pk"))
        return (agg["n"], agg["m"])

    def validated_refresh(self, plan: Plan) -> None:
        validated = plan.events.filter(kind=PlanEvent.Kind.VALIDATED).order_by("-created_at", "-id").first()
        self.flags = validated.detail.get("flags", []) if validated else []
        self.diff = validated.detail.get("diff") if validated else None

    def changed(self, audience: str, name: str, key: Any) -> bool:
        """Whether this audience was last sent this section with another key (then remember this one)."""
        if self.sections.get((audience, name)) == key:
            return False
        self.sections[(audience, name)] = key
        return True

    def render_changes(self, ids: set[int], audiences: set[str]) -> dict[str, str]:
        # The plan's columns first (cheap); the plan with its agent only when the header must be rendered.
        plan_row = Plan.objects.filter(pk=self.plan_id).values_list(*PLAN_FIELDS).get()
        plan = Plan.from_db("default", list(PLAN_FIELDS), plan_row)
        rows = self.steps_read()
        plan_state = (plan.status, plan.approval_mode)
        order = [r[0] for r in rows]
        whole_steps = order != self.step_order  # steps added, removed or reordered: send the whole list
        all_rows = plan_state != self.plan_state  # the plan's status decides which buttons every row has
        changed_ids = [r[0] for r in rows if all_rows or self.steps.get(r[0]) != r]
        self.steps = {r[0]: r for r in rows}
        self.step_order, self.plan_state = order, plan_state
        status_at = STEP_FIELDS.index("status")
        done = steps_done((r[status_at] for r in rows), plan_status=plan.status)
        graph_state = tuple(tuple(r[i] for i in GRAPH_AT) for r in rows)
        graph_changed = graph_state != self.graph_state
        self.graph_state = graph_state

        new_events = self.events_new()
        kinds = {e.kind for e in new_events}
        if PlanEvent.Kind.VALIDATED in kinds:
            self.validated_refresh(plan)
        planning = bool(kinds & PLANNING_KINDS) or all_rows

        if planning:
            self.versions_refresh(plan)
        header_key = (plan_row, done, len(rows), tuple(self.flags), self.next_version.pk if self.next_version else None)
        with_agent = planning or any(self.sections.get((a, "header")) != header_key for a in audiences)
        if with_agent:
            plan = Plan.objects.select_related("agent", "goal", "previous").get(pk=self.plan_id)
        context: dict[str, Any] = {"plan": plan, "flags": self.flags, "diff": self.diff, "done": done, "total": len(rows),
                                   "withdrawn": plan_withdrawn(plan)}
        if planning:
            attempts = list(plan.events.filter(kind=PlanEvent.Kind.ATTEMPT_REJECTED).order_by("-created_at", "-id")[:20])
            context["attempts"] = list(reversed(attempts))
            calls_state = self.calls_now(plan)
            if calls_state != self.calls_state:
                self.calls_state = calls_state
                calls = plan_calls_page(plan, 1)
                context |= {"calls": calls.object_list, "calls_page": calls}
        context |= {"versions": self.versions, "next_version": self.next_version,
                    "agent": plan.agent if with_agent else None}
        accepted = next((e for e in new_events if e.kind == PlanEvent.Kind.PLAN_ACCEPTED), None)
        if accepted is not None:  # "Accepted as done by olga, not verified", as the page says it on load
            context["status_shown"] = plan_status_shown(plan, None, accepted)
        if whole_steps:
            steps = plan_steps(plan)
        else:  # built from the columns already read; only an approver's name costs one more query
            steps = [PlanStep.from_db("default", list(STEP_FIELDS), self.steps[pk]) for pk in changed_ids]
            approver_ids = {s.approved_by_id for s in steps if s.approved_by_id}
            if approver_ids:
                approvers = User.objects.in_bulk(approver_ids)
                for s in steps:
                    if s.approved_by_id:
                        s.approved_by = approvers.get(s.approved_by_id)
        # The graph shows no buttons: the same for everyone, drawn when a step's status, words or links changed.
        graph = ""
        if graph_changed:
            every = steps if whole_steps else [PlanStep.from_db("default", list(STEP_FIELDS), r) for r in rows]
            graph = plan_graph_svg(plan, every, True)
        # Timeline entries are the same for everyone: rendered once, newest on top after prepending.
        entries = "".join(render_to_string("planning/plan_detail.html#event", {"e": e, "prepend": True})
                          for e in new_events)

        # A policy's approval an operator may undo, on the rows pushed (no query unless a step waits so).
        policy_undo = policy_approvals_undoable(plan, steps) if OPERATOR in audiences else {}
        out: dict[str, str] = {}
        for audience in sorted(audiences):
            parts: list[str] = []
            if self.changed(audience, "header", header_key):
                parts.append(render_for("planning/plan_detail.html#header", context, audience))
            if whole_steps:
                parts.append(render_for("planning/plan_detail.html#steps", context | {
                    "steps": steps, "policy_undo": policy_undo}, audience))
            else:
                operator = audience == OPERATOR
                parts.append(step_rows_html(
                    steps, plan=plan, can_decide=operator, policy_undo=policy_undo,
                    rollback=steps_rollback_possible(steps, agent_id=plan.agent_id) if operator else ()))
            if planning and self.changed(audience, "versions", tuple((v.pk, v.status) for v in self.versions)):
                parts.append(render_for("planning/plan_detail.html#versions", context, audience))
            if "attempts" in context:
                parts.append(render_for("planning/plan_detail.html#attempts", context, audience))
            if "calls_page" in context:
                # Only pages showing the first page of calls have this tbody's id.
                parts.append(render_for("planning/plan_detail.html#calls", context, audience))
            parts.append(graph)
            parts.append(entries)
            out[audience] = "".join(parts).strip()
        return out


class AgentLivePage(LivePage):
    """The agent page's sections, sent when their HTML differs from what was last pushed."""

    def __init__(self, key: str, agent_id: int) -> None:
        super().__init__(key)
        self.agent_id = agent_id
        self.last: dict[str, str] = {}

    def concerns(self, message: dict[str, Any]) -> set[int]:
        return {self.agent_id} if self.agent_id in message["agents"] else set()

    def render_changes(self, ids: set[int], audiences: set[str]) -> dict[str, str]:
        context = agent_context(self.agent_id)
        out = {}
        for audience in audiences:
            html = render_for("planning/agent_live.html", context, audience)
            out[audience] = "" if self.last.get(audience) == html else html
            self.last[audience] = html
        return out

