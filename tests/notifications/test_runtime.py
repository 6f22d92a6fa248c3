"""Notifications delivered by the runtime itself, as an operator away from the screen gets them: the embedded
scheduler (SQLite) and the job engine's worker (PostgreSQL) each dispatch a new waiting step to a real webhook
receiver and by e-mail, retry a receiver's 500 later, and send nothing again after a success. Tests wait for
deliveries with a deadline; how fast they came is printed (`-s`), not asserted (speed is measured in bench)."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest
from channels.db import database_sync_to_async
from django.conf import settings
from django.core import mail

from notifications.models import Delivery, DeliveryAttempt
from planning.models import Plan, PlanEvent, PlanStep
from tests.factories import AgentFactory, PlanEventFactory, PlanFactory, PlanStepFactory
from tests.notifications.conftest import Receiver, subscribed

pytestmark = pytest.mark.django_db(transaction=True)
DEADLINE = 30.0


def step_waiting_now() -> float:
    """A step starts waiting for a person; when its event committed (time.monotonic())."""
    plan = PlanFactory(agent=AgentFactory(kind="tool", name="Ada", status="paused"), approval_mode=Plan.ApprovalMode.STEP)
    step = PlanStepFactory(plan=plan, key="s1", status=PlanStep.Status.AWAITING_APPROVAL)
    PlanEventFactory(plan=plan, step=step, kind=PlanEvent.Kind.STEP_AWAITING)
    return time.monotonic()


@contextlib.asynccontextmanager
async def runtime_running() -> AsyncIterator[None]:
    """The stack's runtime in this process: the embedded scheduler, or a worker of the job engine."""
    stop = asyncio.Event()
    if settings.SCALE_OUT:
        from runtime.worker import worker_run

        task = asyncio.create_task(worker_run(runner_id="notify-worker", stop=stop))
    else:
        from runtime.embedded import Scheduler

        scheduler = Scheduler(runner_id="notify-runner", tick=0.05, prune_seconds=0)
        task = asyncio.create_task(scheduler.run())
        stop_wait = asyncio.create_task(stop.wait())
        stop_wait.add_done_callback(lambda _t: scheduler.stop())
    try:
        await asyncio.sleep(1.5)  # started (not a timing assertion: delivery is awaited with a deadline below)
        yield
    finally:
        stop.set()
        await asyncio.wait_for(task, timeout=60)


async def wait_for(receiver: Receiver, count: int) -> list[Any]:
    return await asyncio.get_running_loop().run_in_executor(None, lambda: receiver.wait_for(count, deadline=DEADLINE))


async def test_the_runtime_delivers_a_waiting_step_by_webhook_and_email(receiver: Receiver) -> None:
    await database_sync_to_async(lambda: subscribed(receiver, email="nadia@example.com"))()
    async with runtime_running():
        committed = await database_sync_to_async(step_waiting_now)()
        [got] = await wait_for(receiver, 1)
        print(f"\nwebhook latency ({'scale-out' if settings.SCALE_OUT else 'embedded'}): "
              f"{(got.at - committed) * 1000:.0f} ms from the event's commit")
        deadline = time.monotonic() + DEADLINE
        while not mail.outbox and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
    assert receiver.signature_valid(got)
    assert got.json()["step"]["key"] == "s1"
    assert [m.to for m in mail.outbox] == [["nadia@example.com"]]
    statuses = await database_sync_to_async(lambda: sorted(Delivery.objects.values_list("channel__kind", "status")))()
    assert statuses == [("email", "delivered"), ("webhook", "delivered")]


async def test_the_runtime_retries_a_500_and_sends_nothing_more_after_success(receiver: Receiver,
                                                                             settings: Any) -> None:
    settings.NOTIFY_RETRY_FIRST_SECONDS = 1
    receiver.script = [500]
    await database_sync_to_async(lambda: subscribed(receiver))()
    async with runtime_running():
        await database_sync_to_async(step_waiting_now)()
        first, second = await wait_for(receiver, 2)
        assert second.at > first.at
        # Delivered: more rounds of the runtime (a few sweeps) send nothing again.
        await asyncio.sleep(3 * settings.NOTIFY_SWEEP_SECONDS)
    assert len(receiver.received) == 2
    assert receiver.signature_valid(second)
    assert first.headers["x-planner-delivery"] == second.headers["x-planner-delivery"]
    attempts = await database_sync_to_async(
        lambda: list(DeliveryAttempt.objects.values_list("number", "status_code", "response_excerpt")))()
    assert attempts == [(1, 500, "receiver broke"), (2, 200, "ok")]
