"""Hostile input through the operator's forms: each refused with a clear message, nothing changed, never
a server error. (On PostgreSQL a NUL or a lone surrogate in JSON used to fail in the database: a 500.)"""

from __future__ import annotations

from typing import Any

import pytest
from django.test import Client
from django.urls import reverse

from planning import services
from planning.models import Plan, PlanEvent, PlanStep
from tests.factories import AgentFactory, PlanFactory, PlanStepFactory

pytestmark = pytest.mark.django_db


@pytest.fixture
def client_500(operator: object) -> Client:
    client = Client(raise_request_exception=False)  # a server error shows as a 500, as in a browser
    client.force_login(operator)  # type: ignore[arg-type]
    return client


def write_step() -> PlanStep:
    plan = PlanFactory(agent=AgentFactory(kind="tool"))
    return PlanStepFactory(plan=plan, key="1", position=1, description="Write the notes", tool="file.write",
                           action_hint="", tool_input={"path": "notes.txt", "content": "hello"})


DEEP = 5_000
HOSTILE_JSON = {
    "deep nesting": ('{"path": "notes.txt", "content": "x", "extra": ' + "[" * DEEP + "]" * DEEP + "}",
                     "nested too deeply"),
    "deep nesting beyond the size limit": ('{"path": "n.txt", "content": ' + "[" * 60_000 + "]" * 60_000 + "}",
                                           "at most 20000 characters"),
    "a 5,000-digit integer": ('{"path": "notes.txt", "content": "x", "n": 1' + "0" * 4_999 + "}", "number too large"),
    "a NUL character": ('{"path": "notes.txt", "content": "a\\u0000b"}', "NUL character"),
    "a lone surrogate": ('{"path": "notes.txt", "content": "\\ud800"}', "lone surrogate"),
    "a surrogate in a key": ('{"path": "notes.txt", "content": "x", "\\udfff": 1}', "lone surrogate"),
    "NaN": ('{"path": "notes.txt", "content": NaN}', "not a JSON number"),
    "a bidirectional override in the path": ('{"path": "cod\\u202egnp.exe", "content": "x"}', "bidirectional"),
    "an escaping path": ('{"path": "../../..", "content": "x"}', "escapes the workspace"),
}


@pytest.mark.parametrize("name", list(HOSTILE_JSON))
def test_step_edit_refuses_hostile_json_and_changes_nothing(client_500: Client, name: str) -> None:
    raw, message = HOSTILE_JSON[name]
    step = write_step()
    response = client_500.post(reverse("step-edit", args=[step.pk]),
                               {"description": "Write the notes", "tool": "file.write", "tool_input": raw})
    assert response.status_code == 400, response.content[:300]
    assert message in response.content.decode()
    step.refresh_from_db()
    assert step.tool_input == {"path": "notes.txt", "content": "hello"}
    assert not PlanEvent.objects.exists()


@pytest.mark.parametrize(("text", "message"), [
    ("a\x00b", "Null characters are not allowed"),
    ("bell\x07", "control character"),
    ("see \u202eelif", "bidirectional"),
])
def test_step_edit_refuses_hostile_description(client_500: Client, text: str, message: str) -> None:
    step = write_step()
    response = client_500.post(reverse("step-edit", args=[step.pk]), {
        "description": text, "tool": "file.write", "tool_input": '{"path": "notes.txt", "content": "hello"}'})
    assert response.status_code == 400
    assert message in response.content.decode()
    step.refresh_from_db()
    assert step.description == "Write the notes"


BAD_REASONS = {"too long": ("x" * 2_001, "at most 2000 characters"), "a NUL": ("stop\x00", "Null characters"),
               "a control character": ("stop\x1b[31m", "control character")}


@pytest.mark.parametrize("name", list(BAD_REASONS))
def test_plan_cancel_refuses_an_invalid_reason_instead_of_dropping_it(client_500: Client, name: str) -> None:
    reason, message = BAD_REASONS[name]
    plan = PlanFactory(status=Plan.Status.ACTIVE)
    response = client_500.post(reverse("plan-cancel", args=[plan.pk]), {"reason": reason})
    assert response.status_code == 400
    assert message in response.content.decode() and "Nothing was changed" in response.content.decode()
    plan.refresh_from_db()
    assert plan.status == Plan.Status.ACTIVE
    assert not PlanEvent.objects.exists()


@pytest.mark.parametrize("name", list(BAD_REASONS))
def test_step_skip_refuses_an_invalid_reason_instead_of_dropping_it(client_500: Client, name: str) -> None:
    reason, message = BAD_REASONS[name]
    step = write_step()
    response = client_500.post(reverse("step-skip", args=[step.pk]), {"reason": reason})
    assert response.status_code == 400
    assert message in response.content.decode()
    step.refresh_from_db()
    assert step.status == PlanStep.Status.PENDING
    assert not PlanEvent.objects.exists()


def test_step_decline_says_what_is_wrong_with_too_long_feedback(client_500: Client) -> None:
    step = write_step()
    PlanStep.objects.filter(pk=step.pk).update(status=PlanStep.Status.AWAITING_APPROVAL)
    response = client_500.post(reverse("step-decline", args=[step.pk]), {"feedback": "no " * 1_000})
    assert response.status_code == 400
    assert "at most 2000 characters" in response.content.decode()
    step.refresh_from_db()
    assert step.status == PlanStep.Status.AWAITING_APPROVAL


@pytest.mark.parametrize("reason", ["x" * 2_001, "a\x00b", "\ud800", "esc\x1b"])
def test_services_refuse_invalid_reasons_whoever_calls_them(operator: object, reason: str) -> None:
    """The API and the runner call the services directly: the same refusal there."""
    plan = PlanFactory(status=Plan.Status.ACTIVE)
    step = PlanStepFactory(plan=plan)
    with pytest.raises(services.DecisionError, match="Nothing was changed"):
        services.plan_cancel(plan=plan, user=operator, reason=reason)
    with pytest.raises(services.DecisionError, match="Nothing was changed"):
        services.step_skip(step=step, user=operator, reason=reason)
    plan.refresh_from_db()
    step.refresh_from_db()
    assert plan.status == Plan.Status.ACTIVE and step.status == PlanStep.Status.PENDING


def test_service_step_edit_refuses_hostile_json_given_as_values(operator: object) -> None:
    step = write_step()
    deep: object = "x"
    for _ in range(500):
        deep = [deep]
    for value in ({"path": "notes.txt", "content": deep}, {"path": "notes.txt", "content": "\x00"},
                  {"path": "notes.txt", "content": "x", "n": 10 ** 5000}):
        with pytest.raises(services.DecisionError, match="Nothing was changed"):
            services.step_edit(step=step, user=operator, changes={"tool_input": value})
    step.refresh_from_db()
    assert step.tool_input == {"path": "notes.txt", "content": "hello"}


@pytest.mark.parametrize("name", ["report\u202etxt.exe", "a\u2066b", "bell\x07.txt", "zero\u200bwidth.txt"])
def test_tools_refuse_file_names_that_display_as_another(tmp_path: object, name: str) -> None:
    from agents.tools import ToolError, path_problem, tool_run

    assert "control or bidirectional" in (path_problem(name) or "")
    with pytest.raises(ToolError, match="control or bidirectional"):
        tool_run("file.write", {"path": name, "content": "x"}, workspace=tmp_path)  # type: ignore[arg-type]


def test_tools_show_an_existing_file_name_with_a_bidi_override_escaped(tmp_path: object) -> None:
    from pathlib import Path

    from agents.tools import tool_run

    workspace = Path(str(tmp_path))
    (workspace / "invoice\u202efdp.exe").write_text("x")
    listing = tool_run("file.list", {}, workspace=workspace)
    assert "\u202e" not in listing
    assert "invoice\\u202efdp.exe" in listing


def editor_post(client: Client, step: PlanStep, **fields: str) -> Any:
    """Save the plan editor's form for the one-step plan of `write_step`, with `fields` changed."""
    row = {"key": "1", "description": "Write the notes", "tool": "file.write",
           "input": '{"path": "notes.txt", "content": "hello"}', "expected_outcome": "", "estimated_cycles": "1",
           "depends_on": ""}
    reason = fields.pop("reason", "")
    row |= fields
    data = {"version": str(step.plan.version), "op": "save", "row": ["0"], "reason": reason}
    data |= {f"0-{name}": value for name, value in row.items()}
    return client.post(reverse("plan-editor", args=[step.plan.pk]), data)


HOSTILE_TEXTS = {"a NUL": ("a\x00b", "NUL"), "a bidi override": ("X safe \u202e gpj.exe", "bidirectional"),
                 "an ANSI escape": ("\x1b[31mred", "control character"), "a C1 control": ("a\x85b", "control"),
                 "a right-to-left mark": ("abc\u200fdef", "bidirectional")}


@pytest.mark.parametrize("field", ["description", "expected_outcome", "reason"])
@pytest.mark.parametrize("name", list(HOSTILE_TEXTS))
def test_plan_editor_refuses_hostile_text_and_saves_nothing(client_500: Client, field: str, name: str) -> None:
    text, message = HOSTILE_TEXTS[name]
    step = write_step()
    response = editor_post(client_500, step, **{field: text})
    assert response.status_code == 400, response.content[:300]
    assert message in response.content.decode()
    assert Plan.objects.count() == 1 and not PlanEvent.objects.exists()


@pytest.mark.parametrize("field", ["description", "expected_outcome", "tool"])
@pytest.mark.parametrize("text", ["a\x00b", "a\x1bb"])
def test_a_nul_in_the_plan_editor_is_a_field_error_like_any_control_character(client_500: Client, field: str,
                                                                               text: str) -> None:
    step = write_step()
    response = editor_post(client_500, step, **{field: text})
    assert response.status_code == 400
    assert response["Content-Type"].startswith("text/html")  # the editor again, not a plain-text refusal
    html = response.content.decode()
    assert "The plan was not saved: fix the marked fields" in html
    label = {"description": "Description", "expected_outcome": "Expected outcome", "tool": "Tool"}[field]
    assert f"{label} contains a {'NUL' if '\x00' in text else 'control'} character" in html
    assert Plan.objects.count() == 1 and not PlanEvent.objects.exists()


def test_a_nul_in_another_form_is_still_refused_before_the_view(client_500: Client) -> None:
    step = write_step()
    response = client_500.post(reverse("plan-cancel", args=[step.plan.pk]), {"reason": "a\x00b"})
    assert response.status_code == 400 and response["Content-Type"].startswith("text/plain")
    assert b"NUL" in response.content and b"Nothing was changed" in response.content


@pytest.mark.parametrize("name", ["deep nesting", "a 5,000-digit integer", "NaN", "a NUL character"])
def test_plan_editor_refuses_hostile_tool_input_as_a_form_error(client_500: Client, name: str) -> None:
    raw, message = HOSTILE_JSON[name]
    step = write_step()
    response = editor_post(client_500, step, input=raw)
    assert response.status_code == 400, response.content[:300]
    assert message in response.content.decode()
    assert Plan.objects.count() == 1 and not PlanEvent.objects.exists()


def test_plan_editor_refuses_a_huge_number_of_cycles_as_a_form_error(client_500: Client) -> None:
    step = write_step()
    response = editor_post(client_500, step, estimated_cycles="9" * 5_000)
    assert response.status_code == 400
    assert "whole number" in response.content.decode()


@pytest.mark.parametrize("text", ["\u200eleft", "right\u200f", "arabic\u061cmark"])
def test_step_edit_refuses_direction_marks(client_500: Client, text: str) -> None:
    step = write_step()
    response = client_500.post(reverse("step-edit", args=[step.pk]), {
        "description": text, "tool": "file.write", "tool_input": '{"path": "notes.txt", "content": "hello"}'})
    assert response.status_code == 400
    assert "bidirectional" in response.content.decode()
    step.refresh_from_db()
    assert step.description == "Write the notes"


@pytest.mark.parametrize("url", ["/audit/?plan=99999999999999999999999", "/audit/export.csv?plan=99999999999999999999999",
                                 "/audit/export.json?plan=99999999999999999999999",
                                 "/plans/compare/?a=99999999999999999999999&b=1", "/plans/compare/?a=%C2%B2&b=1",
                                 "/usage/?agent=99999999999999999999999"])
def test_huge_integers_in_query_strings_are_refused_not_a_server_error(client_500: Client, url: str) -> None:
    PlanFactory()
    response = client_500.get(url)
    assert response.status_code in (200, 400), response.status_code
    if "export" in url:
        assert response.status_code == 400
        assert b"Plan id" in response.content or b"less than or equal" in response.content


@pytest.fixture
def admin_500(db: None) -> Client:
    from tests.factories import UserFactory

    client = Client(raise_request_exception=False)
    client.force_login(UserFactory(username="root", is_staff=True, is_superuser=True))
    return client


@pytest.mark.parametrize(("field", "text", "message"), [
    ("name", "evil \u202eexe.txt", "bidirectional"), ("backstory", "ring\x07", "control character"),
    ("backstory", "a\u200fb", "bidirectional"), ("name", "\x1b[31mred", "control character"),
])
def test_admin_refuses_what_the_forms_refuse_in_agent_texts(admin_500: Client, field: str, text: str,
                                                           message: str) -> None:
    from tests.planning.test_admin_and_edit import admin_post_data

    agent = AgentFactory(kind="tool", name="Tess")
    url = reverse("admin:agents_agent_change", args=[agent.pk])
    response = admin_500.post(url, admin_post_data(admin_500, url) | {field: text})
    assert response.status_code == 200 and message in response.content.decode()
    agent.refresh_from_db()
    assert getattr(agent, field) != text and agent.name == "Tess"


@pytest.mark.parametrize("field", ["key", "description", "expected_outcome"])  # result, error: read-only
def test_admin_refuses_a_bell_in_step_texts(admin_500: Client, field: str) -> None:
    from tests.planning.test_admin_and_edit import admin_post_data

    step = write_step()
    url = reverse("admin:planning_planstep_change", args=[step.pk])
    response = admin_500.post(url, admin_post_data(admin_500, url) | {field: "bell\x07"})
    assert response.status_code == 200 and "control character" in response.content.decode()
    step.refresh_from_db()
    assert getattr(step, field) != "bell\x07"


def test_admin_refuses_a_bidi_override_in_a_token_label(admin_500: Client) -> None:
    from agents.models import AgentToken

    agent = AgentFactory(kind="external")
    response = admin_500.post(reverse("admin:agents_agenttoken_add"), {"agent": agent.pk, "label": "ci \u202ebot"})
    assert response.status_code == 200 and "bidirectional" in response.content.decode()
    assert not AgentToken.objects.exists()


@pytest.mark.parametrize("query", ["status__exact=%00", "q=%00", "agent__id__exact=1%00", "q=%FF%FE"])
def test_admin_list_filters_refuse_a_nul_or_invalid_utf8_not_a_server_error(admin_500: Client, query: str) -> None:
    PlanFactory()
    response = admin_500.get(f"/admin/planning/plan/?{query}")
    assert response.status_code == 400
    assert "Nothing was changed" in response.content.decode()


def test_forms_refuse_invalid_utf8_like_the_api(client_500: Client) -> None:
    plan = PlanFactory(status=Plan.Status.ACTIVE)
    response = client_500.post(reverse("plan-cancel", args=[plan.pk]), b"reason=stop%FF%FEnow",
                               content_type="application/x-www-form-urlencoded")
    assert response.status_code == 400 and "not valid UTF-8" in response.content.decode()
    plan.refresh_from_db()
    assert plan.status == Plan.Status.ACTIVE and not PlanEvent.objects.exists()


def test_multipart_forms_refuse_invalid_utf8_too(client_500: Client) -> None:
    plan = PlanFactory(status=Plan.Status.ACTIVE)
    boundary = "hostile"
    body = (f"--{boundary}\r\nContent-Disposition: form-data; name=\"reason\"\r\n\r\n".encode()
            + b"stop\xff\xfenow\r\n" + f"--{boundary}--\r\n".encode())
    response = client_500.post(reverse("plan-cancel", args=[plan.pk]), body,
                               content_type=f"multipart/form-data; boundary={boundary}")
    assert response.status_code == 400 and "not valid UTF-8" in response.content.decode()
    plan.refresh_from_db()
    assert plan.status == Plan.Status.ACTIVE and not PlanEvent.objects.exists()
