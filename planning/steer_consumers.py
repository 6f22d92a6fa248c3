"""Live inbox: the count in every page's navigation, and the inbox page itself, pushed on every change.

Every change is published to the dashboard group (planner_site/events.py), so these consumers join it; the
base class coalesces bursts and re-sends the full state on every (re)connect. A push is sent only when what
the page shows changed (the runner's per-cycle heartbeat alone changes nothing here), so an operator's
keyboard focus and typing are left alone.
"""

from __future__ import annotations

import asyncio
from typing import Any

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncWebsocketConsumer
from django.template.loader import render_to_string

from planner_site.events import DASHBOARD_GROUP
from planning.consumers import LiveConsumer
from planning.models import Plan
from planning.steer_selectors import inbox_count, inbox_items


class InboxLiveBase(LiveConsumer):
    def page_groups(self) -> list[str]:
        return [DASHBOARD_GROUP]

    async def state_changed(self, event: dict[str, Any]) -> None:
        if event.get("kind") == "cycle":  # the heartbeat after each cycle; real changes publish their own kind
            return
        await super().state_changed(event)


class InboxCountConsumer(InboxLiveBase):
    """The "Inbox 4" in the navigation of every page."""

    def render_all(self) -> str:
        count = inbox_count()
        if count == getattr(self, "last_count", None):
            return ""
        self.last_count = count
        return self.render("planning/inbox_count.html", {"count": count, "oob": True})


URGENCY_RECHECK_SECONDS = 30


class InboxConsumer(InboxLiveBase):
    """The inbox page: its list, the count and a polite announcement when new items arrive. Waiting items
    become urgent by the clock alone (the agents' waiting policy), so the list is also re-checked every
    URGENCY_RECHECK_SECONDS and pushed when an item turned urgent."""

    async def connect(self) -> None:
        await super().connect()
        if hasattr(self, "joined"):  # accepted
            self.ticker = asyncio.create_task(self.tick())

    async def disconnect(self, code: int) -> None:
        ticker = getattr(self, "ticker", None)
        if ticker is not None:
            ticker.cancel()
        await super().disconnect(code)

    async def tick(self) -> None:
        while True:
            await asyncio.sleep(URGENCY_RECHECK_SECONDS)
            html = await database_sync_to_async(self.render_all)()
            if html:
                await self.send(text_data=html)

    def render_all(self) -> str:
        items = inbox_items()
        signature = tuple((i.key, i.urgent) for i in items)
        previous = getattr(self, "last_signature", None)
        if signature == previous:
            return ""
        self.last_signature = signature
        count = len(items)
        announce = ""  # only arrivals are announced: the operator's own decisions are announced by their answer
        arrived = len({i.key for i in items} - {key for key, _ in previous or ()})
        if previous is not None and arrived:
            announce = f"{arrived} new in the inbox; {count} item{'s' if count != 1 else ''} wait for you."
        return self.render("planning/inbox_live.html", {"items": items, "count": count, "announce": announce})


def presence_group(plan_id: int) -> str:
    return f"presence-plan-{plan_id}"


class PlanPresenceConsumer(AsyncWebsocketConsumer):
    """Who else has this plan open. Each open page announces itself to the plan's presence group, answers
    newcomers directly, and says goodbye on close; no shared store, so it works on any channel layer.
    (A web process killed without closing its sockets leaves its viewers listed until those pages reload.)"""

    async def connect(self) -> None:
        user = self.scope.get("user")
        if user is None or not user.is_authenticated:
            await self.close(code=4401)
            return
        self.plan_id = int(self.scope["url_route"]["kwargs"]["plan_id"])
        if not await database_sync_to_async(Plan.objects.filter(pk=self.plan_id).exists)():
            await self.close(code=4404)
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
