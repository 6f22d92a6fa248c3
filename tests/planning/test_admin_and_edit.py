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
