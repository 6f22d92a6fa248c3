"""Live inbox: the count in every page's navigation, and the inbox page itself, pushed on every change.

Every change is published to the dashboard group (planner_site/events.py), so these consumers join it; the
base class coalesces bursts and re-sends the full state on every (re)connect. A push is sent only when what
the page shows changed (the runner's per-cycle heartbeat alone changes nothing here), so an operator's
keyboard focus and typing are left alone.
"""

from __future__ import annotations

from typing import Any

from planner_site.events import DASHBOARD_GROUP
from planning.consumers import LiveConsumer
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


class InboxConsumer(InboxLiveBase):
    """The inbox page: its list, the count and a polite announcement when the number of items changes."""

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
