"""Tokens from the command and the admin; external agents on the dashboard, steered like any agent."""

from __future__ import annotations

import io
from typing import Any

import pytest
from django.core.management import CommandError, call_command
from django.test import Client
from django.urls import reverse

from agents.models import Agent, AgentToken
from planning import services
from planning.models import Plan, PlanEvent, PlanStep
from tests.api.conftest import PLAN, ApiClient
from tests.factories import AgentFactory, UserFactory


def token_from_command(*args: str) -> tuple[str, str]:
    out = io.StringIO()
    call_command("agent_token", *args, stdout=out)
    text = out.getvalue()
    return text, text.strip().splitlines()[-1]


@pytest.mark.django_db
def test_agent_token_creates_the_agent_and_prints_a_working_token_last() -> None:
    text, raw = token_from_command("Support bot", "--label", "laptop")
    agent = Agent.objects.get(name="Support bot")
    assert agent.kind == Agent.Kind.EXTERNAL
    assert raw.startswith("apt_")
    assert ApiClient(Client(), raw).get("/api/v1/agent")[1]["name"] == "Support bot"
    _, second = token_from_command("Support bot")
    assert second != raw
    assert AgentToken.objects.filter(agent=agent).count() == 2
    assert Agent.objects.filter(name="Support bot").count() == 1
    assert raw not in "".join(AgentToken.objects.values_list("key_hash", flat=True))


@pytest.mark.django_db
def test_agent_token_refuses_a_built_in_agent() -> None:
    AgentFactory(name="Alice")
    with pytest.raises(CommandError, match="only external agents"):
        token_from_command("Alice")
    assert AgentToken.objects.count() == 0


@pytest.mark.django_db
def test_admin_issues_a_token_once_and_revokes_it() -> None:
    agent = Agent.objects.create(name="Admin bot", kind=Agent.Kind.EXTERNAL)
    admin = UserFactory(username="root", is_staff=True, is_superuser=True)
    browser = Client()
    browser.force_login(admin)
    response = browser.post(reverse("admin:agents_agenttoken_add"), {"agent": agent.pk, "label": "ci"}, follow=True)
    assert response.status_code == 200
    shown = [str(m) for m in response.context["messages"]]
    raw = next(word for m in shown for word in m.split() if word.startswith("apt_"))
    api = ApiClient(Client(), raw)
    assert api.get("/api/v1/agent")[0] == 200
    token = AgentToken.objects.get()
    page = browser.get(reverse("admin:agents_agenttoken_change", args=[token.pk]))
    assert raw.encode() not in page.content  # never shown again
    browser.post(reverse("admin:agents_agenttoken_changelist"),
                 {"action": "revoke", "_selected_action": [token.pk]}, follow=True)
    assert api.get("/api/v1/agent")[0] == 401


@pytest.mark.django_db
def test_the_runner_never_drives_an_external_agent() -> None:
    from runtime.embedded import agents_due

    external = Agent.objects.create(name="Outside", kind=Agent.Kind.EXTERNAL, cycle_interval=0)
    persona = AgentFactory()
    due = [d.pk for d in agents_due(exclude=set(), limit=10)[0]]
    assert persona.pk in due
    assert external.pk not in due


def test_external_plan_on_the_dashboard_and_plan_page(tooled: ApiClient, operator_client: Client) -> None:
    status, body = tooled.post("/api/v1/plans", PLAN)
    plan = Plan.objects.get(pk=body["id"])
    page = operator_client.get(f"/plans/{plan.pk}/")
    assert page.status_code == 200
    assert b"Mail the Q3 summary to Dana" in page.content
    assert b"Research bot (API)" in page.content  # the agent is the actor on the timeline
    dashboard = operator_client.get("/")
    assert b"Research bot" in dashboard.content


def test_operator_approves_and_declines_an_external_plan_through_the_web(tooled: ApiClient, operator_client: Client,
                                                                         operator: Any) -> None:
    body = tooled.post("/api/v1/plans", PLAN)[1]
    plan_id = body["id"]
    response = operator_client.post(f"/plans/{plan_id}/approve/", {"mode": "step"})
    assert response.status_code in (200, 302)
    assert Plan.objects.get(pk=plan_id).status == Plan.Status.ACTIVE
    assert tooled.get(f"/api/v1/plans/{plan_id}/next")[1]["action"] == "wait"  # step 1 up for approval
    first = PlanStep.objects.get(plan_id=plan_id, key="1")
    operator_client.post(f"/steps/{first.pk}/decline/", {"feedback": "Look in the finance drive"})
    answer = tooled.get(f"/api/v1/plans/{plan_id}/next")[1]
    assert (answer["action"], answer["feedback"]) == ("replan", "Look in the finance drive")


def test_operator_edit_of_an_external_step_is_checked_against_the_declared_tools(tooled: ApiClient,
                                                                                  operator: Any) -> None:
    plan_id = tooled.post("/api/v1/plans", PLAN)[1]["id"]
    first = PlanStep.objects.get(plan_id=plan_id, key="1")
    with pytest.raises(services.DecisionError, match="unknown tool 'file.read'"):
        services.step_edit(step=first, user=operator, changes={"tool": "file.read"})
    services.step_edit(step=first, user=operator, changes={"tool_input": {"query": "q3 report final"}})
    first.refresh_from_db()
    assert first.tool_input == {"query": "q3 report final"}
    assert PlanEvent.objects.filter(plan_id=plan_id, kind=PlanEvent.Kind.STEP_EDITED).count() == 1


@pytest.mark.django_db
def test_agent_token_with_an_expiry_prints_it_and_the_token_stops_working_then() -> None:
    from datetime import timedelta

    from django.utils import timezone

    text, raw = token_from_command("Temp bot", "--expires-in", "1")
    token = AgentToken.objects.get(agent__name="Temp bot")
    assert token.expires_at is not None and f"it expires {token.expires_at:%Y-%m-%d %H:%M} UTC" in text
    api = ApiClient(Client(), raw)
    assert api.get("/api/v1/agent")[0] == 200
    AgentToken.objects.filter(pk=token.pk).update(expires_at=timezone.now() - timedelta(seconds=1))
    status, body = api.get("/api/v1/agent")
    assert status == 401 and "expired" in body["detail"]


@pytest.mark.django_db
@pytest.mark.parametrize("days", ["0", "-2", "99999", "nan"])
def test_agent_token_refuses_a_bad_expiry_and_changes_nothing(days: str) -> None:
    with pytest.raises(CommandError):
        token_from_command("Temp bot", "--expires-in", days)
    assert not AgentToken.objects.exists()
