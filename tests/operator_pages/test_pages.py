"""Versions and compare, the plan graph, the audit log and usage: what each page shows, and its cost."""

from __future__ import annotations

import csv
import io
import json
from datetime import timedelta
from decimal import Decimal

import pytest
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from agents.models import LLMCall
from planning.models import Plan, PlanEvent, PlanStep
from planning.operator_selectors import plan_graph
from tests.factories import AgentFactory, LLMCallFactory, PlanEventFactory, PlanFactory, PlanStepFactory

pytestmark = pytest.mark.django_db


def two_versions() -> tuple[Plan, Plan]:
    v1 = PlanFactory(status=Plan.Status.REPLANNED, goal__description="Have a meal")
    PlanEventFactory(plan=v1, kind=PlanEvent.Kind.CREATED, reason="")
    PlanStepFactory(plan=v1, key="1", position=1, description="Go to the store", estimated_cycles=1)
    PlanStepFactory(plan=v1, key="2", position=2, description="Buy food", estimated_cycles=2)
    v2 = PlanFactory(agent=v1.agent, goal=v1.goal, goal_text=v1.goal_text, version=2, previous=v1)
    PlanEventFactory(plan=v2, kind=PlanEvent.Kind.CREATED, reason="step 2 declined: too pricey", actor_label="runner r1")
    PlanStepFactory(plan=v2, key="1", position=1, description="Go to the store", estimated_cycles=1)
    PlanStepFactory(plan=v2, key="3", position=2, description="Cook at home", estimated_cycles=3, risk="risky")
    return v1, v2


def test_versions_say_why_each_was_made(viewer_client: Client) -> None:
    v1, v2 = two_versions()
    html = viewer_client.get(reverse("plan-versions", args=[v2.pk])).content.decode()
    assert "first version" in html and "step 2 declined: too pricey" in html and "runner r1" in html
    assert f"?a={v1.pk}&amp;b={v2.pk}" in html


def test_compare_shows_added_removed_changed_and_estimates(viewer_client: Client) -> None:
    v1, v2 = two_versions()
    PlanStep.objects.filter(plan=v2, key="1").update(description="Walk to the store")
    html = viewer_client.get(reverse("plan-compare") + f"?a={v2.pk}&b={v1.pk}").content.decode()
    assert "version 1</a> → <a" in html
    assert '<span class="tag mark added">Added</span> <span class="key">3</span> Cook at home' in html
    assert '<span class="tag mark removed">Removed</span> <span class="key">2</span> Buy food' in html
    assert '<span class="tag mark changed">Changed</span> <span class="key">1</span> Walk to the store' in html
    assert 'Description: <span class="old">Go to the store</span> → <span class="new">Walk to the store</span>' in html
    assert '<th scope="row">estimated cycles</th><td>3</td><td>4</td>' in html
    assert '<th scope="row">risky steps</th><td>0</td><td>1</td>' in html


def test_compare_names_fields_in_words(viewer_client: Client) -> None:
    v1, v2 = two_versions()
    PlanStep.objects.filter(plan=v1, key="1").update(requires_permission=True)
    PlanStep.objects.filter(plan=v2, key="1").update(action_hint="walk to the store")
    html = viewer_client.get(reverse("plan-compare") + f"?a={v1.pk}&b={v2.pk}").content.decode()
    assert 'Action: <span class="old">work</span> → <span class="new">walk to the store</span>' in html
    assert 'Requires permission: <span class="old">yes</span> → <span class="new">no</span>' in html
    assert "action_hint" not in html and "requires_permission" not in html and "True" not in html


def test_compare_matches_a_renumbered_step_to_itself(viewer_client: Client) -> None:
    v1, v2 = two_versions()
    PlanStep.objects.filter(plan=v2, key="3").update(description="Earn some money", key="2")
    PlanStepFactory(plan=v2, key="3", position=3, description="Buy food", estimated_cycles=2, depends_on=["2"])
    html = viewer_client.get(reverse("plan-compare") + f"?a={v1.pk}&b={v2.pk}").content.decode()
    assert '<span class="tag mark added">Added</span> <span class="key">2</span> Earn some money' in html
    assert '<span class="tag mark changed">Changed</span> <span class="key">3</span> Buy food' in html
    assert 'Step id: <span class="old">2</span> → <span class="new">3</span>' in html
    assert "Removed</span>" not in html


def test_compare_refuses_bad_input_clearly(viewer_client: Client) -> None:
    v1, _ = two_versions()
    assert viewer_client.get(reverse("plan-compare") + "?a=x&b=1").status_code == 400
    assert viewer_client.get(reverse("plan-compare") + f"?a={v1.pk}&b=999999").status_code == 404
    other = PlanFactory()
    response = viewer_client.get(reverse("plan-compare") + f"?a={v1.pk}&b={other.pk}")
    assert response.status_code == 400 and "different agents" in response.content.decode()


def test_graph_lays_steps_out_by_depth() -> None:
    plan = PlanFactory()
    a = PlanStepFactory(plan=plan, key="a")
    b = PlanStepFactory(plan=plan, key="b", depends_on=["a"])
    c = PlanStepFactory(plan=plan, key="c", depends_on=["a"])
    d = PlanStepFactory(plan=plan, key="d", depends_on=["b", "c"])
    graph = plan_graph([a, b, c, d])
    depth = {n.step.key: n.depth for n in graph.nodes}
    assert depth == {"a": 0, "b": 1, "c": 1, "d": 2}
    x = {n.step.key: n.x for n in graph.nodes}
    assert x["a"] < x["b"] == x["c"] < x["d"]
    assert len(graph.edges) == 4


def test_plan_page_draws_the_graph_with_links_to_steps_and_status_colors(viewer_client: Client) -> None:
    plan = PlanFactory()
    PlanStepFactory(plan=plan, key="1", status=PlanStep.Status.COMPLETED)
    PlanStepFactory(plan=plan, key="2", depends_on=["1"], status=PlanStep.Status.AWAITING_APPROVAL)
    html = viewer_client.get(plan.get_absolute_url()).content.decode()
    assert '<a href="#step-1" class="n-completed"' in html
    assert '<a href="#step-2" class="n-awaiting_approval"' in html
    assert 'class="edge"' in html


def test_the_graph_escapes_what_a_model_wrote_in_a_step(viewer_client: Client) -> None:
    plan = PlanFactory()
    PlanStepFactory(plan=plan, key='k"1', description='<img src=x onerror="alert(1)"> & more')
    html = viewer_client.get(plan.get_absolute_url()).content.decode()
    graph = html[html.index('id="plan-graph"'):html.index("</section>", html.index('id="plan-graph"'))]
    assert "<img" not in graph and "&lt;img src=x onerror=&quot;alert(1)&quot;&gt; &amp; more" in graph
    assert 'href="#step-k&quot;1"' in graph


def test_plan_page_shows_the_cost_of_each_call(viewer_client: Client) -> None:
    plan = PlanFactory()
    LLMCallFactory(plan=plan, agent=plan.agent, cost=Decimal("0.001250"))
    LLMCallFactory(plan=plan, agent=plan.agent, cost=None)
    html = viewer_client.get(plan.get_absolute_url()).content.decode()
    assert "<th>Cost</th>" in html and "$0.001250" in html and 'title="Set LLM_PRICES to see costs"' in html


def test_audit_lists_plan_events_and_agent_events_with_filters(viewer_client: Client, operator) -> None:  # type: ignore[no-untyped-def]
    plan = PlanFactory(agent__name="Alice")
    PlanEventFactory(plan=plan, kind=PlanEvent.Kind.STEP_APPROVED, actor=operator, actor_label="olga", reason="ok")
    PlanEventFactory(plan=plan, kind=PlanEvent.Kind.STEP_COMPLETED, actor_label="runner r1")
    bob = AgentFactory(name="Bob")
    PlanEvent.objects.create(agent=bob, kind=PlanEvent.Kind.GOAL_GIVEN, actor_label="olga", reason="Call Sam")
    html = viewer_client.get(reverse("audit")).content.decode()
    assert "<b>Step approved</b>" in html and "<b>Step completed</b>" in html and "<b>Goal given</b>" in html and "Call Sam" in html
    html = viewer_client.get(reverse("audit") + "?operator=olga").content.decode()
    assert "<b>Step completed</b>" not in html and "<b>Goal given</b>" in html and "<b>Step approved</b>" in html
    html = viewer_client.get(reverse("audit") + f"?agent={bob.pk}").content.decode()
    assert "<b>Goal given</b>" in html and "<b>Step approved</b>" not in html
    html = viewer_client.get(reverse("audit") + "?kind=step_completed").content.decode()
    assert "runner r1" in html and "<b>Goal given</b>" not in html
    html = viewer_client.get(reverse("audit") + f"?plan={plan.pk}").content.decode()
    assert "<b>Step approved</b>" in html and "<b>Goal given</b>" not in html


def test_audit_filter_by_date_and_bad_dates(viewer_client: Client) -> None:
    old = PlanEventFactory(kind=PlanEvent.Kind.PLAN_FAILED, reason="long ago")
    PlanEvent.objects.filter(pk=old.pk).update(created_at=timezone.now() - timedelta(days=10))
    PlanEventFactory(kind=PlanEvent.Kind.PLAN_COMPLETED, reason="today")
    since = (timezone.now() - timedelta(days=1)).date().isoformat()
    html = viewer_client.get(reverse("audit") + f"?since={since}").content.decode()
    assert "today" in html and "long ago" not in html
    response = viewer_client.get(reverse("audit") + "?since=2026-02-10&until=2026-01-01")
    assert response.status_code == 400 and "“From” is after “Until”." in response.content.decode()
    assert viewer_client.get(reverse("audit") + "?since=yesterday").status_code == 400


def test_audit_exports_csv_and_json_of_the_filtered_events(viewer_client: Client) -> None:
    plan = PlanFactory(agent__name="Alice, \"the\" agent")
    PlanEventFactory(plan=plan, kind=PlanEvent.Kind.STEP_DECLINED, actor_label="olga", reason="too, \"pricey\"",
                     detail={"feedback": "too pricey"})
    PlanEventFactory(plan=plan, kind=PlanEvent.Kind.STEP_COMPLETED, actor_label="runner r1")
    response = viewer_client.get(reverse("audit-export-csv") + "?kind=step_declined")
    assert response["Content-Type"].startswith("text/csv")
    rows = list(csv.DictReader(io.StringIO(b"".join(response.streaming_content).decode())))  # type: ignore[attr-defined]
    assert len(rows) == 1
    assert rows[0]["reason"] == 'too, "pricey"' and rows[0]["agent__name"] == 'Alice, "the" agent'
    assert json.loads(rows[0]["detail"]) == {"feedback": "too pricey"}
    response = viewer_client.get(reverse("audit-export-json"))
    data = json.loads(b"".join(response.streaming_content))  # type: ignore[attr-defined]
    assert {r["kind"] for r in data} == {"step_declined", "step_completed"}
    assert viewer_client.get("/audit/export.xml").status_code == 404


def test_audit_csv_shows_old_rows_harmlessly_in_a_spreadsheet(viewer_client: Client) -> None:
    """Rows stored before the validators (or written by a model) may hold terminal escapes, bidi overrides or
    text a spreadsheet would run as a formula: the export writes them out so what is seen is what is held."""
    plan = PlanFactory()
    PlanEventFactory(plan=plan, kind=PlanEvent.Kind.STEP_DECLINED, actor_label="=HYPERLINK(\"http://evil\")",
                     reason="\x1b[31mred\x1b[0m X safe \u202e gpj.exe")
    response = viewer_client.get(reverse("audit-export-csv"))
    [row] = list(csv.DictReader(io.StringIO(b"".join(response.streaming_content).decode())))  # type: ignore[attr-defined]
    assert row["actor_label"] == "'=HYPERLINK(\"http://evil\")"
    assert row["reason"] == "\\u001b[31mred\\u001b[0m X safe \\u202e gpj.exe"
    assert "\x1b" not in row["reason"] and "\u202e" not in row["reason"]


def test_audit_is_paginated_with_a_fixed_number_of_queries(viewer_client: Client, django_assert_max_num_queries) -> None:  # type: ignore[no-untyped-def]
    plan = PlanFactory()
    PlanEvent.objects.bulk_create([
        PlanEvent(plan=plan, agent=plan.agent, kind=PlanEvent.Kind.STEP_COMPLETED, actor_label="runner r1",
                  reason=f"event {i}") for i in range(1000)
    ])
    with django_assert_max_num_queries(10):
        response = viewer_client.get(reverse("audit") + "?page=3")
    html = response.content.decode()
    assert "Page 3 of 20 · 1000 events" in html
    assert html.count('class="kind-step_completed"') == 50


def test_usage_totals_groups_fallbacks_and_cost(viewer_client: Client) -> None:
    alice = AgentFactory(name="Alice")
    plan = PlanFactory(agent=alice)
    LLMCallFactory(agent=alice, plan=plan, model="big", tokens_in=100, tokens_out=10, latency_ms=200, error="timeout",
                   cost=Decimal("0.01"))
    LLMCallFactory(agent=alice, plan=plan, model="small", tokens_in=50, tokens_out=5, latency_ms=100,
                   cost=Decimal("0.002"))
    LLMCallFactory(agent=alice, plan=None, model="small", purpose=LLMCall.Purpose.DECIDE, tokens_in=10, tokens_out=1)
    html = viewer_client.get(reverse("usage")).content.decode()
    assert "<b>3</b> calls" in html and "<b>160</b> tokens in" in html and "<b>1</b> errors" in html
    assert "<b>1</b> fallbacks" in html and "$0.0120" in html
    assert "Decide action" in html and "<td>Alice</td>" in html
    assert html.count('<rect class="chart-bar"') == 24 + 30


def test_usage_query_count_with_a_thousand_calls(viewer_client: Client, django_assert_max_num_queries) -> None:  # type: ignore[no-untyped-def]
    agents = [AgentFactory() for _ in range(5)]
    LLMCall.objects.bulk_create([
        LLMCall(agent=agents[i % 5], purpose="plan", model=f"m{i % 3}", tokens_in=10, tokens_out=2, latency_ms=50)
        for i in range(1000)
    ])
    with django_assert_max_num_queries(15):  # 14, and one for the plans by planner (issue 52)
        response = viewer_client.get(reverse("usage"))
    assert "<b>1000</b> calls" in response.content.decode()


def test_error_pages_are_styled_and_a_403_logs_no_traceback(viewer_client: Client, caplog) -> None:  # type: ignore[no-untyped-def]
    response = viewer_client.get("/no/such/page/")
    assert response.status_code == 404 and "There is nothing here" in response.content.decode()
    step = PlanStepFactory(status=PlanStep.Status.AWAITING_APPROVAL)
    response = viewer_client.post(reverse("inbox-step-approve", args=[step.pk]))
    assert response.status_code == 403 and "You may not do this" in response.content.decode()
    from planner_site.error_pages import QuietForbidden
    forbidden = [r for r in caplog.records if "Forbidden" in r.getMessage()]
    assert forbidden and all(QuietForbidden().filter(r) and r.exc_info is None for r in forbidden)


def test_server_error_page_renders_without_a_request() -> None:
    from django.template.loader import render_to_string

    html = render_to_string("500.html")
    assert "Something went wrong on our side" in html and "csrf" not in html.lower()
