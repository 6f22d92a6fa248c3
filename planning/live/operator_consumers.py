"""Live inbox: the count in every page's navigation, and the inbox page itself, pushed on every change.

They are pages of the live hub (planning/live/): every change reaches their feed, which renders once
per burst and audience and pushes only when what the page shows changed; the full state is sent on every
(re)connect. Presence goes through the channel layer directly.
"""

from __future__ import annotations

import asyncio
from typing import Any

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncWebsocketConsumer
from django.template.loader import render_to_string

from planning.live.consumers import LiveConsumer
from planning.live.hub import CLOSE_NOT_FOUND, CLOSE_UNAUTHENTICATED
from planning.live.renderers import LivePage, render_for
from planning.models import Plan
from planning.operator_selectors import InboxItem, inbox_count, inbox_items


class InboxLivePage(LivePage):
    """The inbox, or only its count: any change may add or remove an item. Rendered once per burst of changes
    and per audience, and pushed only when what the page shows changed (items and their urgency, or the count)."""

    def __init__(self, key: str, *, count_only: bool) -> None:
        super().__init__(key)
        self.count_only = count_only
        self.last: Any = None

    def concerns(self, message: dict[str, Any]) -> set[int]:
        return {0}

    def baseline(self) -> None:
        self.last = self.state()[0]

    def state(self) -> tuple[Any, list[InboxItem]]:
        if self.count_only:
            return inbox_count(), []
        items = inbox_items()
        return tuple((i.key, i.urgent) for i in items), items

    def render_changes(self, ids: set[int], audiences: set[str]) -> dict[str, str]:
        previous = self.last
        signature, items = self.state()
        if signature == previous:
            return {}
        self.last = signature
        if self.count_only:
            return dict.fromkeys(audiences, render_to_string("planning/inbox_count.html",
                                                             {"count": signature, "oob": True}))
        arrived = len({key for key, _ in signature} - {key for key, _ in previous or ()})
        count = len(items)
        # Only arrivals are announced: the operator's own decisions are announced by their answer.
        announce = f"{arrived} new in the inbox; {count} item{'s' if count != 1 else ''} wait for you." if arrived else ""
        context = {"items": items, "count": count, "announce": announce}
        return {a: render_for("planning/inbox_live.html", context, a) for a in audiences}


class InboxCountConsumer(LiveConsumer):
    """The "Inbox 4" in the navigation of every page."""

    def page_key(self) -> str:
        return "inbox-count"

    def page_new(self) -> LivePage:
        return InboxLivePage(self.page_key(), count_only=True)

    def render_all(self) -> str:
        return self.render("planning/inbox_count.html", {"count": inbox_count()})


URGENCY_RECHECK_SECONDS = 30


class InboxConsumer(LiveConsumer):
    """The inbox page. Waiting items become urgent by the clock alone (the agents' waiting policy), so an open
    inbox is also re-checked every URGENCY_RECHECK_SECONDS."""

    def page_key(self) -> str:
        return "inbox"

    def page_new(self) -> LivePage:
        return InboxLivePage(self.page_key(), count_only=False)

    def render_all(self) -> str:
        items = inbox_items()
        return self.render("planning/inbox_live.html", {"items": items, "count": len(items), "announce": ""})

    async def connect(self) -> None:
        await super().connect()
        if self.feed is not None:
            self.ticker = asyncio.create_task(self.tick())

    async def disconnect(self, code: int) -> None:
        ticker = getattr(self, "ticker", None)
        if ticker is not None:
            ticker.cancel()
        await super().disconnect(code)

    async def tick(self) -> None:
        while self.feed is not None:
            await asyncio.sleep(URGENCY_RECHECK_SECONDS)
            if self.feed is not None:
                self.feed.pending.add(0)
                self.feed.kick()


def presence_group(plan_id: int) -> str:
    return f"presence-plan-{plan_id}"


class PlanPresenceConsumer(AsyncWebsocketConsumer):
    """Who else has this plan open. Each open page announces itself to the plan's presence group, answers
    newcomers directly, and says goodbye on close; no shared store, so it works on any channel layer.
    (A web process killed without closing its sockets leaves its viewers listed until those pages reload.)"""

    async def connect(self) -> None:
        user = self.scope.get("user")
        if user is None or not user.is_authenticated:
            await self.accept()  # accepted only to say why it closes, as the live pages do
            await self.close(code=CLOSE_UNAUTHENTICATED)
            return
        self.plan_id = int(self.scope["url_route"]["kwargs"]["plan_id"])
        if not await database_sync_to_async(Plan.objects.filter(pk=self.plan_id).exists)():
            await self.accept()
            await self.close(code=CLOSE_NOT_FOUND)
            return
        self.username = user.get_username()
        self.viewers: dict[str, str] = {}  # channel name -> username, for the other open pages
        self.group = presence_group(self.plan_id)
        await self.channel_layer.group_add(self.group, self.channel_name)
        await self.accept()
        await self.send_viewers()
        await self.channel_layer.group_send(self.group, {"type": "presence.join", "channel": self.channel_name,
                                                         "user": self.username})

    async def disconnect(self, code: int) -> None:
        group = getattr(self, "group", None)
        if group is None:
            return
        await self.channel_layer.group_send(group, {"type": "presence.leave", "channel": self.channel_name})
        await self.channel_layer.group_discard(group, self.channel_name)

    async def receive(self, text_data: str | None = None, bytes_data: bytes | None = None) -> None:
        """Pages only listen."""

    async def presence_join(self, event: dict[str, Any]) -> None:
        if event["channel"] == self.channel_name:
            return
        self.viewers[event["channel"]] = str(event["user"])
        await self.channel_layer.send(event["channel"], {"type": "presence.here", "channel": self.channel_name,
                                                         "user": self.username})
        await self.send_viewers()

    async def presence_here(self, event: dict[str, Any]) -> None:
        self.viewers[event["channel"]] = str(event["user"])
        await self.send_viewers()

    async def presence_leave(self, event: dict[str, Any]) -> None:
        if self.viewers.pop(event["channel"], None) is not None:
            await self.send_viewers()

    async def send_viewers(self) -> None:
        others = sorted({name for name in self.viewers.values() if name != self.username})
        if others == getattr(self, "shown", None):  # a layer may deliver a hello twice; say each change once
            return
        self.shown = others
        html = render_to_string("planning/plan_presence.html#names", {"others": others, "oob": True})
        await self.send(text_data=html)
