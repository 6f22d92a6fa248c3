""""Decided by policies" is live like the inbox: a policy's decision, and an operator's undo, are pushed to the
list in the inbox and on the policies page (Undo for operators only); the page's Undo works from the pushed list."""

from __future__ import annotations

from typing import Any

import pytest
from channels.db import database_sync_to_async
from channels.testing import WebsocketCommunicator
from django.test import Client

from planner_site.asgi import application
from planning import services as planning
from planning.live.hub import CLOSE_UNAUTHENTICATED
from planning.models import Plan, PlanEvent, PlanStep
from policies import services
from policies.consumers import DecisionsConsumer
from tests.factories import PlanFactory, PlanStepFactory, UserFactory


def communicator(user: Any, back: str) -> WebsocketCommunicator:
    comm = WebsocketCommunicator(DecisionsConsumer.as_asgi(), f"/ws/policy-decisions/{back}/")
    comm.scope["user"] = user
    comm.scope["url_route"] = {"kwargs": {"back": back}}
    return comm


def waiting_step() -> PlanStep:
    plan = PlanFactory(status=Plan.Status.ACTIVE)
    return PlanStepFactory(plan=plan, status=PlanStep.Status.AWAITING_APPROVAL, description="Buy food")


def approved_by_policy(step: PlanStep) -> PlanEvent:
    return planning.step_approve(step=step, user=services.policy_user(), actor_label="policy: Routine, rule 1",
                                 detail={"policy": 1, "rule": 1})


@pytest.mark.django_db(transaction=True)
@pytest.mark.asyncio
async def test_the_list_is_pushed_as_a_policy_decides_and_as_an_operator_undoes() -> None:
    step = await database_sync_to_async(waiting_step)()
    operator = await database_sync_to_async(UserFactory)(username="olga", role="operators")
    viewer = await database_sync_to_async(UserFactory)(username="victor", role="viewers")
    operator_page, viewer_page = communicator(operator, "policies"), communicator(viewer, "inbox")
    for comm in (operator_page, viewer_page):
        assert (await comm.connect())[0]
        assert "No policy has decided anything yet." in await comm.receive_from(timeout=5)

    approval = await database_sync_to_async(approved_by_policy)(step)
    pushed = await operator_page.receive_from(timeout=5)
    assert f'id="decision-{approval.pk}"' in pushed and "by policy: Routine, rule 1" in pushed
    assert f'action="/policies/decisions/{approval.pk}/undo/"' in pushed and 'name="next" value="policies"' in pushed
    seen = await viewer_page.receive_from(timeout=5)
    assert f'id="decision-{approval.pk}"' in seen and "/undo/" not in seen  # a viewer cannot undo

    await database_sync_to_async(services.decision_undo)(event_id=approval.pk, user=operator)
    pushed = await operator_page.receive_from(timeout=5)
    assert f'id="decision-{approval.pk}"' in pushed and "/undo/" not in pushed  # undone: nothing left to undo
    for comm in (operator_page, viewer_page):
        await comm.disconnect()


@pytest.mark.django_db(transaction=True)
@pytest.mark.asyncio
async def test_the_socket_refuses_anonymous() -> None:
    comm = WebsocketCommunicator(application, "/ws/policy-decisions/inbox/", headers=[(b"origin", b"http://localhost")])
    assert (await comm.connect())[0]  # accepted only to say why it closes
    output = await comm.receive_output(timeout=5)
    assert output["type"] == "websocket.close" and output["code"] == CLOSE_UNAUTHENTICATED
    await comm.disconnect()


@pytest.mark.django_db
def test_the_pages_list_listens_and_its_undo_is_sent_by_the_page_and_lands_back_there(operator: Any,
                                                                                     operator_client: Client) -> None:
    step = waiting_step()
    approval = approved_by_policy(step)
    for url, back in (("/inbox/", "inbox"), ("/policies/", "policies")):
        page = operator_client.get(url).content.decode()
        assert f'data-steer-live="/ws/policy-decisions/{back}/"' in page
        assert f'hx-post="/policies/decisions/{approval.pk}/undo/"' in page
    response = operator_client.post(f"/policies/decisions/{approval.pk}/undo/", {"next": "inbox"},
                                    HTTP_HX_REQUEST="true")
    assert response.status_code == 200 and response["HX-Redirect"] == "/inbox/"
    assert "Approval undone: step" in operator_client.get("/inbox/").content.decode()
    again = operator_client.post(f"/policies/decisions/{approval.pk}/undo/", {"next": "policies"},
                                 HTTP_HX_REQUEST="true")
    assert again["HX-Redirect"] == "/policies/"
    assert "already undone" in operator_client.get("/policies/").content.decode()
