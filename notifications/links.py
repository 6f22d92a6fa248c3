"""Signed deep links: a notification points at its item with a token only this site can make, which expires.
The link only finds the item; whoever opens it still logs in, and deciding still needs the permission."""

from __future__ import annotations

from dataclasses import dataclass

from django.conf import settings
from django.core import signing
from django.urls import reverse

SALT = "notifications.link"
ACTIONS = ("open", "approve", "decline", "undo")


class LinkInvalid(Exception):
    """The link was altered, or is not from this site."""


class LinkExpired(Exception):
    """The link is genuine but older than NOTIFY_LINK_MAX_AGE_SECONDS."""


@dataclass(frozen=True)
class LinkTarget:
    plan_id: int | None
    step_id: int | None
    agent_id: int | None
    action: str


def link_make(*, plan_id: int | None = None, step_id: int | None = None, agent_id: int | None = None,
              action: str = "open") -> str:
    """The absolute, signed URL of an item (a step, a plan, or an agent)."""
    token = signing.dumps({"p": plan_id, "s": step_id, "a": agent_id, "do": action}, salt=SALT, compress=True)
    return settings.PLANNER_BASE_URL + reverse("notify-link", args=[token])


def token_load(token: str, *, salt: str) -> object:
    """A signed link's payload; LinkExpired past NOTIFY_LINK_MAX_AGE_SECONDS, LinkInvalid when altered or foreign."""
    try:
        return signing.loads(token, salt=salt, max_age=settings.NOTIFY_LINK_MAX_AGE_SECONDS)
    except signing.SignatureExpired as exc:
        raise LinkExpired(str(exc)) from exc
    except signing.BadSignature as exc:
        raise LinkInvalid(str(exc)) from exc


def link_read(token: str) -> LinkTarget:
    """What a token points at; LinkExpired or LinkInvalid otherwise."""
    data = token_load(token, salt=SALT)
    if not isinstance(data, dict):
        raise LinkInvalid("not a link of this site")
    ids = [data.get(k) for k in ("p", "s", "a")]
    if not all(i is None or (isinstance(i, int) and not isinstance(i, bool)) for i in ids):
        raise LinkInvalid("not a link of this site")
    action = data.get("do")
    if action not in ACTIONS:
        raise LinkInvalid("not a link of this site")
    return LinkTarget(plan_id=ids[0], step_id=ids[1], agent_id=ids[2], action=action)
