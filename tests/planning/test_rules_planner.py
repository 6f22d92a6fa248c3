"""The rule shortcut is a planner like any other (issue 52): named "rules" on its plans and pages, counted on the
usage page, and switchable per agent (Agent.rules_planner, in the admin)."""

from __future__ import annotations

from typing import Any

import pytest
from django.test import Client

from agents.models import Agent
from planning.models import Plan
from planning.planner import plan_generate
from tests.factories import AgentFactory
from tests.llm_server import LLMTestServer, answer

pytestmark = pytest.mark.django_db

GOAL = "Convert data.csv to JSON"  # an everyday goal the rules turn into one step


def tool_agent(**fields: Any) -> Agent:
    agent = AgentFactory(name="Converter", kind=Agent.Kind.TOOL, **fields)
    agent.workspace.mkdir(parents=True, exist_ok=True)
    (agent.workspace / "data.csv").write_text("a,b\n1,2\n")
    return agent


@pytest.fixture
def small(settings: Any, llm_server: LLMTestServer) -> LLMTestServer:
    settings.LLM_MODELS = {"planner": ["tiny"], "fast": ["tiny"]}
    settings.LLM_MODEL_SETTINGS = {"tiny": {"small": True, "format": "json_object"}}
    settings.PLAN_ONE_STEP_SHORTCUT = "small"
    return llm_server


def test_a_rules_plan_names_the_rules_as_its_planner_on_the_plan_and_usage_pages(
        small: LLMTestServer, viewer_client: Client) -> None:
    plan = plan_generate(agent=tool_agent(), goal_text=GOAL)
    assert plan.status == Plan.Status.AWAITING_APPROVAL and plan.model == "rules"
    assert not small.requests  # no model was asked
    page = viewer_client.get(plan.get_absolute_url()).content.decode()
    assert "planned by: <code>rules</code>" in page
    usage = viewer_client.get("/usage/").content.decode()
    planners = usage[usage.index('id="usage-planners"'):]
    planners = planners[:planners.index("</section>")]
    assert "<td>rules (one step, no model call)</td><td class=\"num\">1</td>" in planners


def test_an_agent_with_the_rules_planner_off_has_the_model_plan_its_everyday_goals(small: LLMTestServer,
                                                                                   viewer_client: Client) -> None:
    steps = ('{"goal": "Convert data.csv to JSON", "steps": [{"id": "1", "tool": "file.convert", "intent": "Convert",'
             ' "input": {"path": "data.csv", "to": "json"}, "requiresPermission": true, "dependsOn": []}]}')
    small.script("tiny", answer(steps))
    plan = plan_generate(agent=tool_agent(rules_planner=False), goal_text=GOAL)
    assert plan.status == Plan.Status.AWAITING_APPROVAL and plan.model == "tiny"
    assert len(small.requests_for("tiny")) == 1
    usage = viewer_client.get("/usage/").content.decode()
    planners = usage[usage.index('id="usage-planners"'):usage.index("</section>", usage.index('id="usage-planners"'))]
    assert "<td>tiny</td>" in planners and "rules" not in planners.split("</table>")[0]


def test_the_rules_planner_is_editable_in_the_admin(admin_client: Client) -> None:
    agent = tool_agent()
    page = admin_client.get(f"/admin/agents/agent/{agent.pk}/change/").content.decode()
    assert 'name="rules_planner"' in page
