"""The live-event publisher: after a change commits, tell the open pages which agent and plan changed.

Messages are small ("agent 3, plan 12 changed"); each websocket consumer re-renders what its page shows
for its own user, so a pushed fragment never carries more than that user may see.
"""

from __future__ import annotations

import logging

from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer
from django.db import transaction

logger = logging.getLogger("planner.events")

DASHBOARD_GROUP = "dashboard"


def agent_group(agent_id: int) -> str:
    return f"agent-{agent_id}"


def plan_group(plan_id: int) -> str:
    return f"plan-{plan_id}"


def publish_changed(*, agent_id: int, plan_id: int | None = None, kind: str = "changed") -> None:
    """Send "state.changed" to the dashboard, the agent's and the plan's groups, now."""
    layer = get_channel_layer()
    if layer is None:
        return
    message = {"type": "state.changed", "agent_id": agent_id, "plan_id": plan_id, "kind": kind}
    groups = [DASHBOARD_GROUP, agent_group(agent_id)]
    if plan_id is not None:
        groups.append(plan_group(plan_id))
    try:
        for group in groups:
            async_to_sync(layer.group_send)(group, message)
    except Exception:  # a page missing one push refetches on reconnect; the change itself is committed
        logger.exception("publishing %s for agent %s failed", kind, agent_id)


def publish_changed_on_commit(*, agent_id: int, plan_id: int | None = None, kind: str = "changed") -> None:
    """Publish once the surrounding transaction commits, so pages never show what was rolled back."""
    transaction.on_commit(lambda: publish_changed(agent_id=agent_id, plan_id=plan_id, kind=kind))
