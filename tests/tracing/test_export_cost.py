"""What an export costs the database (docs/tracing.md, "What it costs"): a lineage whose records this process wrote
is exported from what its services wrote, with one query (the claim); a lineage someone else wrote to is read
again, and its spans are the same either way."""

from __future__ import annotations

from typing import Any

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from planner_site import tracing
from planning.models import Plan, PlanEvent
from planning.planner import plan_generate
from planning.trace_spans import lineage_export, lineage_export_of
from tests.planning.test_planner import run_cycles
from tests.tracing.test_traces import by_name, declined_and_replanned, reporter

pytestmark = pytest.mark.django_db


def exported_by_the_hook(plan: Plan) -> tuple[int, int]:
    """The export a commit of `plan`'s lineage triggers: (spans sent, queries it made)."""
    with CaptureQueriesContext(connection) as queries:
        sent = lineage_export_of(agent_id=plan.agent_id, root_id=plan.trace_root_id)
    return sent, len(queries)


def test_an_export_of_a_lineage_this_process_wrote_makes_one_query(operator: Any,
                                                                   exported: InMemorySpanExporter) -> None:
    from planning.services import plan_approve

    plan = plan_generate(agent=reporter(), goal_text="Write a report from the notes")
    sent, queries = exported_by_the_hook(plan)  # the planning ended: v1 awaits approval
    assert sent >= 2 and queries == 1  # the planning and its model calls, for the claim alone
    plan_approve(plan=plan, user=operator, mode=Plan.ApprovalMode.ALL)
    run_cycles(plan.agent)
    assert Plan.objects.get(pk=plan.pk).status == Plan.Status.COMPLETED
    sent, queries = exported_by_the_hook(plan)  # the lineage ended
    assert sent >= 4 and queries == 1  # the wait, the steps and the root
    spans = list(exported.get_finished_spans())
    assert [s.name for s in spans if s.parent is None] == ["invoke_agent Reporter"]
    assert {"approval_requested", "approved"} <= {e.name for w in by_name(spans, "await_approval") for e in w.events}


def shape(spans: list[ReadableSpan]) -> list[tuple[Any, ...]]:
    ids = {s.context.span_id: s.name for s in spans}
    return sorted((s.name, s.start_time, s.end_time, ids.get(s.parent.span_id) if s.parent else None,
                   sorted(s.attributes.items()), [(e.name, e.timestamp, sorted(e.attributes.items())) for e in s.events],
                   s.status.status_code) for s in spans)


def test_the_spans_built_from_what_was_written_are_those_the_records_give(
        operator: Any, exported: InMemorySpanExporter, django_capture_on_commit_callbacks: Any) -> None:
    from planning.services import plan_approve

    with django_capture_on_commit_callbacks(execute=True):
        first, second = declined_and_replanned(reporter(), operator)
        plan_approve(plan=second, user=operator, mode=Plan.ApprovalMode.ALL)
        run_cycles(second.agent)
    from_memory = list(exported.get_finished_spans())
    assert by_name(from_memory, "invoke_agent")  # the lineage ended and was exported
    # The same lineage exported again from its records alone.
    Plan.objects.filter(pk=first.pk).update(trace_exported_through=0)
    exported.clear()
    assert lineage_export(second.pk) > 0
    assert shape(list(exported.get_finished_spans())) == shape(from_memory)


def test_a_lineage_another_process_wrote_to_is_read_again(operator: Any, exported: InMemorySpanExporter) -> None:
    plan = plan_generate(agent=reporter(), goal_text="Write a report from the notes")
    assert exported_by_the_hook(plan)[1] == 1
    # An operator approves on another server process: its event is not in this process's memory.
    Plan.objects.filter(pk=plan.pk).update(status=Plan.Status.ACTIVE, approval_mode=Plan.ApprovalMode.ALL)
    plan.steps.update(approved_by=operator)
    PlanEvent.objects.create(plan=plan, agent_id=plan.agent_id, kind=PlanEvent.Kind.PLAN_APPROVED, actor=operator,
                             actor_label=operator.username, detail={"channel": "slack"})
    run_cycles(plan.agent)
    assert Plan.objects.get(pk=plan.pk).status == Plan.Status.COMPLETED
    sent, queries = exported_by_the_hook(plan)
    assert sent >= 4 and queries > 1  # the check failed: read again
    [wait] = by_name(list(exported.get_finished_spans()), "await_approval")
    approved = [e for e in wait.events if e.name == "approved"]
    assert approved and approved[0].attributes["planner.channel"] == "slack"
    assert wait.attributes["planner.decision"] == "approved"


def test_nothing_is_kept_while_export_is_off(operator: Any, settings: Any) -> None:
    from planning import trace_spans

    settings.OTEL_EXPORTER_OTLP_ENDPOINT = settings.TRACE_EXPORT_ENDPOINT = ""
    tracing.provider_install(None)
    trace_spans._kept.clear()
    plan_generate(agent=reporter(), goal_text="Write a report from the notes")
    assert trace_spans._kept == {}


def test_a_decision_rolled_back_is_not_in_the_trace(operator: Any, exported: InMemorySpanExporter) -> None:
    from django.db import transaction

    from planning.services import plan_approve

    plan = plan_generate(agent=reporter(), goal_text="Write a report from the notes")
    assert exported_by_the_hook(plan)[1] == 1
    with pytest.raises(RuntimeError), transaction.atomic():  # approved, then the request failed: nothing stays
        plan_approve(plan=plan, user=operator, mode=Plan.ApprovalMode.ALL)
        raise RuntimeError
    plan = Plan.objects.get(pk=plan.pk)
    assert plan.status == Plan.Status.AWAITING_APPROVAL
    plan_approve(plan=plan, user=operator, mode=Plan.ApprovalMode.ALL)
    run_cycles(plan.agent)
    sent, queries = exported_by_the_hook(plan)
    assert sent >= 4 and queries > 1  # what was kept says more than the records: read again
    [wait] = by_name(list(exported.get_finished_spans()), "await_approval")
    assert [e.name for e in wait.events] == ["approval_requested", "approved"]


def test_a_model_call_recorded_elsewhere_is_in_the_trace(operator: Any, exported: InMemorySpanExporter) -> None:
    from agents.models import LLMCall
    from planning.services import plan_approve

    plan = plan_generate(agent=reporter(), goal_text="Write a report from the notes")
    # Another process asked a model about this plan (its call is not in this process's memory).
    LLMCall.objects.create(agent=plan.agent, plan=plan, purpose=LLMCall.Purpose.REPLAN, provider="openai",
                           model="elsewhere-model", tokens_in=7, tokens_out=3)
    sent, queries = exported_by_the_hook(plan)
    assert sent >= 2 and queries > 1  # read again
    plan_approve(plan=plan, user=operator, mode=Plan.ApprovalMode.ALL)
    run_cycles(plan.agent)
    exported_by_the_hook(plan)
    chats = by_name(list(exported.get_finished_spans()), "chat ")
    assert "chat elsewhere-model" in {c.name for c in chats}
    assert len({c.context.span_id for c in chats}) == len(chats)  # each call once
