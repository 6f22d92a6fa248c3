"""One cycle of one agent, as both runtimes run it, and the reads they share."""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import uuid
from collections.abc import Iterator
from datetime import timedelta

from django.conf import settings
from django.db.models import Q, QuerySet
from django.utils import timezone

from agents.connections import CONNECTION_ERRORS, connection_recover, connection_release
from agents.connections import error_brief as error_brief  # its old home: still importable from here
from agents.models import Agent
from planner_site.events import published_together
from planning.models import Plan
from planning.planner import plans_interrupted_fail
from runtime.cycle import agent_cycle, persona_cycles, tools_start

logger = logging.getLogger("planner.runner")

# The agents runners drive: running ones, but not external agents, which drive themselves over the API.
DRIVEN = Q(status=Agent.Status.RUNNING) & ~Q(kind__in=(Agent.Kind.EXTERNAL, Agent.Kind.AGUI))


def runner_id_new() -> str:
    """A name operators can read in timelines: which machine, which process."""
    return f"runner {socket.gethostname()}/{os.getpid()}-{uuid.uuid4().hex[:4]}"


def agents_driven() -> QuerySet[Agent]:
    return Agent.objects.filter(DRIVEN)


def cycle_run(agent_id: int, runner: str, kind: str = "", *, release: bool = True) -> str:
    """Run one cycle of an agent and give the thread's connection back (`release`; a caller with more to do
    on it gives it back itself). Both runtimes run one cycle of an
    agent at a time, so planning found "validating" when a cycle starts was left by a cycle that died (a
    killed worker, a restarted process): it fails first, with that reason, and the agent plans again. `kind`:
    the agent's kind as the caller read it: a tool agent's cycle then skips the persona read, and finds such
    planning in the read of its open plans it makes anyway (agent_cycle, tool_open_plan)."""
    try:
        with cycle_scope():
            if kind != Agent.Kind.TOOL:
                plans_interrupted_fail(agent_ids=[agent_id], runner=runner)
            return agent_cycle(agent_id=agent_id, runner=runner, kind=kind)
    finally:
        if release:
            connection_release()


@contextlib.contextmanager
def cycle_scope() -> Iterator[None]:
    """Where a cycle or a pass does its work: its changes reach the open pages as one message once it ends, and a
    connection the database cut under it is dropped, so that the next statement opens a fresh one."""
    try:
        with published_together():
            yield
    except CONNECTION_ERRORS:
        connection_recover()
        raise


def personas_run(agent_ids: list[int], runner: str) -> tuple[dict[int, str], list[int]]:
    """One pass of these personas (persona_cycles), then the thread's connection given back: what happened to
    each whose cycle ran, and those whose cycle runs apart (it may wait on a model server)."""
    try:
        with cycle_scope():
            return persona_cycles(agent_ids, runner=runner)
    finally:
        connection_release()


def tools_start_run(agent_ids: list[int], runner: str) -> tuple[list[int], list[int]]:
    """The first cycles of tool agents whose chains start (tools_start): the agents planned there, and those whose
    cycle runs apart. The caller chains them on the same connection and gives it back."""
    with cycle_scope():
        return tools_start(agent_ids, runner=runner)


def plans_orphaned_fail(*, runner: str, busy: set[int] | frozenset[int] = frozenset(),
                        stale_seconds: float | None = None) -> int:
    """Plans left "validating" by a cycle that died, of agents no cycle is driving now (`busy` are driven; a
    paused agent is driven no more): failed with their reason, so none waits for good. External agents are
    left alone: their planning runs in the web process that took the request."""
    stale = timezone.now() - timedelta(
        seconds=settings.RUNNER_STALLED_SECONDS if stale_seconds is None else stale_seconds)
    ids = set(Plan.objects.filter(status=Plan.Status.VALIDATING, updated_at__lt=stale)
              .exclude(agent__kind__in=(Agent.Kind.EXTERNAL, Agent.Kind.AGUI)).exclude(agent_id__in=busy)
              .values_list("agent_id", flat=True))
    return plans_interrupted_fail(agent_ids=sorted(ids), runner=runner) if ids else 0
