"""One trace per plan lineage (docs/tracing.md): the goal planned, declined with feedback, replanned, approved
and run is ONE trace with correct parents; a wait of ten minutes is no second trace and no error; the spans
follow the GenAI conventions; nothing is exported while export is off."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.db.models import F
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode

from agents.models import Agent
from planner_site import tracing
from planning.models import Plan, PlanEvent, PlanStep
from planning.planner import plan_generate
from planning.trace_spans import lineage_export, lineage_facts, lineage_load
from tests.factories import AgentFactory
from tests.planning.test_planner import run_cycles

pytestmark = pytest.mark.django_db


def reporter() -> Agent:
    agent = AgentFactory(name="Reporter", kind=Agent.Kind.TOOL)
    (agent.workspace / "notes").mkdir(parents=True)
    (agent.workspace / "notes" / "monday.txt").write_text("The deploy went out on time. Two alerts fired overnight.")
    (agent.workspace / "notes" / "tuesday.txt").write_text("Customers asked for CSV export. Latency is stable.")
    return agent


def declined_and_replanned(agent: Agent, operator: Any) -> tuple[Plan, Plan]:
    """The goal planned, approved step by step, a step declined with feedback, replanned: v2 awaits approval."""
    from planning.services import plan_approve, step_approve, step_decline

    first = plan_generate(agent=agent, goal_text="Write a report from the notes")
    plan_approve(plan=first, user=operator, mode=Plan.ApprovalMode.STEP)
    for _ in range(8):
        run_cycles(agent, 1)
        waiting = first.steps.filter(status=PlanStep.Status.AWAITING_APPROVAL).first()
        if waiting is not None and "tuesday" in waiting.description:
            step_decline(step=waiting, user=operator, feedback="Leave tuesday out, those notes are not final")
            break
        if waiting is not None:
            step_approve(step=waiting, user=operator)
    run_cycles(agent, 1)
    second = Plan.objects.get(previous=first)
    assert second.status == Plan.Status.AWAITING_APPROVAL
    return first, second


def approved_and_run(second: Plan, operator: Any) -> None:
    from planning.services import plan_approve

    plan_approve(plan=second, user=operator, mode=Plan.ApprovalMode.ALL)
    run_cycles(second.agent)
    second.refresh_from_db()
    assert second.status == Plan.Status.COMPLETED


def declined_replanned_approved_run(agent: Agent, operator: Any) -> tuple[Plan, Plan]:
    first, second = declined_and_replanned(agent, operator)
    approved_and_run(second, operator)
    return first, second


def by_name(spans: list[ReadableSpan], prefix: str) -> list[ReadableSpan]:
    return [s for s in spans if (s.name or "").startswith(prefix)]


def hexid(n: int, width: int) -> str:
    return f"{n:0{width}x}"


def test_declined_replanned_approved_and_run_is_one_trace_with_its_parents(
        operator: Any, exported: InMemorySpanExporter, django_capture_on_commit_callbacks: Any) -> None:
    agent = reporter()
    with django_capture_on_commit_callbacks(execute=True):
        first, second = declined_and_replanned(agent, operator)
    while_waiting = [s.name for s in exported.get_finished_spans()]
    with django_capture_on_commit_callbacks(execute=True):
        approved_and_run(second, operator)
    # While v2 waited for the operator, what had closed was already in the tracing tool (not v2's wait, nor the root).
    assert {"plan v1", "plan v2", "chat offline-rules", "execute_tool file.list", "await_approval"} <= set(while_waiting)
    assert "invoke_agent Reporter" not in while_waiting
    spans = list(exported.get_finished_spans())
    assert len({s.context.span_id for s in spans}) == len(spans)  # each span sent once
    assert {hexid(s.context.trace_id, 32) for s in spans} == {first.trace_id} == {second.trace_id}

    [root] = [s for s in spans if s.parent is None]
    assert root.name == "invoke_agent Reporter" and root.attributes["gen_ai.operation.name"] == "invoke_agent"
    assert hexid(root.context.span_id, 16) == first.trace_root_id
    assert root.attributes["planner.outcome"] == "completed" and root.attributes["planner.versions"] == 2
    ids = {s.context.span_id: s for s in spans}
    assert all(s.parent.span_id in ids for s in spans if s.parent is not None)  # no orphan

    plans = by_name(spans, "plan v")
    assert [p.name for p in sorted(plans, key=lambda s: s.start_time)] == ["plan v1", "plan v2"]
    assert all(p.parent.span_id == root.context.span_id for p in plans)
    chats = by_name(spans, "chat ")
    assert {c.attributes["planner.purpose"] for c in chats} == {"restate", "plan", "replan"}
    for chat in chats:  # each model call under the planning it served
        assert ids[chat.parent.span_id].name.startswith("plan v")
        assert chat.attributes["gen_ai.request.model"] == "offline-rules"
        assert "gen_ai.usage.input_tokens" in chat.attributes and "gen_ai.input.messages" not in chat.attributes

    tools = by_name(spans, "execute_tool ")
    assert {t.attributes["gen_ai.tool.name"] for t in tools} == {"file.list", "text.summarize", "report.write"}
    assert all(t.attributes["planner.outcome"] == "completed" for t in tools)
    assert all(t.end_time >= t.start_time for t in spans)

    waits = by_name(spans, "await_approval")
    assert waits and all(w.status.status_code != StatusCode.ERROR for w in waits)  # a wait is never an error
    acts = {e.name: e for w in waits for e in w.events}
    assert {"approval_requested", "approved", "declined"} <= set(acts)
    declined = acts["declined"].attributes
    assert declined["planner.feedback"] == "Leave tuesday out, those notes are not final"
    assert declined["planner.operator"] == operator.username and declined["planner.channel"] == "dashboard"
    assert declined["planner.wait_seconds"] >= 0
    # Exported once: the lineage's first version remembers how far; nothing is sent again.
    assert Plan.objects.get(pk=first.pk).trace_exported_through == second.events.get(kind="plan_completed").pk
    assert lineage_export(second.pk) == 0


def test_a_plan_that_waited_ten_minutes_for_a_person_is_one_trace(
        operator: Any, exported: InMemorySpanExporter, django_capture_on_commit_callbacks: Any) -> None:
    agent = reporter()
    first, second = declined_replanned_approved_run(agent, operator)  # not exported: on_commit not run
    assert exported.get_finished_spans() == ()
    # The operator came back ten minutes after v2 awaited approval: everything from the approval on is later.
    approved = second.events.get(kind=PlanEvent.Kind.PLAN_APPROVED)
    PlanEvent.objects.filter(plan=second, created_at__gte=approved.created_at).update(
        created_at=F("created_at") + timedelta(minutes=10))
    lineage_export(second.pk)
    spans = list(exported.get_finished_spans())
    assert len({s.context.trace_id for s in spans}) == 1 and len([s for s in spans if s.parent is None]) == 1
    [wait] = [s for s in by_name(spans, "await_approval") if s.attributes.get("planner.plan.version") == 2]
    assert 600 <= (wait.end_time - wait.start_time) / 1e9 < 660
    approved_event = next(e for e in wait.events if e.name == "approved")
    assert approved_event.attributes["planner.wait_seconds"] >= 600
    assert wait.status.status_code == StatusCode.UNSET
    [root] = [s for s in spans if s.parent is None]
    assert root.end_time >= wait.end_time  # the root spans the wait


def test_nothing_is_exported_while_export_is_off(operator: Any, settings: Any,
                                                 django_capture_on_commit_callbacks: Any) -> None:
    settings.OTEL_EXPORTER_OTLP_ENDPOINT = settings.TRACE_EXPORT_ENDPOINT = ""
    tracing.provider_install(None)
    agent = reporter()
    with django_capture_on_commit_callbacks(execute=True):
        first, second = declined_replanned_approved_run(agent, operator)
    assert tracing.exporting.provider is None  # no SDK provider was even made
    assert Plan.objects.get(pk=first.pk).trace_exported_through == 0
    assert lineage_export(second.pk) == 0


def test_prompts_and_answers_only_when_content_capture_is_on(operator: Any, settings: Any,
                                                             exported: InMemorySpanExporter) -> None:
    settings.OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT = True
    plan = plan_generate(agent=reporter(), goal_text="Write a report from the notes")
    Plan.objects.filter(pk=plan.pk).update(status=Plan.Status.CANCELLED)
    PlanEvent.objects.create(plan=plan, kind=PlanEvent.Kind.PLAN_CANCELLED, actor_label="olga")
    lineage_export(plan.pk)
    chats = by_name(list(exported.get_finished_spans()), "chat ")
    assert chats and all("Write a report" in str(c.attributes["gen_ai.input.messages"]) for c in chats)


def test_persona_cycles_are_sampled_by_trace_id(settings: Any) -> None:
    settings.OTEL_PERSONA_SAMPLE_RATIO = 0.25
    ids = [tracing.trace_id_new() for _ in range(4000)]
    kept = sum(tracing.sampled(t, 0.25) for t in ids)
    assert 800 < kept < 1200  # about a quarter
    assert all(tracing.sampled(t, 0.25) == tracing.sampled(t, 0.25) for t in ids[:50])  # decided by the id alone
    assert not any(tracing.sampled(t, 0.0) for t in ids) and all(tracing.sampled(t, 1.0) for t in ids)


def test_a_persona_lineage_outside_the_sample_is_not_exported(settings: Any, exported: InMemorySpanExporter) -> None:
    from tests.factories import PlanFactory

    settings.OTEL_PERSONA_SAMPLE_RATIO = 0.0
    plan = PlanFactory(agent=AgentFactory(kind=Agent.Kind.PERSONA), status=Plan.Status.COMPLETED)
    PlanEvent.objects.create(plan=plan, kind=PlanEvent.Kind.PLAN_COMPLETED, actor_label="r")
    assert lineage_export(plan.pk) == 0 and exported.get_finished_spans() == ()
    settings.OTEL_PERSONA_SAMPLE_RATIO = 1.0
    assert lineage_export(plan.pk) > 0


@pytest.mark.parametrize(("header", "parsed"), [
    ("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", ("4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7")),
    (" 00-4BF92F3577B34DA6A3CE929D0E0E4736-00F067AA0BA902B7-00 ", ("4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7")),
    ("00-00000000000000000000000000000000-00f067aa0ba902b7-01", None),  # an invalid trace id
    ("00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01", None),
    ("garbage", None), ("", None), (None, None),
    ("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01; drop table", None),
])
def test_traceparent_is_read_as_w3c_writes_it(header: str | None, parsed: tuple[str, str] | None) -> None:
    assert tracing.traceparent_parse(header) == parsed


def test_a_lineage_made_before_traces_still_has_its_timeline(operator: Any) -> None:
    plan = plan_generate(agent=reporter(), goal_text="Write a report from the notes")
    Plan.objects.filter(pk=plan.pk).update(trace_id="", trace_root_id="")
    plan.refresh_from_db()
    facts = lineage_facts(lineage_load(plan), now=plan.updated_at + timedelta(seconds=5))
    assert facts[0].name == "invoke_agent Reporter" and any(f.kind == "chat" for f in facts)
    assert lineage_export(plan.pk) == 0  # no trace id: nothing to join, nothing exported


def test_a_persona_plan_run_in_a_runners_batch_is_traced_when_sampled(
        settings: Any, exported: InMemorySpanExporter, django_capture_on_commit_callbacks: Any) -> None:
    from runtime.cycle import persona_cycles
    from tests.agents.test_persona_batch import person

    settings.OTEL_PERSONA_SAMPLE_RATIO = 1.0
    agents = [person(steps=(("work", 1), ("eat", 1))) for _ in range(2)]
    for _ in range(6):
        with django_capture_on_commit_callbacks(execute=True):
            persona_cycles([a.pk for a in agents], runner="runner test")
    plan = Plan.objects.filter(agent=agents[0]).order_by("pk").first()
    assert plan is not None and plan.status == Plan.Status.COMPLETED
    spans = [s for s in exported.get_finished_spans() if f"{s.context.trace_id:032x}" == plan.trace_id]
    tools = by_name(spans, "execute_tool ")
    assert {t.attributes["gen_ai.tool.name"] for t in tools} == {"work", "eat"}
    assert [s.name for s in spans if s.parent is None] == [f"invoke_agent {agents[0].name}"]
