"""A tool agent created from the dashboard, files put into its workspace from its page: operators only, every name
and size checked first, confined to the workspace, nothing half done, every change in the audit log."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from django.test import Client
from django.urls import reverse

from agents.models import Agent
from agents.tools import TOOLS
from planner_site.asgi_guards import body_limit
from planning import services
from planning.models import Plan, PlanEvent
from planning.services import DecisionError, Upload
from runtime.cycle import agent_cycle
from tests.factories import AgentFactory

pytestmark = pytest.mark.django_db

READS = ["file.list", "file.read", "text.summarize"]


def tool_agent(operator: Any, name: str = "Clerk", tools: list[str] | None = None) -> Agent:
    return services.agent_create(user=operator, name=name, backstory="Converts the team's files",
                                 tools=tools or sorted(TOOLS))


def tree(root: Path) -> dict[str, bytes]:
    """Every file under root (hidden ones too), with its bytes."""
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


# --- creating a tool agent ---------------------------------------------------------------------------------------


def test_agent_create_makes_a_running_tool_agent_with_its_tools_and_records_who(operator: Any) -> None:
    agent = services.agent_create(user=operator, name="  Data   clerk ", backstory="Keeps CSV files tidy",
                                  tools=["file.read", "file.convert", "file.read"])
    agent.refresh_from_db()
    assert (agent.name, agent.kind, agent.status) == ("Data clerk", Agent.Kind.TOOL, Agent.Status.RUNNING)
    assert agent.tools == ["file.convert", "file.read"]
    event = PlanEvent.objects.get(agent=agent, kind=PlanEvent.Kind.AGENT_CREATED)
    assert event.actor == operator and event.actor_label == operator.username
    assert "file.convert, file.read" in event.reason and event.detail["risky_tools"] == ["file.convert"]


@pytest.mark.parametrize(("name", "tools", "says"), [
    ("", READS, "Name the agent"),
    ("   ", READS, "Name the agent"),
    ("Clerk", [], "Choose at least one tool"),
    ("Clerk", ["file.read", "shell.run"], "Unknown tools: shell.run"),
    ("Clerk\x1b[31m", READS, "The name"),
    ("x" * 101, READS, "too long"),
])
def test_agent_create_refuses_bad_input_and_changes_nothing(operator: Any, name: str, tools: list[str],
                                                            says: str) -> None:
    with pytest.raises(DecisionError, match=says) as refusal:
        services.agent_create(user=operator, name=name, tools=tools)
    assert str(refusal.value).endswith("Nothing was changed.")
    assert not Agent.objects.exists() and not PlanEvent.objects.exists()


def test_agent_create_refuses_a_name_taken_in_any_case(operator: Any) -> None:
    AgentFactory(name="Archivist")
    with pytest.raises(DecisionError, match="An agent named archivist already exists"):
        services.agent_create(user=operator, name="archivist", tools=READS)
    assert Agent.objects.count() == 1 and not PlanEvent.objects.exists()


def test_a_tool_agent_plans_only_with_the_tools_it_was_given(operator: Any) -> None:
    """The validator judges its plans against its own tools: the offline planner's conversion, which needs
    file.convert, is refused by that name for an agent given only reads, and planned for one given every tool."""
    plans = {}
    for name, tools in (("Reader", READS), ("Converter", sorted(TOOLS))):
        agent = tool_agent(operator, name=name, tools=tools)
        services.workspace_upload(agent=agent, user=operator, uploads=[Upload("data.csv", b"name\nAda\n")])
        services.agent_give_goal(agent=agent, user=operator, description="Convert data.csv to JSON")
        for _ in range(3):
            agent_cycle(agent_id=agent.pk, runner="runner-test")
        plans[name] = Plan.objects.filter(agent=agent).latest("pk")
    rejected = PlanEvent.objects.filter(plan=plans["Reader"], kind=PlanEvent.Kind.ATTEMPT_REJECTED)
    assert rejected.exists() and all("file.convert" in event.reason for event in rejected)
    assert plans["Reader"].status == Plan.Status.FAILED
    assert plans["Converter"].status == Plan.Status.AWAITING_APPROVAL
    assert "file.convert" in plans["Converter"].steps.values_list("tool", flat=True)


# --- uploading files ---------------------------------------------------------------------------------------------


def test_upload_puts_files_in_the_workspace_and_records_them(operator: Any) -> None:
    agent = tool_agent(operator)
    paths = services.workspace_upload(agent=agent, user=operator, folder="notes/", uploads=[
        Upload("monday.txt", b"The deploy went out."), Upload("people.csv", b"name\nAda\n")])
    assert paths == ["notes/monday.txt", "notes/people.csv"]
    assert tree(agent.workspace) == {"notes/monday.txt": b"The deploy went out.", "notes/people.csv": b"name\nAda\n"}
    event = PlanEvent.objects.get(agent=agent, kind=PlanEvent.Kind.FILES_UPLOADED)
    assert event.actor == operator
    assert event.reason == "Uploaded 2 files: notes/monday.txt (20 bytes), notes/people.csv (9 bytes)"
    assert event.detail["files"][0] == {"path": "notes/monday.txt", "bytes": 20, "replaced": False}


def test_upload_keeps_an_existing_file_unless_told_to_replace_it(operator: Any) -> None:
    agent = tool_agent(operator)
    services.workspace_upload(agent=agent, user=operator, uploads=[Upload("data.csv", b"old")])
    with pytest.raises(DecisionError, match="'data.csv' already exists; tick Replace") as refusal:
        services.workspace_upload(agent=agent, user=operator, uploads=[Upload("new.txt", b"n"), Upload("data.csv", b"new")])
    assert str(refusal.value).endswith("Nothing was changed.")
    assert tree(agent.workspace) == {"data.csv": b"old"}  # new.txt, which was fine, did not go in either
    services.workspace_upload(agent=agent, user=operator, uploads=[Upload("data.csv", b"new")], replace=True)
    assert tree(agent.workspace) == {"data.csv": b"new"}
    assert PlanEvent.objects.filter(kind=PlanEvent.Kind.FILES_UPLOADED).latest("pk").detail["files"][0]["replaced"]


@pytest.mark.parametrize(("name", "folder"), [
    ("../escape.txt", ""),
    ("..", ""),
    ("notes/../../escape.txt", ""),
    ("/etc/passwd", ""),
    ("C:\\Windows\\win.ini", ""),
    ("..\\escape.txt", ""),
    ("~root", ""),
    (".bashrc", ""),
    ("evil\x00.txt", ""),
    ("bidi\u202etxt.exe", ""),
    ("ok.txt", "../outside"),
    ("ok.txt", "notes/../../outside"),
    ("ok.txt", "/tmp"),
    ("ok.txt", ".hidden"),
])
def test_upload_refuses_names_and_folders_that_leave_the_workspace(operator: Any, tmp_path: Path, name: str,
                                                                   folder: str) -> None:
    agent = tool_agent(operator)
    before = tree(tmp_path)
    with pytest.raises(DecisionError, match="Not uploaded") as refusal:
        services.workspace_upload(agent=agent, user=operator, uploads=[Upload(name, b"x")], folder=folder)
    assert str(refusal.value).endswith("Nothing was changed.")
    assert tree(tmp_path) == before
    assert not PlanEvent.objects.filter(kind=PlanEvent.Kind.FILES_UPLOADED).exists()


def test_upload_refuses_a_folder_that_is_a_link_out_of_the_workspace(operator: Any, tmp_path: Path) -> None:
    agent = tool_agent(operator)
    outside = tmp_path / "outside"
    outside.mkdir()
    agent.workspace.mkdir(parents=True)
    os.symlink(outside, agent.workspace / "shared")
    with pytest.raises(DecisionError, match="leads outside the workspace"):
        services.workspace_upload(agent=agent, user=operator, uploads=[Upload("x.txt", b"x")], folder="shared")
    assert list(outside.iterdir()) == []


def test_upload_refuses_more_than_the_limit_and_changes_nothing(operator: Any, settings: Any) -> None:
    settings.WORKSPACE_UPLOAD_MAX_BYTES = 1024
    agent = tool_agent(operator)
    with pytest.raises(DecisionError, match=r"1.5 KB, more than the 1.0 KB an upload may hold"):
        services.workspace_upload(agent=agent, user=operator, uploads=[Upload("a.txt", b"a" * 768),
                                                                       Upload("b.txt", b"b" * 768)])
    assert tree(agent.workspace) == {} if agent.workspace.exists() else True
    services.workspace_upload(agent=agent, user=operator, uploads=[Upload("a.txt", b"a" * 1024)])  # at the limit
    assert tree(agent.workspace) == {"a.txt": b"a" * 1024}


def test_upload_refuses_an_agent_that_is_not_a_tool_agent(operator: Any) -> None:
    persona = AgentFactory(kind=Agent.Kind.PERSONA, name="Jenbina")
    with pytest.raises(DecisionError, match="Jenbina is not a tool agent"):
        services.workspace_upload(agent=persona, user=operator, uploads=[Upload("a.txt", b"a")])
    assert not persona.workspace.exists()


def test_an_upload_whose_record_fails_leaves_no_file(operator: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """Nothing half done: when the event cannot be recorded, the files it would have recorded are not there."""
    agent = tool_agent(operator)

    def broken(**kwargs: Any) -> None:
        raise RuntimeError("the database went away")

    monkeypatch.setattr("planning.services.agents.event_agent_record", broken)
    with pytest.raises(RuntimeError):
        services.workspace_upload(agent=agent, user=operator, uploads=[Upload("a.txt", b"a")])
    assert tree(agent.workspace) == {}


def test_the_upload_path_may_carry_an_upload_but_no_more(settings: Any) -> None:
    settings.WORKSPACE_UPLOAD_MAX_BYTES = 5 * 1024 * 1024
    settings.REQUEST_MAX_BODY_BYTES = 2_621_440
    assert body_limit("/agents/7/workspace/") == 5 * 1024 * 1024 + 2_621_440
    assert body_limit("/agents/7/goals/") == 2_621_440
    assert body_limit("/agents/7/workspace/../goals/") == 2_621_440


# --- the pages ---------------------------------------------------------------------------------------------------


def test_an_operator_creates_a_tool_agent_from_the_dashboard(operator_client: Client, operator: Any) -> None:
    assert 'href="/agents/new/"' in operator_client.get("/").content.decode()
    page = operator_client.get(reverse("agent-new")).content.decode()
    assert "file.convert: Convert a CSV file to JSON" in page and "risky: waits for approval" in page
    response = operator_client.post(reverse("agent-new"), {"name": "Clerk", "backstory": "Tidy files",
                                                           "tools": ["file.read", "file.list"]})
    agent = Agent.objects.get(name="Clerk")
    assert response.status_code == 302 and response["Location"] == agent.get_absolute_url()
    assert agent.tools == ["file.list", "file.read"] and agent.kind == Agent.Kind.TOOL
    html = operator_client.get(agent.get_absolute_url()).content.decode()
    assert "Created the tool agent Clerk. Upload its files, then give it a goal." in html
    assert "Upload files" in html and "No files yet." in html


def test_the_new_agent_form_refuses_bad_input_with_the_reason(operator_client: Client) -> None:
    AgentFactory(name="Clerk")
    response = operator_client.post(reverse("agent-new"), {"name": "clerk", "tools": ["file.read"]})
    assert response.status_code == 400
    assert "An agent named clerk already exists" in response.content.decode()
    response = operator_client.post(reverse("agent-new"), {"name": "Other"})
    assert response.status_code == 400 and "Choose at least one tool" in response.content.decode()
    assert Agent.objects.count() == 1


def test_a_viewer_cannot_create_an_agent_or_upload(viewer_client: Client, operator: Any) -> None:
    agent = tool_agent(operator)
    assert "New agent" not in viewer_client.get("/").content.decode()
    page = viewer_client.get(agent.get_absolute_url()).content.decode()
    assert "Upload files" not in page and "Workspace" in page
    assert viewer_client.get(reverse("agent-new")).status_code == 403
    assert viewer_client.post(reverse("agent-new"), {"name": "Mine", "tools": ["file.read"]}).status_code == 403
    response = viewer_client.post(reverse("agent-upload", args=[agent.pk]),
                                  {"files": [SimpleUploadedFile("a.txt", b"a")]})
    assert response.status_code == 403
    assert list(Agent.objects.values_list("name", flat=True)) == ["Clerk"]
    assert not agent.workspace.exists()
    assert not PlanEvent.objects.filter(kind=PlanEvent.Kind.FILES_UPLOADED).exists()


def test_login_is_needed_to_create_or_upload(operator: Any) -> None:
    agent = tool_agent(operator)
    for url in (reverse("agent-new"), reverse("agent-upload", args=[agent.pk])):
        response = Client().post(url, {"name": "X", "tools": ["file.read"]})
        assert response.status_code == 302 and response["Location"].startswith("/accounts/login/")
    assert Agent.objects.count() == 1


def test_the_upload_needs_the_csrf_token(operator: Any) -> None:
    agent = tool_agent(operator)
    client = Client(enforce_csrf_checks=True)
    client.force_login(operator)
    response = client.post(reverse("agent-upload", args=[agent.pk]), {"files": [SimpleUploadedFile("a.txt", b"a")]})
    assert response.status_code == 403 and not agent.workspace.exists()


def test_an_operator_uploads_files_and_sees_them_listed(operator_client: Client, operator: Any) -> None:
    agent = tool_agent(operator)
    response = operator_client.post(reverse("agent-upload", args=[agent.pk]), {
        "files": [SimpleUploadedFile("people.csv", b"name,city\nAda,London\n"),
                  SimpleUploadedFile("<img src=x onerror=alert(1)>.txt", b"hello")],
        "folder": "in"}, follow=True)
    html = response.content.decode()
    shown = "in/&lt;img src=x onerror=alert(1)&gt;.txt"
    assert f"Uploaded in/people.csv, {shown} into Clerk&#x27;s workspace." in html
    assert "<code>in/people.csv</code>" in html and f"<code>{shown}</code>" in html and "<img src=x" not in html
    assert tree(agent.workspace) == {"in/people.csv": b"name,city\nAda,London\n",
                                     "in/<img src=x onerror=alert(1)>.txt": b"hello"}
    audit = operator_client.get(reverse("audit")).content.decode()
    assert "Files uploaded" in audit and "Agent created" in audit


def test_an_upload_page_refusal_says_why_and_writes_nothing(operator_client: Client, operator: Any,
                                                            settings: Any, tmp_path: Path) -> None:
    settings.WORKSPACE_UPLOAD_MAX_BYTES = 10
    agent = tool_agent(operator)
    before = tree(tmp_path)
    html = operator_client.post(reverse("agent-upload", args=[agent.pk]), {
        "files": [SimpleUploadedFile("big.txt", b"x" * 11)]}, follow=True).content.decode()
    assert "more than the 10 bytes an upload may hold" in html and "Nothing was changed." in html
    html = operator_client.post(reverse("agent-upload", args=[agent.pk]), {
        "files": [SimpleUploadedFile("a.txt", b"x")], "folder": "../../outside"}, follow=True).content.decode()
    assert "escapes the workspace" in html
    # The browser's name is cut to its last part by Django before any view sees it: inside the workspace.
    operator_client.post(reverse("agent-upload", args=[agent.pk]), {
        "files": [SimpleUploadedFile("../../escape.txt", b"x")]})
    assert tree(tmp_path) == before | {f"workspaces/{agent.pk}/escape.txt": b"x"}
    html = operator_client.post(reverse("agent-upload", args=[agent.pk]), {}, follow=True).content.decode()
    assert "Choose at least one file to upload. Nothing was changed." in html
