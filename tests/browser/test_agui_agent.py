"""A remote AG-UI agent in real Chromium (docs/agui-agents.md): an operator adds it by address on New agent, gives
it a goal, sees its tool calls as the plan's steps, edits the write's arguments its interrupt asks approval for,
approves from the inbox, and the agent goes on: its run is resumed once with the edit in resume[]."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
from playwright.sync_api import expect

from tests.agui_agent import FileAgent, agui_agent_serving
from tests.browser.conftest import OPERATOR, Login

pytestmark = pytest.mark.browser


@pytest.fixture
def file_agent() -> Iterator[tuple[FileAgent, str]]:
    agent = FileAgent()
    with agui_agent_serving(agent) as url:  # the browser tests' server allows loopback (OUTBOUND_ALLOWED_NETWORKS)
        yield agent, url


def test_an_agui_agent_is_added_given_a_goal_and_its_interrupt_approved_with_an_edit(
        login: Login, file_agent: tuple[FileAgent, str]) -> None:
    remote, url = file_agent
    page = login(OPERATOR)
    page.goto("/agents/new/")
    form = page.get_by_role("form", name="New AG-UI agent")
    form.get_by_label("Name").fill("Browser AG-UI agent")
    form.get_by_label("Agent URL").fill(url)
    form.get_by_role("button", name="Add AG-UI agent").click()
    expect(page.locator("h1")).to_contain_text("Browser AG-UI agent")
    expect(page.locator("h1")).to_contain_text("Remote (AG-UI)")

    page.locator("#id_description").fill("Sum up the release notes in a file")
    page.get_by_role("button", name="Give goal").click()
    # The request returns at once; the runner reads the run and the plan page follows it live.
    expect(page.locator("body")).to_contain_text("read_file")
    expect(page.locator("body")).to_contain_text("write_file: May I write summary.txt?")
    assert len(remote.runs) == 1

    page.goto("/inbox/")
    item = page.locator(".inbox-item", has_text="May I write summary.txt?")
    expect(item).to_contain_text("planned by: AG-UI agent Browser AG-UI agent")
    step_link = item.locator("a[href*='#step-']").get_attribute("href") or ""
    assert "#step-s3" in step_link

    # The write's arguments edited in the step editor before approving.
    step_pk = item.locator("input[name=feedback]").get_attribute("id").rsplit("-", 1)[-1]  # type: ignore[union-attr]
    page.goto(f"/steps/{step_pk}/edit/")
    edited = {"path": "release-summary.txt", "content": "ship on friday"}
    page.locator("#id_tool_input").fill(json.dumps(edited))
    page.get_by_role("button", name="Save step").click()

    page.goto("/inbox/")
    item = page.locator(".inbox-item", has_text="May I write summary.txt?")
    expect(item).to_contain_text("release-summary.txt")
    item.get_by_role("button", name="Approve").click()
    expect(page.locator(".inbox-item", has_text="May I write summary.txt?")).to_have_count(0)

    # The runner resumes the run; the plan page shows the agent going on.
    page.goto(step_link.split("#")[0])
    expect(page.locator("body")).to_contain_text("wrote release-summary.txt")
    assert len(remote.runs) == 2
    assert remote.runs[1]["resume"] == [{"interruptId": "i-write", "status": "resolved",
                                         "payload": {"approved": True, "arguments": edited}}]
