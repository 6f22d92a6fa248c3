"""An agent speaking MCP (the official SDK's streamable HTTP client, with a token from `manage.py agent_token`)
against the real server, while an operator in Chromium approves one of its steps in the inbox and declines
another on the plan page. The agent hears each decision over MCP; the operator sees the agent like any other:
plan page, timeline, versions, inbox, audit log, dashboard, usage."""

from __future__ import annotations

import asyncio
import queue
import re
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import httpx2
import pytest
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client
from playwright.sync_api import Page, expect

from tests.browser.conftest import OPERATOR, Login, Server, manage

pytestmark = [pytest.mark.browser, pytest.mark.timeout(300)]

LIVE = 20_000  # ms
AGENT = "Scout"
FEEDBACK = "Not to Dana: send the summary to finance first"
GOAL = "Mail the Q3 summary to Dana"
TOOLS = [
    {"name": "search", "description": "Search the company wiki", "risk": "safe",
     "input_schema": {"type": "object", "properties": {"query": {"type": "string"}}, "required": ["query"]}},
    {"name": "send_email", "description": "Send an email", "risk": "risky",
     "input_schema": {"type": "object", "properties": {"to": {"type": "string"}, "body": {"type": "string"}},
                      "required": ["to", "body"]}},
]
PLAN = {"goal": GOAL, "thinking_summary": "Find the report, then mail it.", "steps": [
    {"id": "1", "tool": "search", "intent": "Find the Q3 report", "input": {"query": "q3 report"},
     "requiresPermission": True},
    {"id": "2", "tool": "send_email", "intent": "Mail the summary to Dana", "dependencies": ["1"],
     "input": {"to": "dana@example.com", "body": "The Q3 summary"}, "requiresPermission": True},
]}
VERSION_2 = {"steps": [
    {"id": "3", "tool": "send_email", "intent": "Mail the summary to finance", "dependencies": ["1"],
     "input": {"to": "finance@example.com", "body": "The Q3 summary"}, "requiresPermission": True},
]}
WAIT_SECONDS = 10  # each wait_for_decision call
WAITS = 12  # at most this many calls for one decision (the test's own bound, not a timed assertion)


async def call(session: ClientSession, tool: str, arguments: dict[str, Any]) -> dict[str, Any]:
    result = await session.call_tool(tool, arguments)
    assert not result.is_error, f"{tool}: {result.content}"
    assert result.structured_content is not None
    return result.structured_content


async def decision(session: ClientSession, plan_id: int, action: str) -> dict[str, Any]:
    """Wait over MCP until the answer is `action`; anything but "wait" meanwhile is a failure."""
    for _ in range(WAITS):
        answer = await call(session, "wait_for_decision", {"plan_id": plan_id, "timeout_seconds": WAIT_SECONDS})
        if answer["action"] == action:
            return answer
        assert answer["action"] == "wait", answer
    raise AssertionError(f"no {action!r} after {WAITS} waits")


async def mcp_agent(url: str, token: str, plans: queue.Queue[int]) -> dict[str, Any]:
    """What an MCP client does, as the README's configuration describes it: the token on the HTTP client."""
    seen: dict[str, Any] = {}
    async with (httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"},
                                   timeout=httpx2.Timeout(30.0, read=WAIT_SECONDS + 30.0)) as http,
                streamable_http_client(f"{url}/mcp", http_client=http) as (read, write),
                ClientSession(read, write) as session):
        await session.initialize()
        await call(session, "declare_tools", {"tools": TOOLS})
        plan = await call(session, "submit_plan", PLAN)
        seen["plan"] = plan
        plans.put(plan["id"])
        run = seen["run"] = await decision(session, plan["id"], "run")  # the operator approves step 1
        await call(session, "report_step_start", {"step_id": run["step"]["id"], "request_id": "start-1"})
        await call(session, "report_step_result", {"step_id": run["step"]["id"], "request_id": "result-1",
                                                    "succeeded": True, "output": {"found": "q3-report.pdf"}})
        seen["replan"] = await decision(session, plan["id"], "replan")  # the operator declines step 2
        seen["v2"] = await call(session, "submit_version", {"plan_id": plan["id"], **VERSION_2})
    return seen


def plan_id_of(agent: Future[dict[str, Any]], plans: queue.Queue[int]) -> int:
    while True:
        try:
            return plans.get(timeout=1)
        except queue.Empty:
            if agent.done():  # it failed before submitting: say why
                agent.result()
                raise AssertionError("the agent ended without submitting a plan") from None


def open_live(page: Page, path: str) -> None:
    page.goto(path)
    expect(page.locator("#live-status")).to_have_class(re.compile(r"\bon\b"))


def badge(page: Page, key: str) -> Any:
    return page.locator(f"#step-{key} .step-head .badge")


def test_an_mcp_agent_is_steered_by_an_operator_in_the_browser(login: Login, server: Server) -> None:
    token = manage(server.env, "agent_token", AGENT, "--policy", "permission", "--label", "MCP client")
    token = token.strip().splitlines()[-1]
    page = login(OPERATOR)
    open_live(page, "/inbox/")
    plans: queue.Queue[int] = queue.Queue()
    with ThreadPoolExecutor(max_workers=1) as pool:
        agent = pool.submit(asyncio.run, mcp_agent(server.url, token, plans))
        plan_id = plan_id_of(agent, plans)

        # Step 1 requires permission: it reaches the inbox live, and the operator approves it there.
        items = page.locator("#inbox-list .inbox-item").filter(has=page.get_by_role("link", name=AGENT, exact=True))
        item = items.filter(has_text="Find the Q3 report")
        expect(item).to_have_count(1, timeout=LIVE)
        expect(item).to_contain_text("requires permission: yes")
        item.get_by_role("button", name="Approve", exact=True).click()
        expect(page.locator("#flash [role=status]")).to_contain_text(f"Approved step 1 of {AGENT}'s plan")
        expect(item).to_have_count(0)
        # The agent runs step 1 and reaches step 2, which needs permission too: it arrives in the inbox live.
        expect(items.filter(has_text="Mail the summary to Dana")).to_have_count(1, timeout=LIVE)

        # The agent ran step 1 and reported it over MCP; the plan page shows it, then step 2 waiting.
        open_live(page, f"/plans/{plan_id}/")
        expect(page.locator("#plan-header h1")).to_contain_text(f"{GOAL} v1")
        expect(badge(page, "1")).to_have_text("Completed", timeout=LIVE)
        expect(page.locator("#step-1")).to_contain_text("q3-report.pdf")
        step2 = page.locator("#step-2")
        expect(badge(page, "2")).to_have_text("Awaiting approval", timeout=LIVE)
        step2.get_by_label("Feedback").fill(FEEDBACK)
        step2.get_by_role("button", name="Decline", exact=True).click()
        expect(page.locator("#flash [role=status]")).to_have_text(
            f"Declined step 2 of {AGENT}'s plan “{GOAL}” (v1); the agent replans with your feedback.")

        # The agent hears the decline with the feedback and submits version 2, which the page shows live.
        expect(page.locator("#plan-header")).to_contain_text("Superseded by version 2", timeout=LIVE)
        seen = agent.result(timeout=120)

    assert (seen["plan"]["version"], seen["plan"]["status"]) == (1, "active")  # the agent's policy: no plan approval
    assert (seen["run"]["step"]["key"], seen["run"]["step"]["tool"]) == ("1", "search")
    assert seen["replan"]["feedback"] == FEEDBACK
    assert [s["key"] for s in seen["replan"]["kept"]] == ["1"]
    assert seen["v2"]["version"] == 2

    # Version 1's timeline: the operator's decisions and the agent's reports, each by whom.
    timeline = page.locator("#plan-timeline")
    expect(page.locator("#plan-status")).to_have_text("Replanned")
    expect(timeline).to_contain_text("Step approved · step 1 · by olga")
    expect(timeline).to_contain_text(f"Step started · step 1 · by {AGENT} (MCP)")
    expect(timeline).to_contain_text(f"Step completed · step 1 · by {AGENT} (MCP)")
    expect(timeline).to_contain_text(f"Step declined · step 2 · by olga — {FEEDBACK}")

    # Version 2 keeps the completed step and carries the reason it exists.
    page.locator("#plan-versions").get_by_role("link", name="version 2").click()
    expect(page.locator("#plan-header h1")).to_contain_text(f"{GOAL} v2")
    expect(badge(page, "1")).to_have_text("Completed")
    expect(page.locator("#step-1")).to_contain_text("kept from earlier version")
    expect(page.locator("#step-3")).to_contain_text("Mail the summary to finance")
    expect(page.locator("#step-2")).to_have_count(0)
    expect(page.locator("#plan-versions").get_by_role("link", name="version 1")).to_be_visible()
    expect(page.locator("#plan-versions")).to_contain_text("Changes from version 1")

    # The audit log has the whole story of plan 1, the agent's part under its name.
    page.goto(f"/audit/?plan={plan_id}")
    events = page.locator("#audit-events")
    expect(events).to_contain_text("Step declined")
    expect(events).to_contain_text(FEEDBACK)
    expect(events).to_contain_text("Step approved")
    expect(events).to_contain_text(f"{AGENT} (MCP)")

    # The dashboard lists the agent with its current plan; its page and its usage (no model calls here) open.
    open_live(page, "/")
    row = page.locator("#agent-rows tr.agent-row").filter(has=page.get_by_role("link", name=AGENT, exact=True))
    expect(row).to_have_count(1)
    expect(row.get_by_role("link", name=GOAL)).to_have_attribute("href", f"/plans/{seen['v2']['id']}/")
    row.get_by_role("link", name=AGENT, exact=True).click()
    expect(page.locator("#agent-header")).to_contain_text(AGENT)
    agent_id = re.search(r"/agents/(\d+)/", page.url)
    assert agent_id is not None
    page.goto(f"/usage/?agent={agent_id.group(1)}")
    expect(page.locator("main")).to_contain_text("No model calls in this period.")
