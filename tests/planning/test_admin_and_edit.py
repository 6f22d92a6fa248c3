"""Admin edits and step edits are recorded like any other change: who, what, the diff."""

from __future__ import annotations

from typing import Any

import pytest
from django.test import Client
from django.urls import reverse

from planning.models import PlanEvent, PlanStep
from tests.factories import AgentFactory, PlanFactory, PlanStepFactory, UserFactory

pytestmark = pytest.mark.django_db


@pytest.fixture
def admin_client_logged(db: None) -> Client:
    client = Client()
    client.force_login(UserFactory(username="root", is_staff=True, is_superuser=True))
    return client


def test_admin_plan_edit_is_recorded_with_diff(admin_client_logged: Client) -> None:
    plan = PlanFactory(thinking_summary="old idea")
    url = reverse("admin:planning_plan_change", args=[plan.pk])
    page = admin_client_logged.get(url)
    assert page.status_code == 200
    form = page.context["adminform"].form
    data = {k: ("" if v is None else v) for k, v in form.initial.items() if not isinstance(v, (list, dict))}
    data.update({"thinking_summary": "new idea", "risks": "[]", "goal": plan.goal_id, "agent": plan.agent_id,
                 "steps-TOTAL_FORMS": "0", "steps-INITIAL_FORMS": "0", "events-TOTAL_FORMS": "0",
                 "events-INITIAL_FORMS": "0"})
    response = admin_client_logged.post(url, data)
    assert response.status_code == 302, response.content.decode()[:2000]
    event = PlanEvent.objects.get(plan=plan, kind=PlanEvent.Kind.ADMIN_EDIT)
    assert event.actor_label == "root"
    assert event.detail["diff"]["thinking_summary"] == ["old idea", "new idea"]


def test_admin_event_log_is_read_only(admin_client_logged: Client) -> None:
    event = PlanEvent.objects.create(plan=PlanFactory(), kind=PlanEvent.Kind.CREATED, actor_label="runner")
    assert admin_client_logged.post(reverse("admin:planning_planevent_delete", args=[event.pk]), {"post": "yes"}).status_code == 403
    assert PlanEvent.objects.filter(pk=event.pk).exists()


def test_viewer_cannot_use_admin_to_change(viewer_client: Client) -> None:
    plan = PlanFactory()
    viewer = viewer_client
    response = viewer.post(reverse("admin:planning_plan_change", args=[plan.pk]), {"thinking_summary": "x"})
    assert response.status_code in (302, 403)
    plan.refresh_from_db()
    assert plan.thinking_summary == ""


def tool_step(**kwargs: Any) -> PlanStep:
    agent = AgentFactory(kind="tool")
    plan = PlanFactory(agent=agent)
    return PlanStepFactory(plan=plan, key="1", position=1, description="Read the data", tool="file.read",
                           action_hint="", tool_input={"path": "data.csv"}, **kwargs)


def test_step_edit_records_diff_and_revalidates(operator_client: Client, operator: object) -> None:
    step = tool_step()
    url = reverse("step-edit", args=[step.pk])
    assert "Read the data" in operator_client.get(url).content.decode()
    response = operator_client.post(url, {"description": "Read the CSV", "tool": "file.read",
                                          "tool_input": '{"path": "input/data.csv"}', "reason": "file moved"})
    assert response.status_code == 302
    step.refresh_from_db()
    assert step.tool_input == {"path": "input/data.csv"}
    event = PlanEvent.objects.get(kind=PlanEvent.Kind.STEP_EDITED)
    assert event.actor == operator and event.reason == "file moved"
    assert event.detail["changed"]["1"]["description"] == ["Read the data", "Read the CSV"]


@pytest.mark.parametrize(("tool_input", "message"), [
    ('{"path": "../../etc/passwd"}', "not valid"),
    ("{not json", "not valid JSON"),
    ('["a"]', "must be a JSON object"),
])
def test_step_edit_rejects_bad_input_and_changes_nothing(operator_client: Client, tool_input: str, message: str) -> None:
    step = tool_step()
    response = operator_client.post(reverse("step-edit", args=[step.pk]),
                                    {"description": "x", "tool": "file.read", "tool_input": tool_input})
    assert response.status_code == 400
    assert message in response.content.decode()
    step.refresh_from_db()
    assert step.tool_input == {"path": "data.csv"} and step.description == "Read the data"
    assert not PlanEvent.objects.exists()


def test_completed_step_cannot_be_edited(operator_client: Client) -> None:
    step = tool_step(status=PlanStep.Status.COMPLETED)
    response = operator_client.post(reverse("step-edit", args=[step.pk]),
                                    {"description": "changed", "tool": "file.read", "tool_input": '{"path": "a.csv"}'})
    assert response.status_code == 400
    assert "only steps not yet started can be edited" in response.content.decode()


# --- the admin obeys the services' rules ------------------------------------------------------------------


def admin_post_data(client: Client, url: str) -> dict[str, Any]:
    """The change form as the browser would post it unchanged (main form and every inline formset)."""
    page = client.get(url)
    assert page.status_code == 200
    forms = [page.context["adminform"].form]
    data: dict[str, Any] = {}
    for inline in page.context["inline_admin_formsets"]:
        formset = inline.formset
        management = formset.management_form
        data.update({management[name].html_name: management[name].value() for name in management.fields})
        forms.extend(formset.forms)
    for form in forms:
        for name in form.fields:
            value = form[name].value()
            if isinstance(value, bool):
                if value:
                    data[form[name].html_name] = "on"
            elif value is not None:
                data[form[name].html_name] = value
    return data


def step_change(client: Client, step: PlanStep, **changes: Any) -> Any:
    url = reverse("admin:planning_planstep_change", args=[step.pk])
    data = admin_post_data(client, url)
    data.update(changes)
    return client.post(url, data)


def test_admin_step_change_that_is_valid_is_saved_and_recorded(admin_client_logged: Client) -> None:
    step = tool_step()
    response = step_change(admin_client_logged, step, description="Read the CSV file")
    assert response.status_code == 302, response.content.decode()[:3000]
    step.refresh_from_db()
    assert step.description == "Read the CSV file"
    assert PlanEvent.objects.filter(kind=PlanEvent.Kind.ADMIN_EDIT).count() == 1


def test_admin_cannot_set_a_completed_step_back_to_running(admin_client_logged: Client) -> None:
    step = tool_step(status=PlanStep.Status.COMPLETED)
    response = step_change(admin_client_logged, step, status=PlanStep.Status.RUNNING)
    assert response.status_code == 200  # the form again, with the reason
    assert "completed is final" in response.content.decode()
    step.refresh_from_db()
    assert step.status == PlanStep.Status.COMPLETED
    assert not PlanEvent.objects.exists()


@pytest.mark.parametrize(("tool_input", "message"), [
    ('{"path": "../../.."}', "escapes the workspace"),
    ('{"path": "/etc/passwd"}', "outside the workspace"),
    ('{"path": "a.csv", "x": ' + "[" * 3000 + "]" * 3000 + "}", "nested too deeply"),
    ('{"path": "a.csv", "n": 1' + "0" * 4999 + "}", "number too large"),
    ('{"path": "a\\u0000.csv"}', "NUL character"),
    ('{"path": "\\ud800"}', "lone surrogate"),
])
def test_admin_refuses_a_step_input_the_services_refuse(admin_client_logged: Client, tool_input: str,
                                                         message: str) -> None:
    step = tool_step()
    response = step_change(admin_client_logged, step, tool_input=tool_input)
    assert response.status_code == 200
    assert message in response.content.decode()
    step.refresh_from_db()
    assert step.tool_input == {"path": "data.csv"}
    assert not PlanEvent.objects.exists()


def test_admin_refuses_a_bad_step_input_in_the_plan_inline(admin_client_logged: Client) -> None:
    step = tool_step()
    url = reverse("admin:planning_plan_change", args=[step.plan_id])
    data = admin_post_data(admin_client_logged, url)
    data["steps-0-tool_input"] = '{"path": "../../.."}'
    response = admin_client_logged.post(url, data)
    assert response.status_code == 200
    assert "escapes the workspace" in response.content.decode()
    step.refresh_from_db()
    assert step.tool_input == {"path": "data.csv"}


def test_admin_cannot_edit_a_started_step(admin_client_logged: Client) -> None:
    step = tool_step(status=PlanStep.Status.COMPLETED)
    response = step_change(admin_client_logged, step, tool_input='{"path": "other.csv"}')
    assert response.status_code == 200
    assert "only steps not yet started can be edited" in response.content.decode()
    step.refresh_from_db()
    assert step.tool_input == {"path": "data.csv"}


def test_admin_cannot_reopen_a_completed_plan(admin_client_logged: Client) -> None:
    plan = PlanFactory(status="completed")
    url = reverse("admin:planning_plan_change", args=[plan.pk])
    data = admin_post_data(admin_client_logged, url)
    data["status"] = "active"
    response = admin_client_logged.post(url, data)
    assert response.status_code == 200
    assert "is final" in response.content.decode()
    plan.refresh_from_db()
    assert plan.status == "completed"


@pytest.mark.parametrize("raw", ["[" * 3000 + "]" * 3000, "1" + "0" * 4999, '"\\u0000"', "NaN"])
def test_admin_json_fields_of_every_app_refuse_hostile_json(admin_client_logged: Client, raw: str) -> None:
    plan = PlanFactory()
    url = reverse("admin:planning_plan_change", args=[plan.pk])
    data = admin_post_data(admin_client_logged, url)
    data["risks"] = raw
    response = admin_client_logged.post(url, data)
    assert response.status_code == 200
    assert "errornote" in response.content.decode()
    plan.refresh_from_db()
    assert plan.risks == []
