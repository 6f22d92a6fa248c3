from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.test import Client

from tests.factories import UserFactory
from tests.llm_fixtures import llm_server  # noqa: F401  (a fixture for the gateway and planner tests)


def idle_in_transaction_unbounded_here() -> None:
    """This test process's own PostgreSQL connection holds each test's transaction open while the test waits on
    runners, model servers and browsers: no idle-in-transaction limit for it (docs/runtime-guarantees.md). The
    runners it starts keep theirs. Set before its first connection (the settings' dict is the connection's)."""
    from django.conf import settings

    options = settings.DATABASES["default"].get("OPTIONS", {})
    if isinstance(options.get("options"), str):
        options["options"] = re.sub(r"idle_in_transaction_session_timeout=\d+", "idle_in_transaction_session_timeout=0",
                                    options["options"])


idle_in_transaction_unbounded_here()


@pytest.fixture(autouse=True)
def workspaces(settings: Any, tmp_path: Path) -> Path:
    """Every test gets its own agents' workspaces folder."""
    settings.AGENT_WORKSPACES = tmp_path / "workspaces"
    # The scripted model server (tests/llm_server.py) answers any number of requests at once, unlike a real local
    # one: no one-at-a-time bound for it unless a test asks for one (tests/agents/test_fair_sharing.py).
    settings.LLM_LOCAL_CONCURRENCY = 0
    return settings.AGENT_WORKSPACES


@pytest.fixture
def operator(db: None) -> Any:
    return UserFactory(username="olga", role="operators")


@pytest.fixture
def viewer(db: None) -> Any:
    return UserFactory(username="victor", role="viewers")


@pytest.fixture
def operator_client(operator: Any) -> Client:
    client = Client()
    client.force_login(operator)
    return client


@pytest.fixture
def viewer_client(viewer: Any) -> Client:
    client = Client()
    client.force_login(viewer)
    return client



@pytest.fixture(autouse=True)
def engine_jobs_cleared(request: pytest.FixtureRequest) -> Iterator[None]:
    """The job engine's tables are not Django's to flush between transactional tests (its models are
    unmanaged): cycles of one test's agents must not run in the next. Scale-out stack only."""
    from django.conf import settings

    marker = request.node.get_closest_marker("django_db")
    if not settings.SCALE_OUT or marker is None or not marker.kwargs.get("transaction"):
        yield
        return
    request.getfixturevalue("transactional_db")  # cleared before the database is flushed
    yield
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("DELETE FROM procrastinate_jobs")
        cursor.execute("DELETE FROM procrastinate_workers")
