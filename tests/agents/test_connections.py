"""A worker thread's database connection: given back after a cycle, kept while a caller's transaction needs it,
and never opened only to be given back (agents/connections.py)."""

from __future__ import annotations

import pytest
from django.db import connection, transaction
from django.db.backends.signals import connection_created

from agents.connections import connection_release, in_transaction
from agents.models import Agent

pytestmark = pytest.mark.django_db(transaction=True)


def test_in_transaction_is_true_only_inside_atomic() -> None:
    assert not in_transaction()
    with transaction.atomic():
        assert in_transaction()
        with transaction.atomic():
            assert in_transaction()
    assert not in_transaction()


def test_release_keeps_a_callers_transaction_and_opens_nothing_when_already_released() -> None:
    with transaction.atomic():
        Agent.objects.count()
        connection_release()  # the caller's transaction still needs it: kept
        assert Agent.objects.count() == 0
    if connection.vendor == "sqlite":
        pytest.skip("SQLite keeps each thread's connection (no pool): nothing is given back")
    opened: list[object] = []

    def count(**kwargs: object) -> None:
        opened.append(kwargs["connection"])

    connection_created.connect(count)
    try:
        connection_release()  # given back to the pool
        connection_release()  # again, with nothing open: nothing is opened only to answer
        assert opened == []
        assert Agent.objects.count() == 0  # the next query takes one again
        assert len(opened) == 1
    finally:
        connection_created.disconnect(count)
