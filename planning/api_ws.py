"""The API's websocket, /ws/api/plans/<id>/: what the agent may do now, pushed whenever it changes.

An alternative to long-polling GET /api/v1/plans/<id>/next: the same answers, as JSON messages. The
agent authenticates with its bearer token in the Authorization header (no session, no browser Origin asked
for: an agent is not a browser); messages it sends are ignored. The socket is accepted first, so that any
client, not only a browser, reads why it is closed: 4401 no valid token (or the token was revoked while
open: checked on every change of the agent and every TOKEN_CHECK_SECONDS), 4403 not an external agent,
4404 not its plan.

The periodic check is one query for every open socket of the process (`TokenWatch`), not one a socket: with
2,000 agents connected, a query a socket every few seconds kept the workers' database thread busy, and an
operator's decision waited behind them.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import logging
from collections.abc import Callable, Iterator
from typing import Any

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncJsonWebsocketConsumer

from agents.models import Agent, AgentToken
from planner_site.bearer import bearer_token
from planning.live.hub import changes_watched
from planning.services.reported import NotFound, plan_next_read


def authorization_token(headers: list[tuple[bytes, bytes]]) -> str:
    """The bearer token of the socket's Authorization header ("" without one)."""
    return next((bearer_token(value) for name, value in headers if name.lower() == b"authorization"), "")


def token_active(token_id: int) -> bool:
    return AgentToken.objects.active().filter(pk=token_id).exists()


def answer_read(*, agent: Agent, plan_id: int, token_id: int | None) -> dict[str, Any] | None:
    """The plan's next answer for its agent; None when `token_id` is given and no longer active."""
    if token_id is not None and not token_active(token_id):
        return None
    return plan_next_read(agent=agent, plan_id=plan_id)


def tokens_active(token_ids: set[int]) -> set[int]:
    return set(AgentToken.objects.active().filter(pk__in=token_ids).values_list("pk", flat=True))


logger = logging.getLogger("planner.api")

POLL_SECONDS = 2.0
TOKEN_CHECK_SECONDS = 5.0  # a revoked token's socket closes within this even if the revocation's push is lost


class TokenWatch:
    """The tokens of this process's open API sockets (on one event loop), checked together every
    TOKEN_CHECK_SECONDS; each socket whose token is no longer active is told (`notify`). Runs while any is open."""

    def __init__(self) -> None:
        self.watchers: dict[int, set[Callable[[], None]]] = {}
        self.task: asyncio.Task[None] | None = None

    def add(self, token_id: int, notify: Callable[[], None]) -> None:
        self.watchers.setdefault(token_id, set()).add(notify)
        if self.task is None or self.task.done():
            # A context of its own: not the request's that started it (whose executor ends with the request).
            self.task = asyncio.get_running_loop().create_task(self.run(), context=contextvars.Context())

    def discard(self, token_id: int, notify: Callable[[], None]) -> None:
        watchers = self.watchers.get(token_id, set())
        watchers.discard(notify)
        if not watchers:
            self.watchers.pop(token_id, None)

    async def run(self) -> None:
        while self.watchers:
            await asyncio.sleep(TOKEN_CHECK_SECONDS)
            ids = set(self.watchers)
            if not ids:
                continue
            try:
                active = await database_sync_to_async(tokens_active, thread_sensitive=False)(ids)
            except Exception:  # the database is away: the next round checks again
                logger.warning("the open API sockets' tokens could not be checked", exc_info=True)
                continue
            for token_id in ids - active:
                for notify in list(self.watchers.get(token_id, ())):
                    notify()


_watches: dict[asyncio.AbstractEventLoop, TokenWatch] = {}


@contextlib.contextmanager
def token_watched(token_id: int, notify: Callable[[], None]) -> Iterator[None]:
    """`notify` is called when the token is found inactive by this loop's TokenWatch."""
    loop = asyncio.get_running_loop()
    for old in [lp for lp in _watches if lp.is_closed()]:
        del _watches[old]
    watch = _watches.setdefault(loop, TokenWatch())
    watch.add(token_id, notify)
    try:
        yield
    finally:
        watch.discard(token_id, notify)


class PlanNextConsumer(AsyncJsonWebsocketConsumer):
    async def connect(self) -> None:
        token = await database_sync_to_async(AgentToken.objects.lookup)(authorization_token(self.scope.get("headers", [])))
        await self.accept()  # before any refusal: a client sees a close code only on an accepted socket
        if token is None:
            await self.close(code=4401)
            return
        agent = token.agent
        if agent.kind != Agent.Kind.EXTERNAL:
            await self.close(code=4403)
            return
        self.agent, self.token_id = agent, token.pk
        self.plan_id = int(self.scope["url_route"]["kwargs"]["plan_id"])
        try:
            self.last = await database_sync_to_async(plan_next_read)(agent=agent, plan_id=self.plan_id)
        except NotFound:
            await self.close(code=4404)
            return
        await self.send_json(self.last)
        self.follower = asyncio.create_task(self.follow())

    async def follow(self) -> None:
        """Look again whenever the plan or agent changes (or every few seconds while live updates are down);
        close with 4401 once the token is revoked (checked on each change, and with every open socket's by the
        process's TokenWatch)."""
        revoked = asyncio.Event()
        first = True
        while True:  # pushed; while live updates are down, one look every POLL_SECONDS, then pushed again
            async with changes_watched(agents={self.agent.pk}, plans={self.plan_id}) as changed:
                def on_revoked(changed: asyncio.Event | None = changed) -> None:
                    revoked.set()
                    if changed is not None:
                        changed.set()

                with token_watched(self.token_id, on_revoked):
                    if first or changed is not None:  # a change before the watch began is not missed
                        await self.state_changed({}, token_checked=not first)
                        first = False
                    while True:
                        if changed is None:
                            await asyncio.sleep(POLL_SECONDS)
                        else:
                            await changed.wait()
                            changed.clear()
                        if revoked.is_set():
                            await self.close(code=4401)
                            return
                        await self.state_changed({}, token_checked=True)
                        if changed is None:
                            break  # the next look tries the live updates again

    async def disconnect(self, code: int) -> None:
        follower = getattr(self, "follower", None)
        if follower is not None:
            follower.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await follower

    async def receive_json(self, content: Any, **kwargs: Any) -> None:
        """The agent acts over HTTP; what it sends here changes nothing."""

    async def state_changed(self, event: dict[str, Any], *, token_checked: bool = False) -> None:
        """Send the answer if it changed; with `token_checked`, the token is checked first, in the same hop to
        the database thread (one hop a change, not two: thousands of sockets share that thread)."""
        try:
            answer = await database_sync_to_async(answer_read)(
                agent=self.agent, plan_id=self.plan_id, token_id=self.token_id if token_checked else None)
        except NotFound:
            await self.close(code=4404)
            return
        if answer is None:
            await self.close(code=4401)
            return
        if answer != self.last:
            self.last = answer
            await self.send_json(answer)
