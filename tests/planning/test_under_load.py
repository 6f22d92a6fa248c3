"""What keeps pages fast while agents long-poll (tests/bench/load.py measures it): a page's middleware runs in
its request's thread without hopping to the event loop per middleware, and the dashboard counts its inbox once."""

from __future__ import annotations

from typing import Any
from unittest import mock

import pytest
from asgiref.sync import SyncToAsync
from channels.testing import HttpCommunicator
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext

from planner_site.asgi import application
from tests.factories import PlanEventFactory, PlanStepFactory
from tests.operator_pages.test_inbox import waiting_plan, waiting_step

pytestmark = pytest.mark.django_db


async def hops_of(path: str) -> tuple[int, int]:
    """(status, how many times the request went from the event loop to a thread) for one request to the real
    ASGI application (which, unlike the test client, gives the request's connection back at its end)."""
    hops = 0
    original = SyncToAsync.__call__

    async def counted(self: SyncToAsync[Any, Any], *args: Any, **kwargs: Any) -> Any:
        nonlocal hops
        hops += 1
        return await original(self, *args, **kwargs)

    with mock.patch.object(SyncToAsync, "__call__", counted):
        response = await HttpCommunicator(application, "GET", path, headers=[(b"host", b"127.0.0.1")]).get_response()
    return response["status"], hops


@pytest.mark.django_db(transaction=True)
async def test_a_page_hops_to_a_thread_a_few_times_not_once_per_middleware_hook() -> None:
    # A sync-only middleware in the middle of the chain made Django run the rest of it on the event loop, each
    # hook of each middleware a hop to the request's thread and back: 16 for /healthz, each a wait for the
    # interpreter lock under load. The chain now runs in one thread: only the view and its view hooks hop.
    status, hops = await hops_of("/healthz")
    assert status == 200
    assert hops <= 6, hops


def test_a_nul_in_the_query_is_still_refused_before_any_view(viewer_client: Client) -> None:
    response = viewer_client.get("/audit/?plan=%00")
    assert response.status_code == 400
    assert b"NUL" in response.content and b"Nothing was changed" in response.content


def test_the_dashboard_counts_its_inbox_once_and_shows_the_same_number_twice(viewer_client: Client) -> None:
    waiting_step()
    waiting_plan()
    PlanEventFactory(plan=PlanStepFactory().plan)
    with CaptureQueriesContext(connection) as queries:
        html = viewer_client.get("/").content.decode()
    # inbox_count counts the waiting steps (and, apart, the waiting plans): once for the page, not per use.
    inbox_counts = [q["sql"] for q in queries.captured_queries
                    if q["sql"].startswith('SELECT COUNT(*) AS "__count" FROM "planning_planstep"')]
    assert len(inbox_counts) == 1, inbox_counts
    assert 'id="inbox-link">Inbox <span id="inbox-count"' in html and 'data-count="2"' in html  # the navigation
    assert '<b>2</b> items in the inbox' in html  # the dashboard's own line
