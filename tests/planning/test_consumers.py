"""Live pages over websockets: login required, current state on connect, pushes after each change."""

from __future__ import annotations

from typing import Any

import pytest
from channels.db import database_sync_to_async
from channels.testing import WebsocketCommunicator

from planner_site.asgi import application
from planning import consumers, services
from planning.models import PlanStep
from tests.factories import PlanStepFactory, UserFactory

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.asyncio]


def communicator_for(consumer: Any, path: str, user: Any, **kwargs: int) -> WebsocketCommunicator:
    comm = WebsocketCommunicator(consumer.as_asgi(), path)
    comm.scope["user"] = user
    comm.scope["url_route"] = {"kwargs": kwargs}
    return comm


async def test_websocket_without_login_is_refused() -> None:
    comm = WebsocketCommunicator(application, "/ws/dashboard/", headers=[(b"origin", b"http://localhost")])
    connected, _ = await comm.connect()
    assert not connected
    await comm.disconnect()


async def test_websocket_from_foreign_origin_is_refused() -> None:
    comm = WebsocketCommunicator(application, "/ws/dashboard/", headers=[(b"origin", b"http://evil.example")])
    connected, _ = await comm.connect()
    assert not connected
    await comm.disconnect()


async def test_plan_page_gets_current_state_on_connect_and_push_on_change() -> None:
    step = await database_sync_to_async(PlanStepFactory)(
        status=PlanStep.Status.AWAITING_APPROVAL, description="Buy <b>food</b>")
    operator = await database_sync_to_async(UserFactory)(username="olga", role="operators")
    comm = communicator_for(consumers.PlanConsumer, f"/ws/plans/{step.plan_id}/", operator, plan_id=step.plan_id)
    connected, _ = await comm.connect()
    assert connected
    first = await comm.receive_from(timeout=5)
    assert 'id="plan-steps"' in first and "Awaiting approval" in first
    assert "Buy &lt;b&gt;food&lt;/b&gt;" in first
    assert ">Approve<" in first  # an operator's page carries the decision buttons

    await database_sync_to_async(services.step_approve)(step=step, user=operator)
    pushed = await comm.receive_from(timeout=5)
    assert "Step approved" in pushed and "approved by olga" in pushed
    await comm.disconnect()


async def test_viewer_push_has_no_decision_buttons() -> None:
    step = await database_sync_to_async(PlanStepFactory)(status=PlanStep.Status.AWAITING_APPROVAL)
    viewer = await database_sync_to_async(UserFactory)(username="victor", role="viewers")
    comm = communicator_for(consumers.PlanConsumer, f"/ws/plans/{step.plan_id}/", viewer, plan_id=step.plan_id)
    connected, _ = await comm.connect()
    assert connected
    html = await comm.receive_from(timeout=5)
    assert "Awaiting approval" in html and ">Approve<" not in html and ">Decline<" not in html
    await comm.disconnect()


async def test_dashboard_pushes_changed_row() -> None:
    step = await database_sync_to_async(PlanStepFactory)(status=PlanStep.Status.RUNNING, description="Work a shift")
    viewer = await database_sync_to_async(UserFactory)(username="victor", role="viewers")
    comm = communicator_for(consumers.DashboardConsumer, "/ws/dashboard/", viewer)
    connected, _ = await comm.connect()
    assert connected
    assert "Work a shift" in await comm.receive_from(timeout=5)
    await database_sync_to_async(services.step_finish)(step=step, runner="runner-x", succeeded=True, result="done")
    pushed = await comm.receive_from(timeout=5)
    assert f'id="agent-row-{step.plan.agent_id}"' in pushed and "1/1 steps" in pushed
    await comm.disconnect()


async def test_client_messages_change_nothing() -> None:
    step = await database_sync_to_async(PlanStepFactory)(status=PlanStep.Status.AWAITING_APPROVAL)
    operator = await database_sync_to_async(UserFactory)(username="olga", role="operators")
    comm = communicator_for(consumers.PlanConsumer, f"/ws/plans/{step.plan_id}/", operator, plan_id=step.plan_id)
    await comm.connect()
    await comm.receive_from(timeout=5)
    for junk in ['{"approve": 1}', "not json", "x" * 100_000]:
        await comm.send_to(text_data=junk)
    assert await comm.receive_nothing(timeout=0.3)
    await database_sync_to_async(step.refresh_from_db)()
    assert step.status == PlanStep.Status.AWAITING_APPROVAL
    await comm.disconnect()


async def test_missing_plan_closes_socket() -> None:
    operator = await database_sync_to_async(UserFactory)(username="olga", role="operators")
    comm = communicator_for(consumers.PlanConsumer, "/ws/plans/999999/", operator, plan_id=999999)
    connected, _ = await comm.connect()
    assert not connected
    await comm.disconnect()
