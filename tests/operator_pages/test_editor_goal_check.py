"""Issue 50: an operator's own version (the plan editor) is checked against the goal as every planner's plan is;
what it leaves undone is shown as a validator flag naming who planned it, and the person decides: it is saved."""

from __future__ import annotations

from typing import Any

import pytest
from django.test import Client
from django.urls import reverse

from agents.models import Agent
from planning.models import Plan, PlanEvent
from tests.factories import PlanFactory, PlanStepFactory
from tests.operator_pages.test_editor import form

pytestmark = pytest.mark.django_db

GOAL = "Make a backup copy of data.csv called data_backup.csv"


def backup_plan() -> Plan:
    plan = PlanFactory(status=Plan.Status.AWAITING_APPROVAL, agent__kind=Agent.Kind.TOOL, goal__description=GOAL,
                       goal_text=GOAL, approval_mode=Plan.ApprovalMode.PENDING)
    plan.agent.workspace.mkdir(parents=True, exist_ok=True)
    (plan.agent.workspace / "data.csv").write_text("a,b\n1,2\n")
    PlanStepFactory(plan=plan, key="1", position=1, description="Copy it", tool="file.copy",
                    tool_input={"path": "data.csv", "to": "data_backup.csv"}, action_hint="file.copy",
                    requires_permission=True, risk="risky")
    return plan


def row(key: str, description: str, tool: str, tool_input: str) -> dict[str, Any]:
    return {"key": key, "description": description, "tool": tool, "input": tool_input, "expected_outcome": "",
            "estimated_cycles": "1", "depends_on": "", "requires_permission": False}


def saved_flags(plan: Plan) -> list[str]:
    new = Plan.objects.get(previous=plan)
    return list(new.events.get(kind=PlanEvent.Kind.VALIDATED).detail["flags"])


@pytest.mark.parametrize(("rows", "undone"), [
    ([row("1", "Look at the data", "file.read", '{"path": "data.csv"}')],
     ["planned by olga: the goal asks for data_backup.csv, but no step writes it (not refused: olga decides)",
      "planned by olga: the goal asks to copy a file, but no step does; use file.copy (not refused: olga decides)",
      "planned by olga: the goal asks for a change, but every step only reads; a plan of reads does not do it "
      "(not refused: olga decides)"]),
    ([row("1", "Back it up", "file.write", '{"path": "data_backup.csv", "content": "a,b"}')],
     ["planned by olga: the goal asks to copy a file, but no step does; use file.copy (not refused: olga decides)"]),
])
def test_an_edit_that_leaves_the_goal_undone_is_saved_with_a_flag_naming_the_person(
        operator_client: Client, rows: list[dict[str, Any]], undone: list[str]) -> None:
    plan = backup_plan()
    response = operator_client.post(reverse("plan-editor", args=[plan.pk]), form(plan, rows))
    assert response.status_code == 302  # saved: the person decides, no refusal
    new = Plan.objects.get(previous=plan)
    assert new.status == Plan.Status.AWAITING_APPROVAL and new.planned_by == "olga"
    flags = saved_flags(plan)
    assert [f for f in flags if f.startswith("planned by olga")] == undone
    page = operator_client.get(new.get_absolute_url()).content.decode()
    assert "Validator flags" in page and "edited by olga" in page
    assert "planned by olga: the goal asks to copy a file, but no step does" in page
    # The inbox card, where another operator may approve it, shows the same flags.
    inbox = operator_client.get(reverse("inbox")).content.decode()
    card = inbox[inbox.index(f'id="inbox-plan-{new.pk}"'):]
    assert "planned by olga: the goal asks to copy a file, but no step does" in card[:card.index("</li>\n  ")]


def test_an_edit_that_does_the_goal_has_no_goal_flag(operator_client: Client) -> None:
    plan = backup_plan()
    rows = [row("1", "Copy it elsewhere first", "file.copy", '{"path": "data.csv", "to": "data_backup.csv"}')]
    assert operator_client.post(reverse("plan-editor", args=[plan.pk]), form(plan, rows)).status_code == 302
    assert not [f for f in saved_flags(plan) if "planned by" in f]
