"""A newcomer's first tool agent, from the dashboard alone: create it, upload a file, give it a goal, approve the
plan, and see the file it made. (Named to run last: the agent it creates stays in the session's server.)"""

from __future__ import annotations

from pathlib import Path

import pytest
from playwright.sync_api import expect

from tests.browser.conftest import OPERATOR, Login, Server

pytestmark = pytest.mark.browser


def test_newcomer_creates_a_tool_agent_uploads_a_file_and_gives_it_a_goal(login: Login, server: Server,
                                                                          tmp_path: Path) -> None:
    page = login(OPERATOR)
    page.goto("/")
    page.get_by_role("link", name="New agent").click()
    page.get_by_label("Name", exact=True).fill("Newcomer's clerk")
    page.get_by_label("What it is for").fill("Turns the CSV files I give it into JSON")
    expect(page.get_by_label("file.convert: Convert a CSV file to JSON")).to_be_checked()
    page.get_by_label("web.fetch: Fetch a web page").uncheck()
    page.get_by_role("button", name="Create agent").click()
    expect(page.locator("#flash [role=status]")).to_have_text(
        "Created the tool agent Newcomer's clerk. Upload its files, then give it a goal.")
    workspace = page.locator("#agent-workspace")
    expect(workspace).to_contain_text("No files yet.")

    people = tmp_path / "people.csv"
    people.write_text("name,city\nAda,London\nGrace,Arlington\n")
    page.get_by_label("Files", exact=True).set_input_files(str(people))
    page.get_by_role("button", name="Upload").click()
    expect(page.locator("#flash [role=status]")).to_have_text("Uploaded people.csv into Newcomer's clerk's workspace.")
    expect(workspace).to_contain_text("people.csv")

    page.get_by_label("Goal", exact=True).fill("Convert people.csv to JSON")
    page.get_by_role("button", name="Give goal").click()
    plans = page.locator("#agent-plans")
    expect(plans.get_by_role("link", name="Convert people.csv to JSON")).to_be_visible(timeout=30_000)
    expect(plans).to_contain_text("Awaiting approval", timeout=30_000)

    plans.get_by_role("link", name="Convert people.csv to JSON").click()
    page.get_by_role("button", name="Approve all").click()
    expect(page.locator("#plan-status")).to_have_text("Completed", timeout=30_000)
    page.get_by_role("link", name="Newcomer's clerk").first.click()
    expect(page.locator("#agent-workspace")).to_contain_text("people.json")

    page.goto("/audit/")
    expect(page.locator("main")).to_contain_text("Agent created")
    expect(page.locator("main")).to_contain_text("Files uploaded")
