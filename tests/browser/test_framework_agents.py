"""Agents of other frameworks, steered from the dashboard in real Chromium: an OpenAI Agents SDK agent and a
LangGraph agent, each a process of its own against the real server, their models answering from the local
OpenAI-compatible test server. An operator approves one step and declines another with feedback; the agents go
on or change course accordingly, the feedback reaches their model, and they show on the dashboard like any other.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import Page, expect

from tests.browser.conftest import OPERATOR, ROOT, Login, Server, manage
from tests.llm_server import LLMTestServer, answer, tool_call, tool_results

CLIENT_PATH = ROOT / "clients" / "python"
if str(CLIENT_PATH) not in sys.path:
    sys.path.insert(0, str(CLIENT_PATH))

from planner_client import Client  # noqa: E402  (from clients/python, as a user's checkout would)

pytestmark = [pytest.mark.browser, pytest.mark.timeout(300)]

AGENTS = Path(__file__).parent / "framework_agents"
LIVE = 20_000  # ms
AGENT_SECONDS = 120


@pytest.fixture
def llm() -> Iterator[LLMTestServer]:
    with LLMTestServer() as server:
        yield server


def agent_token(server: Server, name: str, policy: str) -> str:
    return manage(server.env, "agent_token", name, "--policy", policy).strip().splitlines()[-1]


def agent_start(script: str, server: Server, llm: LLMTestServer, token: str, model: str,
                workdir: Path) -> subprocess.Popen[str]:
    """The agent as its own process, as a user runs it: not from the repository's root, where the dashboard's
    `agents` app would shadow the OpenAI Agents SDK's package of the same name."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OPENAI_", "DJANGO_", "DATABASE_", "REDIS_"))}
    env |= {"PLANNER_URL": server.url, "PLANNER_TOKEN": token, "OPENAI_BASE_URL": llm.base_url, "MODEL": model,
            "PYTHONPATH": str(CLIENT_PATH), "PYTHONUNBUFFERED": "1", "OPENAI_AGENTS_DISABLE_TRACING": "1"}
    return subprocess.Popen([sys.executable, str(AGENTS / script)], env=env, cwd=workdir, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)


def agent_finished(agent: subprocess.Popen[str]) -> dict[str, Any]:
    """The agent's closing JSON line, once it ended well (its whole output in the failure otherwise)."""
    try:
        output, _ = agent.communicate(timeout=AGENT_SECONDS)
    except subprocess.TimeoutExpired:
        agent.kill()
        output, _ = agent.communicate()
        pytest.fail(f"the agent did not finish:\n{output}")
    assert agent.returncode == 0, output
    return dict(json.loads(output.strip().splitlines()[-1]))


def eventually[T](read: Callable[[], T | None], agent: subprocess.Popen[str], what: str) -> T:
    """What `read` finds once it finds it (the agent runs meanwhile); fails at once if the agent ended."""
    deadline = time.monotonic() + AGENT_SECONDS
    while time.monotonic() < deadline:
        found = read()
        if found is not None:
            return found
        if agent.poll() is not None:
            pytest.fail(f"the agent ended before {what}:\n{agent.communicate()[0]}")
        time.sleep(0.2)
    pytest.fail(f"gave up waiting for {what}")


def plan_awaiting(watcher: Client, version: int, *, step: bool) -> dict[str, Any] | None:
    """The agent's plan of `version` waiting for an operator: its step (step=True) or the plan itself."""
    for summary in watcher.plans():
        if summary["version"] != version:
            continue
        plan = watcher.plan(summary["id"])
        if not step and plan["status"] == "awaiting_approval":
            return plan
        if step and any(s["status"] == "awaiting_approval" for s in plan["steps"]):
            return plan
    return None


def badge(page: Page, key: str) -> Any:
    return page.locator(f"#step-{key} .step-head .badge")


def inbox_item(page: Page, agent: str) -> Any:
    return page.locator("#inbox-list .inbox-item").filter(has=page.get_by_role("link", name=agent, exact=True))


def shows_like_any_agent(page: Page, agent: str, feedback: str) -> None:
    """The agent's row on the dashboard, and the operator's decisions about it in the audit log."""
    page.goto("/")
    expect(page.locator("#agent-rows tr.agent-row").filter(
        has=page.get_by_role("link", name=agent, exact=True))).to_have_count(1)
    page.goto("/audit/?operator=olga")
    events = page.locator("#audit-events")
    expect(events).to_contain_text(feedback)
    expect(events).to_contain_text(agent)


# --- the OpenAI Agents SDK ------------------------------------------------------------------------------------

SDK_FEEDBACK = "Send it to finance@example.com, not to Dana"


def test_openai_agents_sdk_tool_calls_wait_for_the_operator(login: Login, server: Server, llm: LLMTestServer,
                                                            tmp_path: Path) -> None:
    name = "SDK mailer"
    token = agent_token(server, name, "permission")  # plans start at once; risky calls wait for an operator
    summary = "Q3: revenue up 12%"
    llm.script("model-sdk",
               tool_call("search_wiki", {"query": "Q3 report"}, call_id="call_search"),
               tool_call("send_email", {"to": "dana@example.com", "body": summary}, call_id="call_dana"),
               tool_call("send_email", {"to": "finance@example.com", "body": summary}, call_id="call_finance"),
               answer("Sent the Q3 summary to finance."))
    agent = agent_start("openai_agents_mailer.py", server, llm, token, "model-sdk", tmp_path)
    try:
        with Client(server.url, token) as watcher:
            # The search is safe: it ran without anyone. The email to Dana waits on the dashboard.
            v1 = eventually(lambda: plan_awaiting(watcher, 1, step=True), agent, "the email to await approval")
            page = login(OPERATOR)
            page.goto(f"/plans/{v1['id']}/")
            expect(page.locator("#plan-header h1")).to_contain_text("Mail the Q3 summary to Dana v1")
            expect(badge(page, "1")).to_have_text("Awaiting approval")
            email = page.locator("#step-1")
            expect(email).to_contain_text("send_email")
            expect(email).to_contain_text("dana@example.com")
            assert agent.poll() is None  # the run is paused on the call, not ended

            # Declined with feedback: the model reads it as the call's result and mails finance instead, which
            # comes back as version 2 of the plan.
            email.get_by_label("Feedback").fill(SDK_FEEDBACK)
            email.get_by_role("button", name="Decline", exact=True).click()
            expect(badge(page, "1")).to_have_text("Declined")
            expect(page.locator("#plan-timeline")).to_contain_text(f"Step declined · step 1 · by olga — {SDK_FEEDBACK}")
            expect(page.locator("#plan-header")).to_contain_text("Superseded by version 2", timeout=LIVE)

            # The operator approves the new call from the inbox; the SDK runs it and the run ends.
            page.goto("/inbox/")
            item = inbox_item(page, name)
            expect(item).to_contain_text("finance@example.com", timeout=LIVE)
            item.get_by_role("button", name="Approve", exact=True).click()
            expect(item).to_have_count(0)
            result = agent_finished(agent)
            assert result == {"final": "Sent the Q3 summary to finance.",
                              "sent": [{"to": "finance@example.com", "body": summary}]}

            # What the model was told: the search's result, the operator's feedback, the sent email.
            requests = llm.requests_for("model-sdk")
            assert len(requests) == 4
            assert "revenue up 12%" in tool_results(requests[1])["call_search"]
            rejected = tool_results(requests[2])["call_dana"]
            assert SDK_FEEDBACK in rejected and "declined" in rejected
            assert tool_results(requests[3])["call_finance"] == "sent to finance@example.com"

            # Version 2 on the dashboard: the approved call, its result, the way from version 1.
            v2 = watcher.plans()[0]
            assert (v2["version"], v2["previous"], v2["status"]) == (2, v1["id"], "completed")
            page.goto(f"/plans/{v2['id']}/")
            expect(page.locator("#plan-status")).to_have_text("Completed")
            expect(badge(page, "1")).to_have_text("Completed")
            expect(page.locator("#step-1")).to_contain_text("sent to finance@example.com")
            expect(page.locator("#plan-timeline")).to_contain_text("Step approved · step 1 · by olga")
            expect(page.locator("#plan-timeline")).to_contain_text("Plan completed")
            expect(page.locator("#plan-versions").get_by_role("link", name="version 1")).to_be_visible()
            shows_like_any_agent(page, name, SDK_FEEDBACK)
    finally:
        if agent.poll() is None:
            agent.kill()


# --- LangGraph ------------------------------------------------------------------------------------------------

PLAN_FEEDBACK = "Search the finance drive, not the wiki"
MAIL_FEEDBACK = "Greet Dana and sign it"


def plan_json(query: str) -> str:
    return json.dumps({"steps": [{"id": "1", "tool": "search", "intent": f"Search for {query}",
                                  "input": {"query": query}, "requiresPermission": False}]})


def test_langgraph_plan_and_interrupts_are_decided_by_the_operator(login: Login, server: Server,
                                                                   llm: LLMTestServer, tmp_path: Path) -> None:
    name = "Graph mailer"
    token = agent_token(server, name, "plan")  # an operator approves each plan
    rewritten = {"to": "dana@example.com", "body": "Hi Dana, Q3 revenue is up 12%. Best, the mailer"}
    llm.script("model-graph", answer(plan_json("Q3 report on the wiki")), answer(plan_json("Q3 on the finance drive")),
               answer(json.dumps({"to": "dana@example.com", "body": "Revenue up 12%."})),
               answer(json.dumps(rewritten)))
    agent = agent_start("langgraph_planner.py", server, llm, token, "model-graph", tmp_path)
    try:
        with Client(server.url, token) as watcher:
            # The graph's whole plan waits for the operator, who declines it with feedback.
            v1 = eventually(lambda: plan_awaiting(watcher, 1, step=False), agent, "the plan to await approval")
            page = login(OPERATOR)
            page.goto(f"/plans/{v1['id']}/")
            expect(page.locator("#plan-status")).to_have_text("Awaiting approval")
            expect(page.locator("#step-1")).to_contain_text("Q3 report on the wiki")
            page.get_by_label("Reason").fill(PLAN_FEEDBACK)
            page.get_by_role("button", name="Decline with feedback").click()
            expect(page.locator("#plan-header")).to_contain_text("Superseded by version 2", timeout=LIVE)
            assert PLAN_FEEDBACK in llm.requests_for("model-graph")[1].messages[-1]["content"]

            # Version 2 follows the feedback; the operator approves it and the graph runs its step.
            page.locator("#plan-versions").get_by_role("link", name="version 2").click()
            expect(page.locator("#step-1")).to_contain_text("Q3 on the finance drive")
            expect(page.locator("#plan-timeline")).to_contain_text(PLAN_FEEDBACK)  # why this version exists
            page.get_by_role("button", name="Approve all").click()
            expect(page.locator("#plan-status")).to_have_text("Completed", timeout=LIVE)
            expect(page.locator("#step-1")).to_contain_text("revenue up 12%")
            expect(page.locator("#plan-versions").get_by_role("link", name="version 1")).to_be_visible()

            # The email interrupts the graph: a plan of its own, which the operator declines with feedback ...
            mail = eventually(lambda: plan_awaiting(watcher, 1, step=False), agent, "the email to await approval")
            page.goto(f"/plans/{mail['id']}/")
            expect(page.locator("#step-1")).to_contain_text("Revenue up 12%.")
            page.get_by_label("Reason").fill(MAIL_FEEDBACK)
            page.get_by_role("button", name="Decline with feedback").click()
            expect(page.locator("#plan-header")).to_contain_text("Superseded by version 2", timeout=LIVE)
            assert MAIL_FEEDBACK in llm.requests_for("model-graph")[3].messages[-1]["content"]

            # ... and approves from the inbox once rewritten: only then is it sent.
            page.goto("/inbox/")
            item = inbox_item(page, name)
            expect(item).to_contain_text("Hi Dana, Q3 revenue", timeout=LIVE)
            item.get_by_role("button", name="Approve all").click()
            expect(item).to_have_count(0)
            result = agent_finished(agent)
            assert result["sent"] == [rewritten]
            assert "revenue up 12%" in result["found"]["1"]
            assert len(llm.requests_for("model-graph")) == 4

            sent = watcher.plans()[0]
            page.goto(f"/plans/{sent['id']}/")
            expect(page.locator("#plan-status")).to_have_text("Completed")
            expect(page.locator("#step-1")).to_contain_text("sent to dana@example.com")
            expect(page.locator("#plan-timeline")).to_contain_text("Plan approved")
            shows_like_any_agent(page, name, MAIL_FEEDBACK)
    finally:
        if agent.poll() is None:
            agent.kill()
