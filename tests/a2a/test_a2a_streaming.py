"""Remote A2A agents whose card offers streaming (followed by SendStreamingMessage and SubscribeToTask in the
runner's cycle, each event recorded and pushed as it arrives) and whose card asks for a credential (given at add
time, never shown, sent only to the card's origin), against the tests' a2a-sdk agent on loopback."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from django.test import Client
from django.urls import reverse

from agents.models import Agent
from planner_site import events
from planning.models import A2ATask, Plan, PlanEvent
from runtime.cycle import agent_cycle
from runtime.cycles import cycle_run
from tests.a2a import a2a_agent
from tests.a2a.a2a_agent import QUESTION

pytestmark = pytest.mark.django_db

TOKEN = "s3cret-token-4711"


@pytest.fixture(autouse=True)
def loopback(settings: Any) -> None:
    settings.OUTBOUND_ALLOWED_NETWORKS = ["127.0.0.0/8", "localhost"]
    a2a_agent.METHODS.clear()
    a2a_agent.ANSWERS.clear()
    a2a_agent.AUTHORIZATIONS.clear()


@pytest.fixture
def streaming_base() -> Iterator[str]:
    with a2a_agent.served(streaming=True) as base:
        yield base


def goal_given(client: Client, base: str, *, credential: str = "", goal: str = "Summarise my notes") -> Agent:
    response = client.post(reverse("agent-a2a-new"), {"url": base, "credential": credential})
    assert response.status_code == 302, response.content.decode()
    agent = Agent.objects.get(kind=Agent.Kind.A2A)
    assert client.post(reverse("agent-goal", args=[agent.pk]),
                       {"description": goal, "horizon": "short_term"}).status_code == 302
    return agent


def test_a_streaming_agent_is_followed_by_its_stream_in_one_cycle(operator_client: Client,
                                                                   streaming_base: str) -> None:
    agent = goal_given(operator_client, streaming_base)
    assert "followed as they stream" in operator_client.get(agent.get_absolute_url()).content.decode()
    # One cycle: the goal sent by SendStreamingMessage and the task followed until it asks (no polling).
    assert agent_cycle(agent_id=agent.pk, runner="test runner") == "task input-required (streamed)"
    assert a2a_agent.METHODS == ["SendStreamingMessage"]
    plan = Plan.objects.get(agent=agent)
    assert plan.status == Plan.Status.CLARIFYING and plan.clarification_question == QUESTION
    assert list(plan.steps.order_by("position").values_list("description", flat=True)) == [
        "Planned 3 steps: read notes.txt, outline the summary, write summary.md", "Artifact plan"]
    states = [e.detail["diff"]["state"] for e in plan.events.filter(kind=PlanEvent.Kind.TASK_STATE).order_by("pk")]
    assert states == [["", "submitted"], ["submitted", "working"], ["working", "input-required"]]
    assert QUESTION in operator_client.get(reverse("inbox")).content.decode()
    # The answer goes back on the same task by SendStreamingMessage, once; the task is followed to its end.
    operator_client.post(reverse("plan-clarify", args=[plan.pk]), {"answer": "markdown i guess?"})
    assert agent_cycle(agent_id=agent.pk, runner="test runner") == "task completed (streamed)"
    assert a2a_agent.ANSWERS == ["markdown i guess?"]
    assert a2a_agent.METHODS.count("SendStreamingMessage") == 2 and "SendMessage" not in a2a_agent.METHODS
    plan.refresh_from_db()
    assert plan.status == Plan.Status.COMPLETED
    descriptions = list(plan.steps.order_by("position").values_list("description", flat=True))
    assert descriptions == ["Planned 3 steps: read notes.txt, outline the summary, write summary.md",
                            "Artifact plan", "Writing summary.md as markdown i guess?", "Artifact summary.md"]
    assert agent_cycle(agent_id=agent.pk, runner="test runner") == "idle"
    assert a2a_agent.ANSWERS == ["markdown i guess?"]  # nothing sent twice


@pytest.mark.django_db(transaction=True)
def test_each_streamed_event_reaches_the_open_pages_as_it_commits(operator_client: Client, streaming_base: str,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    agent = goal_given(operator_client, streaming_base)
    pushes: list[set[int]] = []
    monkeypatch.setattr(events.publisher, "publish", lambda *, agents, plans: pushes.append(set(plans)))
    cycle_run(agent.pk, "test runner")  # as a runtime runs it: changes of a cycle go out together, but a stream's live
    plan = Plan.objects.get(agent=agent)
    assert plan.status == Plan.Status.CLARIFYING
    assert len([p for p in pushes if plan.pk in p]) >= 4  # the task, the step, the artifact, the question


def test_a_task_under_way_is_followed_again_by_subscribing(operator_client: Client, settings: Any,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """A stream left at A2A_STREAM_MAX_SECONDS while the agent still works: the next cycle subscribes to the task
    and follows it to its question."""
    settings.A2A_STREAM_MAX_SECONDS = 0.3
    monkeypatch.setattr(a2a_agent, "THINK_SECONDS", 1.0)
    with a2a_agent.served(streaming=True) as base:
        agent = goal_given(operator_client, base)
        assert agent_cycle(agent_id=agent.pk, runner="test runner").startswith("task ")
        plan = Plan.objects.get(agent=agent)
        assert plan.status == Plan.Status.ACTIVE and A2ATask.objects.get(plan=plan).state in ("submitted", "working")
        settings.A2A_STREAM_MAX_SECONDS = 10
        assert agent_cycle(agent_id=agent.pk, runner="test runner") == "task input-required (streamed)"
    assert "SubscribeToTask" in a2a_agent.METHODS and "GetTask" not in a2a_agent.METHODS
    plan.refresh_from_db()
    assert plan.status == Plan.Status.CLARIFYING and plan.clarification_question == QUESTION
    assert plan.steps.count() == 2  # each message and artifact once, across the two streams


def test_a_polling_agent_is_still_polled(operator_client: Client) -> None:
    with a2a_agent.served(streaming=False) as base:
        agent = goal_given(operator_client, base)
        agent_cycle(agent_id=agent.pk, runner="test runner")
    assert a2a_agent.METHODS[0] == "SendMessage" and "SendStreamingMessage" not in a2a_agent.METHODS


def test_an_agent_whose_card_asks_for_a_token_gets_the_operators(operator_client: Client) -> None:
    with a2a_agent.served(token=TOKEN) as base:
        refused = operator_client.post(reverse("agent-a2a-new"), {"url": base})
        assert refused.status_code == 400 and "asks for a bearer token" in refused.content.decode()
        split = operator_client.post(reverse("agent-a2a-new"), {"url": base, "credential": "s3cret\r\nX-Evil: 1"})
        assert split.status_code == 400 and "one line" in split.content.decode()
        assert "s3cret" not in split.content.decode() and not Agent.objects.exists()
        agent = goal_given(operator_client, base, credential=TOKEN, goal="pls summarise, quick")
        assert agent.a2a_credential == TOKEN
        for page in (agent.get_absolute_url(), reverse("agent-new"), reverse("audit")):
            body = operator_client.get(page).content.decode()
            assert TOKEN not in body, page
        assert "a credential is kept for it (not shown)" in operator_client.get(agent.get_absolute_url()).content.decode()
        created = PlanEvent.objects.get(agent=agent, kind=PlanEvent.Kind.AGENT_CREATED)
        assert TOKEN not in str(created.detail) and TOKEN not in created.reason and created.detail["credential"]
        for _ in range(20):
            agent_cycle(agent_id=agent.pk, runner="test runner")
            if Plan.objects.get(agent=agent).status == Plan.Status.CLARIFYING:
                break
    assert Plan.objects.get(agent=agent).status == Plan.Status.CLARIFYING
    assert a2a_agent.AUTHORIZATIONS and set(a2a_agent.AUTHORIZATIONS) == {f"Bearer {TOKEN}"}


def test_a_card_that_asks_for_no_credential_takes_none(operator_client: Client) -> None:
    with a2a_agent.served() as base:
        response = operator_client.post(reverse("agent-a2a-new"), {"url": base, "credential": TOKEN})
    body = response.content.decode()
    assert response.status_code == 400 and "asks for no credential" in body and TOKEN not in body
    assert not Agent.objects.exists()


def test_the_credential_is_not_sent_to_another_origin(operator_client: Client) -> None:
    """The card is read at localhost, its interface is at 127.0.0.1: another origin, which gets no credential
    (the agent refuses the goal, and the plan says why)."""
    with a2a_agent.served(token=TOKEN) as base:
        agent = goal_given(operator_client, base.replace("127.0.0.1", "localhost"), credential=TOKEN)
        agent_cycle(agent_id=agent.pk, runner="test runner")
    plan = Plan.objects.get(agent=agent)
    assert plan.status == Plan.Status.FAILED and "did not answer as expected" in plan.failure_reason
    assert a2a_agent.AUTHORIZATIONS == [""]


def card_with(scheme: dict[str, Any]) -> Any:
    from agents.a2a_remote import card_parse

    return card_parse({"name": "X", "supportedInterfaces": [{"url": "https://x.example/a2a",
                                                              "protocolBinding": "JSONRPC"}],
                       "securitySchemes": {"s": scheme}, "securityRequirements": [{"schemes": {"s": {"list": []}}}]})


def test_what_credential_a_card_asks_for_in_words() -> None:
    from agents.a2a_remote import RemoteError, card_parse, credential_asked

    assert credential_asked(card_parse({"name": "X"})) == ""
    assert credential_asked(card_with({"httpAuthSecurityScheme": {"scheme": "Bearer"}})) == "a bearer token"
    assert credential_asked(card_with({"apiKeySecurityScheme": {"location": "header", "name": "X-Api-Key"}})) == (
        "an API key (sent in the X-Api-Key header)")
    assert "OAuth 2" in credential_asked(card_with({"oauth2SecurityScheme": {}}))
    for unsupported in ({"apiKeySecurityScheme": {"location": "query", "name": "key"}},
                        {"httpAuthSecurityScheme": {"scheme": "basic"}}, {"mtlsSecurityScheme": {}}):
        with pytest.raises(RemoteError, match="cannot send"):
            credential_asked(card_with(unsupported))
