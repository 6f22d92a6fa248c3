"""The runner: leases keep an agent with one runner; --cycles stops after N cycles per agent."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from agents.models import Agent
from agents.runner import Runner, agents_claim, agents_release
from tests.factories import AgentFactory

pytestmark = pytest.mark.django_db


def test_two_runners_never_claim_the_same_agent() -> None:
    AgentFactory.create_batch(4, kind="tool")
    first = agents_claim(runner="a", limit=3, exclude=set())
    second = agents_claim(runner="b", limit=10, exclude=set())
    assert len(first) == 3 and len(second) == 1
    assert not set(first) & set(second)
    assert set(Agent.objects.filter(lease_owner="a").values_list("pk", flat=True)) == set(first)


def test_expired_lease_is_taken_over() -> None:
    agent = AgentFactory(kind="tool", lease_owner="dead-runner", lease_expires_at=timezone.now() - timedelta(seconds=1))
    assert agents_claim(runner="b", limit=5, exclude=set()) == [agent.pk]
    agent.refresh_from_db()
    assert agent.lease_owner == "b"


def test_live_lease_is_respected_and_release_frees_it() -> None:
    AgentFactory(kind="tool", lease_owner="a", lease_expires_at=timezone.now() + timedelta(seconds=30))
    assert agents_claim(runner="b", limit=5, exclude=set()) == []
    agents_release(runner="a")
    assert len(agents_claim(runner="b", limit=5, exclude=set())) == 1


def test_paused_and_not_due_agents_are_not_claimed() -> None:
    AgentFactory(kind="tool", status=Agent.Status.PAUSED)
    AgentFactory(kind="tool", next_cycle_at=timezone.now() + timedelta(hours=1))
    assert agents_claim(runner="a", limit=5, exclude=set()) == []


@pytest.mark.django_db(transaction=True)
@pytest.mark.asyncio
async def test_runner_drives_each_agent_n_cycles_and_releases_leases() -> None:
    from channels.db import database_sync_to_async

    await database_sync_to_async(lambda: AgentFactory.create_batch(3, kind="tool", cycle_interval=0))()
    runner = Runner(runner_id="test-runner", cycles=2, tick=0.01)
    await runner.run()
    counts = await database_sync_to_async(lambda: sorted(Agent.objects.values_list("cycle_count", flat=True)))()
    assert counts == [2, 2, 2]
    assert not await Agent.objects.exclude(lease_owner="").aexists()
