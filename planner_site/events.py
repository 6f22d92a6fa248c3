"""The live-event publisher: after a change commits, tell the open pages which agents and plans changed.

A change is one small message ("agents 3, plans 12 changed"), published after its transaction commits to the
one group every web process listens on (`LIVE_GROUP`); the web process renders what its pages show
(planning/live/), once per page and audience, whoever made the change.

How a message travels, by where it starts:
- in a process that serves live pages (it has a hub): straight to that hub, no layer round trip;
- with a shared layer (Redis): `group_send` on one long-lived event loop of this process, so other
  web processes get it (never a fresh event loop per send);
- on the embedded stack (in-memory layer, no Redis), in a process without a hub (`runagents`,
  `manage.py shell`): nowhere. The embedded stack is one process; open pages show another process's
  changes when they are next loaded (or reconnect). Live pages with several processes need Redis.

The changes of a runner's cycle or pass go out as one message when it ends (`published_together`);
elsewhere (a request, the admin, a shell) each change goes out once its transaction commits.

Each message carries the publisher's id and a sequence number; a publisher that failed to send sets
`gap` on its next message, so pages that may have missed something re-render their full state.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import contextvars
import functools
import logging
import threading
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from typing import Any

from django.conf import settings
from django.db import transaction

logger = logging.getLogger("planner.events")

LIVE_GROUP = "live"
MESSAGE_TYPE = "live.changed"
DRAIN_SECONDS = 2.0


def layer_is_shared() -> bool:
    """Whether the channel layer reaches other processes (Redis), or only this one (in-memory)."""
    backend = settings.CHANNEL_LAYERS.get("default", {}).get("BACKEND", "")
    return bool(backend) and "InMemoryChannelLayer" not in backend


def message_parse(raw: Any) -> dict[str, Any] | None:
    """A change message from the layer, checked field by field; None if malformed."""
    if not isinstance(raw, dict) or raw.get("type") != MESSAGE_TYPE:
        return None
    agents, plans = raw.get("agents"), raw.get("plans")
    if not isinstance(agents, list) or not isinstance(plans, list):
        return None
    if not all(isinstance(i, int) and not isinstance(i, bool) for i in agents + plans):
        return None
    src, seq = raw.get("src"), raw.get("seq")
    if not isinstance(src, str) or not isinstance(seq, int) or len(src) > 64:
        return None
    return {"type": MESSAGE_TYPE, "agents": agents, "plans": plans, "src": src, "seq": seq,
            "gap": bool(raw.get("gap"))}


class Publisher:
    """One per process: numbers the messages and sends them on one long-lived loop."""

    def __init__(self) -> None:
        self.src = uuid.uuid4().hex
        self.seq = 0
        self.gap = False
        self.lock = threading.Lock()
        self.loop: asyncio.AbstractEventLoop | None = None
        self.futures: set[Future[None]] = set()
        # The hub of this process, if it serves live pages: (its loop, its deliver callback).
        self.local: tuple[asyncio.AbstractEventLoop, Callable[[dict[str, Any]], None]] | None = None

    def message_new(self, agents: set[int], plans: set[int]) -> dict[str, Any]:
        with self.lock:
            self.seq += 1
            gap, self.gap = self.gap, False
            return {"type": MESSAGE_TYPE, "agents": sorted(agents), "plans": sorted(plans), "src": self.src,
                    "seq": self.seq, "gap": gap}

    def publish(self, *, agents: set[int], plans: set[int]) -> None:
        agents, plans = {a for a in agents if a}, {p for p in plans if p}
        if not agents and not plans:
            return
        local = self.local
        if local is not None:
            loop, deliver = local
            message = self.message_new(agents, plans)
            try:
                # A fresh context: the caller's (a sync_to_async thread's) must not leak into the hub's tasks.
                loop.call_soon_threadsafe(deliver, message, context=contextvars.Context())
            except RuntimeError:  # that loop has closed: the hub is gone
                self.local = None
            if layer_is_shared():
                self.send_shared(message)
            return
        if layer_is_shared():
            self.send_shared(None, agents=agents, plans=plans)
        # Else: the embedded stack, in a process that serves no page: no open page can hear it (see above).

    # --- shared layer (Redis) ------------------------------------------------------------------------------

    def loop_get(self) -> asyncio.AbstractEventLoop:
        with self.lock:
            if self.loop is None or not self.loop.is_running():
                loop = asyncio.new_event_loop()
                started = threading.Event()

                def run() -> None:
                    asyncio.set_event_loop(loop)
                    loop.call_soon(started.set)
                    loop.run_forever()

                threading.Thread(target=run, name="live-publisher", daemon=True).start()
                started.wait(5)
                self.loop = loop
            return self.loop

    def send_shared(self, message: dict[str, Any] | None, *, agents: set[int] | None = None,
                    plans: set[int] | None = None) -> None:
        """Schedule one `group_send` on the publisher loop; the sequence number is taken there, in order."""
        future = asyncio.run_coroutine_threadsafe(self.group_send(message, agents or set(), plans or set()),
                                                  self.loop_get())
        with self.lock:
            self.futures.add(future)
        future.add_done_callback(self.futures.discard)

    async def group_send(self, message: dict[str, Any] | None, agents: set[int], plans: set[int]) -> None:
        from channels.layers import get_channel_layer

        if message is None:
            message = self.message_new(agents, plans)
        layer = get_channel_layer()
        if layer is None:
            return
        try:
            await layer.group_send(LIVE_GROUP, message)
        except Exception as exc:  # the change is committed; open pages resync when the layer is back
            self.gap = True
            logger.warning("live update not sent (%s: %s); pages resync when the layer is back",
                           type(exc).__name__, exc)

    def drain(self, timeout: float = DRAIN_SECONDS) -> None:
        """Wait for the sends under way (a short-lived process, such as a shell, exits right after)."""
        with self.lock:
            pending = list(self.futures)
        for future in pending:
            with contextlib.suppress(Exception):
                future.result(timeout=timeout)


publisher = Publisher()
atexit.register(publisher.drain)


class _Changes:
    """The agents and plans whose changes committed inside one `published_together` block."""

    def __init__(self) -> None:
        self.agents: set[int] = set()
        self.plans: set[int] = set()

    def publish(self) -> None:
        publisher.publish(agents=self.agents, plans=self.plans)


_together: contextvars.ContextVar[_Changes | None] = contextvars.ContextVar("published_together", default=None)


@contextlib.contextmanager
def published_together() -> Iterator[None]:
    """The changes committed inside this block go out as one message when it ends (a runner's cycle or pass:
    one message instead of one per event). Only committed changes are gathered (each is added by its own
    `transaction.on_commit` callback, which a rollback discards), so nothing rolled back is ever pushed."""
    changes = _Changes()
    token = _together.set(changes)
    try:
        yield
    finally:
        _together.reset(token)
        changes.publish()


@contextlib.contextmanager
def published_apart() -> Iterator[None]:
    """Inside a `published_together` block, the changes committed inside this one go out each as it commits (a
    remote agent's stream followed by a cycle: the open pages follow it live)."""
    token = _together.set(None)
    try:
        yield
    finally:
        _together.reset(token)


def publish_changed(*, agent_id: int, plan_id: int | None = None, kind: str = "changed") -> None:
    """Tell the open pages now that this agent (and plan) changed."""
    publisher.publish(agents={agent_id}, plans={plan_id} if plan_id else set())


def _committed(agent_id: int, plan_id: int | None, kind: str) -> None:
    changes = _together.get()
    if changes is None:
        publish_changed(agent_id=agent_id, plan_id=plan_id, kind=kind)
        return
    changes.agents.add(agent_id)
    if plan_id:
        changes.plans.add(plan_id)


def publish_changed_on_commit(*, agent_id: int, plan_id: int | None = None, kind: str = "changed") -> None:
    """Publish once the surrounding transaction commits (at once outside one), so pages never show what was
    rolled back. Inside `published_together`, with the block's other changes when it ends."""
    transaction.on_commit(functools.partial(_committed, agent_id, plan_id, kind))
