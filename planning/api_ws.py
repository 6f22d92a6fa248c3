"""The API's websocket, /ws/api/plans/<id>/: what the agent may do now, pushed whenever it changes.

An alternative to long-polling GET /api/v1/plans/<id>/next: the same answers, as JSON messages. The
agent authenticates with its bearer token in the Authorization header (no session, no browser Origin asked
for: an agent is not a browser); messages it sends are ignored. The socket is accepted first, so that any
client, not only a browser, reads why it is closed: 4401 no valid token (or the token was revoked while
open: checked on every change of the agent and every TOKEN_CHECK_SECONDS), 4403 not an external agent,
4404 not its plan.
"""

from __future__ import annotations

import asyncio
import contextlib
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


POLL_SECONDS = 2.0
TOKEN_CHECK_SECONDS = 5.0  # a revoked token's socket closes within this even if the revocation's push is lost


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
        close with 4401 once the token is revoked."""
        async with changes_watched(agents={self.agent.pk}, plans={self.plan_id}) as changed:
            await self.state_changed({})  # a change before the watch began is not missed
            while True:
                woken = True
                if changed is None:
                    await asyncio.sleep(POLL_SECONDS)
                else:
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(changed.wait(), timeout=TOKEN_CHECK_SECONDS)
                    woken = changed.is_set()
                    changed.clear()
                if not await database_sync_to_async(token_active)(self.token_id):
                    await self.close(code=4401)
                    return
                if woken:
                    await self.state_changed({})

    async def disconnect(self, code: int) -> None:
        follower = getattr(self, "follower", None)
        if follower is not None:
            follower.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await follower

    async def receive_json(self, content: Any, **kwargs: Any) -> None:
        """The agent acts over HTTP; what it sends here changes nothing."""

    async def state_changed(self, event: dict[str, Any]) -> None:
        try:
            answer = await database_sync_to_async(plan_next_read)(agent=self.agent, plan_id=self.plan_id)
        except NotFound:
            await self.close(code=4404)
            return
        if answer != self.last:
            self.last = answer
            await self.send_json(answer)
