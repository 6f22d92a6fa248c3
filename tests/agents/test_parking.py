"""Parked cycles (agents/parking.py): a cycle that awaits the loop frees its thread for other cycles, gets
the answer or the error back where it asked, and never parks inside a transaction."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from django.db import transaction

from agents.parking import CyclePool, loop_await


class Waits:
    """A coroutine that sleeps, counting how many of its calls wait at once."""

    def __init__(self) -> None:
        self.now = 0
        self.most = 0

    async def __call__(self, *, seconds: float, value: Any = None, error: str = "") -> Any:
        self.now += 1
        self.most = max(self.most, self.now)
        try:
            await asyncio.sleep(seconds)
        finally:
            self.now -= 1
        if error:
            raise ValueError(error)
        return value


async def test_cycles_on_one_thread_wait_together_and_get_their_answers() -> None:
    waits = Waits()
    pool = CyclePool(threads=1, loop=asyncio.get_running_loop(), name="test-park")
    try:
        def cycle(n: int) -> int:
            return int(loop_await(waits, seconds=0.2, value=n)) + int(loop_await(waits, seconds=0.05, value=n))

        results = await asyncio.wait_for(asyncio.gather(*(pool.submit(cycle, n) for n in range(5))), timeout=10)
    finally:
        pool.shutdown()
    assert results == [0, 2, 4, 6, 8]
    assert waits.most == 5  # one thread, five cycles waiting at once: none held it


async def test_an_error_awaited_reaches_the_cycle_that_asked() -> None:
    waits = Waits()
    pool = CyclePool(threads=1, loop=asyncio.get_running_loop(), name="test-park")
    caught: list[str] = []
    try:
        def cycle() -> str:
            try:
                loop_await(waits, seconds=0.01, error="the model said no")
            except ValueError as exc:
                caught.append(str(exc))
            return "went on"

        assert await asyncio.wait_for(pool.submit(cycle), timeout=10) == "went on"
        with pytest.raises(ZeroDivisionError):  # the cycle's own error ends its future, not the thread
            await asyncio.wait_for(pool.submit(lambda: 1 / 0), timeout=10)
        assert await asyncio.wait_for(pool.submit(lambda: "still serving"), timeout=10) == "still serving"
    finally:
        pool.shutdown()
    assert caught == ["the model said no"]


@pytest.mark.django_db(transaction=True)
async def test_a_cycle_inside_a_transaction_waits_without_parking() -> None:
    """The cycles of a thread share its database connection: one inside atomic() must keep the thread, or
    another cycle would run its statements inside that transaction."""
    waits = Waits()
    pool = CyclePool(threads=1, loop=asyncio.get_running_loop(), name="test-park")
    try:
        def in_transaction() -> None:
            with transaction.atomic():
                loop_await(waits, seconds=0.2)

        await asyncio.wait_for(asyncio.gather(pool.submit(in_transaction), pool.submit(in_transaction)), timeout=10)
    finally:
        pool.shutdown()
    assert waits.most == 1
