"""A planner's question in real Chromium: it waits in the inbox with an answer field, counted in the navigation,
and the answer given there resumes planning; the agent page says what waits meanwhile.

The scenario below is added to the server's database by this module; its agent is paused, so the runner never
plans it (the answered plan stays "replan due", which the agent page shows).
"""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
from playwright.sync_api import expect

from tests.browser.conftest import OPERATOR, Login, Server, manage

pytestmark = pytest.mark.browser

QUESTION_SCENARIO = r"""
import json
from agents.models import Agent
from goals.models import Goal
from planning.models import Plan, PlanEvent

agent = Agent.objects.create(name="Quester", backstory="Browser-test agent whose goal is unclear.", kind="tool",
                             status=Agent.Status.PAUSED, cycle_interval=1.0)
goal = Goal.objects.create(agent=agent, description="Do the thing", horizon=Goal.Horizon.SHORT)
plan = Plan.objects.create(agent=agent, goal=goal, goal_text="Do the thing", status=Plan.Status.CLARIFYING,
                           model="offline-rules", clarification_question="Which files, and what result?")
PlanEvent.objects.create(plan=plan, kind=PlanEvent.Kind.CREATED, actor_label="scenario")
PlanEvent.objects.create(plan=plan, kind=PlanEvent.Kind.CLARIFICATION_ASKED, actor_label="scenario",
                         reason=plan.clarification_question)
print(json.dumps({"agent": agent.pk, "plan": plan.pk}))
"""


@pytest.fixture(scope="module")
def question(server: Server) -> dict[str, Any]:
    result: dict[str, Any] = json.loads(manage(server.env, "shell", "-c", QUESTION_SCENARIO).strip().splitlines()[-1])
    return result


def test_question_is_answered_in_the_inbox(login: Login, question: dict[str, Any]) -> None:
    page = login(OPERATOR)
    page.goto(f"/agents/{question['agent']}/")
    expect(page.locator("#agent-following")).to_contain_text("The planner asks: Which files, and what result?")
    expect(page.locator("#agent-following")).not_to_contain_text("No open plans")

    page.goto("/inbox/")
    expect(page.locator("#live-status")).to_have_class(re.compile(r"\bon\b"))
    item = page.locator(f"#inbox-question-{question['plan']}")
    expect(item).to_contain_text("Planner asks a question")
    expect(item).to_contain_text("The planner asks: Which files, and what result?")
    before = int(page.locator("#inbox-count").get_attribute("data-count") or "0")
    assert before >= 1

    item.get_by_label("Your answer").fill("convert data.csv to JSON")
    item.get_by_role("button", name="Answer and plan again").click()
    expect(page.locator("#flash")).to_contain_text("Answer given to Quester; the agent plans again with it next cycle.")
    expect(item).to_have_count(0)

    page.goto(f"/agents/{question['agent']}/")
    expect(page.locator("#agent-following")).to_contain_text("Replan scheduled: operator answered")
    expect(page.locator("#agent-following")).not_to_contain_text("No open plans")
