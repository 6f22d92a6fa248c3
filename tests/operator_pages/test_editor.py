"""The plan editor: a whole plan edited and saved as version n+1 only when the planner's validator accepts it."""

from __future__ import annotations

import re
from typing import Any

import pytest
from django.test import Client
from django.urls import reverse

from agents.models import Agent
from planning.engine.validate import StepSpec
from planning.models import Plan, PlanEvent, PlanStep
from planning.services import PlanEditInvalid, StaleVersion, plan_edit_save
from tests.factories import PlanFactory, PlanStepFactory

pytestmark = pytest.mark.django_db


def tool_plan(status: str = Plan.Status.AWAITING_APPROVAL) -> Plan:
    plan = PlanFactory(status=status, agent__kind=Agent.Kind.TOOL, goal__description="Convert data.csv to JSON",
                       approval_mode=Plan.ApprovalMode.PENDING if status == Plan.Status.AWAITING_APPROVAL else "all")
    PlanStepFactory(plan=plan, key="1", position=1, description="Read the CSV", tool="file.read",
                    tool_input={"path": "data.csv"}, action_hint="file.read", status=PlanStep.Status.COMPLETED
                    if status == Plan.Status.ACTIVE else PlanStep.Status.PENDING, result="a,b")
    PlanStepFactory(plan=plan, key="2", position=2, description="Write the JSON", tool="file.write",
                    tool_input={"path": "data.json", "content": "[1]"}, action_hint="file.write", depends_on=["1"],
                    requires_permission=True, risk="risky")
    return plan


def form(plan: Plan, rows: list[dict[str, Any]], op: str = "save", **extra: str) -> dict[str, Any]:
    data: dict[str, Any] = {"version": str(plan.version), "op": op, "row": [str(i) for i in range(len(rows))]} | extra
    for i, row in enumerate(rows):
        for name, value in row.items():
            if name == "requires_permission":
                if value:
                    data[f"{i}-{name}"] = "on"
            else:
                data[f"{i}-{name}"] = value
    return data


def rows_of(plan: Plan) -> list[dict[str, Any]]:
    return [{"key": s.key, "description": s.description, "tool": s.tool, "input": s.input_display,
             "expected_outcome": s.expected_outcome, "estimated_cycles": str(s.estimated_cycles),
             "depends_on": ", ".join(s.depends_on), "requires_permission": s.requires_permission}
            for s in plan.steps.exclude(status=PlanStep.Status.COMPLETED)]


def test_editor_shows_every_step_to_operators_and_is_forbidden_to_viewers(operator_client: Client,
                                                                          viewer_client: Client) -> None:
    plan = tool_plan()
    url = reverse("plan-editor", args=[plan.pk])
    html = operator_client.get(url).content.decode()
    assert "Read the CSV" in html and "Write the JSON" in html and "Save as version 2" in html
    assert viewer_client.get(url).status_code == 403
    assert viewer_client.post(url, form(plan, rows_of(plan))).status_code == 403


def test_add_remove_and_reorder_change_the_form_only(operator_client: Client) -> None:
    plan = tool_plan()
    url = reverse("plan-editor", args=[plan.pk])
    rows = rows_of(plan)
    html = operator_client.post(url, form(plan, rows, op="add"), HTTP_HX_REQUEST="true").content.decode()
    assert html.count('name="row"') == 3 and 'name="2-key" value="3"' in html
    html = operator_client.post(url, form(plan, rows, op="remove-0"), HTTP_HX_REQUEST="true").content.decode()
    assert html.count('name="row"') == 1 and "Read the CSV" not in html
    html = operator_client.post(url, form(plan, rows, op="down-0"), HTTP_HX_REQUEST="true").content.decode()
    assert html.index("Write the JSON") < html.index("Read the CSV")
    assert Plan.objects.count() == 1 and PlanEvent.objects.count() == 0


def test_invalid_edit_shows_errors_by_the_field_and_saves_nothing(operator_client: Client) -> None:
    plan = tool_plan()
    rows = rows_of(plan)
    rows[0]["input"] = "{not json"
    rows[1]["tool"] = "delete_everything"
    response = operator_client.post(reverse("plan-editor", args=[plan.pk]), form(plan, rows), HTTP_HX_REQUEST="true")
    html = response.content.decode()
    assert response.status_code == 400
    assert "Input is not valid JSON" in html
    assert "The plan was not saved" in html
    rows[0]["input"] = '{"path": "data.csv"}'
    html = operator_client.post(reverse("plan-editor", args=[plan.pk]), form(plan, rows),
                                HTTP_HX_REQUEST="true").content.decode()
    assert "Unknown tool &#x27;delete_everything&#x27;" in html
    # the error sits in the tool field of the second row
    row = html[html.index('id="row-1"'):]
    assert row.index("Unknown tool") < row.index("Input (JSON)")
    assert Plan.objects.count() == 1 and PlanEvent.objects.count() == 0


def test_valid_edit_saves_version_two_with_its_diff(operator_client: Client) -> None:
    plan = tool_plan()
    rows = rows_of(plan)
    rows[1]["description"] = "Write the JSON file"
    rows.append({"key": "3", "description": "List the workspace", "tool": "file.list", "input": "{}",
                 "depends_on": "2", "estimated_cycles": "1"})
    response = operator_client.post(reverse("plan-editor", args=[plan.pk]), form(plan, rows, reason="add a check"),
                                    HTTP_HX_REQUEST="true")
    assert response.status_code == 200
    new = Plan.objects.get(previous=plan)
    assert response["HX-Redirect"] == new.get_absolute_url()
    assert new.version == 2 and new.status == Plan.Status.AWAITING_APPROVAL
    assert [s.key for s in new.steps.all()] == ["1", "2", "3"]
    plan.refresh_from_db()
    assert plan.status == Plan.Status.REPLANNED
    validated = PlanEvent.objects.get(plan=new, kind=PlanEvent.Kind.VALIDATED)
    assert [a["key"] for a in validated.detail["diff"]["added"]] == ["3"]
    assert validated.detail["diff"]["changed"] == [
        {"key": "2", "fields": {"description": ["Write the JSON", "Write the JSON file"]}}]
    assert validated.detail["diff"]["kept"] == ["1"]
    assert PlanEvent.objects.get(plan=plan, kind=PlanEvent.Kind.PLAN_EDITED).actor_label == "olga"
    html = operator_client.get(new.get_absolute_url()).content.decode()
    assert "Changes from version 1" in html


def test_edit_of_an_active_plan_keeps_completed_steps(operator) -> None:  # type: ignore[no-untyped-def]
    plan = tool_plan(status=Plan.Status.ACTIVE)
    new = plan_edit_save(plan=plan, user=operator, seen_version=1, steps=[
        StepSpec(key="1", description="Redo the read?", tool="file.read", input={"path": "other.csv"}),
        StepSpec(key="2", description="Write the JSON", tool="file.write",
                   input={"path": "data.json", "content": "[1]"}, depends_on=["1"], requires_permission=True),
    ])
    kept = new.steps.get(key="1")
    assert kept.status == PlanStep.Status.COMPLETED and kept.carried_over and kept.tool_input == {"path": "data.csv"}
    assert new.status == Plan.Status.ACTIVE


def test_edit_on_a_stale_version_is_refused_with_the_current_version(operator) -> None:  # type: ignore[no-untyped-def]
    plan = tool_plan()
    steps = [StepSpec(key="1", description="Read the CSV", tool="file.read", input={"path": "data.csv"})]
    v2 = plan_edit_save(plan=plan, user=operator, seen_version=1, steps=steps)
    with pytest.raises(StaleVersion) as refused:
        plan_edit_save(plan=plan, user=operator, seen_version=1, steps=steps)
    assert refused.value.current == v2
    assert "the plan is now version 2" in str(refused.value)
    assert Plan.objects.count() == 2


def test_finished_plans_cannot_be_edited(operator_client: Client) -> None:
    plan = tool_plan()
    Plan.objects.filter(pk=plan.pk).update(status=Plan.Status.COMPLETED)
    html = operator_client.get(reverse("plan-editor", args=[plan.pk])).content.decode()
    assert "only plans awaiting approval or active can be edited" in html
    response = operator_client.post(reverse("plan-editor", args=[plan.pk]), form(plan, rows_of(plan)),
                                    HTTP_HX_REQUEST="true")
    assert response.status_code == 409 and Plan.objects.count() == 1


def test_dependency_cycle_is_refused(operator) -> None:  # type: ignore[no-untyped-def]
    plan = tool_plan()
    with pytest.raises(PlanEditInvalid) as refused:
        plan_edit_save(plan=plan, user=operator, seen_version=1, steps=[
            StepSpec(key="1", description="Read", tool="file.read", input={"path": "data.csv"}, depends_on=["2"]),
            StepSpec(key="2", description="Read again", tool="file.read", input={"path": "data.csv"}, depends_on=["1"]),
        ])
    assert any("cycle" in p for p in refused.value.problems)
    assert Plan.objects.count() == 1


def three_read_plan() -> Plan:
    """A tool plan of three reads in a chain: 1 -> 2 -> 3."""
    plan = PlanFactory(status=Plan.Status.AWAITING_APPROVAL, agent__kind=Agent.Kind.TOOL,
                       approval_mode=Plan.ApprovalMode.PENDING)
    for key, path in (("1", "a.csv"), ("2", "b.csv"), ("3", "c.csv")):
        PlanStepFactory(plan=plan, key=key, position=int(key), description=f"Read {path}", tool="file.read",
                        tool_input={"path": path}, action_hint="file.read",
                        depends_on=[str(int(key) - 1)] if key != "1" else [])
    return plan


def row_deps(html: str) -> dict[str, str]:
    """Each row's step id and its "Depends on" field, in the order the editor shows them."""
    keys = re.findall(r'name="(\d+)-key" value="([^"]*)"', html)
    deps = dict(re.findall(r'name="(\d+)-depends_on" value="([^"]*)"', html))
    return {key: deps[index] for index, key in keys}


def test_reorder_asks_whether_to_keep_or_update_dependencies(operator_client: Client) -> None:
    plan = three_read_plan()
    url = reverse("plan-editor", args=[plan.pk])
    html = operator_client.post(url, form(plan, rows_of(plan), op="up-2"), HTTP_HX_REQUEST="true").content.decode()
    assert list(row_deps(html)) == ["1", "3", "2"]
    assert row_deps(html) == {"1": "", "3": "2", "2": "1"}  # moved, not yet rewired: the operator is asked
    assert "Keep them, or update them to follow the new order?" in html
    assert 'name="reordered_from" value="1,2,3"' in html

    moved = [dict(r) for r in rows_of(plan)]
    moved = [moved[0], moved[2], moved[1]]
    kept = operator_client.post(url, form(plan, moved, op="deps-keep", reordered_from="1,2,3"),
                                HTTP_HX_REQUEST="true").content.decode()
    assert row_deps(kept) == {"1": "", "3": "2", "2": "1"} and "reordered_from" not in kept

    updated = operator_client.post(url, form(plan, moved, op="deps-update", reordered_from="1,2,3"),
                                   HTTP_HX_REQUEST="true").content.decode()
    assert row_deps(updated) == {"1": "", "3": "1", "2": "3"} and "reordered_from" not in updated


def test_updated_dependencies_are_saved_and_hand_made_ones_kept(operator_client: Client) -> None:
    plan = three_read_plan()
    PlanStep.objects.filter(plan=plan, key="3").update(depends_on=["1"])  # chosen by hand: not the old order
    rows = rows_of(plan)
    moved = [rows[1], rows[0], rows[2]]  # 2 before 1
    url = reverse("plan-editor", args=[plan.pk])
    updated = operator_client.post(url, form(plan, moved, op="deps-update", reordered_from="1,2,3"),
                                   HTTP_HX_REQUEST="true").content.decode()
    assert row_deps(updated) == {"2": "", "1": "2", "3": "1"}
    rows_now = [dict(r, depends_on=row_deps(updated)[r["key"]]) for r in moved]
    operator_client.post(url, form(plan, rows_now), HTTP_HX_REQUEST="true")
    new = Plan.objects.get(previous=plan)
    assert [(s.key, s.depends_on) for s in new.steps.order_by("position")] == [("2", []), ("1", ["2"]), ("3", ["1"])]


def test_an_edited_version_says_who_edited_it(operator_client: Client) -> None:
    plan = tool_plan()
    PlanEvent.objects.create(plan=plan, kind=PlanEvent.Kind.VALIDATED, actor_label="runner")
    Plan.objects.filter(pk=plan.pk).update(model="offline-rules")
    operator_client.post(reverse("plan-editor", args=[plan.pk]), form(plan, rows_of(plan), reason="tidy"),
                         HTTP_HX_REQUEST="true")
    new = Plan.objects.get(previous=plan)
    html = operator_client.get(new.get_absolute_url()).content.decode()
    assert "edited by olga in the plan editor" in html
    assert "Written by olga in the plan editor and checked by the validator" in html
    assert "planned by: <code>offline-rules</code>" not in html and "Accepted at the first attempt" not in html
    assert "planned by: <code>offline-rules</code>" in operator_client.get(plan.get_absolute_url()).content.decode()


def external_plan() -> Plan:
    from tests.api.conftest import TOOLS

    plan = PlanFactory(status=Plan.Status.AWAITING_APPROVAL, agent__kind=Agent.Kind.EXTERNAL,
                       agent__declared_tools=TOOLS, approval_mode=Plan.ApprovalMode.PENDING)
    PlanStepFactory(plan=plan, key="1", position=1, description="Find the report", tool="search",
                    tool_input={"query": "q3"}, action_hint="")
    return plan


def test_editor_of_an_external_agent_shows_its_declared_tools(operator_client: Client) -> None:
    plan = external_plan()
    html = operator_client.get(reverse("plan-editor", args=[plan.pk])).content.decode()
    assert 'name="0-tool"' in html and 'name="0-input"' in html
    assert '<option value="send_email"' in html and "file.read" not in html


def test_editor_saves_an_external_agents_plan_checked_against_its_tools(operator_client: Client) -> None:
    plan = external_plan()
    url = reverse("plan-editor", args=[plan.pk])
    rows = rows_of(plan)
    rows[0]["input"] = '{"query": "q3 report"}'
    response = operator_client.post(url, form(plan, rows))
    assert response.status_code == 302
    new = Plan.objects.get(previous=plan)
    assert new.steps.get().tool_input == {"query": "q3 report"}
    rows[0]["tool"] = "file.read"  # a built-in tool this agent never declared
    response = operator_client.post(reverse("plan-editor", args=[new.pk]), form(new, rows))
    assert response.status_code == 400 and "unknown tool" in response.content.decode().lower()
    assert Plan.objects.count() == 2


def test_step_edit_of_an_external_agent_offers_and_saves_its_declared_tools(operator_client: Client) -> None:
    plan = external_plan()
    step = plan.steps.get()
    url = reverse("step-edit", args=[step.pk])
    assert '<option value="send_email"' in operator_client.get(url).content.decode()
    response = operator_client.post(url, {"description": "Mail Dana", "tool": "send_email",
                                          "tool_input": '{"to": "dana@example.com", "body": "hi"}'})
    assert response.status_code == 302, response.content[:400]
    step.refresh_from_db()
    assert (step.tool, step.tool_input["to"]) == ("send_email", "dana@example.com")
