"""An operator and a viewer in real Chromium against the real server (see conftest.py for the scenario).

Every assertion is about what the user sees; live changes are awaited with Playwright's auto-waiting
`expect`, and `window.__marker` proves that they arrived without a reload.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest
from playwright.sync_api import APIResponse, Locator, Page, expect

from tests.browser.conftest import OPERATOR, ROOT, VIEWER, Login, PageErrors, Server

pytestmark = pytest.mark.browser

LIVE = 20_000  # ms: the runner cycles every second; generous for a loaded CI machine
# A declined step never comes back unchanged: the offline replan takes the action the feedback names instead
# (meeting a friend, which also needs permission, so version 2 waits for an approval too).
FEEDBACK = "Too pricey; meet friend Sam instead, he has dinner ready"


def open_live(page: Page, path: str) -> None:
    """Open a page and wait until its websocket is connected (the header's dot turns on)."""
    page.goto(path)
    expect(page.locator("#live-status")).to_have_class(re.compile(r"\bon\b"))


def mark(page: Page) -> None:
    page.evaluate("window.__marker = 1")


def assert_not_reloaded(page: Page) -> None:
    assert page.evaluate("window.__marker") == 1, "the page was reloaded or navigated"


def badge(page: Page, key: str) -> Locator:
    """The status badge of the step with this key."""
    return page.locator(f"#step-{key} .step-head .badge")


def post_form(page: Page, path: str, form: dict[str, str]) -> APIResponse:
    """POST as this page's user would, with the CSRF token htmx sends (from the page's hx-headers)."""
    token = json.loads(page.locator("body").get_attribute("hx-headers") or "{}")["X-CSRFToken"]
    return page.request.post(path, form=form, headers={"X-CSRFToken": token, "Referer": page.url},
                             max_redirects=0)


def test_operator_watches_declines_and_approves(login: Login, server: Server) -> None:
    """The issue's flow: live completion, decline with feedback, version 2, approval; all seen by the operator."""
    alice = server.scenario["alice"]
    page = login(OPERATOR)

    # The plan before the agent runs: nothing done yet.
    open_live(page, f"/plans/{alice['plan']}/")
    expect(page.locator("#plan-header h1")).to_contain_text("Have a meal v1")
    expect(badge(page, "1")).to_have_text("Pending")
    expect(badge(page, "2")).to_have_text("Pending")
    expect(page.locator("#step-2")).to_contain_text("requires permission")
    mark(page)

    # The operator resumes Alice in a second tab; the runner drives her, and the plan page follows live.
    agent_tab = page.context.new_page()
    agent_tab.goto(f"/agents/{alice['agent']}/")
    agent_tab.get_by_role("button", name="Resume").click()
    expect(agent_tab.locator("#agent-header .badge")).to_have_text("Running", timeout=LIVE)
    agent_tab.close()

    expect(badge(page, "1")).to_have_text("Completed", timeout=LIVE)
    expect(page.locator("#step-1")).to_contain_text("arrived at the store")
    expect(page.locator("#plan-timeline")).to_contain_text("Agent resumed · by olga")
    expect(page.locator("#plan-timeline")).to_contain_text("Step completed · step 1")

    # Step 2 spends money: it waits for an operator, with Approve, Decline and a Feedback field.
    step2 = page.locator("#step-2")
    expect(badge(page, "2")).to_have_text("Awaiting approval", timeout=LIVE)
    expect(step2.get_by_role("button", name="Approve", exact=True)).to_be_visible()
    expect(step2.get_by_role("button", name="Decline", exact=True)).to_be_visible()
    expect(step2.get_by_label("Feedback")).to_be_visible()
    assert_not_reloaded(page)

    # Decline with feedback: the step is declined and, next cycle, version 2 appears, still without a reload.
    step2.get_by_label("Feedback").fill(FEEDBACK)
    step2.get_by_role("button", name="Decline", exact=True).click()
    expect(page.locator("#flash [role=status]")).to_have_text(
        "Declined step 2 of Alice's plan “Have a meal” (v1); the agent replans with your feedback.")
    expect(badge(page, "2")).to_have_text("Declined")
    expect(page.locator("#plan-timeline")).to_contain_text(f"Step declined · step 2 · by olga — {FEEDBACK}")
    expect(page.locator("#plan-header")).to_contain_text("Superseded by version 2", timeout=LIVE)
    expect(page.locator("#plan-status")).to_have_text("Replanned")
    expect(page.locator("#plan-timeline")).to_contain_text("Replanned")
    assert_not_reloaded(page)

    # Version 2 keeps the completed step and takes the feedback into account.
    page.locator("#plan-versions").get_by_role("link", name="version 2").click()
    expect(page.locator("#plan-header h1")).to_contain_text("Have a meal v2")
    expect(page).not_to_have_url(re.compile(rf"/plans/{alice['plan']}/$"))
    expect(badge(page, "1")).to_have_text("Completed", timeout=LIVE)  # the planner may still be at work
    expect(page.locator("#step-1")).to_contain_text("kept from earlier version")
    # The feedback steers the planner's thinking; it is not pasted into step text (that grew with each replan).
    expect(page.locator("#plan-header")).to_contain_text(FEEDBACK)
    # Why this version exists, in its own timeline: the operator's feedback (it is in the replan prompt too;
    # the offline model no longer copies it into the step text).
    expect(page.locator("#plan-timeline")).to_contain_text(FEEDBACK)
    expect(page.locator("#plan-versions")).to_contain_text("Changes from version 1")
    expect(page.locator("#plan-versions").get_by_role("link", name="version 1")).to_be_visible()
    expect(page.locator("#live-status")).to_have_class(re.compile(r"\bon\b"))
    mark(page)

    # The operator's choice replaced buying food; it waits for approval too, and this time the operator approves it.
    waiting = page.locator("li.step[data-status='awaiting_approval']")
    expect(waiting).to_have_count(1, timeout=LIVE)
    expect(waiting).to_contain_text("Meet friend instead")
    expect(page.locator("#plan-steps")).not_to_contain_text("Buy some food")
    key = waiting.locator(".key").inner_text()
    waiting.get_by_role("button", name="Approve", exact=True).click()
    expect(page.locator("#flash [role=status]")).to_have_text(f"Approved step {key} of Alice's plan “Have a meal” (v2).")
    expect(page.locator("#plan-timeline")).to_contain_text(f"Step approved · step {key} · by olga")
    expect(badge(page, key)).not_to_have_text("Awaiting approval")
    expect(page.locator(f"#step-{key}")).to_contain_text("approved by olga")
    expect(badge(page, key)).to_have_text("Completed", timeout=LIVE)
    expect(page.locator(f"#step-{key}")).to_contain_text("spent time with a friend")
    expect(page.locator("#plan-status")).to_have_text("Completed", timeout=LIVE)
    expect(page.locator("#plan-timeline")).to_contain_text("Plan completed")
    expect(page.locator("li.step .decide")).to_have_count(0)
    assert_not_reloaded(page)


def test_viewer_sees_no_decisions_and_cannot_post_them(login: Login, server: Server) -> None:
    """A viewer sees the waiting step but no way to decide it, and the server refuses a forged decision."""
    bob = server.scenario["bob"]
    page = login(VIEWER)
    open_live(page, f"/plans/{bob['plan']}/")  # the sections are re-rendered for the viewer on connect

    expect(badge(page, "2")).to_have_text("Awaiting approval")
    expect(page.get_by_role("button", name="Approve")).to_have_count(0)
    expect(page.get_by_role("button", name="Decline")).to_have_count(0)
    expect(page.get_by_label("Feedback")).to_have_count(0)
    expect(page.get_by_role("link", name="Edit step")).to_have_count(0)
    expect(page.locator(".decide")).to_have_count(0)  # no Replan or Cancel plan either

    step = bob["steps"]["2"]
    approve = post_form(page, f"/steps/{step}/approve/", {})
    assert approve.status == 403, approve.text()
    assert "CSRF" not in approve.text()  # refused for the role, not for a missing token
    decline = post_form(page, f"/steps/{step}/decline/", {"feedback": "no"})
    assert decline.status == 403, decline.text()

    page.reload()
    expect(badge(page, "2")).to_have_text("Awaiting approval")
    expect(page.locator("#plan-timeline")).not_to_contain_text("Step approved")
    expect(page.locator("#plan-timeline")).not_to_contain_text("Step declined")


def test_decline_without_feedback_is_refused(login: Login, server: Server, page_errors: PageErrors) -> None:
    """Declining needs feedback: the browser, then the server, refuse without it; the step still waits."""
    bob = server.scenario["bob"]
    page_errors.allow("the server responded with a status of 400 (Bad Request)")  # the refusal, on purpose
    page = login(OPERATOR)
    open_live(page, f"/plans/{bob['plan']}/")
    step2 = page.locator("#step-2")
    feedback = step2.get_by_label("Feedback")
    decline = step2.get_by_role("button", name="Decline", exact=True)
    posts: list[str] = []
    page.on("request", lambda r: posts.append(r.url) if r.method == "POST" else None)

    # The browser refuses an empty field by itself: nothing is sent.
    decline.click()
    assert feedback.evaluate("el => el.validity.valueMissing") is True
    page.wait_for_timeout(500)
    assert posts == []

    # Blank feedback gets past the browser; the server refuses it and says why, where the operator looks.
    feedback.fill("   ")
    decline.click()
    expect(page.locator("#flash [role=alert]")).to_have_text(
        "Feedback is required to decline a step. Nothing was changed.")
    assert len(posts) == 1
    expect(badge(page, "2")).to_have_text("Awaiting approval")

    # The same without htmx: 400 and the reason.
    response = post_form(page, f"/steps/{bob['steps']['2']}/decline/", {"feedback": ""})
    assert response.status == 400
    assert "Feedback is required" in response.text()

    page.reload()
    expect(badge(page, "2")).to_have_text("Awaiting approval")
    expect(step2.get_by_role("button", name="Approve", exact=True)).to_be_visible()


def test_dashboard_lists_every_agent(login: Login, server: Server, tmp_path: Path) -> None:
    page = login(OPERATOR)
    open_live(page, "/")
    rows = page.locator("#agent-rows tr.agent-row")
    for name in ("Alice", "Bob", "Jenbina", "Marco", "Archivist", "Reporter", "Intern"):
        expect(rows.filter(has=page.get_by_role("link", name=name, exact=True))).to_have_count(1)
    # Other browser tests of this session's server may add agents of their own: the count covers them all.
    shown = rows.count()
    assert shown >= 7
    expect(page.locator("#dashboard-counts")).to_contain_text(f"{shown} agents")
    bob = rows.filter(has=page.get_by_role("link", name="Bob", exact=True))
    expect(bob).to_contain_text("Paused")
    expect(bob).to_contain_text("step 2 awaits approval")
    expect(bob.get_by_role("link", name="Catch up with Sam")).to_have_attribute("href", f"/plans/{server.scenario['bob']['plan']}/")
    expect(bob).to_contain_text("1/2 steps")

    shot = tmp_path / "dashboard.png"
    page.set_viewport_size({"width": 1280, "height": 600})  # the full-page shot grows to the table's height
    page.screenshot(path=str(shot), full_page=True)
    if os.environ.get("UPDATE_SCREENSHOTS") == "1":  # refresh the README's picture on request
        target = ROOT / "docs" / "dashboard.png"
        target.parent.mkdir(exist_ok=True)
        target.write_bytes(shot.read_bytes())


def test_dashboard_rows_update_live(login: Login, server: Server) -> None:
    page = login(OPERATOR)
    open_live(page, "/")
    mark(page)
    jenbina = page.locator("#agent-rows tr.agent-row").filter(has=page.get_by_role("link", name="Jenbina", exact=True))
    cycles = jenbina.locator("td").last
    before = cycles.inner_text()
    expect(cycles).not_to_have_text(before, timeout=8_000)  # Jenbina cycles every 1.5 s
    assert_not_reloaded(page)
