"""This process's one listener for changes, and the feeds that serve its open pages.

- The **hub** is this process's single listener: it subscribes once to the layer's `LIVE_GROUP` (on the
  embedded stack, the in-memory layer, it hears this process's publisher directly, and only it) and hands
  each change message to the feeds it concerns. It checks the layer with a heartbeat (a ping to itself every
  second) and the publishers' sequence numbers; after a gap (a Redis outage, a lost message) every open
  page is asked to resync: its socket is closed with `CLOSE_RESYNC` and the page reconnects at once,
  receiving its full state.
- A **feed** serves every client of one page (the dashboard, plan 12, agent 3) in this process. On a
  change it renders at once (no sleep) through its page (planning/live/renderers.py), once per audience,
  and sends the same text to every client of that audience. Changes that arrive during a render are
  merged into the next one.

A client is any open socket with `push` and `close` (`Client`); the consumers (planning/live/consumers.py)
are the clients, and the hub never imports them.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import itertools
import logging
from collections.abc import AsyncIterator, Callable, Coroutine
from typing import Any, Protocol

from channels.db import database_sync_to_async
from channels.layers import get_channel_layer
from django.core.exceptions import ObjectDoesNotExist

from planner_site import events
from planning.live.renderers import LivePage

logger = logging.getLogger("planner.live")

CLOSE_RESYNC = 4000  # the page may have missed changes: reconnect now and get the full state
CLOSE_UNAUTHENTICATED = 4401  # log in again
CLOSE_NOT_FOUND = 4404  # no such page (an unknown path, a deleted plan)
CLOSE_LAYER_DOWN = 4503  # live updates are unavailable for now: retry with backoff

PING_SECONDS = 1.0
PING_TIMEOUT_SECONDS = 3.0
# Live updates are declared off after this many heartbeats in a row failed with nothing heard from the layer. One
# late pong is a busy event loop more often than a lost layer, and declaring the layer off sends every watcher to
# polling the database, which loads the loop more (2,000 agents connected: docs/performance.md).
PING_MISSES = 3


class LayerUnavailable(Exception):
    """The channel layer (Redis) cannot be reached: live updates are off until it is back."""


class Client(Protocol):
    """What the hub needs of one open page's socket (planning.live.consumers.LiveConsumer)."""

    generation_min: int

    async def push(self, text: str, generation: int) -> None: ...

    async def close(self, code: int | None = None, reason: str | None = None) -> None: ...


def task_detached(coro: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
    """A task of the hub's own, in a fresh context.

    The hub outlives whoever started it. A long poll that is an async view behind sync middleware runs inside
    asgiref's `async_to_sync`, whose context names a thread executor that quits when the request ends; a task
    copying that context would send every later `database_sync_to_async` to the dead executor
    ("CurrentThreadExecutor already quit or is broken") and the pages would stop updating.
    """
    return asyncio.get_running_loop().create_task(coro, context=contextvars.Context())


# --- feeds and the hub -----------------------------------------------------------------------------------------


class Feed:
    """The clients of one page in this process, and the render loop that serves them all."""

    def __init__(self, hub: LiveHub, page: LivePage) -> None:
        self.hub = hub
        self.page = page
        self.clients: dict[Client, str] = {}
        self.pending: set[int] = set()
        self.task: asyncio.Task[None] | None = None
        self.generation = 0
        self.ready = False

    def notice(self, message: dict[str, Any]) -> None:
        ids = self.page.concerns(message)
        if ids:
            self.pending |= ids
            self.kick()

    def kick(self) -> None:
        if self.ready and self.pending and (self.task is None or self.task.done()):
            self.task = task_detached(self.run())

    async def run(self) -> None:
        while self.pending and self.clients:
            ids, self.pending = self.pending, set()
            self.generation += 1
            generation = self.generation
            audiences = set(self.clients.values())
            try:
                payloads = await database_sync_to_async(self.page.render_changes)(ids, audiences)
            except ObjectDoesNotExist:
                await asyncio.gather(*(c.close(code=CLOSE_NOT_FOUND) for c in list(self.clients)))
                return
            except Exception:
                logger.exception("rendering a live update of %s failed", self.page.key)
                continue
            sends = [client.push(payloads.get(audience, ""), generation)
                     for client, audience in list(self.clients.items()) if payloads.get(audience)]
            if sends:
                await asyncio.gather(*sends, return_exceptions=True)


class LiveHub:
    """This process's one listener for changes, and its open pages' feeds."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.feeds: dict[str, Feed] = {}
        self.shared = events.layer_is_shared()
        self.layer: Any = get_channel_layer() if self.shared else None
        self.channel = ""
        self.healthy = True
        self.tasks: list[asyncio.Task[None]] = []
        self.seqs: dict[str, int] = {}
        self.pongs: dict[int, asyncio.Future[None]] = {}
        self.heard = 0.0  # when (the loop's time) the layer last delivered anything to this hub
        # Listeners that are not pages (the external agents' long polls and sockets): which agents and plans
        # they follow, and what to call when one changes.
        self.watchers: dict[object, tuple[frozenset[int], frozenset[int], Callable[[], None]]] = {}

    # lifecycle

    async def start(self) -> None:
        if self.shared:
            try:
                self.channel = await self.layer.new_channel("live-hub.")
                await self.layer.group_add(events.LIVE_GROUP, self.channel)
            except Exception as exc:
                raise LayerUnavailable(str(exc)) from exc
            self.tasks = [task_detached(self.receive_loop()), task_detached(self.ping_loop())]
        events.publisher.local = (self.loop, self.deliver)

    async def stop(self) -> None:
        if events.publisher.local is not None and events.publisher.local[0] is self.loop:
            events.publisher.local = None
        for task in self.tasks:
            task.cancel()
        for task in self.tasks:
            with contextlib.suppress(BaseException):
                await task
        if self.shared and self.channel:
            with contextlib.suppress(Exception):
                await self.layer.group_discard(events.LIVE_GROUP, self.channel)

    # messages

    def deliver(self, message: dict[str, Any]) -> None:
        for feed in list(self.feeds.values()):
            feed.notice(message)
        agents, plans = set(message["agents"]), set(message["plans"])
        for watched_agents, watched_plans, notify in list(self.watchers.values()):
            if agents & watched_agents or plans & watched_plans:
                notify()

    def note_sequence(self, message: dict[str, Any]) -> bool:
        """False when messages from this publisher were lost since the last one seen."""
        last = self.seqs.get(message["src"])
        self.seqs[message["src"]] = max(message["seq"], last or 0)
        return not message["gap"] and (last is None or message["seq"] <= last + 1)

    async def receive_loop(self) -> None:
        while True:
            try:
                raw = await self.layer.receive(self.channel)
            except asyncio.CancelledError:
                raise
            except Exception:
                logger.exception("receiving live updates failed")
                await asyncio.sleep(PING_SECONDS)
                continue
            self.heard = self.loop.time()
            if raw.get("type") == "live.ping":
                pong = self.pongs.pop(int(raw.get("n", 0)), None)
                if pong is not None and not pong.done():
                    pong.set_result(None)
                continue
            message = events.message_parse(raw)
            if message is None:
                continue
            if message["src"] == events.publisher.src:
                continue  # this process's own change, delivered locally already
            in_order = self.note_sequence(message)
            self.deliver(message)
            if not in_order:
                logger.warning("live updates were lost (publisher %s); open pages resync", message["src"][:8])
                await self.resync()

    async def ping(self, n: int) -> bool:
        """Whether a ping sent to this hub's own channel comes back through the layer in time."""
        pong = self.loop.create_future()
        self.pongs[n] = pong
        try:
            await asyncio.wait_for(self.layer.send(self.channel, {"type": "live.ping", "n": n}), PING_TIMEOUT_SECONDS)
            await asyncio.wait_for(pong, PING_TIMEOUT_SECONDS)
        except asyncio.CancelledError:
            raise
        except Exception:
            return False
        finally:
            self.pongs.pop(n, None)
        return True

    async def ping_loop(self) -> None:
        """A heartbeat through the layer. While it fails (PING_MISSES in a row), pages are told live updates are off
        (they retry with backoff, and get their full state when they are back); so a gap never leaves a page
        stale."""
        misses = 0
        for n in itertools.count(1):
            await asyncio.sleep(PING_SECONDS)
            started = self.loop.time()
            ok = await self.ping(n) or self.heard >= started  # anything heard meanwhile: the layer answers
            misses = 0 if ok else misses + 1
            if ok and not self.healthy:
                logger.warning("the channel layer answers again: open pages resync")
                self.healthy = True
                await self.resync()
            elif misses >= PING_MISSES and self.healthy:
                logger.warning("the channel layer does not answer: live updates paused, pages retry")
                self.healthy = False
                await self.close_all(CLOSE_LAYER_DOWN)

    async def close_all(self, code: int) -> None:
        clients = [c for feed in self.feeds.values() for c in feed.clients]
        await asyncio.gather(*(c.close(code=code) for c in clients), return_exceptions=True)

    async def resync(self) -> None:
        """Every open page reconnects and gets its full state; every watcher looks again."""
        for _agents, _plans, notify in list(self.watchers.values()):
            notify()
        await self.close_all(CLOSE_RESYNC)

    # feeds

    async def join(self, client: Client, key: str, page_new: Callable[[], LivePage], audience: str) -> Feed:
        feed = self.feeds.get(key)
        if feed is None:
            feed = Feed(self, page_new())
            self.feeds[key] = feed
            try:
                await database_sync_to_async(feed.page.baseline)()
            except BaseException:
                self.feeds.pop(key, None)
                raise
            feed.ready = True
        feed.clients[client] = audience
        client.generation_min = feed.generation + 1
        return feed

    async def leave(self, client: Client, feed: Feed) -> None:
        feed.clients.pop(client, None)
        if not feed.clients and self.feeds.get(feed.page.key) is feed:
            del self.feeds[feed.page.key]
            if feed.task is not None:
                feed.task.cancel()
        if not self.feeds and not self.watchers:
            await hub_stop(self)

    # watchers

    def watch(self, *, agents: set[int], plans: set[int], notify: Callable[[], None]) -> object:
        token = object()
        self.watchers[token] = (frozenset(agents), frozenset(plans), notify)
        return token

    async def unwatch(self, token: object) -> None:
        self.watchers.pop(token, None)
        if not self.feeds and not self.watchers:
            await hub_stop(self)


_hubs: dict[asyncio.AbstractEventLoop, asyncio.Future[LiveHub]] = {}


async def hub_get() -> LiveHub:
    """This loop's hub, started on first use; LayerUnavailable if it cannot listen (Redis down)."""
    loop = asyncio.get_running_loop()
    for old in [lp for lp in _hubs if lp.is_closed()]:
        del _hubs[old]
    future = _hubs.get(loop)
    if future is None:
        future = loop.create_future()
        _hubs[loop] = future
        hub = LiveHub(loop)
        try:
            await hub.start()
        except BaseException as exc:
            del _hubs[loop]
            future.set_exception(exc)
            future.exception()  # retrieved: the waiters below re-raise it
            raise
        future.set_result(hub)
    hub = await asyncio.shield(future)
    if not hub.healthy:
        raise LayerUnavailable("the channel layer does not answer the heartbeat")
    return hub


UNAVAILABLE_LOG_SECONDS = 10.0
_unavailable_logged = [float("-inf")]


@contextlib.asynccontextmanager
async def changes_watched(*, agents: set[int], plans: set[int]) -> AsyncIterator[asyncio.Event | None]:
    """An event set whenever one of these agents or plans changes (from any process), cleared by the caller;
    None when this process cannot listen (the shared layer is down): then the caller polls."""
    try:
        hub = await hub_get()
    except Exception:  # LayerUnavailable, or Redis refusing the connection
        now = asyncio.get_running_loop().time()
        if now - _unavailable_logged[0] >= UNAVAILABLE_LOG_SECONDS:  # not once a watcher: thousands poll meanwhile
            _unavailable_logged[0] = now
            logger.warning("live updates unavailable; watchers poll instead", exc_info=True)
        yield None
        return
    changed = asyncio.Event()
    token = hub.watch(agents=agents, plans=plans, notify=changed.set)
    try:
        yield changed
    finally:
        await hub.unwatch(token)


async def hub_stop(hub: LiveHub) -> None:
    future = _hubs.get(hub.loop)
    if future is not None and future.done() and not future.exception() and future.result() is hub:
        del _hubs[hub.loop]
    await hub.stop()

