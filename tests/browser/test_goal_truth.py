"""Issue 50 tried as a new user would, in real Chromium with the offline default: a tool agent given a goal its
tools cannot reach says "cannot" before anything is approved, a vague goal becomes a question in the inbox, and a
doable goal ends "Completed" only with its output verified (the file written and checked).

Goals are worded here in this test's own words (evals/ keep theirs)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from playwright.sync_api import Page, expect

from tests.browser.conftest import OPERATOR, Login, Server

pytestmark = pytest.mark.browser

AGENT = "Truthful clerk"
PLANNED_SECONDS = 30_000


def goal_given(page: Page, goal: str, agent_url: str) -> None:
    """Give the goal on the agent page and open its plan once the planner has answered."""
    page.goto(agent_url)
    page.get_by_label("Goal", exact=True).fill(goal)
    page.get_by_role("button", name="Give goal").click()
    link = page.locator("#agent-plans").get_by_role("link", name=goal, exact=True)
    expect(link).to_be_visible(timeout=PLANNED_SECONDS)
    link.first.click()
    expect(page.locator("#plan-status")).not_to_have_text(re.compile("Validating|Draft"), timeout=PLANNED_SECONDS)


def test_cannot_and_vague_goals_are_answered_before_approval_and_done_means_verified(
        login: Login, server: Server, tmp_path: Path) -> None:
    page = login(OPERATOR)
    page.goto("/")
    page.get_by_role("link", name="New agent").click()
    page.get_by_label("Name", exact=True).fill(AGENT)
    page.get_by_label("What it is for").fill("Looks after the CSV files I give it")
    page.get_by_role("button", name="Create agent").click()
    expect(page.locator("#flash [role=status]")).to_contain_text(f"Created the tool agent {AGENT}.")
    people = tmp_path / "people.csv"
    people.write_text("name,city\nAda,London\nGrace,Arlington\n")
    page.get_by_label("Files", exact=True).set_input_files(str(people))
    page.get_by_role("button", name="Upload").click()
    expect(page.locator("#agent-workspace")).to_contain_text("people.csv")
    agent_url = page.url

    # Goals its tools cannot reach: a stated "cannot", no step, nothing to approve.
    for goal in ("email the totals of people.csv to finance@example.com", "please post this on twitter",
                 "post people.csv on twitter"):
        goal_given(page, goal, agent_url)
        expect(page.locator("main")).to_contain_text("cannot be done with this agent's tools: no tool sends e-mail")
        expect(page.get_by_role("button", name="Approve all")).to_have_count(0)
        expect(page.locator("#plan-step-list")).to_contain_text("No steps.")
        expect(page.locator("#plan-status")).not_to_have_text(re.compile("Completed|Awaiting approval|Active"))

    # A vague goal: a question in the inbox, before any plan to approve.
    goal_given(page, "hmm, sort it out", agent_url)
    expect(page.locator("#plan-status")).to_have_text("Needs clarification")
    expect(page.locator("#plan-question")).to_contain_text('What should I do for "hmm, sort it out"?')
    expect(page.get_by_role("button", name="Approve all")).to_have_count(0)
    page.goto("/inbox/")
    question = page.locator(".inbox-item", has_text="hmm, sort it out")
    expect(question).to_contain_text("Planner asks a question")
    expect(question.get_by_role("button", name="Approve all")).to_have_count(0)

    # A doable goal: approved, run, and "Completed" only once its output was checked.
    goal_given(page, "Copy people.csv to people_backup.csv", agent_url)
    expect(page.locator("#plan-status")).to_have_text("Awaiting approval")
    expect(page.locator("main")).to_contain_text("file.copy")
    page.get_by_role("button", name="Approve all").click()
    expect(page.locator("#plan-status")).to_have_text("Completed", timeout=PLANNED_SECONDS)
    expect(page.locator("#plan-timeline-list")).to_contain_text("outcome verified")
    page.goto(agent_url)
    expect(page.locator("#agent-workspace")).to_contain_text("people_backup.csv")
