"""A remote A2A agent's credential changed after it was added (docs/a2a-agents.md): an operator replaces or
removes it on the agent's page, a viewer cannot; it is never shown back, the audit log records the change without
it, and the agent's next request carries the new one (or none). Against the tests' a2a-sdk agent on loopback,
which asks for a bearer token."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from django.test import Client
from django.urls import reverse

from agents.models import Agent
from planning.models import Plan, PlanEvent
from runtime.cycle import agent_cycle
from tests.a2a import a2a_agent

pytestmark = pytest.mark.django_db

OLD, NEW = "old-token-expired-4711", "new-token-rotated-0815"


@pytest.fixture
def agent_base(settings: Any) -> Iterator[str]:
    settings.OUTBOUND_ALLOWED_NETWORKS = ["127.0.0.0/8"]
    a2a_agent.AUTHORIZATIONS.clear()
    with a2a_agent.served(token=NEW) as base:  # the agent takes only the new token
        yield base


def added(client: Client, base: str, credential: str = OLD) -> Agent:
    assert client.post(reverse("agent-a2a-new"), {"url": base, "credential": credential}).status_code == 302
    return Agent.objects.get(kind=Agent.Kind.A2A)


def change(client: Client, agent: Agent, action: str, credential: str = "") -> Any:
    return client.post(reverse("agent-a2a-credential", args=[agent.pk]), {"action": action, "credential": credential},
                       follow=True)


def text_of(response: Any) -> str:
    if response.streaming:
        return b"".join(response.streaming_content).decode()
    return response.content.decode()


def secrets_shown(client: Client, agent: Agent) -> list[str]:
    """The pages (the agent's, the audit log and its exports) that show either credential: none should."""
    pages = [agent.get_absolute_url(), reverse("audit"), reverse("audit-export-csv"), reverse("audit-export-json")]
    shown = {page: text_of(client.get(page)) for page in pages}
    assert "credential_changed" in shown[reverse("audit-export-csv")]
    return [page for page, text in shown.items() for secret in (OLD, NEW) if secret in text]


def test_an_operator_replaces_the_credential_and_the_next_request_carries_it(operator_client: Client,
                                                                             agent_base: str) -> None:
    agent = added(operator_client, agent_base)
    page = operator_client.get(agent.get_absolute_url()).content.decode()
    assert "A credential is kept for this agent (not shown)" in page and "Replace credential" in page
    response = change(operator_client, agent, "replace", NEW)
    assert "Credential replaced: the agent&#x27;s next request carries the new one." in response.content.decode()
    assert Agent.objects.get(pk=agent.pk).a2a_credential == NEW
    changed = PlanEvent.objects.get(agent=agent, kind=PlanEvent.Kind.CREDENTIAL_CHANGED)
    assert changed.actor_label == "olga" and changed.detail["diff"] == {"credential": ["kept", "replaced"]}
    assert "Credential changed" in operator_client.get(reverse("audit")).content.decode()
    assert secrets_shown(operator_client, agent) == []
    # The goal goes to the agent with the new token: it takes it and comes to its question.
    operator_client.post(reverse("agent-goal", args=[agent.pk]), {"description": "Summarise my notes",
                                                                  "horizon": "short_term"})
    for _ in range(40):
        agent_cycle(agent_id=agent.pk, runner="test runner")
        if Plan.objects.get(agent=agent).status == Plan.Status.CLARIFYING:
            break
    assert Plan.objects.get(agent=agent).status == Plan.Status.CLARIFYING
    assert set(a2a_agent.AUTHORIZATIONS) == {f"Bearer {NEW}"}


def test_an_operator_removes_the_credential_and_the_next_request_goes_without(operator_client: Client,
                                                                               agent_base: str) -> None:
    agent = added(operator_client, agent_base, credential=NEW)
    response = change(operator_client, agent, "remove")
    assert "Credential removed: requests to the agent now go without one." in response.content.decode()
    assert Agent.objects.get(pk=agent.pk).a2a_credential == ""
    page = operator_client.get(agent.get_absolute_url()).content.decode()
    assert "No credential is kept for this agent." in page and "Remove credential" not in page
    changed = PlanEvent.objects.get(agent=agent, kind=PlanEvent.Kind.CREDENTIAL_CHANGED)
    assert changed.detail["diff"] == {"credential": ["kept", "removed"]} and NEW not in changed.reason
    assert secrets_shown(operator_client, agent) == []
    again = change(operator_client, agent, "remove")
    assert "No credential is kept for Summary writer. Nothing was changed." in again.content.decode()
    assert PlanEvent.objects.filter(kind=PlanEvent.Kind.CREDENTIAL_CHANGED).count() == 1
    operator_client.post(reverse("agent-goal", args=[agent.pk]), {"description": "Summarise my notes",
                                                                  "horizon": "short_term"})
    agent_cycle(agent_id=agent.pk, runner="test runner")
    assert a2a_agent.AUTHORIZATIONS == [""]  # sent without: the agent refused it
    assert Plan.objects.get(agent=agent).status == Plan.Status.FAILED


def test_a_viewer_cannot_change_the_credential(operator_client: Client, viewer_client: Client,
                                               agent_base: str) -> None:
    agent = added(operator_client, agent_base)
    assert "Replace credential" not in viewer_client.get(agent.get_absolute_url()).content.decode()
    for action, credential in (("replace", "viewer-token"), ("remove", "")):
        response = viewer_client.post(reverse("agent-a2a-credential", args=[agent.pk]),
                                      {"action": action, "credential": credential})
        assert response.status_code == 403
    assert Agent.objects.get(pk=agent.pk).a2a_credential == OLD
    assert not PlanEvent.objects.filter(kind=PlanEvent.Kind.CREDENTIAL_CHANGED).exists()


@pytest.mark.parametrize(("credential", "said"), [("", "Give the new credential, or choose Remove."),
                                                   ("two\r\nlines", "one line"), ("x" * 2001, "at most 2000")])
def test_a_bad_credential_is_refused_and_nothing_changes(operator_client: Client, agent_base: str,
                                                         credential: str, said: str) -> None:
    agent = added(operator_client, agent_base)
    body = change(operator_client, agent, "replace", credential).content.decode()
    assert said in body and "two\r\nlines" not in body
    assert Agent.objects.get(pk=agent.pk).a2a_credential == OLD
    assert not PlanEvent.objects.filter(kind=PlanEvent.Kind.CREDENTIAL_CHANGED).exists()


def test_an_agent_whose_card_asks_for_none_takes_no_credential(operator_client: Client, settings: Any) -> None:
    settings.OUTBOUND_ALLOWED_NETWORKS = ["127.0.0.0/8"]
    with a2a_agent.served() as base:
        agent = added(operator_client, base, credential="")
    body = change(operator_client, agent, "replace", NEW).content.decode()
    assert "asks for no credential" in body and Agent.objects.get(pk=agent.pk).a2a_credential == ""
