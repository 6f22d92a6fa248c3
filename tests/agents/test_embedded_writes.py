"""The embedded stack's SQLite settings (WAL, IMMEDIATE transactions, a busy timeout) let the runner's threads and
the web write to one file at once: every write commits, none is lost, none fails with "database is locked"."""

from __future__ import annotations

import contextlib
from concurrent.futures import ThreadPoolExecutor

import pytest
from django.db import connection, transaction
from django.db.models import F

from agents.models import Agent
from tests.factories import AgentFactory

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(connection.vendor != "sqlite", reason="the embedded stack's SQLite settings"),
]


def test_writers_in_many_threads_all_commit_and_none_is_lost() -> None:
    agent = AgentFactory()

    def cycles(in_transaction: bool) -> None:
        try:
            for _ in range(25):
                with transaction.atomic() if in_transaction else contextlib.nullcontext():
                    Agent.objects.filter(pk=agent.pk).update(cycle_count=F("cycle_count") + 1)
        finally:
            connection.close()

    with ThreadPoolExecutor(max_workers=8) as pool:
        list(pool.map(cycles, [True, False] * 4))

    agent.refresh_from_db()
    assert agent.cycle_count == 200


def test_a_read_then_write_transaction_does_not_deadlock_another_writer() -> None:
    """IMMEDIATE takes the write lock when the transaction begins: two transactions that each read and then
    write never both hold a read lock waiting to upgrade (SQLite would fail one at once, timeout or not)."""
    agent = AgentFactory()

    def read_then_write() -> None:
        try:
            for _ in range(20):
                with transaction.atomic():
                    count = Agent.objects.get(pk=agent.pk).cycle_count
                    Agent.objects.filter(pk=agent.pk).update(cycle_count=count + 1)
        finally:
            connection.close()

    with ThreadPoolExecutor(max_workers=4) as pool:
        list(pool.map(lambda _: read_then_write(), range(4)))

    agent.refresh_from_db()
    assert agent.cycle_count == 80  # no lost update: each read saw the write before it
