"""Agents' traces join: a plan submitted with a W3C traceparent (API, MCP) is in the caller's trace, its root span
a child of the caller's span; the Python client sends the caller's traceparent; a real OTLP/HTTP receiver on
loopback gets the spans when the endpoint is set; the plan page draws the spans and links to the trace."""

from __future__ import annotations

from typing import Any

import pytest
from django.test import Client
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from planner_site import tracing
from planning.models import Plan
from tests.api.conftest import PLAN, ApiClient
from tests.tracing.conftest import OtlpReceiver

CALLER_TRACE, CALLER_SPAN = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
TRACEPARENT = f"00-{CALLER_TRACE}-{CALLER_SPAN}-01"


@pytest.mark.django_db
def test_a_plan_submitted_with_a_traceparent_joins_the_callers_trace(
        tooled: ApiClient, exported: InMemorySpanExporter, django_capture_on_commit_callbacks: Any) -> None:
    tooled.client.defaults["HTTP_TRACEPARENT"] = TRACEPARENT
    status, body = tooled.post("/api/v1/plans", PLAN)
    assert status == 201
    plan = Plan.objects.get(pk=body["id"])
    assert (plan.trace_id, plan.trace_parent_id) == (CALLER_TRACE, CALLER_SPAN)
    with django_capture_on_commit_callbacks(execute=True):
        assert tooled.post(f"/api/v1/plans/{plan.pk}/cancel", {"reason": "no longer needed"})[0] == 200
    spans = exported.get_finished_spans()
    assert spans and {f"{s.context.trace_id:032x}" for s in spans} == {CALLER_TRACE}
    [root] = [s for s in spans if s.name.startswith("invoke_agent")]
    assert root.parent is not None and f"{root.parent.span_id:016x}" == CALLER_SPAN and root.parent.is_remote
    # The wait for the operator is inside the caller's trace, under the dashboard's root.
    [wait] = [s for s in spans if s.name == "await_approval"]
    assert wait.parent.span_id == root.context.span_id
    assert [e.name for e in wait.events][-1] == "cancelled"


@pytest.mark.django_db
def test_two_plans_in_one_callers_trace_are_two_lineages(
        tooled: ApiClient, exported: InMemorySpanExporter, django_capture_on_commit_callbacks: Any) -> None:
    tooled.client.defaults["HTTP_TRACEPARENT"] = TRACEPARENT
    ids = [tooled.post("/api/v1/plans", PLAN)[1]["id"] for _ in range(2)]
    with django_capture_on_commit_callbacks(execute=True):
        for plan_id in ids:
            assert tooled.post(f"/api/v1/plans/{plan_id}/cancel", {"reason": "done elsewhere"})[0] == 200
    roots = [s for s in exported.get_finished_spans() if s.name.startswith("invoke_agent")]
    assert len(roots) == 2 and {r.attributes["planner.plan.id"] for r in roots} == set(ids)
    assert all(f"{r.parent.span_id:016x}" == CALLER_SPAN for r in roots if r.parent is not None)
    assert all(r.attributes["planner.versions"] == 1 for r in roots)


@pytest.mark.django_db
@pytest.mark.parametrize("header", [None, "garbage", "00-00000000000000000000000000000000-00f067aa0ba902b7-01"])
def test_without_a_valid_traceparent_a_plan_starts_its_own_trace(tooled: ApiClient, header: str | None) -> None:
    if header is not None:
        tooled.client.defaults["HTTP_TRACEPARENT"] = header
    status, body = tooled.post("/api/v1/plans", PLAN)
    assert status == 201
    plan = Plan.objects.get(pk=body["id"])
    assert len(plan.trace_id) == 32 and plan.trace_id != CALLER_TRACE and plan.trace_parent_id == ""


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("where", ["header", "meta"])
async def test_a_plan_submitted_over_mcp_with_a_traceparent_joins_the_callers_trace(where: str) -> None:
    import httpx2
    from mcp import ClientSession
    from mcp.client.streamable_http import streamable_http_client

    from planner_site.asgi import application
    from tests.mcp.test_server import BASE, db, ok, setup

    raw = await db(setup)()
    headers = {"Authorization": f"Bearer {raw}"} | ({"traceparent": TRACEPARENT} if where == "header" else {})
    async with (httpx2.AsyncClient(transport=httpx2.ASGITransport(app=application), base_url=BASE, headers=headers,
                                   timeout=60) as http,
                streamable_http_client(f"{BASE}/mcp", http_client=http) as (read, write),
                ClientSession(read, write) as session):
        await session.initialize()
        meta: Any = {"traceparent": TRACEPARENT} if where == "meta" else None  # MCP's trace context
        created = ok(await session.call_tool("submit_plan", PLAN, meta=meta))
    plan = await db(Plan.objects.get)(pk=created["id"])
    assert (plan.trace_id, plan.trace_parent_id) == (CALLER_TRACE, CALLER_SPAN)


def test_the_python_client_sends_the_callers_traceparent() -> None:
    from planner_client.client import trace_headers

    assert trace_headers() == {}  # outside any span: nothing to send
    tracer = TracerProvider().get_tracer("agent")
    with tracer.start_as_current_span("my agent's run") as span:
        sent = trace_headers()
    context = span.get_span_context()
    assert tracing.traceparent_parse(sent["traceparent"]) == (f"{context.trace_id:032x}", f"{context.span_id:016x}")


@pytest.mark.django_db
def test_an_otlp_http_receiver_gets_the_lineage_when_the_endpoint_is_set(
        receiver: OtlpReceiver, settings: Any, operator: Any, django_capture_on_commit_callbacks: Any) -> None:
    from tests.tracing.test_traces import declined_replanned_approved_run, reporter

    settings.OTEL_EXPORTER_OTLP_ENDPOINT = receiver.url
    tracing.provider_install(None)  # the settings' endpoint, with the batching exporter made on first export
    try:
        with django_capture_on_commit_callbacks(execute=True):
            first, second = declined_replanned_approved_run(reporter(), operator)
        tracing.flush()
    finally:
        tracing.provider_install(None)
    assert receiver.requests and {path for path, _ in receiver.requests} == {"/v1/traces"}
    received = receiver.spans()
    assert {r.service for r in received} == {"agent-planner"}
    spans = [r.span for r in received]
    assert {s.trace_id.hex() for s in spans} == {first.trace_id}
    names = {s.name for s in spans}
    assert {"invoke_agent Reporter", "plan v1", "plan v2", "chat offline-rules", "await_approval",
            "execute_tool report.write"} <= names
    [root] = [s for s in spans if not s.parent_span_id]
    assert all(s.parent_span_id for s in spans if s is not root)
    declined = [e for s in spans for e in s.events if e.name == "declined"]
    assert declined and any(a.key == "planner.feedback" for a in declined[0].attributes)


@pytest.mark.django_db
def test_the_plan_page_draws_the_spans_and_links_to_the_trace(
        viewer_client: Client, settings: Any, operator: Any) -> None:
    from tests.tracing.test_traces import declined_replanned_approved_run, reporter

    first, second = declined_replanned_approved_run(reporter(), operator)
    settings.TRACE_URL_TEMPLATE = "http://localhost:6006/trace/{trace_id}"
    page = viewer_client.get(second.get_absolute_url()).content.decode()
    assert "Where the time went" in page
    assert f'href="http://localhost:6006/trace/{first.trace_id}"' in page
    for label in ("invoke_agent Reporter", "plan v1", "plan v2", "chat offline-rules", "await_approval",
                  "execute_tool report.write"):
        assert f">{label}</text>" in page
    assert "declined by" in page  # the wait says how it ended
    settings.TRACE_URL_TEMPLATE = ""
    page = viewer_client.get(first.get_absolute_url()).content.decode()
    assert "plan-trace-link" not in page and f"<code id=\"plan-trace-id\">{first.trace_id}</code>" in page
