"""Live "Decided by policies": the list in the inbox and on the policies page, pushed as policies decide and as
operators undo (the live hub of planning/live/hub.py, as the inbox: any change may concern it)."""

from __future__ import annotations

from typing import Any

from planning.live.consumers import LiveConsumer
from planning.live.renderers import LivePage, render_for
from policies.selectors import Decision, decisions_recent

PAGES = ("inbox", "policies")  # where the list is shown: an Undo returns there


def signature(decisions: list[Decision]) -> tuple[tuple[int, bool], ...]:
    """What the list shows that may change: which decisions, and which of them can still be undone."""
    return tuple((d.event.pk, d.undoable) for d in decisions)


class DecisionsLivePage(LivePage):
    """Rendered once per burst of changes and per audience (only operators see Undo), pushed only when the
    decisions or their undoability changed."""

    def __init__(self, key: str, *, back: str) -> None:
        super().__init__(key)
        self.back = back
        self.last: Any = None

    def concerns(self, message: dict[str, Any]) -> set[int]:
        return {0}

    def baseline(self) -> None:
        self.last = signature(decisions_recent())

    def render_changes(self, ids: set[int], audiences: set[str]) -> dict[str, str]:
        decisions = decisions_recent()
        if signature(decisions) == self.last:
            return {}
        self.last = signature(decisions)
        context = {"decisions": decisions, "back": self.back, "oob": True}
        return {a: render_for("policies/decisions_live.html", context, a) for a in audiences}


class DecisionsConsumer(LiveConsumer):
    """`/ws/policy-decisions/<inbox|policies>/`: the list on that page."""

    def back(self) -> str:
        back = str(self.scope["url_route"]["kwargs"].get("back", ""))
        return back if back in PAGES else "inbox"

    def page_key(self) -> str:
        return f"policy-decisions-{self.back()}"

    def page_new(self) -> LivePage:
        return DecisionsLivePage(self.page_key(), back=self.back())

    def render_all(self) -> str:
        return self.render("policies/decisions_live.html", {"decisions": decisions_recent(), "back": self.back()})
