"""Steering in real Chromium against the real server: the inbox decided in place and from the keyboard, the plan
editor (an invalid save, then a valid one), two operators deciding the same plan at once, the compare view, the
audit log and usage, and every page usable at 768 px.

The scenario below is added to the server's database by this module (its agents are paused, so the runner never
touches them). With UPDATE_SCREENSHOTS=1 the tests refresh the README's pictures in docs/.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import Page, Route, expect

from tests.browser.conftest import OPERATOR, ROOT, Login, PageErrors, Server, manage

pytestmark = pytest.mark.browser

SECOND_OPERATOR = ("otto", "otto-browser-pass-1")

STEER_SCENARIO = r"""
import json
from datetime import timedelta
from decimal import Decimal
from django.contrib.auth.models import Group, User
from django.utils import timezone
from agents.models import Agent, LLMCall
from goals.models import Goal
from planning.models import Plan, PlanEvent, PlanStep

otto = User.objects.create_user(SECOND[0], "", SECOND[1])
otto.groups.add(Group.objects.get(name="operators"))

def agent(name, kind, **extra):
    return Agent.objects.create(name=name, backstory="Browser-test agent for the steering pages.", kind=kind,
                                status=Agent.Status.PAUSED, cycle_interval=1.0, **extra)

def plan(a, goal_text, status, steps, risks=()):
    goal = Goal.objects.create(agent=a, description=goal_text, horizon=Goal.Horizon.SHORT)
    p = Plan.objects.create(agent=a, goal=goal, goal_text=goal_text, status=status, confidence=0.8,
                            model="offline-rules", risks=list(risks),
                            approval_mode="all" if status == "active" else "pending",
                            thinking_summary="Written by the steering browser tests.")
    PlanEvent.objects.create(plan=p, kind=PlanEvent.Kind.CREATED, actor_label="scenario")
    ids = {}
    for position, spec in enumerate(steps, start=1):
        ids[str(position)] = PlanStep.objects.create(plan=p, key=str(position), position=position, **spec).pk
        if spec.get("status") == "awaiting_approval":
            PlanEvent.objects.create(plan=p, step_id=ids[str(position)], kind=PlanEvent.Kind.STEP_AWAITING,
                                     actor_label="scenario", reason="requires permission")
    PlanEvent.objects.create(plan=p, kind=PlanEvent.Kind.VALIDATED, actor_label="scenario")
    return p, ids

def tool_steps():
    return [
        dict(description="Read the CSV file", tool="file.read", action_hint="file.read", tool_input={"path": "data.csv"},
             expected_outcome="the rows of data.csv"),
        dict(description="Write the rows as JSON", tool="file.write", action_hint="file.write",
             tool_input={"path": "data.json", "content": "[1, 2, 3]"}, depends_on=["1"], requires_permission=True,
             risk="risky", expected_outcome="data.json exists"),
        dict(description="List the workspace", tool="file.list", action_hint="file.list", tool_input={},
             depends_on=["2"]),
    ]

clerk = agent("Clerk", "tool")
clerk_plan, _ = plan(clerk, "Convert data.csv to JSON", "awaiting_approval", tool_steps(),
                     risks=["overwrites data.json if it exists"])
editor_agent = agent("Editor", "tool")
editor_plan, _ = plan(editor_agent, "Tidy the data folder", "awaiting_approval", tool_steps())
courier = agent("Courier", "tool", escalate_after_minutes=5)
courier_plan, _ = plan(courier, "Archive the old reports", "awaiting_approval", tool_steps())
PlanEvent.objects.filter(plan=courier_plan).update(created_at=timezone.now() - timedelta(minutes=12))
carol = agent("Carol", "persona")
carol_plan, carol_steps = plan(carol, "Buy a birthday present", "active", [
    dict(description="Buy a book for Sam", action_hint="buy food", requires_permission=True, risk="risky",
         status="awaiting_approval"),
])
dora = agent("Dana", "persona")
dora_plan, dora_steps = plan(dora, "Go out for dinner", "active", [
    dict(description="Book a table at the pricey place", action_hint="buy food", requires_permission=True,
         risk="risky", status="awaiting_approval"),
])
now = timezone.now()
calls = []
for hour in range(0, 60, 3):
    for model, tokens, cost, error in (("gpt-4o-mini", 900, "0.000420", ""), ("offline-rules", 300, None, ""),
                                       ("qwen2:7b", 700, "0.000090", "timeout" if hour % 9 == 0 else "")):
        calls.append(LLMCall(agent=clerk if hour % 2 else carol, plan=clerk_plan if hour % 2 else None,
                             purpose="plan" if hour % 2 else "decide", model=model, tokens_in=tokens,
                             tokens_out=tokens // 5, latency_ms=200 + hour * 7, error=error,
                             cost=Decimal(cost) if cost else None, response="{}"))
created = LLMCall.objects.bulk_create(calls)
for i, call in enumerate(created):
    LLMCall.objects.filter(pk=call.pk).update(created_at=now - timedelta(hours=(i // 3) * 3))
print(json.dumps({
    "clerk": clerk_plan.pk, "editor": editor_plan.pk, "courier": courier_plan.pk,
    "carol": {"plan": carol_plan.pk, "step": carol_steps["1"]}, "dora": {"plan": dora_plan.pk, "step": dora_steps["1"]},
}))
""".replace("SECOND", repr(SECOND_OPERATOR))


# The seeded demo's agents keep running in this server: their plans come and go in the inbox, and one that
# leaves while the keyboard test has moved focus onto it takes the focus with it. This module's operators
# decide on its own scenario, so the demo sits still meanwhile (and runs on afterwards).
DEMO_HOLD = ("from agents.models import Agent; ids = list(Agent.objects.filter(status='running')"
             ".values_list('pk', flat=True)); Agent.objects.filter(pk__in=ids).update(status='paused'); print(ids)")
DEMO_RESUME = "from agents.models import Agent; Agent.objects.filter(pk__in={ids}).update(status='running')"


@pytest.fixture(scope="module")
def steer(server: Server) -> Iterator[dict[str, Any]]:
    """This module's agents and plans, added to the running server's database, with the demo held still."""
    held = json.loads(manage(server.env, "shell", "-c", DEMO_HOLD).strip().splitlines()[-1])
    result: dict[str, Any] = json.loads(manage(server.env, "shell", "-c", STEER_SCENARIO).strip().splitlines()[-1])
    yield result
    manage(server.env, "shell", "-c", DEMO_RESUME.format(ids=held))


def screenshot(page: Page, tmp_path: Path, name: str) -> None:
    """Take the picture; with UPDATE_SCREENSHOTS=1 it becomes the README's docs/<name>."""
    shot = tmp_path / name
    page.screenshot(path=str(shot), full_page=True)
    if os.environ.get("UPDATE_SCREENSHOTS") == "1":
        target = ROOT / "docs" / name
        target.parent.mkdir(exist_ok=True)
        target.write_bytes(shot.read_bytes())


def open_inbox(page: Page) -> None:
    page.goto("/inbox/")
    expect(page.locator("#live-status")).to_have_class(re.compile(r"\bon\b"))
    page.evaluate("window.__marker = 1")


def item(page: Page, agent: str) -> Any:
    return page.locator("#inbox-list .inbox-item").filter(has=page.get_by_role("link", name=agent, exact=True))


def test_a_decision_that_cannot_reach_the_server_says_so_at_the_button(login: Login, steer: dict[str, Any],
                                                                      page_errors: PageErrors) -> None:
    """Issue 50: "Approve" clicked while the server cannot be reached says so next to the button (not only in the
    banner), the button can be used again, nothing is decided later by surprise, and a reload shows the state."""
    page_errors.allow("net::ERR_FAILED")  # the browser's own note of the aborted request
    page_errors.allow("htmx:sendError")  # htmx's own log of it (and of its afterRequest, failed): on purpose
    page_errors.allow("htmx error event htmx:afterRequest")
    page_errors.allow("console error: htmx:afterRequest")
    page = login(OPERATOR)
    open_inbox(page)
    clerk = item(page, "Clerk")
    page.route("**/inbox/plans/*/approve/", lambda route: route.abort())
    button = clerk.get_by_role("button", name="Approve all")
    button.click()
    note = clerk.locator(".decide-error")
    expect(note).to_have_attribute("role", "alert")
    expect(note).to_contain_text("Not sent: the server cannot be reached. Nothing was decided by this click")
    expect(button).to_be_enabled()
    page.unroute("**/inbox/plans/*/approve/")
    page.wait_for_timeout(1500)  # anything htmx would send again by itself would have gone by now
    page.reload()
    expect(page.locator("#live-status")).to_have_class(re.compile(r"\bon\b"))
    expect(item(page, "Clerk")).to_contain_text("Plan awaits approval")  # still waiting: never applied in silence
    expect(item(page, "Clerk").locator(".decide-error")).to_have_count(0)


def test_inbox_decides_in_place_and_from_the_keyboard(login: Login, steer: dict[str, Any], tmp_path: Path) -> None:
    page = login(OPERATOR)
    open_inbox(page)
    expect(page).to_have_title(re.compile(r"^Inbox \d+ · Agent planner$"))
    courier, clerk, carol, dora = (item(page, n) for n in ("Courier", "Clerk", "Carol", "Dana"))
    expect(courier).to_contain_text("urgent")  # waited 12 min against a 5 min policy: escalated, not decided
    expect(page.locator("#inbox-list .inbox-item").first).to_contain_text("Courier")
    expect(clerk).to_contain_text("Convert data.csv to JSON")
    expect(clerk).to_contain_text("requires permission: yes")
    expect(carol).to_contain_text("Buy a book for Sam")
    screenshot(page, tmp_path, "inbox.png")

    # Approve all, with the mouse: the item leaves the list, the count follows, the page is not reloaded.
    before = int(page.locator("#inbox-count").get_attribute("data-count") or "0")
    clerk.get_by_role("button", name="Approve all").click()
    expect(page.locator("#flash [role=status]")).to_have_text(
        "Approved Clerk's plan “Convert data.csv to JSON” (v1): every step approved.")
    expect(clerk).to_have_count(0)
    announce = page.locator("#inbox-announce")  # said politely; new arrivals may follow it
    expect(announce).to_have_attribute("aria-live", "polite")
    expect(announce).to_contain_text(re.compile("Approved Clerk's plan|new in the inbox"))
    assert int(page.locator("#inbox-count").get_attribute("data-count") or "0") <= before - 1

    # The keyboard: focus Carol's item, "a" approves it; focus stays in the list.
    carol.focus()
    page.keyboard.press("a")
    expect(page.locator("#flash [role=status]")).to_contain_text("Approved step 1 of Carol's plan")
    expect(carol).to_have_count(0)
    assert page.evaluate("document.activeElement.closest('#inbox-list') !== null")

    # j/k move between items; "d" goes to the feedback field; Enter declines with it.
    dora.focus()
    page.keyboard.press("k")  # Courier, urgent, is first: Dora is never the first item
    expect(dora).not_to_be_focused()
    page.keyboard.press("j")
    expect(dora).to_be_focused()
    page.keyboard.press("d")
    feedback = dora.get_by_label("Feedback")
    expect(feedback).to_be_focused()
    feedback.fill("Too pricey; cook at home")
    feedback.press("Enter")
    expect(page.locator("#flash [role=status]")).to_contain_text(
        "Declined step 1 of Dana's plan “Go out for dinner” (v1); the agent replans with your feedback.")
    expect(dora).to_have_count(0)
    assert page.evaluate("window.__marker") == 1, "the inbox was reloaded"

    # The decisions are in the audit log, named for what happened and by whom.
    page.goto("/audit/?operator=olga")
    events = page.locator("#audit-events")
    expect(events).to_contain_text("Step declined")
    expect(events).to_contain_text("Too pricey; cook at home")
    expect(events).to_contain_text("Plan approved")
    screenshot(page, tmp_path, "audit.png")


def test_two_operators_decide_the_same_plan_at_once(login: Login, steer: dict[str, Any],
                                                    page_errors: PageErrors) -> None:
    page_errors.allow("the server responded with a status of 409 (Conflict)")  # the second decision's refusal
    olga, otto = login(OPERATOR), login(SECOND_OPERATOR)
    for page in (olga, otto):
        open_inbox(page)
    buttons = [item(p, "Courier").get_by_role("button", name="Approve all") for p in (olga, otto)]
    for button in buttons:
        expect(button).to_be_enabled()
    # Both click before either answer arrives. Olga's request is held in her browser until Otto has clicked:
    # without that, Otto's decision could reach Olga's inbox first and remove the item under her pointer.
    held: list[Route] = []
    olga.route(re.compile(rf"/inbox/plans/{steer['courier']}/approve/$"), lambda route: held.append(route))
    buttons[0].click(no_wait_after=True)
    for _ in range(250):  # the route handler runs while Playwright waits
        if held:
            break
        olga.wait_for_timeout(20)
    assert len(held) == 1, "Olga's click sent no approval"
    buttons[1].click(no_wait_after=True)
    held[0].continue_()
    for page in (olga, otto):
        expect(page.locator("#flash .flash")).to_have_count(1)
    texts = [p.locator("#flash").inner_text() for p in (olga, otto)]
    assert sum("Approved Courier's plan" in t for t in texts) == 1, texts
    assert sum("no longer awaiting approval" in t and "Nothing was changed." in t for t in texts) == 1, texts
    for page in (olga, otto):
        expect(item(page, "Courier")).to_have_count(0)

    # On the plan page each sees who else is looking at it.
    for page in (olga, otto):
        page.goto(f"/plans/{steer['courier']}/")
    expect(olga.locator("#plan-presence")).to_have_text("Also viewing this plan: otto")
    expect(otto.locator("#plan-presence")).to_have_text("Also viewing this plan: olga")
    otto.close()
    expect(olga.locator("#plan-presence")).to_have_text("")


def test_editor_refuses_an_invalid_plan_then_saves_version_two(login: Login, steer: dict[str, Any],
                                                                tmp_path: Path, page_errors: PageErrors) -> None:
    page_errors.allow("the server responded with a status of 400 (Bad Request)")  # the invalid save, on purpose
    page = login(OPERATOR)
    page.goto(f"/plans/{steer['editor']}/")
    page.get_by_role("link", name="Edit plan").click()
    expect(page.get_by_role("heading", level=1)).to_contain_text("Tidy the data folder")
    page.evaluate("window.__marker = 1")
    rows = page.locator("#editor-rows > li")
    expect(rows).to_have_count(3)

    # Reorder and remove without a reload; then an invalid input and a path outside the workspace.
    page.get_by_role("button", name="Remove step 3").click()
    expect(rows).to_have_count(2)
    page.get_by_role("button", name="+ Add step").click()
    expect(rows).to_have_count(3)
    new_row = rows.nth(2)
    new_row.get_by_label("Description").fill("Summarize the notes")
    new_row.get_by_label("Tool").select_option("text.summarize")
    new_row.get_by_label("Input (JSON)").fill('{"path": "../secrets.txt"}')
    rows.nth(1).get_by_label("Input (JSON)").fill('{"path": "data.json", "content": ')
    page.get_by_role("button", name="Save as version 2").click()
    expect(page.locator("#editor-errors")).to_contain_text("The plan was not saved")
    expect(rows.nth(1).locator(".has-error", has_text="Input (JSON)")).to_contain_text("Input is not valid JSON")
    screenshot(page, tmp_path, "editor.png")
    rows.nth(1).get_by_label("Input (JSON)").fill('{"path": "data.json", "content": "[1, 2, 3]"}')
    page.get_by_role("button", name="Save as version 2").click()
    expect(rows.nth(2).locator(".has-error", has_text="Input (JSON)")).to_contain_text("escapes the workspace")
    assert page.evaluate("window.__marker") == 1, "the editor was reloaded"

    new_row.get_by_label("Input (JSON)").fill('{"path": "notes.txt"}')
    page.get_by_label("Why").fill("summarize instead of listing")
    page.get_by_role("button", name="Save as version 2").click()
    expect(page.locator("#plan-header h1")).to_contain_text("Tidy the data folder v2")
    expect(page.locator("#plan-versions")).to_contain_text("Changes from version 1")
    expect(page.locator("#plan-versions")).to_contain_text("Summarize the notes")
    expect(page.locator("#plan-timeline")).to_contain_text("edited by olga: summarize instead of listing")

    # Versions say why each was made; the compare view shows what changed, field by field.
    page.get_by_role("link", name="All versions and compare").click()
    expect(page.locator("main")).to_contain_text("edited by olga: summarize instead of listing")
    page.get_by_role("button", name="Compare").click()
    compare = page.locator("#compare")
    expect(compare).to_contain_text("Summarize the notes")
    expect(compare).to_contain_text("List the workspace")
    expect(compare.get_by_role("row", name=re.compile("estimated cycles"))).to_be_visible()
    screenshot(page, tmp_path, "compare.png")


def test_usage_and_pages_fit_768_pixels(login: Login, steer: dict[str, Any], tmp_path: Path) -> None:
    page = login(OPERATOR)
    page.goto("/usage/")
    expect(page.locator("#usage-totals")).to_contain_text("calls")
    expect(page.locator("main")).to_contain_text("gpt-4o-mini")
    expect(page.locator("svg.chart rect.chart-bar").first).to_be_attached()
    screenshot(page, tmp_path, "usage.png")
    page.set_viewport_size({"width": 768, "height": 900})
    for path in ("/inbox/", "/audit/", "/usage/", f"/plans/{steer['clerk']}/", f"/plans/{steer['editor']}/editor/", "/"):
        page.goto(path)
        overflow = page.evaluate("document.documentElement.scrollWidth")
        assert overflow <= 768, f"{path} is {overflow} px wide at 768 px"
