"""The API's websocket, /ws/api/plans/<id>/: what the agent may do now, pushed whenever it changes.

An alternative to long-polling GET /api/v1/plans/<id>/next: the same answers, as JSON messages. The
agent authenticates with its bearer token in the Authorization header (no session); messages it sends
are ignored. Close codes: 4401 no valid token, 4403 not an external agent, 4404 not its plan.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncJsonWebsocketConsumer

from agents.models import Agent, AgentToken
from planning.consumers import changes_watched
from planning.external import NotFound, plan_next_read


def bearer_token(headers: list[tuple[bytes, bytes]]) -> str:
    for name, value in headers:
        if name.lower() == b"authorization":
            scheme, _, token = value.decode("latin1").partition(" ")
            if scheme.lower() == "bearer":
                return token.strip()
    return ""


def token_agent(raw: str) -> Agent | None:
    token = AgentToken.objects.lookup(raw)
    return token.agent if token is not None else None


POLL_SECONDS = 2.0


class PlanNextConsumer(AsyncJsonWebsocketConsumer):
    async def connect(self) -> None:
        agent = await database_sync_to_async(token_agent)(bearer_token(self.scope.get("headers", [])))
        if agent is None:
            await self.close(code=4401)
            return
        if agent.kind != Agent.Kind.EXTERNAL:
            await self.close(code=4403)
            return
        self.agent = agent
        self.plan_id = int(self.scope["url_route"]["kwargs"]["plan_id"])
        try:
            self.last = await database_sync_to_async(plan_next_read)(agent=agent, plan_id=self.plan_id)
        except NotFound:
            await self.close(code=4404)
            return
        await self.accept()
        await self.send_json(self.last)
        self.follower = asyncio.create_task(self.follow())

    async def follow(self) -> None:
        """Look again whenever the plan or agent changes (or every few seconds while live updates are down)."""
        async with changes_watched(agents={self.agent.pk}, plans={self.plan_id}) as changed:
            await self.state_changed({})  # a change before the watch began is not missed
            while True:
                if changed is None:
                    await asyncio.sleep(POLL_SECONDS)
                else:
                    await changed.wait()
                    changed.clear()
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
