"""The live pages' websockets: one consumer per open page.

A **consumer** is one websocket: it checks the login, joins its page's feed on the hub
(planning/live/hub.py), sends the page's full state (so a reconnect always resyncs), and then only relays
what the feed sends. Clients send nothing; anything they send is ignored.
"""

from __future__ import annotations

import logging
from typing import Any
from urllib.parse import parse_qsl

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncWebsocketConsumer
from django.core.exceptions import ObjectDoesNotExist
from django.utils.datastructures import MultiValueDict

from planner_site.roles import user_can_decide
from planning.live.hub import (
    CLOSE_LAYER_DOWN,
    CLOSE_NOT_FOUND,
    CLOSE_UNAUTHENTICATED,
    Feed,
    LayerUnavailable,
    LiveHub,
    hub_get,
    hub_stop,
)
from planning.live.renderers import (
    OPERATOR,
    VIEWER,
    AgentLivePage,
    DashboardLivePage,
    LivePage,
    PlanLivePage,
    render_for,
)
from planning.selectors import DashboardFilter, agent_context, dashboard_page_counted, plan_context

logger = logging.getLogger("planner.live")


class LiveConsumer(AsyncWebsocketConsumer):
    """One open page. Subclasses say which feed it joins and how its full state renders."""

    # No channel of its own (an alias with no layer): the hub listens for the whole process, so a
    # page opens without touching Redis, and one Redis outage does not fail every connect with a 500.
    channel_layer_alias = "live-pages-listen-through-the-hub"
    feed: Feed | None = None
    generation_min = 0

    async def connect(self) -> None:
        self.feed = None
        self.backlog: list[str] = []
        self.live = False
        user = self.scope.get("user")
        if user is None or not user.is_authenticated:
            await self.refuse(CLOSE_UNAUTHENTICATED)
            return
        self.audience = OPERATOR if await database_sync_to_async(user_can_decide)(user) else VIEWER
        self.query: MultiValueDict[str, str] = MultiValueDict()
        for k, v in parse_qsl(self.scope.get("query_string", b"").decode("latin-1")):
            self.query.appendlist(k, v)
        try:
            hub = await hub_get()
        except LayerUnavailable as exc:
            logger.warning("websocket refused while the channel layer is down: %s", exc)
            await self.refuse(CLOSE_LAYER_DOWN)
            return
        try:
            # Join first, render after: a change committed meanwhile is pushed, never lost.
            self.feed = await hub.join(self, self.page_key(), self.page_new, self.audience)
            html = await database_sync_to_async(self.render_all)()
        except ObjectDoesNotExist:
            if self.feed is not None:
                await hub.leave(self, self.feed)
                self.feed = None
            else:
                await self.leave_hub_if_idle(hub)
            await self.refuse(CLOSE_NOT_FOUND)
            return
        await self.accept()
        await self.send(text_data=html)
        self.live = True
        for text in self.backlog:
            await self.send(text_data=text)
        self.backlog = []

    async def leave_hub_if_idle(self, hub: LiveHub) -> None:
        if not hub.feeds and not hub.watchers:
            await hub_stop(hub)

    async def refuse(self, code: int) -> None:
        """Accept, then close with a code the page can read (a refused handshake only shows 1006)."""
        await self.accept()
        await self.close(code=code)

    async def disconnect(self, code: int) -> None:
        feed, self.feed = self.feed, None
        if feed is not None:
            await feed.hub.leave(self, feed)

    async def receive(self, text_data: str | None = None, bytes_data: bytes | None = None) -> None:
        """The pages only listen; a client message changes nothing."""

    async def push(self, text: str, generation: int) -> None:
        if generation < self.generation_min:
            return  # rendered before this page's full state was read
        if not self.live:
            self.backlog.append(text)
            return
        await self.send(text_data=text)

    def page_key(self) -> str:
        raise NotImplementedError

    def page_new(self) -> LivePage:
        raise NotImplementedError

    def render_all(self) -> str:
        raise NotImplementedError

    def render(self, template: str, context: dict[str, Any]) -> str:
        return render_for(template, context | {"user": self.scope["user"], "oob": True}, self.audience)


class DashboardConsumer(LiveConsumer):
    def page_key(self) -> str:
        return "dashboard"

    def page_new(self) -> LivePage:
        return DashboardLivePage(self.page_key())

    def render_all(self) -> str:
        filters = DashboardFilter.from_query(self.query)
        rows, _, counts = dashboard_page_counted(filters)
        return self.render("planning/dashboard_full.html", {"rows": rows, "counts": counts, "filters": filters})


class ObjectPageConsumer(LiveConsumer):
    """The page of one object, named by the route's `<kind>_id`: one feed per object."""

    kind = ""
    page_class: type[AgentLivePage] | type[PlanLivePage]

    def object_id(self) -> int:
        return int(self.scope["url_route"]["kwargs"][f"{self.kind}_id"])

    def page_key(self) -> str:
        return f"{self.kind}-{self.object_id()}"

    def page_new(self) -> LivePage:
        return self.page_class(self.page_key(), self.object_id())


class AgentConsumer(ObjectPageConsumer):
    kind = "agent"
    page_class = AgentLivePage

    def render_all(self) -> str:
        return self.render("planning/agent_live.html", agent_context(self.object_id()))


class PlanConsumer(ObjectPageConsumer):
    kind = "plan"
    page_class = PlanLivePage

    def render_all(self) -> str:
        context = plan_context(self.object_id(), events_page=self.query.get("events", 1),
                               calls_page=self.query.get("calls", 1))
        return self.render("planning/plan_live.html", context)


class UnknownPathConsumer(AsyncWebsocketConsumer):
    """Any other websocket path: closed with CLOSE_NOT_FOUND, not an error."""

    channel_layer_alias = LiveConsumer.channel_layer_alias

    async def connect(self) -> None:
        await self.accept()
        await self.close(code=CLOSE_NOT_FOUND)
