"""Live pages: each consumer joins its groups, and on every change re-renders its page's sections.

Messages from the publisher only name what changed; the consumer renders for its own user (a viewer
never receives decision buttons). Changes arriving close together are rendered once (coalesced).
On connect, and so after every reconnect, the current state is sent, so nothing missed stays stale.
Clients send nothing; anything they send is ignored.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncWebsocketConsumer
from django.core.exceptions import ObjectDoesNotExist
from django.template.loader import render_to_string

from planner_site.events import DASHBOARD_GROUP, agent_group, plan_group
from planner_site.roles import user_can_decide
from planning.selectors import agent_context, dashboard_counts, dashboard_rows, plan_context

logger = logging.getLogger("planner.live")

COALESCE_SECONDS = 0.05


class LiveConsumer(AsyncWebsocketConsumer):
    groups_for_page: list[str] = []

    async def connect(self) -> None:
        user = self.scope.get("user")
        if user is None or not user.is_authenticated:
            await self.close(code=4401)
            return
        self.can_decide = await database_sync_to_async(user_can_decide)(user)
        self.pending: set[int] = set()
        self.flush_task: asyncio.Task[None] | None = None
        try:
            html = await database_sync_to_async(self.render_all)()
        except ObjectDoesNotExist:
            await self.close(code=4404)
            return
        self.joined = self.page_groups()
        for group in self.joined:
            await self.channel_layer.group_add(group, self.channel_name)
        await self.accept()
        await self.send(text_data=html)

    async def disconnect(self, code: int) -> None:
        for group in getattr(self, "joined", []):
            await self.channel_layer.group_discard(group, self.channel_name)
        if getattr(self, "flush_task", None):
            self.flush_task.cancel()  # type: ignore[union-attr]

    async def receive(self, text_data: str | None = None, bytes_data: bytes | None = None) -> None:
        """The pages only listen; a client message changes nothing."""

    async def state_changed(self, event: dict[str, Any]) -> None:
        self.pending.add(int(event.get("agent_id") or 0))
        if self.flush_task is None or self.flush_task.done():
            self.flush_task = asyncio.create_task(self.flush())

    async def flush(self) -> None:
        await asyncio.sleep(COALESCE_SECONDS)
        agent_ids, self.pending = self.pending, set()
        try:
            html = await database_sync_to_async(self.render_changed)(agent_ids)
        except ObjectDoesNotExist:
            await self.close(code=4404)
            return
        except Exception:
            logger.exception("rendering a live update failed")
            return
        if html:
            await self.send(text_data=html)

    def page_groups(self) -> list[str]:
        raise NotImplementedError

    def render_all(self) -> str:
        raise NotImplementedError

    def render_changed(self, agent_ids: set[int]) -> str:
        return self.render_all()

    def render(self, template: str, context: dict[str, Any]) -> str:
        return render_to_string(template, context | {"can_decide": self.can_decide, "user": self.scope["user"], "live": True})


class DashboardConsumer(LiveConsumer):
    def page_groups(self) -> list[str]:
        return [DASHBOARD_GROUP]

    def render_all(self) -> str:
        self.known: set[int] = set()
        rows = dashboard_rows()
        self.known = {r.agent.pk for r in rows}
        return self.render("planning/dashboard_live.html", {"rows": rows, "counts": dashboard_counts(), "full": True})

    def render_changed(self, agent_ids: set[int]) -> str:
        if not agent_ids <= self.known:  # an agent this page has not shown yet: send the whole table
            return self.render_all()
        rows = dashboard_rows(agent_ids=sorted(agent_ids))
        if len(rows) < len(agent_ids):  # an agent was deleted
            return self.render_all()
        return self.render("planning/dashboard_live.html", {"rows": rows, "counts": dashboard_counts(), "full": False})


class AgentConsumer(LiveConsumer):
    def page_groups(self) -> list[str]:
        return [agent_group(self.scope["url_route"]["kwargs"]["agent_id"])]

    def render_all(self) -> str:
        return self.render("planning/agent_live.html", agent_context(self.scope["url_route"]["kwargs"]["agent_id"]))


class PlanConsumer(LiveConsumer):
    def page_groups(self) -> list[str]:
        return [plan_group(self.scope["url_route"]["kwargs"]["plan_id"])]

    def render_all(self) -> str:
        return self.render("planning/plan_live.html", plan_context(self.scope["url_route"]["kwargs"]["plan_id"]))
