"""Dashboard filters and pages, the plan page's timeline and model-call pages, and the fixed number of
queries of pages and live pushes, whatever their size."""

from __future__ import annotations

import re
from typing import Any

import pytest
from django.test import Client
from django.urls import reverse, set_script_prefix
from django.utils.html import escape

from agents.models import Agent
from planning.live.renderers import DashboardLivePage, PlanLivePage
from planning.models import Plan, PlanStep
from planning.selectors import CALLS_PAGE_SIZE, DASHBOARD_PAGE_SIZE, TIMELINE_PAGE_SIZE
from tests.factories import AgentFactory, LLMCallFactory, PlanEventFactory, PlanFactory, PlanStepFactory

pytestmark = pytest.mark.django_db


def agent_names(html: str) -> list[str]:
    return re.findall(r'<tr id="agent-row-\d+"[^>]*>\s*<td><a href="[^"]+">([^<]+)</a>', html)


def test_dashboard_pages_of_fifty_with_links(viewer_client: Client) -> None:
    Agent.objects.bulk_create([Agent(name=f"agent-{i:03d}") for i in range(DASHBOARD_PAGE_SIZE + 7)])
    first = viewer_client.get("/").content.decode()
    assert len(agent_names(first)) == DASHBOARD_PAGE_SIZE
    assert "page 1 of 2" in first and 'href="?page=2"' in first
    second = viewer_client.get("/?page=2").content.decode()
    assert agent_names(second) == [f"agent-{i:03d}" for i in range(DASHBOARD_PAGE_SIZE, DASHBOARD_PAGE_SIZE + 7)]
    assert 'data-live="/ws/dashboard/?page=2"' in second  # the socket resyncs this page, not the first
    assert "57 agents" in second


@pytest.mark.parametrize("script_name", ["", "/planner"])
def test_dashboard_rows_link_each_agent_and_plan_under_the_sites_prefix(viewer_client: Client, script_name: str) -> None:
    """The rows' links are the models' own URLs (the routes are reversed once, then reused), each row its own
    agent and plan, under the prefix the site is served at (SCRIPT_NAME, a proxy's sub-path)."""
    agents = [AgentFactory(name=f"linked-{i}") for i in range(3)]
    plans = [PlanFactory(agent=a, status=Plan.Status.ACTIVE) for a in agents[:2]]
    set_script_prefix(f"{script_name}/")  # what the server's handler does for a request under that prefix
    try:
        html = viewer_client.get("/").content.decode()
        second = viewer_client.get("/").content.decode()  # the routes reused
    finally:
        set_script_prefix("/")
    def rows(page: str) -> str:
        return page[page.index('<tbody id="agent-rows"'):page.index("</tbody>")]

    assert rows(second) == rows(html)
    for agent in agents:
        row = html[html.index(f'<tr id="agent-row-{agent.pk}"'):]
        row = row[:row.index("</tr>")]
        assert f'<a href="{script_name}/agents/{agent.pk}/">{agent.name}</a>' in row
    for plan in plans:
        row = html[html.index(f'<tr id="agent-row-{plan.agent_id}"'):]
        assert f'<a href="{script_name}/plans/{plan.pk}/">' in row[:row.index("</tr>")]
    assert html.count(f'href="{script_name}/plans/') == len(plans)


@pytest.mark.parametrize("page", ["0", "-3", "abc", "99999999999999999999", "2.5"])
def test_dashboard_bad_page_numbers_show_a_page_not_an_error(viewer_client: Client, page: str) -> None:
    AgentFactory(name="Only")
    response = viewer_client.get("/", {"page": page})
    assert response.status_code == 200 and agent_names(response.content.decode()) == ["Only"]


def test_dashboard_filters_by_status_kind_waiting_and_failing(viewer_client: Client) -> None:
    AgentFactory(name="Runner", status="running")
    AgentFactory(name="Sleeper", status="paused")
    AgentFactory(name="Toolie", kind="tool", status="running")
    AgentFactory(name="Waiter", waiting_reason="step 2 awaits approval")
    failed = PlanFactory(agent=AgentFactory(name="Faller"), status=Plan.Status.FAILED)
    retrying = PlanStepFactory(plan=PlanFactory(agent=AgentFactory(name="Retrier")), retries=1)
    # An old failure does not count once a newer plan exists.
    PlanFactory(agent=AgentFactory(name="Recovered"), status=Plan.Status.FAILED)
    PlanFactory(agent=Agent.objects.get(name="Recovered"), status=Plan.Status.ACTIVE)

    def names(**query: str) -> list[str]:
        return sorted(agent_names(viewer_client.get("/", query).content.decode()))

    assert names(status="paused") == ["Sleeper"]
    assert names(kind="tool") == ["Toolie"]
    assert names(waiting="1") == ["Waiter"]
    assert names(failing="1") == ["Faller", "Retrier"]
    assert names(kind="tool", status="paused") == []
    assert "No agent matches these filters" in viewer_client.get("/", {"kind": "tool", "status": "paused"}).content.decode()
    assert len(names(status="nonsense")) == 7  # an unknown value filters nothing
    html = viewer_client.get("/").content.decode()
    assert "<b>2</b> failing" in html and "<b>1</b> agent waiting for an operator" in html
    assert failed.agent.name == "Faller" and retrying.retries == 1


def test_dashboard_row_escapes_what_agents_and_models_wrote_and_shortens_long_text(viewer_client: Client) -> None:
    agent = AgentFactory(name="<img src=x onerror=alert(1)>", waiting_reason='step "1" <b>awaits</b>', status="running")
    goal = "Tidy & <script>alert('goal')</script> " + "x" * 80
    plan = PlanFactory(agent=agent, goal_text=goal, status=Plan.Status.ACTIVE)
    PlanStepFactory(plan=plan, position=0, description="<i>Delete</i> the 'old' logs", status=PlanStep.Status.AWAITING_APPROVAL)
    html = viewer_client.get("/").content.decode()
    row = html[html.index(f'<tr id="agent-row-{agent.pk}"'):]
    row = row[:row.index("</tr>")]
    assert "<img" not in row and "<script" not in row and "<b>" not in row and "<i>" not in row
    assert "&lt;img src=x onerror=alert(1)&gt;" in row
    assert f'Waiting: <a href="/plans/{plan.pk}/">step &quot;1&quot; &lt;b&gt;awaits&lt;/b&gt;</a>' in row
    assert f">{escape(goal[:59])}…</a>" in row  # truncatechars:60's text
    assert '<span class="badge awaiting_approval">Awaiting approval</span> &lt;i&gt;Delete&lt;/i&gt; the &#x27;old&#x27; logs' in row
    assert '<span class="badge running">Running</span>' in row and '<span class="tag">Persona</span>' in row


def test_dashboard_filter_is_kept_across_pages(viewer_client: Client) -> None:
    Agent.objects.bulk_create([Agent(name=f"p-{i:03d}", status="paused") for i in range(DASHBOARD_PAGE_SIZE + 1)])
    AgentFactory(name="zz-running", status="running")
    html = viewer_client.get("/", {"status": "paused"}).content.decode()
    assert 'href="?status=paused&amp;page=2"' in html
    second = viewer_client.get("/", {"status": "paused", "page": "2"}).content.decode()
    assert agent_names(second) == [f"p-{DASHBOARD_PAGE_SIZE:03d}"]


@pytest.mark.parametrize("query", [{}, {"status": "paused"}, {"waiting": "1"}, {"kind": "tool"},
                                   {"kind": "tool", "status": "paused"}])
def test_dashboard_pages_count_what_the_filter_shows(viewer_client: Client, query: dict[str, str]) -> None:
    """The number of pages is the filter's, whether the paginator counts or takes the count above the table."""
    Agent.objects.bulk_create([Agent(name=f"t-{i:03d}", kind="tool", status="paused", waiting_reason="plan v1 awaits approval")
                               for i in range(DASHBOARD_PAGE_SIZE + 1)])
    Agent.objects.bulk_create([Agent(name=f"z-{i:03d}", status="running") for i in range(DASHBOARD_PAGE_SIZE)])
    html = viewer_client.get("/", query).content.decode()
    pages = 3 if not query else 2  # 101 agents in all; 51 of them paused tool agents waiting
    assert f"page 1 of {pages}" in html
    last = viewer_client.get("/", {**query, "page": str(pages)}).content.decode()
    assert len(agent_names(last)) == 1
    assert f"page {pages} of {pages}" in last


def test_dashboard_queries_do_not_grow_with_agents(viewer_client: Client, django_assert_max_num_queries: Any) -> None:
    def grow(n: int) -> None:
        for i in range(n):
            PlanStepFactory(plan=PlanFactory(status=Plan.Status.FAILED if i % 2 else Plan.Status.ACTIVE))

    urls = ["/", "/?failing=1", "/?page=2", "/?status=running&kind=persona"]
    grow(4)
    counts = []
    for url in urls:
        with django_assert_max_num_queries(15) as small:
            assert agent_names(viewer_client.get(url).content.decode())
        counts.append(len(small.captured_queries))
    grow(120)
    for url, count in zip(urls, counts, strict=True):
        with django_assert_max_num_queries(count):
            assert agent_names(viewer_client.get(url).content.decode())


def test_plan_timeline_and_calls_are_paged(viewer_client: Client) -> None:
    plan = PlanFactory()
    events = [PlanEventFactory(plan=plan, reason=f"event number {i}") for i in range(TIMELINE_PAGE_SIZE + 5)]
    LLMCallFactory.create_batch(CALLS_PAGE_SIZE + 3, plan=plan, agent=plan.agent)
    url = reverse("plan-detail", args=[plan.pk])
    html = viewer_client.get(url).content.decode()
    assert html.count('class="event kind-') == TIMELINE_PAGE_SIZE
    assert f"event number {len(events) - 1}" in html and "event number 0<" not in html  # newest first
    assert html.count('<tr id="call-') == CALLS_PAGE_SIZE
    assert 'id="plan-timeline-list"' in html and 'id="plan-calls-rows"' in html
    older = viewer_client.get(url, {"events": 2}).content.decode()
    assert older.count('class="event kind-') == 5 and "event number 0" in older
    # Not the first page: new entries pushed live must not land here.
    assert 'id="plan-timeline-list"' not in older and 'id="plan-timeline-list-p2"' in older
    assert f'data-live="/ws/plans/{plan.pk}/?events=2"' in older
    calls = viewer_client.get(url, {"calls": 2}).content.decode()
    assert calls.count('<tr id="call-') == 3 and 'id="plan-calls-rows-p2"' in calls


def test_plan_page_queries_do_not_grow_with_steps_events_or_versions(
        viewer_client: Client, django_assert_max_num_queries: Any) -> None:
    plan = PlanFactory()
    PlanStepFactory.create_batch(3, plan=plan)
    PlanEventFactory.create_batch(2, plan=plan)
    LLMCallFactory(plan=plan, agent=plan.agent)
    url = reverse("plan-detail", args=[plan.pk])
    with django_assert_max_num_queries(25) as small:
        viewer_client.get(url)
    PlanStepFactory.create_batch(120, plan=plan)
    PlanEventFactory.create_batch(80, plan=plan)
    LLMCallFactory.create_batch(40, plan=plan, agent=plan.agent)
    previous = plan
    for version in range(2, 6):  # a chain of versions
        previous = PlanFactory(agent=plan.agent, goal=plan.goal, previous=previous, version=version,
                               status=Plan.Status.REPLANNED)
    with django_assert_max_num_queries(len(small.captured_queries)):
        html = viewer_client.get(url).content.decode()
    assert html.count('class="step status-') == 123
    assert "version 5" in html


def test_live_plan_push_queries_do_not_grow_with_steps(django_assert_max_num_queries: Any) -> None:
    plan = PlanFactory()
    steps = PlanStepFactory.create_batch(5, plan=plan)
    page = PlanLivePage(f"plan-{plan.pk}", plan.pk)
    page.baseline()
    PlanStep.objects.filter(pk=steps[0].pk).update(status="running")
    with django_assert_max_num_queries(15) as small:
        out = page.render_changes({plan.pk}, {"operator", "viewer"})
    assert f'id="step-{steps[0].key}"' in out["viewer"] and f'id="step-{steps[1].key}"' not in out["viewer"]
    more = PlanStepFactory.create_batch(200, plan=plan)
    page.baseline()
    PlanStep.objects.filter(pk=more[7].pk).update(status="running")
    PlanEventFactory(plan=plan, step=more[7], kind="step_started", reason="started")
    with django_assert_max_num_queries(len(small.captured_queries) + 1):  # + the new entry's step
        out = page.render_changes({plan.pk}, {"operator", "viewer"})
    assert out["viewer"].count('class="step status-') == 1 and "started" in out["viewer"]


def test_live_dashboard_push_queries_do_not_grow_with_changed_agents(django_assert_max_num_queries: Any) -> None:
    plans = [PlanFactory() for _ in range(30)]
    for plan in plans:
        PlanStepFactory(plan=plan)
    page = DashboardLivePage("dashboard")
    with django_assert_max_num_queries(8) as small:
        page.render_changes({plans[0].agent_id}, {"viewer"})
    with django_assert_max_num_queries(len(small.captured_queries)):
        out = page.render_changes({p.agent_id for p in plans}, {"viewer"})
    assert out["viewer"].count('<tr id="agent-row-') == 30


def li_of(html: str, key: str) -> str:
    start = html.index(f'<li id="step-{key}"')
    return html[start:html.index("</li>", start) + len("</li>")]


def test_a_pushed_step_row_is_the_row_the_page_shows_to_each_audience(operator_client: Client,
                                                                      viewer_client: Client) -> None:
    plan = PlanFactory(status=Plan.Status.ACTIVE)
    PlanStepFactory(plan=plan, key="1", position=1, status=PlanStep.Status.COMPLETED, result="it's <done>")
    waiting = PlanStepFactory(plan=plan, key="2", position=2, description='Send "the" <b>mail</b>',
                              tool="file.write", tool_input={"path": "out.md", "content": "x"}, depends_on=["1"])
    page = PlanLivePage(f"plan-{plan.pk}", plan.pk)
    page.baseline()
    PlanStep.objects.filter(pk=waiting.pk).update(status=PlanStep.Status.AWAITING_APPROVAL, precheck="writes out.md")
    pushed = page.render_changes({plan.pk}, {"operator", "viewer"})
    for audience, client in (("operator", operator_client), ("viewer", viewer_client)):
        shown = client.get(plan.get_absolute_url()).content.decode()
        assert li_of(pushed[audience], "2") == li_of(shown, "2")
    assert ">Approve<" in li_of(pushed["operator"], "2") and ">Approve<" not in li_of(pushed["viewer"], "2")
    assert "Send &quot;the&quot; &lt;b&gt;mail&lt;/b&gt;" in li_of(pushed["viewer"], "2")  # Django's entities


def test_a_pushed_dashboard_row_is_the_row_the_page_shows(viewer_client: Client) -> None:
    plan = PlanFactory(agent__name="O'Brien <bot>", goal_text="Tidy & sort", status=Plan.Status.ACTIVE)
    PlanStepFactory(plan=plan, description="Sort 'them'", status=PlanStep.Status.RUNNING)
    pushed = DashboardLivePage("dashboard").render_changes({plan.agent_id}, {"viewer"})["viewer"]
    shown = viewer_client.get("/").content.decode()
    row = shown[shown.index(f'<tr id="agent-row-{plan.agent_id}"'):]
    row = row[:row.index("</tr>") + len("</tr>")]
    assert row in pushed and "O&#x27;Brien &lt;bot&gt;" in row and "Sort &#x27;them&#x27;" in row


def test_the_row_templates_fail_on_a_name_their_context_lacks() -> None:
    from django.template import engines
    from jinja2 import UndefinedError

    with pytest.raises(UndefinedError):
        engines["jinja2"].from_string("<b>{{ step.descripton }}</b>").render({"step": PlanStep(description="x")})
