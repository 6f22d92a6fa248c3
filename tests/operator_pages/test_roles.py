"""The role rules of every steering URL and socket: anonymous, viewer, operator, admin."""

from __future__ import annotations

import json
from typing import Any

import pytest
from channels.db import database_sync_to_async
from channels.testing import WebsocketCommunicator
from django.test import Client
from django.urls import reverse

from planner_site.asgi import application
from planning import services
from planning.live import operator_consumers
from planning.live.hub import CLOSE_UNAUTHENTICATED
from planning.models import Plan, PlanEvent, PlanStep
from tests.factories import AgentFactory, PlanStepFactory, UserFactory


def pages(plan: Plan) -> list[str]:
    return [reverse("inbox"), reverse("inbox-count"), reverse("audit"), reverse("audit-export-csv"),
            reverse("audit-export-json"), reverse("usage"), reverse("plan-versions", args=[plan.pk]),
            reverse("plan-compare") + f"?a={plan.pk}&b={plan.pk}"]


def decisions(plan: Plan, step: PlanStep) -> list[tuple[str, dict[str, Any]]]:
    return [(reverse("inbox-step-approve", args=[step.pk]), {}),
            (reverse("inbox-step-decline", args=[step.pk]), {"feedback": "no"}),
            (reverse("inbox-plan-approve", args=[plan.pk]), {"mode": "all"}),
            (reverse("inbox-plan-cancel", args=[plan.pk]), {}),
            (reverse("inbox-plan-clarify", args=[plan.pk]), {"answer": "yes"}),
            (reverse("plan-editor", args=[plan.pk]), {"op": "add", "version": "1"})]


@pytest.fixture
def scene(db: None) -> tuple[Plan, PlanStep]:
    step = PlanStepFactory(status=PlanStep.Status.AWAITING_APPROVAL)
    return step.plan, step


@pytest.mark.django_db
def test_anonymous_is_sent_to_login_everywhere(scene: tuple[Plan, PlanStep]) -> None:
    plan, step = scene
    client = Client()
    for url in [*pages(plan), reverse("plan-editor", args=[plan.pk])]:
        response = client.get(url)
        assert response.status_code == 302 and response["Location"].startswith("/accounts/login/"), url
    for url, data in decisions(plan, step):
        assert client.post(url, data).status_code == 302, url
    assert PlanEvent.objects.count() == 0


@pytest.mark.django_db
def test_viewer_reads_every_page_but_decides_and_edits_nothing(viewer_client: Client,
                                                               scene: tuple[Plan, PlanStep]) -> None:
    plan, step = scene
    for url in pages(plan):
        assert viewer_client.get(url).status_code == 200, url
    assert viewer_client.get(reverse("plan-editor", args=[plan.pk])).status_code == 403
    for url, data in decisions(plan, step):
        assert viewer_client.post(url, data).status_code == 403, url
    step.refresh_from_db()
    assert step.status == PlanStep.Status.AWAITING_APPROVAL and PlanEvent.objects.count() == 0


@pytest.mark.django_db
@pytest.mark.parametrize("role", ["operator", "admin"])
def test_operators_and_admins_read_and_decide(role: str, scene: tuple[Plan, PlanStep]) -> None:
    plan, step = scene
    user = (UserFactory(username="olga", role="operators") if role == "operator"
            else UserFactory(username="ada", is_staff=True, is_superuser=True))
    client = Client()
    client.force_login(user)
    for url in [*pages(plan), reverse("plan-editor", args=[plan.pk])]:
        assert client.get(url).status_code == 200, url
    response = client.post(reverse("inbox-step-approve", args=[step.pk]), HTTP_HX_REQUEST="true")
    assert response.status_code == 200
    step.refresh_from_db()
    assert step.approved_by == user


@pytest.mark.django_db
def test_get_only_pages_refuse_post_and_decisions_refuse_get(operator_client: Client,
                                                             scene: tuple[Plan, PlanStep]) -> None:
    plan, step = scene
    assert operator_client.post(reverse("inbox")).status_code == 405
    assert operator_client.get(reverse("inbox-step-approve", args=[step.pk])).status_code == 405


@pytest.mark.django_db
def test_admin_change_to_an_agent_without_a_plan_is_in_the_audit_log(db: None) -> None:
    admin = UserFactory(username="ada", is_staff=True, is_superuser=True)
    agent = AgentFactory(name="Idle")
    client = Client()
    client.force_login(admin)
    url = reverse("admin:agents_agent_change", args=[agent.pk])
    page = client.get(url)
    assert page.status_code == 200 and "escalate_after_minutes" in page.content.decode()
    form = page.context["adminform"].form
    data = {name: json.dumps(value) if isinstance(value, dict | list) else value
            for name, value in ((n, form[n].value()) for n in form.fields) if value is not None}
    data |= {"escalate_after_minutes": "15", "needs-TOTAL_FORMS": "0", "needs-INITIAL_FORMS": "0",
             "needs-MIN_NUM_FORMS": "0", "needs-MAX_NUM_FORMS": "1000"}
    response = client.post(url, data)
    assert response.status_code == 302, response.content.decode()[:2000]
    agent.refresh_from_db()
    assert agent.escalate_after_minutes == 15
    event = PlanEvent.objects.get(kind=PlanEvent.Kind.ADMIN_EDIT)
    assert event.plan is None and event.agent == agent and event.actor_label == "ada"
    assert Client().get(reverse("audit")).status_code == 302
    assert "Edited in admin" in client.get(reverse("audit")).content.decode()




async def closed_with(comm: WebsocketCommunicator) -> int:
    output = await comm.receive_output(timeout=5)
    while output["type"] == "websocket.send":
        output = await comm.receive_output(timeout=5)
    assert output["type"] == "websocket.close"
    return int(output.get("code", 1000))


def communicator(consumer: Any, path: str, user: Any) -> WebsocketCommunicator:
    comm = WebsocketCommunicator(consumer.as_asgi(), path)
    comm.scope["user"] = user
    comm.scope["url_route"] = {"kwargs": {}}
    return comm


@pytest.mark.django_db(transaction=True)
@pytest.mark.asyncio
@pytest.mark.parametrize("path", ["/ws/inbox/", "/ws/inbox/count/"])
async def test_inbox_sockets_refuse_anonymous(path: str) -> None:
    comm = WebsocketCommunicator(application, path, headers=[(b"origin", b"http://localhost")])
    connected, _ = await comm.connect()
    assert connected  # accepted only to say why it closes
    assert await closed_with(comm) == CLOSE_UNAUTHENTICATED
    await comm.disconnect()


@pytest.mark.django_db(transaction=True)
@pytest.mark.asyncio
async def test_inbox_socket_pushes_the_list_without_buttons_to_viewers_and_with_them_to_operators() -> None:
    await database_sync_to_async(PlanStepFactory)(status=PlanStep.Status.AWAITING_APPROVAL,
                                                         description="Buy <b>food</b>")
    viewer = await database_sync_to_async(UserFactory)(username="victor", role="viewers")
    operator = await database_sync_to_async(UserFactory)(username="olga", role="operators")
    seen = {}
    for name, user in (("viewer", viewer), ("operator", operator)):
        comm = communicator(operator_consumers.InboxConsumer, "/ws/inbox/", user)
        connected, _ = await comm.connect()
        assert connected
        seen[name] = await comm.receive_from(timeout=5)
        await comm.disconnect()
    assert "Buy &lt;b&gt;food&lt;/b&gt;" in seen["viewer"] and ">Approve<" not in seen["viewer"]
    assert ">Approve<" in seen["operator"] and 'id="inbox-count"' in seen["operator"]


@pytest.mark.django_db(transaction=True)
@pytest.mark.asyncio
async def test_nav_count_socket_pushes_the_new_count_after_a_decision() -> None:
    step = await database_sync_to_async(PlanStepFactory)(status=PlanStep.Status.AWAITING_APPROVAL)
    operator = await database_sync_to_async(UserFactory)(username="olga", role="operators")
    comm = communicator(operator_consumers.InboxCountConsumer, "/ws/inbox/count/", operator)
    connected, _ = await comm.connect()
    assert connected
    assert 'data-count="1"' in await comm.receive_from(timeout=5)
    await database_sync_to_async(services.step_approve)(step=step, user=operator)
    assert 'data-count="0"' in await comm.receive_from(timeout=5)
    await comm.disconnect()


@pytest.mark.django_db(transaction=True)
@pytest.mark.asyncio
async def test_nav_count_socket_counts_a_question_of_the_planner() -> None:
    await database_sync_to_async(PlanStepFactory)(status=PlanStep.Status.AWAITING_APPROVAL)
    operator = await database_sync_to_async(UserFactory)(username="olga", role="operators")
    comm = communicator(operator_consumers.InboxCountConsumer, "/ws/inbox/count/", operator)
    connected, _ = await comm.connect()
    assert connected
    assert 'data-count="1"' in await comm.receive_from(timeout=5)
    agent = await database_sync_to_async(AgentFactory)(kind="tool")
    await database_sync_to_async(asking)(agent)
    assert 'data-count="2"' in await comm.receive_from(timeout=5)  # pushed as the planner asks
    await comm.disconnect()


def asking(agent: Any) -> Plan:
    from planning.services import plan_ask, plan_start

    plan = plan_start(agent=agent, goal_text="Do the thing", goal=None, previous=None, reason="", actor_label="r")
    return plan_ask(plan=plan, question="What should I do?", model="offline-rules", actor_label="r")


def presence_communicator(plan_id: int, user: Any) -> WebsocketCommunicator:
    comm = WebsocketCommunicator(operator_consumers.PlanPresenceConsumer.as_asgi(), f"/ws/plans/{plan_id}/presence/")
    comm.scope["user"] = user
    comm.scope["url_route"] = {"kwargs": {"plan_id": plan_id}}
    return comm


@pytest.mark.django_db(transaction=True)
@pytest.mark.asyncio
async def test_plan_page_shows_who_else_views_it() -> None:
    step = await database_sync_to_async(PlanStepFactory)()
    olga = await database_sync_to_async(UserFactory)(username="olga", role="operators")
    otto = await database_sync_to_async(UserFactory)(username="otto", role="viewers")
    first = presence_communicator(step.plan_id, olga)
    assert (await first.connect())[0]
    assert "Also viewing" not in await first.receive_from(timeout=5)  # alone
    second = presence_communicator(step.plan_id, otto)
    assert (await second.connect())[0]
    assert "Also viewing" not in await second.receive_from(timeout=5)  # before the others answer
    assert "Also viewing this plan: olga" in await second.receive_from(timeout=5)
    assert "Also viewing this plan: otto" in await first.receive_from(timeout=5)
    await second.disconnect()
    left = await first.receive_from(timeout=5)
    assert 'id="plan-presence"' in left and "Also viewing" not in left
    await first.disconnect()


@pytest.mark.django_db(transaction=True)
@pytest.mark.asyncio
async def test_presence_socket_refuses_anonymous() -> None:
    comm = WebsocketCommunicator(application, "/ws/plans/1/presence/", headers=[(b"origin", b"http://localhost")])
    connected, _ = await comm.connect()
    assert connected
    assert await closed_with(comm) == CLOSE_UNAUTHENTICATED
    await comm.disconnect()
