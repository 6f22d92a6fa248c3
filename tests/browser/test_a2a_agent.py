"""A remote A2A agent in real Chromium (docs/a2a-agents.md): an operator adds the tests' a2a-sdk agent (served on
loopback, its card offering streaming) by its address on New agent, gives it a goal, sees its steps on the plan
page, answers its question from the inbox, and the agent goes on: the answer reaches it once, on the same task,
and its task completes with the summary it wrote."""

from __future__ import annotations

import re
import time
from collections.abc import Iterator

import pytest
from playwright.sync_api import expect

from tests.a2a import a2a_agent
from tests.a2a.a2a_agent import QUESTION
from tests.browser.conftest import OPERATOR, Login

pytestmark = pytest.mark.browser


@pytest.fixture
def agent_base() -> Iterator[str]:
    a2a_agent.ANSWERS.clear()
    a2a_agent.METHODS.clear()
    with a2a_agent.served(streaming=True) as base:  # the browser tests' server allows loopback
        yield base


def test_an_a2a_agent_is_added_given_a_goal_and_its_question_answered_from_the_inbox(
        login: Login, agent_base: str) -> None:
    page = login(OPERATOR)
    page.goto("/agents/new/")
    form = page.get_by_role("form", name="Add a remote A2A agent")
    form.get_by_label("Agent card address").fill(agent_base)
    form.get_by_role("button", name="Add agent").click()
    expect(page.locator("#flash")).to_contain_text("Added the remote A2A agent Summary writer.")
    expect(page.locator("h1")).to_contain_text("Summary writer")
    expect(page.locator("body")).to_contain_text("followed as they stream")

    page.locator("#id_description").fill("Summarise the notes in my folder, short pls")
    page.get_by_role("button", name="Give goal").click()
    # The runner sends the goal and follows the task's stream; the agent page follows it live: the steps the
    # agent reported, then its question.
    following = page.locator("#agent-following")
    expect(following).to_contain_text("Planned 3 steps: read notes.txt")
    expect(following).to_contain_text("Artifact plan")
    expect(following).to_contain_text("Needs clarification")

    page.goto("/inbox/")
    item = page.locator(".inbox-item", has_text=QUESTION)
    expect(item).to_contain_text("Summary writer")
    plan_href = item.locator("a[href*='/plans/']").first.get_attribute("href") or ""
    assert re.search(r"/plans/\d+/", plan_href), plan_href
    item.get_by_label("Your answer").fill("Markdown, with a title")
    item.get_by_role("button", name="Answer and plan again").click()
    expect(page.locator("#flash")).to_contain_text("Answer given to Summary writer")
    expect(page.locator(".inbox-item", has_text=QUESTION)).to_have_count(0)

    # The agent goes on: the plan page follows it to its end, the summary it wrote among its steps.
    page.goto(plan_href.split("#")[0])
    expect(page.locator("body")).to_contain_text("Writing summary.md as Markdown, with a title")
    expect(page.locator("body")).to_contain_text("Artifact summary.md")
    expect(page.locator("body")).to_contain_text("Planned 3 steps: read notes.txt")
    deadline = time.monotonic() + 10
    while "SendStreamingMessage" not in a2a_agent.METHODS[1:] and time.monotonic() < deadline:
        time.sleep(0.1)
    assert a2a_agent.ANSWERS == ["Markdown, with a title"]
    assert "SendMessage" not in a2a_agent.METHODS  # streamed, never polled
