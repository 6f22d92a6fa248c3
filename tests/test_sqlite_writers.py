"""The SQLite backend queues a process's writers itself (planner_site/sqlite/base.py)."""

from __future__ import annotations

import contextlib
from concurrent.futures import ThreadPoolExecutor

import pytest
from django.db import connection, transaction
from django.db.models import F

from agents.models import Agent
from planner_site.sqlite.base import WRITERS
from tests.factories import AgentFactory

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(connection.vendor != "sqlite", reason="the writers' queue is the SQLite backend's"),
]


def test_writers_in_many_threads_all_commit_and_none_is_lost() -> None:
    agent = AgentFactory()

    def cycles(in_transaction: bool) -> None:
        try:
            for _ in range(25):
                # A transaction takes its turn when it begins, a lone statement when it runs.
                with transaction.atomic() if in_transaction else contextlib.nullcontext():
                    Agent.objects.filter(pk=agent.pk).update(cycle_count=F("cycle_count") + 1)
        finally:
            connection.close()

    with ThreadPoolExecutor(max_workers=8) as pool:
        list(pool.map(cycles, [True, False] * 4))

    agent.refresh_from_db()
    assert agent.cycle_count == 200
    assert not WRITERS.locked()


def test_a_rolled_back_or_committed_transaction_lets_the_next_writer_in() -> None:
    with pytest.raises(RuntimeError), transaction.atomic():
        AgentFactory()
        raise RuntimeError("the cycle broke")
    assert not WRITERS.locked()
    assert not Agent.objects.exists()  # rolled back

    with transaction.atomic():
        AgentFactory()
    assert not WRITERS.locked()
    assert Agent.objects.count() == 1
