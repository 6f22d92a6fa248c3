"""Every page as a user meets it: each decision confirmed (role=status) with no error in the browser, every page
within a phone's width, and a lost live connection said in words.

The module adds its own paused agents to the server's database (the runner never drives them). Console errors and
htmx error events fail every browser test (see PageErrors in conftest.py).
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator
from typing import Any

import pytest
from playwright.sync_api import Browser, Page, Route, WebSocketRoute, expect

from tests.browser.conftest import OPERATOR, Login, Server, manage

pytestmark = pytest.mark.browser

PAGES_SCENARIO = r"""
import json
from django.contrib.auth.models import User
from agents.models import Agent, Need
from goals.models import Goal
from planning.models import Plan, PlanEvent, PlanStep

def agent(name, kind):
    a = Agent.objects.create(name=name, backstory="Browser-test agent of the pages module.", kind=kind,
                             status=Agent.Status.PAUSED, cycle_interval=1.0)
    if kind == "persona":
        for need in ("hunger", "energy", "money", "social", "fun"):
            Need.objects.create(agent=a, name=need, satisfaction=0.7, decay_per_hour=0.01)
    return a

def plan(a, goal_text, status, steps, version=1, previous=None):
    goal = Goal.objects.create(agent=a, description=goal_text, horizon=Goal.Horizon.SHORT)
    p = Plan.objects.create(agent=a, goal=goal, goal_text=goal_text, status=status, confidence=0.8, version=version,
                            previous=previous, model="offline-rules", thinking_summary="Written by the pages tests.",
                            approval_mode="all" if status == "active" else "pending")
    PlanEvent.objects.create(plan=p, kind=PlanEvent.Kind.CREATED, actor_label="scenario")
    ids = {}
    for position, spec in enumerate(steps, start=1):
        ids[str(position)] = PlanStep.objects.create(plan=p, key=str(position), position=position, **spec).pk
        if spec.get("status") == "awaiting_approval":
            PlanEvent.objects.create(plan=p, step_id=ids[str(position)], kind=PlanEvent.Kind.STEP_AWAITING,
                                     actor_label="scenario", reason="requires permission")
    PlanEvent.objects.create(plan=p, kind=PlanEvent.Kind.VALIDATED, actor_label="scenario")
    return p, ids

petra = agent("Petra", "persona")
petra_plan, _ = plan(petra, "Visit the market with a rather long goal text that wraps", "awaiting_approval", [
    dict(description="Go to the store", action_hint="go to the store"),
    dict(description="Buy some food for the week", action_hint="buy food", requires_permission=True, risk="risky",
         depends_on=["1"]),
])
Agent.objects.filter(pk=petra.pk).update(waiting_reason="plan v1 awaits approval")
quinn = agent("Quinn", "persona")
quinn_plan, quinn_steps = plan(quinn, "Call an old friend", "active", [
    dict(description="Call an old friend to catch up", action_hint="call a friend", requires_permission=True,
         risk="risky", status="awaiting_approval"),
])
Agent.objects.filter(pk=quinn.pk).update(waiting_reason="step 1 awaits approval")
rita = agent("Rita", "tool")
tool_steps = lambda: [
    dict(description="Read the notes", tool="file.read", action_hint="file.read", tool_input={"path": "notes/monday.txt"}),
    dict(description="Write a report of every note in the folder", tool="file.write", action_hint="file.write",
         tool_input={"path": "report.md", "content": "A long line of content " * 8}, depends_on=["1"],
         requires_permission=True, risk="risky"),
]
rita_v1, _ = plan(rita, "Summarize the notes", "replanned", tool_steps())
rita_v2, _ = plan(rita, "Summarize the notes", "awaiting_approval", tool_steps(), version=2, previous=rita_v1)
print(json.dumps({"petra": {"agent": petra.pk, "plan": petra_plan.pk},
                  "quinn": {"agent": quinn.pk, "plan": quinn_plan.pk},
                  "rita": {"agent": rita.pk, "v1": rita_v1.pk, "v2": rita_v2.pk}}))
"""

# What sticks out past the screen's right edge, for the failure message.
WIDER = """Array.from(document.querySelectorAll('main *')).filter(e => e.getBoundingClientRect().right > innerWidth + 1)
  .slice(0, 4).map(e => e.tagName.toLowerCase() + (e.id ? '#' + e.id : '') + (e.className ? '.' + e.className : ''))"""
PHONE = {"width": 390, "height": 844}
DISCONNECTED = "Disconnected, retrying: what you see may be out of date"


@pytest.fixture(scope="module")
def pages(server: Server) -> Iterator[dict[str, Any]]:
    result: dict[str, Any] = json.loads(manage(server.env, "shell", "-c", PAGES_SCENARIO).strip().splitlines()[-1])
    yield result
    ids = [result[name]["agent"] for name in ("petra", "quinn", "rita")]
    manage(server.env, "shell", "-c", f"from agents.models import Agent; Agent.objects.filter(pk__in={ids}).delete()")


def open_live(page: Page, path: str) -> None:
    page.goto(path)
    expect(page.locator("#live-status")).to_have_class(re.compile(r"\bon\b"))


def answer_after_the_push(route: Route) -> None:
    """The decision reaches the server at once; its answer reaches the page only after the live push has (a push
    is often quicker than the answer, and it removes the form that was clicked)."""
    response = route.fetch()
    time.sleep(1.5)
    route.fulfill(response=response)


def confirmation(page: Page) -> Any:
    return page.locator("#flash [role=status]")


def test_every_decision_confirms_without_errors(login: Login, pages: dict[str, Any]) -> None:
    page = login(OPERATOR)
    page.on("dialog", lambda dialog: dialog.accept())  # "Cancel this plan?"
    page.route(re.compile(r"/(plans|steps)/\d+/(approve|cancel)/$"), answer_after_the_push)

    # The plan page: approving the plan removes its buttons, by the push and by the answer, in either order.
    petra = pages["petra"]
    open_live(page, f"/plans/{petra['plan']}/")
    page.get_by_role("button", name="Approve all").click()
    expect(page.locator("#plan-status")).to_have_text("Active")
    expect(confirmation(page)).to_have_text(
        "Approved Petra's plan “Visit the market with a rather long goal text that wraps” (v1): every step approved.")

    # A step, then the whole plan (cancelling an active plan lost its answer to the push: eight
    # htmx:oobErrorNoTarget errors and no confirmation).
    quinn = pages["quinn"]
    open_live(page, f"/plans/{quinn['plan']}/")
    page.locator("#step-1").get_by_role("button", name="Approve", exact=True).click()
    expect(confirmation(page)).to_have_text("Approved step 1 of Quinn's plan “Call an old friend” (v1).")
    page.get_by_role("button", name="Cancel plan").click()
    expect(confirmation(page)).to_have_text("Cancelled Quinn's plan “Call an old friend” (v1).")
    expect(page.locator("#plan-status")).to_have_text("Cancelled")

    # The agent page.
    open_live(page, f"/agents/{quinn['agent']}/")
    page.get_by_role("button", name="Stop").click()
    expect(confirmation(page)).to_have_text("Stopped Quinn.")
    expect(page.locator("#agent-header .badge")).to_have_text("Stopped")


def test_no_page_scrolls_sideways_on_a_phone(browser: Browser, login: Login, server: Server,
                                            pages: dict[str, Any]) -> None:
    rita = pages["rita"]
    paths = ["/", "/inbox/", f"/agents/{pages['petra']['agent']}/", f"/agents/{rita['agent']}/",
             f"/plans/{pages['petra']['plan']}/", f"/plans/{rita['v2']}/", f"/plans/{rita['v2']}/versions/",
             f"/plans/compare/?a={rita['v1']}&b={rita['v2']}", f"/plans/{rita['v2']}/editor/", "/audit/", "/usage/"]
    page = login(OPERATOR)
    page.set_viewport_size(PHONE)
    too_wide: dict[str, str] = {}
    for path in paths:
        page.goto(path)
        width = page.evaluate("document.documentElement.scrollWidth")
        if width > PHONE["width"]:
            too_wide[path] = f"{width} px ({', '.join(page.evaluate(WIDER))})"
    context = browser.new_context(base_url=server.url, viewport=PHONE)
    try:
        anonymous = context.new_page()
        anonymous.goto("/accounts/login/")
        width = anonymous.evaluate("document.documentElement.scrollWidth")
        if width > PHONE["width"]:
            too_wide["/accounts/login/"] = f"{width} px"
    finally:
        context.close()
    assert too_wide == {}, f"pages wider than {PHONE['width']} px: {too_wide}"


def test_a_lost_connection_is_said_in_a_banner_until_it_is_back(login: Login, pages: dict[str, Any]) -> None:
    page = login(OPERATOR)
    state: dict[str, Any] = {"down": False, "sockets": []}

    def relay(ws: WebSocketRoute) -> None:
        if state["down"]:
            ws.close(code=1011, reason="the test's outage")
            return
        ws.connect_to_server()
        state["sockets"].append(ws)

    page.route_web_socket(re.compile(r"/ws/dashboard/"), relay)
    open_live(page, "/")
    banner = page.get_by_role("alert")
    expect(banner).to_have_count(0)

    state["down"] = True
    for ws in state["sockets"]:
        ws.close(code=1011, reason="the test's outage")
    expect(banner).to_have_text(DISCONNECTED)
    expect(page.locator("#live-status")).not_to_have_class(re.compile(r"\bon\b"))
    page.wait_for_timeout(1500)  # retries fail meanwhile: the banner stays
    expect(banner).to_have_text(DISCONNECTED)

    state["down"] = False
    expect(page.locator("#live-status")).to_have_class(re.compile(r"\bon\b"), timeout=20_000)
    expect(banner).to_have_count(0)


def test_reordering_in_the_editor_asks_about_dependencies(login: Login, pages: dict[str, Any]) -> None:
    page = login(OPERATOR)
    page.goto(f"/plans/{pages['rita']['v2']}/editor/")
    page.get_by_role("button", name="Move step 2 up").click()
    question = page.get_by_role("group", name=re.compile("The steps were reordered"))
    expect(question).to_contain_text("Keep them, or update them to follow the new order?")
    expect(page.locator("#editor-rows > li").first).to_have_attribute("aria-label", "Step 2")
    question.get_by_role("button", name="Update dependencies to the new order").click()
    expect(question).to_have_count(0)
    expect(page.get_by_role("listitem", name="Step 2").get_by_label("Depends on")).to_have_value("")
    expect(page.get_by_role("listitem", name="Step 1").get_by_label("Depends on")).to_have_value("2")
