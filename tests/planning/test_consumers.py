"""Live pages over websockets: login required, current state on connect, pushes of what changed only."""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import pytest
from channels.db import database_sync_to_async
from channels.testing import WebsocketCommunicator
from django.conf import settings as django_settings
from django.db import connection, transaction

from planner_site import events
from planner_site.asgi import application
from planning import services
from planning.live import consumers, renderers
from planning.live import hub as live_hub
from planning.models import PlanEvent, PlanStep
from tests.factories import AgentFactory, PlanFactory, PlanStepFactory, UserFactory

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.asyncio]

ROOT = Path(__file__).resolve().parents[2]
ORIGIN = [(b"origin", b"http://localhost")]


def communicator_for(consumer: Any, path: str, user: Any, **kwargs: int) -> WebsocketCommunicator:
    comm = WebsocketCommunicator(consumer.as_asgi(), path)
    comm.scope["user"] = user
    comm.scope["url_route"] = {"kwargs": kwargs}
    return comm


async def closed_with(comm: WebsocketCommunicator) -> int:
    output = await comm.receive_output(timeout=5)
    while output["type"] == "websocket.send":
        output = await comm.receive_output(timeout=5)
    assert output["type"] == "websocket.close"
    return int(output.get("code", 1000))


async def test_websocket_without_login_is_closed_with_4401() -> None:
    comm = WebsocketCommunicator(application, "/ws/dashboard/", headers=ORIGIN)
    connected, _ = await comm.connect()
    assert connected  # accepted only to say why it closes: a refused handshake shows the page no code
    assert await closed_with(comm) == live_hub.CLOSE_UNAUTHENTICATED
    await comm.disconnect()


async def test_websocket_from_foreign_origin_is_refused() -> None:
    comm = WebsocketCommunicator(application, "/ws/dashboard/", headers=[(b"origin", b"http://evil.example")])
    connected, _ = await comm.connect()
    assert not connected
    await comm.disconnect()


@pytest.mark.parametrize(("origin", "host", "accepted"), [
    (b"http://localhost:9999", b"localhost:8000", False),  # another port of the same host: another site
    (b"http://localhost", b"localhost:8000", False),
    (b"https://localhost", b"localhost", True),  # the scheme's default port is the port
    (b"http://localhost:8000", b"localhost:8000", True),
])
async def test_websocket_origin_must_be_this_site_port_included(origin: bytes, host: bytes, accepted: bool) -> None:
    comm = WebsocketCommunicator(application, "/ws/dashboard/", headers=[(b"origin", origin), (b"host", host)])
    connected, _ = await comm.connect()
    assert connected is accepted  # accepted: then closed with 4401 (no login), as any page without a session
    await comm.disconnect()


async def test_unknown_websocket_path_is_closed_with_4404() -> None:
    for path in ("/ws/nothing/", "/ws/plans/abc/", "/elsewhere"):
        comm = WebsocketCommunicator(application, path, headers=ORIGIN)
        connected, _ = await comm.connect()
        assert connected
        assert await closed_with(comm) == live_hub.CLOSE_NOT_FOUND
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


async def viewer_on_plan(steps: int, username: str) -> tuple[Any, list[Any], WebsocketCommunicator, str]:
    """A plan of `steps` steps ("Task 1"...), and a viewer's plan page connected to it, with its first state."""
    plan = await database_sync_to_async(PlanFactory)()
    made = [await database_sync_to_async(PlanStepFactory)(plan=plan, key=str(k), position=k, description=f"Task {k}")
            for k in range(1, steps + 1)]
    viewer = await database_sync_to_async(UserFactory)(username=username, role="viewers")
    comm = communicator_for(consumers.PlanConsumer, f"/ws/plans/{plan.pk}/", viewer, plan_id=plan.pk)
    await comm.connect()
    return plan, made, comm, await comm.receive_from(timeout=5)


async def test_push_carries_only_the_changed_step_and_the_new_entry() -> None:
    plan, steps, comm, _ = await viewer_on_plan(5, "victor")
    await database_sync_to_async(services.steps_request_approval)([steps[2]], runner="runner-x")
    pushed = await comm.receive_from(timeout=5)
    assert 'id="step-3"' in pushed and "Awaiting approval" in pushed
    for other in ("1", "2", "4", "5"):
        assert f'id="step-{other}"' not in pushed
    assert 'id="plan-steps"' not in pushed  # not the whole list
    assert "Step awaits approval" in pushed and 'data-live-prepend="plan-timeline-list"' in pushed
    await comm.disconnect()


async def test_one_render_per_change_and_audience_same_bytes_for_all(monkeypatch: pytest.MonkeyPatch) -> None:
    step = await database_sync_to_async(PlanStepFactory)(status=PlanStep.Status.AWAITING_APPROVAL)
    renders: list[set[str]] = []
    original = renderers.PlanLivePage.render_changes

    def counted(self: renderers.PlanLivePage, ids: set[int], audiences: set[str]) -> dict[str, str]:
        renders.append(set(audiences))
        return original(self, ids, audiences)

    monkeypatch.setattr(renderers.PlanLivePage, "render_changes", counted)
    users = [await database_sync_to_async(UserFactory)(username=f"op{i}", role="operators") for i in range(3)]
    users.append(await database_sync_to_async(UserFactory)(username="viewer1", role="viewers"))
    comms = [communicator_for(consumers.PlanConsumer, f"/ws/plans/{step.plan_id}/", u, plan_id=step.plan_id) for u in users]
    for comm in comms:
        await comm.connect()
        await comm.receive_from(timeout=5)
    await database_sync_to_async(services.event_record)(plan=step.plan, kind=PlanEvent.Kind.STEP_EDITED,
                                                        actor_label="test", reason="a note")
    pushed = [await comm.receive_from(timeout=5) for comm in comms]
    assert renders == [{"operator", "viewer"}]
    assert pushed[0] == pushed[1] == pushed[2]  # the operators get the same text
    assert "a note" in pushed[3]
    for comm in comms:
        await comm.disconnect()


async def test_changes_during_a_render_are_merged_into_the_next(monkeypatch: pytest.MonkeyPatch) -> None:
    step = await database_sync_to_async(PlanStepFactory)()
    gate = threading.Event()
    calls: list[int] = []
    original = renderers.PlanLivePage.render_changes

    def slow(self: renderers.PlanLivePage, ids: set[int], audiences: set[str]) -> dict[str, str]:
        calls.append(1)
        if len(calls) == 1:
            gate.wait(5)
        return original(self, ids, audiences)

    monkeypatch.setattr(renderers.PlanLivePage, "render_changes", slow)
    viewer = await database_sync_to_async(UserFactory)(username="victor", role="viewers")
    comm = communicator_for(consumers.PlanConsumer, f"/ws/plans/{step.plan_id}/", viewer, plan_id=step.plan_id)
    await comm.connect()
    await comm.receive_from(timeout=5)
    record = database_sync_to_async(services.event_record, thread_sensitive=False)
    await record(plan=step.plan, kind=PlanEvent.Kind.STEP_EDITED, actor_label="test", reason="first")
    await asyncio.sleep(0.2)  # the first render is under way, held by the gate
    for i in range(4):
        await record(plan=step.plan, kind=PlanEvent.Kind.STEP_EDITED, actor_label="test", reason=f"later {i}")
    gate.set()
    pushed = await comm.receive_from(timeout=5)
    while not await comm.receive_nothing(timeout=0.5):
        pushed += await comm.receive_from(timeout=5)
    assert "first" in pushed and all(f"later {i}" in pushed for i in range(4))
    assert len(calls) == 2  # the four changes made during the first render: one more render, not four
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


async def test_dashboard_pushes_changed_row_and_counts_only() -> None:
    step = await database_sync_to_async(PlanStepFactory)(status=PlanStep.Status.RUNNING, description="Work a shift")
    other = await database_sync_to_async(AgentFactory)(name="Other")
    viewer = await database_sync_to_async(UserFactory)(username="victor", role="viewers")
    comm = communicator_for(consumers.DashboardConsumer, "/ws/dashboard/", viewer)
    connected, _ = await comm.connect()
    assert connected
    assert "Work a shift" in await comm.receive_from(timeout=5)
    await database_sync_to_async(services.step_finish)(step=step, runner="runner-x", succeeded=True, result="done")
    pushed = await comm.receive_from(timeout=5)
    assert f'id="agent-row-{step.plan.agent_id}"' in pushed and "1/1 steps" in pushed
    assert f'id="agent-row-{other.pk}"' not in pushed
    assert 'id="dashboard-counts"' in pushed
    await comm.disconnect()


async def test_dashboard_full_state_follows_its_page_and_filters() -> None:
    await database_sync_to_async(AgentFactory)(name="Paula", status="paused")
    await database_sync_to_async(AgentFactory)(name="Rita", status="running")
    viewer = await database_sync_to_async(UserFactory)(username="victor", role="viewers")
    comm = communicator_for(consumers.DashboardConsumer, "/ws/dashboard/?status=paused", viewer)
    comm.scope["query_string"] = b"status=paused"
    await comm.connect()
    html = await comm.receive_from(timeout=5)
    assert "Paula" in html and "Rita" not in html
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


async def test_missing_plan_closes_socket_with_4404() -> None:
    operator = await database_sync_to_async(UserFactory)(username="olga", role="operators")
    comm = communicator_for(consumers.PlanConsumer, "/ws/plans/999999/", operator, plan_id=999999)
    await comm.connect()
    assert await closed_with(comm) == live_hub.CLOSE_NOT_FOUND
    await comm.disconnect()


async def test_resync_closes_open_pages_with_4000() -> None:
    step = await database_sync_to_async(PlanStepFactory)()
    viewer = await database_sync_to_async(UserFactory)(username="victor", role="viewers")
    comm = communicator_for(consumers.PlanConsumer, f"/ws/plans/{step.plan_id}/", viewer, plan_id=step.plan_id)
    await comm.connect()
    await comm.receive_from(timeout=5)
    hub = await live_hub.hub_get()
    await hub.resync()
    assert await closed_with(comm) == live_hub.CLOSE_RESYNC
    await comm.disconnect()


async def test_a_lost_message_is_seen_as_a_gap() -> None:
    hub = live_hub.LiveHub(asyncio.get_running_loop())
    message = {"type": events.MESSAGE_TYPE, "agents": [1], "plans": [], "src": "p1", "gap": False}
    assert hub.note_sequence(message | {"seq": 1})
    assert hub.note_sequence(message | {"seq": 2})
    assert not hub.note_sequence(message | {"seq": 4})  # 3 never arrived
    assert not hub.note_sequence(message | {"seq": 5, "gap": True})  # its publisher failed to send one


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def test_websocket_while_the_layer_is_down_is_closed_with_4503(settings: Any) -> None:
    settings.CHANNEL_LAYERS = {"default": {
        "BACKEND": "channels_redis.pubsub.RedisPubSubChannelLayer",
        "CONFIG": {"hosts": [{"address": f"redis://127.0.0.1:{free_port()}/0", "socket_timeout": None}],
                   "prefix": f"test-down-{os.getpid()}"},
    }}
    viewer = await database_sync_to_async(UserFactory)(username="victor", role="viewers")
    comm = communicator_for(consumers.DashboardConsumer, "/ws/dashboard/", viewer)
    connected, _ = await comm.connect()
    assert connected
    assert await closed_with(comm) == live_hub.CLOSE_LAYER_DOWN
    await comm.disconnect()


async def test_a_runner_cycle_is_one_publish_of_what_committed(monkeypatch: pytest.MonkeyPatch) -> None:
    """A runner's cycle or pass (published_together): its committed changes go out as one message when it ends;
    what a transaction rolled back is never pushed, inside the block or after it."""
    sent: list[tuple[set[int], set[int]]] = []
    monkeypatch.setattr(events.publisher, "publish", lambda *, agents, plans: sent.append((set(agents), set(plans))))
    step = await database_sync_to_async(PlanStepFactory)()
    other = await database_sync_to_async(PlanStepFactory)()
    rolled_back = await database_sync_to_async(PlanStepFactory)()

    def record(plan: Any, reason: str) -> None:
        services.event_record(plan=plan, kind=PlanEvent.Kind.STEP_EDITED, actor_label="t", reason=reason)

    def cycle() -> None:
        with events.published_together():
            with transaction.atomic():
                for i in range(3):
                    record(step.plan, str(i))
            with transaction.atomic():
                record(rolled_back.plan, "x")
                transaction.set_rollback(True)  # rolled back: nothing to publish
            record(other.plan, "y")  # its own transaction (autocommit)
            assert sent == []  # nothing goes out before the block ends

    await database_sync_to_async(cycle)()
    assert sent == [({step.plan.agent_id, other.plan.agent_id}, {step.plan_id, other.plan_id})]

    def request() -> None:  # outside a block (a request, the admin): each committed change, nothing rolled back
        with transaction.atomic():
            record(rolled_back.plan, "z")
            transaction.set_rollback(True)
        with transaction.atomic():
            record(step.plan, "w")

    sent.clear()
    await database_sync_to_async(request)()
    assert sent == [({step.plan.agent_id}, {step.plan_id})]


async def step_change_in_another_process(step: PlanStep, var_dir: Path) -> None:
    """`manage.py shell` (a real second process, on this test's database) asks for approval of the step."""
    env = dict(os.environ, PLANNER_VAR_DIR=str(var_dir))
    if events.layer_is_shared():
        parts = urlsplit(os.environ["DATABASE_URL"])
        env["DATABASE_URL"] = urlunsplit(parts._replace(path="/" + str(connection.settings_dict["NAME"])))
    else:
        env["SQLITE_PATH"] = str(connection.settings_dict["NAME"])
    code = (f"from planning import services; from planning.models import PlanStep; "
            f"services.steps_request_approval([PlanStep.objects.get(pk={step.pk})], runner='other-process')")
    result = await asyncio.to_thread(subprocess.run, [sys.executable, "manage.py", "shell", "-c", code], cwd=ROOT,
                                     env=env, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr


@pytest.mark.skipif(not events.layer_is_shared(),
                    reason="scale-out only: the embedded stack is one process, with no relay between processes; "
                           "another process's changes show at the next page load (the test below)")
async def test_change_made_by_another_process_reaches_the_open_page(tmp_path: Path) -> None:
    """Scale-out: a `manage.py shell` process changes a step; the open page gets it through Redis."""
    step = await database_sync_to_async(PlanStepFactory)(description="Walk the dog")
    viewer = await database_sync_to_async(UserFactory)(username="victor", role="viewers")
    comm = communicator_for(consumers.PlanConsumer, f"/ws/plans/{step.plan_id}/", viewer, plan_id=step.plan_id)
    await comm.connect()
    await comm.receive_from(timeout=5)
    await step_change_in_another_process(step, tmp_path)
    pushed = await comm.receive_from(timeout=10)
    assert f'id="step-{step.key}"' in pushed and "Awaiting approval" in pushed and "by other-process" in pushed
    await comm.disconnect()


@pytest.mark.skipif(events.layer_is_shared(), reason="embedded stack only (on scale-out the test above pushes it)")
async def test_embedded_change_made_by_another_process_shows_at_the_next_page_load(tmp_path: Path) -> None:
    """Embedded: another process's change reaches an open page when it (re)loads, and no socket file is made."""
    step = await database_sync_to_async(PlanStepFactory)(description="Walk the dog")
    viewer = await database_sync_to_async(UserFactory)(username="victor", role="viewers")
    comm = communicator_for(consumers.PlanConsumer, f"/ws/plans/{step.plan_id}/", viewer, plan_id=step.plan_id)
    await comm.connect()
    first = await comm.receive_from(timeout=5)
    assert "Awaiting approval" not in first
    await step_change_in_another_process(step, tmp_path)
    await comm.disconnect()
    again = communicator_for(consumers.PlanConsumer, f"/ws/plans/{step.plan_id}/", viewer, plan_id=step.plan_id)
    await again.connect()
    state = await again.receive_from(timeout=5)
    assert f'id="step-{step.key}"' in state and "Awaiting approval" in state and "by other-process" in state
    await again.disconnect()
    # No socket between processes: neither this process (it serves the page) nor the other one made one.
    assert not (Path(django_settings.VAR_DIR) / "live.sock").exists()
    assert not [path for path in tmp_path.rglob("*") if path.is_socket()]


async def test_the_graph_follows_a_step_status_change_and_stays_put_otherwise() -> None:
    plan, steps, comm, first = await viewer_on_plan(3, "vera")
    assert 'id="plan-graph"' in first  # the whole page state, graph included
    await database_sync_to_async(services.steps_request_approval)([steps[1]], runner="runner-x")
    pushed = await comm.receive_from(timeout=5)
    assert 'id="plan-graph"' in pushed
    graph = pushed[pushed.index('id="plan-graph"'):]
    assert "Task 2 (Awaiting approval)" in graph  # the node shows the new status
    # A change the graph does not show (a step's expected outcome) pushes the step, not the graph.
    await database_sync_to_async(PlanStep.objects.filter(pk=steps[0].pk).update)(expected_outcome="a quiet room")
    await database_sync_to_async(events.publish_changed)(agent_id=plan.agent_id, plan_id=plan.pk, kind="edited")
    pushed = await comm.receive_from(timeout=5)
    assert 'id="step-1"' in pushed and 'id="plan-graph"' not in pushed
    await comm.disconnect()


async def test_pages_keep_updating_after_the_long_poll_that_started_the_hub_ends(tmp_path: Path) -> None:
    """An agent's long poll (an async view behind sync middleware, so inside asgiref's `async_to_sync`) starts
    the hub; a page opens; the poll ends. Later changes, from another process on scale-out, still reach the
    page (the CI run of 2026-11 lost every push here: "CurrentThreadExecutor already quit or is broken")."""
    from asgiref.sync import async_to_sync, sync_to_async

    step = await database_sync_to_async(PlanStepFactory)(description="Walk the dog")
    viewer = await database_sync_to_async(UserFactory)(username="victor", role="viewers")
    page_open = threading.Event()

    async def long_poll() -> None:
        async with live_hub.changes_watched(agents={step.plan.agent_id}, plans={step.plan_id}) as changed:
            assert changed is not None
            await asyncio.to_thread(page_open.wait, 10)

    poll = asyncio.ensure_future(sync_to_async(async_to_sync(long_poll), thread_sensitive=False)())
    await asyncio.sleep(0.5)  # the poll has started the hub
    comm = communicator_for(consumers.PlanConsumer, f"/ws/plans/{step.plan_id}/", viewer, plan_id=step.plan_id)
    await comm.connect()
    await comm.receive_from(timeout=5)
    page_open.set()
    await poll
    if events.layer_is_shared():
        await step_change_in_another_process(step, tmp_path)
    else:
        await database_sync_to_async(services.steps_request_approval)([step], runner="other-process")
    pushed = await comm.receive_from(timeout=10)
    assert f'id="step-{step.key}"' in pushed and "Awaiting approval" in pushed and "by other-process" in pushed
    await comm.disconnect()
