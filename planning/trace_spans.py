"""A plan lineage's spans, made from what the product recorded (docs/tracing.md): the same spans go to the
operators' tracing tool (planner_site/tracing.py, when an endpoint is set) and onto the plan page's timeline.

One lineage (a plan's versions, each replan's next one) is one trace:

    invoke_agent <agent>              the agent's work on the goal: from the first version to the lineage's end
      plan v<n>                       each (re)planning, with its rejected attempts as events
        chat <model>                  each model call of that planning (LLMCall rows)
      await_approval / await_answer   each wait for a person, with the human act as its events (never an error)
      execute_tool <tool>             each run of a step, with its outcome

The spans are built after the facts, each with its recorded start and end: a wait of ten minutes (or ten days)
for an operator holds nothing open, and the trace is whole however many processes took part.
"""

from __future__ import annotations

import functools
import json
import logging
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import transaction
from django.db.models import F, Func, QuerySet, Subquery
from django.db.models.lookups import Exact
from django.utils import timezone

from agents.models import Agent, LLMCall
from planner_site import tracing
from planner_site.tracing import SpanEvent, SpanFact
from planning.models import Plan, PlanEvent

logger = logging.getLogger("planner.tracing")

# What ends a (re)planning.
PLANNING_ENDS = {PlanEvent.Kind.VALIDATED, PlanEvent.Kind.PLAN_FAILED, PlanEvent.Kind.CLARIFICATION_ASKED,
                 PlanEvent.Kind.PLAN_CANCELLED}
# What ends a lineage (and the export of its trace); a failed planning with a retry due goes on.
LINEAGE_ENDS = {PlanEvent.Kind.PLAN_COMPLETED, PlanEvent.Kind.PLAN_CANCELLED, PlanEvent.Kind.PLAN_FAILED}
# A person's act on a wait, as the span event is named.
HUMAN_ACTS: dict[str, str] = {
    PlanEvent.Kind.PLAN_APPROVED: "approved", PlanEvent.Kind.STEP_APPROVED: "approved",
    PlanEvent.Kind.STEP_DECLINED: "declined", PlanEvent.Kind.REPLAN_REQUESTED: "declined",
    PlanEvent.Kind.STEP_SKIPPED: "skipped", PlanEvent.Kind.STEP_EDITED: "edited", PlanEvent.Kind.PLAN_EDITED: "edited",
    PlanEvent.Kind.PLAN_CANCELLED: "cancelled", PlanEvent.Kind.CLARIFIED: "answered",
}
# The status a lineage's last version has when an event ended the lineage.
END_STATUS: dict[str, str] = {PlanEvent.Kind.PLAN_COMPLETED: Plan.Status.COMPLETED,
                              PlanEvent.Kind.PLAN_CANCELLED: Plan.Status.CANCELLED,
                              PlanEvent.Kind.PLAN_FAILED: Plan.Status.FAILED}
STEP_ENDS: dict[str, str] = {PlanEvent.Kind.STEP_COMPLETED: "completed", PlanEvent.Kind.STEP_FAILED: "failed",
             PlanEvent.Kind.STEP_ROLLED_BACK: "rolled_back", PlanEvent.Kind.STEP_CANCELLED: "cancelled"}


def lineage_ends(event: PlanEvent) -> bool:
    """Whether the event ends its lineage: the plan completed or cancelled, or failed with no retry due."""
    return event.kind in LINEAGE_ENDS and not (
        event.kind == PlanEvent.Kind.PLAN_FAILED and isinstance(event.detail, dict) and event.detail.get("retry_at"))


def channel_of(event: PlanEvent) -> str:
    """The way a decision came: a policy, an external agent's API or MCP call, a channel a notification named,
    else the dashboard (an operator's own act)."""
    detail = event.detail if isinstance(event.detail, dict) else {}
    if detail.get("channel"):
        return str(detail["channel"])
    if "policy" in detail:
        return "policy"
    for via in ("API", "MCP"):
        if event.actor_label.endswith(f"({via})"):
            return via.lower()
    return "dashboard" if event.actor_id else "system"


@dataclass
class Lineage:
    """A lineage as recorded: its versions (oldest first), their events and model calls, in time order."""

    agent: Agent
    versions: list[Plan]
    events: list[PlanEvent]
    calls: list[LLMCall]

    @property
    def trace_id(self) -> str:
        return self.versions[0].trace_id

    @property
    def ended(self) -> PlanEvent | None:
        last = self.versions[-1]
        return next((e for e in reversed(self.events) if e.plan_id == last.pk and lineage_ends(e)), None)


# What the spans say of a version and its agent: not its steps' texts, restatement or risks.
VERSION_FIELDS = ("agent_id", "previous_id", "version", "goal_text", "status", "model", "edited_by", "created_at",
                  "trace_id", "trace_root_id", "trace_parent_id", "trace_exported_through")


def lineage_load(plan: Plan, *, agent: Agent | None = None, capture: bool = False) -> Lineage:
    """The lineage `plan` belongs to, in four queries (three given its agent)."""
    if plan.trace_root_id:  # its root span's id, not the trace id: two plans may join one caller's trace
        versions = list(Plan.objects.filter(agent_id=plan.agent_id, trace_root_id=plan.trace_root_id)
                        .order_by("version", "pk"))
    else:  # a plan made before traces: its versions by their links
        versions, seen = [plan], plan
        while seen.previous_id is not None and (seen := Plan.objects.get(pk=seen.previous_id)):
            versions.insert(0, seen)
        seen = plan
        while (after := Plan.objects.filter(previous_id=seen.pk).first()) is not None:
            versions.append(seen := after)
    ids = [v.pk for v in versions]
    return Lineage(agent=agent or Agent.objects.get(pk=plan.agent_id), versions=versions,
                   events=lineage_events(ids), calls=lineage_calls(ids, capture=capture))


def lineage_versions(*, agent_id: int, root_id: str) -> list[Plan]:
    """The versions of a lineage (its agent, its root span's id), oldest first, each with its agent, in one
    query, with only what the spans say of them."""
    return list(Plan.objects.select_related("agent").only(*VERSION_FIELDS, "agent__name", "agent__kind")
                .filter(agent_id=agent_id, trace_root_id=root_id).order_by("version", "pk"))


def lineage_events(plan_ids: Sequence[int]) -> list[PlanEvent]:
    """The versions' events in time order, with only what spans say (not a step's result)."""
    return list(PlanEvent.objects.filter(plan_id__in=plan_ids).select_related("step").only(
        "plan_id", "step_id", "kind", "actor_id", "actor_label", "reason", "detail", "created_at",
        "step__key", "step__tool", "step__action_hint").order_by("created_at", "id"))


def lineage_calls(plan_ids: Sequence[int], *, capture: bool) -> list[LLMCall]:
    """The versions' model calls in time order; their prompts and answers only when they go on the spans."""
    calls = LLMCall.objects.filter(plan_id__in=plan_ids).order_by("created_at", "id")
    return list(calls if capture else calls.defer("prompt", "response", "response_format"))


def lineage_facts(lineage: Lineage, *, now: datetime, capture: bool = False) -> list[SpanFact]:
    """The lineage's spans, from its records only (no query): the root (key ""), then in time order. A span
    still going on (a planning under way, a wait) ends at `now` and says so (`planner.open`)."""
    agent, versions = lineage.agent, lineage.versions
    ended = lineage.ended
    last = versions[-1]
    root = SpanFact(key="", name=f"invoke_agent {agent.name}", kind="agent", start=versions[0].created_at,
                    end=ended.created_at if ended else now, attributes={
                        "gen_ai.operation.name": "invoke_agent", "gen_ai.agent.name": agent.name,
                        "gen_ai.agent.id": str(agent.pk), "planner.agent.kind": agent.kind,
                        "planner.goal": versions[0].goal_text, "planner.plan.id": versions[0].pk,
                        "planner.versions": len(versions),
                        "planner.outcome": END_STATUS[ended.kind] if ended else last.status,
                        "planner.open": ended is None}, closed_by=ended.pk if ended else 0)
    if ended is not None and ended.kind == PlanEvent.Kind.PLAN_FAILED:
        root.error = ended.reason or "the plan failed"
    facts = [root]
    by_version: dict[int, list[PlanEvent]] = {}
    for event in lineage.events:
        by_version.setdefault(event.plan_id or 0, []).append(event)
    plannings: dict[int, SpanFact] = {}
    for version in versions:
        events = by_version.get(version.pk, [])
        planning = planning_fact(version, events, now=now)
        plannings[version.pk] = planning
        facts.append(planning)
        facts.extend(waits_facts(version, events, now=now))
        facts.extend(tool_facts(events, now=now))
    for fact in facts[1:]:
        if not fact.closed_by and not fact.attributes.get("planner.open"):
            fact.closed_by = root.closed_by  # closed by nothing recorded of its own: goes with the lineage
    for call in lineage.calls:
        chat = chat_fact(call, plannings.get(call.plan_id or 0), capture=capture)
        # Exported with the planning it served (once it ended), else with the lineage.
        chat.closed_by = plannings[call.plan_id or 0].closed_by if chat.parent else root.closed_by
        facts.append(chat)
    return [root, *sorted(facts[1:], key=lambda f: (f.start, f.key))]


def planning_fact(version: Plan, events: Sequence[PlanEvent], *, now: datetime) -> SpanFact:
    """`plan v<n>`: from the version's creation to its validation (or failure, or question)."""
    start = next((e.created_at for e in events if e.kind == PlanEvent.Kind.CREATED), version.created_at)
    end_event = next((e for e in events if e.kind in PLANNING_ENDS), None)
    rejected = [e for e in events if e.kind == PlanEvent.Kind.ATTEMPT_REJECTED
                and (end_event is None or e.created_at <= end_event.created_at)]
    fact = SpanFact(
        key=f"plan/{version.pk}", parent="", name=f"plan v{version.version}", kind="plan", start=start,
        end=end_event.created_at if end_event else (start if version.status != Plan.Status.VALIDATING else now),
        attributes={"gen_ai.operation.name": "plan", "planner.plan.id": version.pk,
                    "planner.plan.version": version.version, "planner.attempts": len(rejected) + (1 if end_event else 0),
                    "gen_ai.request.model": version.model, "planner.edited_by": version.edited_by,
                    "planner.open": end_event is None and version.status == Plan.Status.VALIDATING},
        events=[SpanEvent("attempt_rejected", e.created_at, {"gen_ai.request.model": str(e.detail.get("model", "")),
                                                             "planner.reasons": e.reason[:1000]}) for e in rejected])
    if end_event is not None:
        fact.closed_by = end_event.pk
    elif version.status != Plan.Status.VALIDATING:
        fact.closed_by = next((e.pk for e in events), 0)  # no planning recorded (e.g. a persona's repeated plan)
    if end_event is not None and end_event.kind == PlanEvent.Kind.PLAN_FAILED:
        fact.error = end_event.reason or "planning failed"
    return fact


def chat_fact(call: LLMCall, planning: SpanFact | None, *, capture: bool) -> SpanFact:
    """`chat <model>`: one model call, under the planning it served (else under the root)."""
    start = call.created_at - timedelta(milliseconds=call.latency_ms or 0)
    if planning is not None and call.created_at > planning.end and not planning.attributes.get("planner.open"):
        planning = None  # a call after its version's planning (a persona's cycle): under the root
    fact = SpanFact(
        key=f"chat/{call.pk}", parent=planning.key if planning else "", name=f"chat {call.model}", kind="chat",
        start=start, end=call.created_at,
        attributes={"gen_ai.operation.name": "chat", "gen_ai.provider.name": call.provider,
                    "gen_ai.request.model": call.model, "gen_ai.usage.input_tokens": call.tokens_in,
                    "gen_ai.usage.output_tokens": call.tokens_out, "planner.purpose": call.purpose})
    if call.finish_reason:
        fact.attributes["gen_ai.response.finish_reasons"] = call.finish_reason
    if capture:
        fact.attributes["gen_ai.input.messages"] = call.prompt if isinstance(call.prompt, str) else json.dumps(call.prompt)
        fact.attributes["gen_ai.output.messages"] = call.response
    if call.error:
        fact.error = call.error
        fact.attributes["error.type"] = call.error.split(":", 1)[0][:100]
    return fact


def act_attributes(event: PlanEvent, since: datetime) -> dict[str, Any]:
    detail = event.detail if isinstance(event.detail, dict) else {}
    attributes: dict[str, Any] = {"planner.operator": event.actor_label, "planner.channel": channel_of(event),
                                  "planner.wait_seconds": round((event.created_at - since).total_seconds(), 3)}
    if event.reason:
        attributes["planner.feedback" if event.kind in (PlanEvent.Kind.STEP_DECLINED, PlanEvent.Kind.REPLAN_REQUESTED)
                   else "planner.reason"] = event.reason[:1000]
    if "policy" in detail:
        attributes |= {"planner.policy": str(detail.get("policy_name") or detail["policy"]),
                       "planner.rule": str(detail.get("rule", "")), "planner.action": str(detail.get("action", ""))}
    return attributes


def waits_facts(version: Plan, events: Sequence[PlanEvent], *, now: datetime) -> list[SpanFact]:
    """Each wait for a person: the plan awaiting approval (from its validation), a step awaiting approval, a
    question awaiting an answer; ended by the person's act (or by the plan moving on without one). The acts are
    span events; a wait is never an error."""
    facts: list[SpanFact] = []
    open_waits: dict[str, SpanFact] = {}

    def open_wait(key: str, name: str, at: datetime, attributes: dict[str, Any]) -> None:
        fact = SpanFact(key=f"wait/{version.pk}/{key}/{len(facts)}", parent="", name=name, kind="wait", start=at,
                        end=at, attributes={"gen_ai.operation.name": "await_human", **attributes})
        fact.events.append(SpanEvent("approval_requested" if name == "await_approval" else "question_asked", at,
                                     dict(attributes)))
        open_waits[key] = fact
        facts.append(fact)

    def close(key: str, event: PlanEvent, act: str) -> None:
        fact = open_waits.pop(key, None)
        if fact is None:
            return
        fact.end = event.created_at
        fact.closed_by = event.pk
        name = "decided_by_policy" if "policy" in (event.detail or {}) else act
        fact.events.append(SpanEvent(name, event.created_at, act_attributes(event, fact.start)))
        fact.attributes["planner.decision"] = act

    for event in events:
        kind = event.kind
        step_key = f"step/{event.step_id}" if event.step_id else ""
        if kind == PlanEvent.Kind.VALIDATED:
            open_wait("plan", "await_approval", event.created_at, {"planner.plan.version": version.version})
        elif kind == PlanEvent.Kind.CLARIFICATION_ASKED:
            open_wait("question", "await_answer", event.created_at, {"planner.question": event.reason[:1000]})
        elif kind == PlanEvent.Kind.STEP_AWAITING and step_key:
            step = event.step
            open_wait(step_key, "await_approval", event.created_at, {
                "planner.step.key": step.key if step else "", "gen_ai.tool.name": tool_name(step)})
        elif kind == PlanEvent.Kind.ESCALATED:
            for fact in open_waits.values():
                fact.events.append(SpanEvent("escalated", event.created_at, act_attributes(event, fact.start)))
        elif kind == PlanEvent.Kind.STEP_STARTED and "plan" in open_waits:
            facts.remove(open_waits.pop("plan"))  # the plan went on by itself: it never waited for anyone
        elif kind in HUMAN_ACTS:
            act = HUMAN_ACTS[kind]
            if step_key and step_key in open_waits:
                close(step_key, event, act)
            elif kind == PlanEvent.Kind.CLARIFIED:
                close("question", event, act)
            elif not step_key or kind in (PlanEvent.Kind.PLAN_CANCELLED, PlanEvent.Kind.PLAN_EDITED):
                close("plan", event, act)
            if kind in (PlanEvent.Kind.PLAN_CANCELLED, PlanEvent.Kind.PLAN_EDITED, PlanEvent.Kind.REPLAN_REQUESTED):
                for key in list(open_waits):
                    close(key, event, act)
        elif kind in (PlanEvent.Kind.REPLANNED, *LINEAGE_ENDS):
            for key in list(open_waits):  # the plan moved on without a person's act on these
                open_waits[key].end = event.created_at
                open_waits[key].closed_by = event.pk
                open_waits[key].attributes["planner.decision"] = "none"
                open_waits.pop(key)
    for fact in open_waits.values():
        fact.end = now
        fact.attributes["planner.open"] = True
    return facts


def tool_name(step: Any) -> str:
    return (step.tool or step.action_hint) if step is not None else ""


def tool_facts(events: Sequence[PlanEvent], *, now: datetime) -> list[SpanFact]:
    """`execute_tool <tool>`: each run of a step, from its start to its result."""
    facts: list[SpanFact] = []
    running: dict[int, SpanFact] = {}
    for event in events:
        if event.step_id is None:
            continue
        if event.kind == PlanEvent.Kind.STEP_STARTED:
            tool = tool_name(event.step)
            running[event.step_id] = fact = SpanFact(
                key=f"tool/{event.step_id}/{event.pk}", parent="", name=f"execute_tool {tool}", kind="tool",
                start=event.created_at, end=now, attributes={
                    "gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": tool,
                    "gen_ai.tool.call.id": str(event.step_id), "planner.step.key": event.step.key if event.step else "",
                    "planner.open": True})
            facts.append(fact)
        elif event.kind in STEP_ENDS and (ended := running.pop(event.step_id, None)) is not None:
            fact = ended
            fact.end = event.created_at
            fact.closed_by = event.pk
            fact.attributes["planner.outcome"] = STEP_ENDS[event.kind]
            fact.attributes["planner.open"] = False
            if event.kind == PlanEvent.Kind.STEP_FAILED:
                fact.error = event.reason or "the step failed"
                fact.attributes["error.type"] = "step_failed"
    return facts


# --- export -----------------------------------------------------------------------------------------------


def sample_ratio(kind: str) -> float:
    """The share of an agent kind's lineages exported: persona agents' are sampled, every other kind's are all."""
    return settings.OTEL_PERSONA_SAMPLE_RATIO if kind == Agent.Kind.PERSONA else 1.0


# The kind of each agent this process exported a lineage of (an agent's kind never changes): a persona lineage
# outside the sample is then left out before anything is read. Bounded: a forgotten agent is just read again.
_kinds: dict[int, str] = {}


def lineage_export(plan_id: int) -> int:
    """Export the spans of the lineage of `plan_id` closed since its last export, read from the records (not from
    what this process kept of it); the number exported (see `lineage_export_of`)."""
    plan = Plan.objects.filter(pk=plan_id).only("agent_id", "trace_root_id").first()
    return lineage_export_of(agent_id=plan.agent_id, root_id=plan.trace_root_id, kept=False) if plan is not None else 0


@dataclass
class Kept:
    """A lineage as this process holds it between exports: what its last export read, and every event (and model
    call) of it this process wrote since, as the services wrote them."""

    lineage: Lineage
    calls_known: bool  # its model calls are all there (read, or recorded here since)
    since: int  # how far its export went (the first version's `trace_exported_through`, as last read or claimed)


# The lineages this process is exporting, by (agent id, root span id): an export builds their spans from what is
# kept here instead of reading them again. Bounded: a forgotten lineage is read again at its next export.
_kept: dict[tuple[int, str], Kept] = {}
_kept_of_plan: dict[int, tuple[int, str]] = {}  # a version's lineage, for its model calls
_kept_lock = threading.Lock()
KEPT_REMEMBERED = 1024


def lineage_export_of(*, agent_id: int, root_id: str, kept: bool = True) -> int:
    """Export the spans of a lineage (its agent, its root span's id) closed since its last export; the number
    exported. Each span goes once, with the first export after the record that closed it (EXPORT_AT says when):
    a planning with its model calls, a wait with the person's act, a step with its result, the root when the
    lineage ends (again, same id, if a failed lineage is reopened and ends later).

    The spans are built from what this process kept of the lineage (`kept`, as its services wrote it) when it
    holds it all: then the export is one query, the claim, which also checks that the records hold as many of its
    events and model calls as were kept (`kept_unchanged`).
    Otherwise (the lineage began in another process, another process wrote to it since, or the claim's check
    failed) the lineage is read again: three queries (the versions with their agent, their events, the claim), a
    fourth for the model calls when a planning or the lineage closed; one for a persona lineage outside the
    sample (none once the process knows the agent's kind: `events_traced`)."""
    if not root_id or not tracing.export_on():
        return 0  # a plan made before traces: nothing to join, nothing exported
    key = (agent_id, root_id)
    if kept and (held := kept_get(key)) is not None and held.lineage.versions:
        first = held.lineage.versions[0]
        if not tracing.sampled(first.trace_id, sample_ratio(kind_remember(agent_id, held.lineage.agent.kind))):
            kept_forget(key)
            return 0
        exported = spans_send(key, held, checked=True)
        if exported is not None:
            return exported
    versions = lineage_versions(agent_id=agent_id, root_id=root_id)
    if not versions or not versions[0].trace_id:
        return 0
    first = versions[0]
    if not tracing.sampled(first.trace_id, sample_ratio(kind_remember(agent_id, first.agent.kind))):
        kept_forget(key)
        return 0  # decided before anything else is read: an unsampled persona costs one query, once
    lineage = Lineage(agent=first.agent, versions=versions, events=lineage_events([v.pk for v in versions]), calls=[])
    held = Kept(lineage=lineage, calls_known=False, since=first.trace_exported_through)
    return spans_send(key, held, checked=False) or 0


def spans_send(key: tuple[int, str], held: Kept, *, checked: bool) -> int | None:
    """Export the spans of `held` closed since the lineage's last export, and keep the lineage as exported (until
    it ends); the number exported. `checked`: built from what this process kept, so the claim checks the records
    still say the same; None when they do not (or the model calls are needed and were not kept): read again."""
    lineage = held.lineage
    first = lineage.versions[0]
    capture = tracing.capture_content()
    since, now = held.since, timezone.now()
    facts = lineage_facts(lineage, now=now, capture=capture)
    # A model call's span closes with its planning, or with the lineage: the calls are needed only when one did.
    if not held.calls_known and any(f.kind in ("agent", "plan") and f.closed_by > since for f in facts):
        if checked:
            return None
        lineage.calls, held.calls_known = lineage_calls([v.pk for v in lineage.versions], capture=capture), True
        facts = lineage_facts(lineage, now=now, capture=capture)
    facts = [f for f in facts if f.closed_by > since]
    if not facts:
        kept_put(key, held)
        return 0
    through = max(f.closed_by for f in facts)
    # Claimed before it is sent: two processes closing spans of one lineage at once never send a span twice.
    claim: QuerySet[Plan] = Plan.objects.filter(pk=first.pk, trace_exported_through=since)
    if checked:  # the model calls matter when a planning or the lineage closed (their spans go with it)
        claim = kept_unchanged(claim, held, calls=any(f.kind in ("agent", "plan") for f in facts))
    if not claim.update(trace_exported_through=through):
        kept_forget(key)
        return None if checked else 0
    held.since = through
    if lineage.ended is None:
        kept_put(key, held)
    else:
        kept_forget(key)  # ended: nothing more to export, unless an operator reopens it (then it is read again)
    return tracing.spans_export(trace_id=first.trace_id, root_id=first.trace_root_id,
                                parent_id=first.trace_parent_id, facts=facts)


def kept_unchanged(claim: QuerySet[Plan], held: Kept, *, calls: bool) -> QuerySet[Plan]:
    """`claim` only if the records hold as many events of the lineage (of any of its versions, a new one too) and
    (`calls`) model calls of its versions as `held` does: then every record written since, here or elsewhere, is in it (a
    version is created with its CREATED event, and what the spans read of a version, its creation and its
    events set)."""
    lineage = held.lineage
    first = lineage.versions[0]
    checks = [Exact(tally(PlanEvent.objects.filter(plan__agent_id=lineage.agent.pk,
                                                   plan__trace_root_id=first.trace_root_id)), len(lineage.events))]
    if calls:
        checks.append(Exact(tally(LLMCall.objects.filter(plan_id__in=[v.pk for v in lineage.versions])),
                            len(lineage.calls)))
    return claim.filter(*checks)


def tally(rows: QuerySet[Any]) -> Subquery:
    """The number of `rows`, as a subquery."""
    return Subquery(rows.order_by().annotate(n=Func(F("pk"), function="COUNT")).values("n"))


def kept_get(key: tuple[int, str]) -> Kept | None:
    """What this process kept of a lineage, as a copy its writers will not change while it is exported."""
    with _kept_lock:
        held = _kept.get(key)
        if held is None:
            return None
        lineage = held.lineage
        return Kept(lineage=Lineage(agent=lineage.agent, versions=list(lineage.versions),
                                    events=sorted(lineage.events, key=lambda e: (e.created_at, e.pk)),
                                    calls=sorted(lineage.calls, key=lambda c: (c.created_at, c.pk))),
                    calls_known=held.calls_known, since=held.since)


def kept_put(key: tuple[int, str], held: Kept) -> None:
    with _kept_lock:
        if key not in _kept and len(_kept) >= KEPT_REMEMBERED:
            _kept.clear()
            _kept_of_plan.clear()
        # What this process wrote meanwhile (events are kept as they are written, before their commit) stays.
        if (now := _kept.get(key)) is not None:
            known = {e.pk for e in held.lineage.events}
            held.lineage.events += [e for e in now.lineage.events if e.pk not in known]
            known = {c.pk for c in held.lineage.calls}
            held.lineage.calls += [c for c in now.lineage.calls if c.pk not in known]
            for version in now.lineage.versions:
                version_keep(held.lineage, version)
        _kept[key] = held
        for version in held.lineage.versions:
            _kept_of_plan[version.pk] = key


def kept_forget(key: tuple[int, str]) -> None:
    with _kept_lock:
        held = _kept.pop(key, None)
        for version in held.lineage.versions if held is not None else ():
            _kept_of_plan.pop(version.pk, None)


def version_keep(lineage: Lineage, plan: Plan) -> None:
    """The version as last written (replacing the one kept of it), in version order."""
    lineage.versions = sorted([v for v in lineage.versions if v.pk != plan.pk] + [plan], key=lambda v: (v.version, v.pk))


def event_keep(plan: Plan, event: PlanEvent) -> None:
    """Keep an event as a service wrote it, with its version, for the lineage's next export. A lineage not kept
    yet is kept from its first version's first event on (the claim's check tells whether that was all of it)."""
    key = (plan.agent_id, plan.trace_root_id)
    with _kept_lock:
        held = _kept.get(key)
        if held is None:
            if plan.previous_id is not None or not Plan.agent.is_cached(plan):
                return  # read at its next export, and kept from then on
            if len(_kept) >= KEPT_REMEMBERED:
                _kept.clear()
                _kept_of_plan.clear()
            held = _kept[key] = Kept(lineage=Lineage(agent=plan.agent, versions=[], events=[], calls=[]),
                                     calls_known=True, since=plan.trace_exported_through)
        if event.pk is None or (event.step_id is not None and not PlanEvent.step.is_cached(event)):
            _kept.pop(key)  # cannot be kept as the records give it: read again
            return
        version_keep(held.lineage, plan)
        held.lineage.events.append(event)
        _kept_of_plan[plan.pk] = key


def calls_traced(calls: Sequence[LLMCall]) -> None:
    """The hook of the write of model calls (agents/llm_calls.py): a call of a lineage this process keeps is kept
    with it. Nothing with export off."""
    if not tracing.export_on() or not _kept_of_plan:
        return
    with _kept_lock:
        for call in calls:
            if (key := _kept_of_plan.get(call.plan_id or 0)) is not None and (held := _kept.get(key)) is not None:
                if call.pk is None:
                    held.calls_known = False
                else:
                    held.lineage.calls.append(call)


# The lineages whose export this process already took past an event id: a second callback of the same commit (a
# replan's planning ended and its first step put up for approval at once) costs nothing. Bounded: forgotten lineages just read again.
_exported: dict[str, int] = {}
EXPORTED_REMEMBERED = 4096


def kind_remember(agent_id: int, kind: str) -> str:
    if len(_kinds) >= EXPORTED_REMEMBERED:
        _kinds.clear()
    _kinds[agent_id] = kind
    return kind


def lineage_export_safe(agent_id: int, root_id: str, event_id: int) -> None:
    if event_id and _exported.get(root_id, 0) >= event_id:
        return
    try:
        lineage_export_of(agent_id=agent_id, root_id=root_id)
    except Exception:  # a tracing tool that is down never fails a plan
        logger.exception("trace of lineage %s of agent %s not exported", root_id, agent_id)
    if len(_exported) >= EXPORTED_REMEMBERED:
        _exported.clear()
    _exported[root_id] = event_id


# The events whose commit exports what closed since the last export: the end of a planning (the plan then runs,
# or waits for a person: its approval, an answer), the start of a wait for a person (a step put up for approval),
# the lineage's end. So whenever the plan waits for a person, the tracing tool holds everything before the wait.
# Not a person's act (its wait goes with the plan's next planning, wait or end: a decline's replan, the next step
# up for approval, the end), nor a step's result (the most frequent event): these would add an export (its
# claim) for spans that follow shortly anyway.
EXPORT_AT = frozenset({*PLANNING_ENDS, *LINEAGE_ENDS, PlanEvent.Kind.STEP_AWAITING})


def events_traced(events: Sequence[PlanEvent]) -> Sequence[PlanEvent]:
    """The hook of every write of events (event_record, and the runners' batches): each event of a traced
    lineage is kept with it (`event_keep`), and once they commit, the spans closed since the last export are
    exported (with export on; nothing otherwise). The events, for chaining."""
    if not tracing.export_on():
        return events
    latest: dict[tuple[int, str], int] = {}
    for event in events:
        cached = PlanEvent.plan.is_cached(event)
        if event.plan_id is None or not (cached or event.kind in EXPORT_AT):
            continue  # written without its version at hand: its lineage is read at its next export
        plan = event.plan  # the version the event was written with (as the services do): its lineage's ids, no query
        if plan is None or not plan.trace_root_id:
            continue
        kind = _kinds.get(plan.agent_id)
        if kind is None and Plan.agent.is_cached(plan):
            kind = kind_remember(plan.agent_id, plan.agent.kind)
        if kind is not None and not tracing.sampled(plan.trace_id, sample_ratio(kind)):
            continue
        if cached:
            event_keep(plan, event)
        if event.kind in EXPORT_AT:
            lineage = (plan.agent_id, plan.trace_root_id)
            latest[lineage] = max(latest.get(lineage, 0), event.pk or 0)
    for (agent_id, root_id), event_id in sorted(latest.items()):
        transaction.on_commit(functools.partial(lineage_export_safe, agent_id, root_id, event_id))
    return events


# --- the plan page's timeline -------------------------------------------------------------------------------


@dataclass
class Bar:
    """One row of the timeline: a span as an offset and width in percent of the lineage's duration."""

    label: str
    kind: str
    depth: int
    left: float
    width: float
    seconds: float
    open: bool
    error: bool
    detail: str


def timeline_bars(facts: Sequence[SpanFact]) -> list[Bar]:
    """The facts as bars over the root's time span (the root first, children under their parents in time
    order); each at least a sliver wide so an instant shows."""
    if not facts:
        return []
    start = min(f.start for f in facts)
    end = max(f.end for f in facts)
    total = max((end - start).total_seconds(), 1e-6)
    depth_of = {"": 0}
    for fact in facts:
        if fact.key:
            depth_of[fact.key] = depth_of.get(fact.parent, 0) + 1
    ordered: list[SpanFact] = []
    children: dict[str, list[SpanFact]] = {}
    for fact in facts:
        if fact.key:
            children.setdefault(fact.parent, []).append(fact)

    def walk(fact: SpanFact) -> None:
        ordered.append(fact)
        for child in sorted(children.get(fact.key, []), key=lambda f: (f.start, f.key)):
            walk(child)

    roots = [f for f in facts if not f.key] or sorted(facts, key=lambda f: f.start)[:1]
    for root in roots:
        walk(root)
    bars = []
    for fact in ordered:
        left = (fact.start - start).total_seconds() / total * 100
        width = max(fact.seconds / total * 100, 0.4)
        bars.append(Bar(label=fact.name, kind=fact.kind, depth=depth_of.get(fact.key, 1),
                        left=round(min(left, 99.6), 2), width=round(min(width, 100 - min(left, 99.6)), 2),
                        seconds=fact.seconds, open=bool(fact.attributes.get("planner.open")), error=bool(fact.error),
                        detail=bar_detail(fact)))
    return bars


def bar_detail(fact: SpanFact) -> str:
    """What the row says beside its duration: the decision of a wait, a call's tokens, a step's outcome."""
    a = fact.attributes
    if fact.kind == "wait":
        acts = fact.events[1:]
        if acts:
            last = acts[-1]
            return f"{last.name.replace('_', ' ')} by {last.attributes.get('planner.operator', '')}"
        return "waiting" if a.get("planner.open") else "moved on without a decision"
    if fact.kind == "chat":
        return f"{a.get('gen_ai.usage.input_tokens', 0)} in / {a.get('gen_ai.usage.output_tokens', 0)} out tokens"
    if fact.kind == "tool":
        return str(a.get("planner.outcome", "running"))
    if fact.kind == "plan":
        return f"{a.get('planner.attempts', 0)} attempt(s)"
    return str(a.get("planner.outcome", ""))


def plan_timeline(plan: Plan) -> dict[str, Any]:
    """The plan page's timeline: the lineage's bars and the link to its trace (TRACE_URL_TEMPLATE)."""
    lineage = lineage_load(plan, agent=plan.agent, capture=False)
    facts = lineage_facts(lineage, now=timezone.now())
    return {"bars": timeline_bars(facts), "trace_id": lineage.trace_id, "trace_url": tracing.trace_url(lineage.trace_id),
            "seconds": facts[0].seconds if facts else 0.0}

