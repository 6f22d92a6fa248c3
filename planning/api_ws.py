"""The API's websocket, /ws/api/plans/<id>/: what the agent may do now, pushed whenever it changes.

An alternative to long-polling GET /api/v1/plans/<id>/next: the same answers, as JSON messages. The
agent authenticates with its bearer token in the Authorization header (no session); messages it sends
are ignored. Close codes: 4401 no valid token, 4403 not an external agent, 4404 not its plan.
"""

from __future__ import annotations

from typing import Any

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncJsonWebsocketConsumer

from agents.models import Agent, AgentToken
from planner_site.events import agent_group, plan_group
from planning.external import NotFound, plan_next


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
            self.last = await database_sync_to_async(plan_next)(agent=agent, plan_id=self.plan_id)
        except NotFound:
            await self.close(code=4404)
            return
        self.joined = [plan_group(self.plan_id), agent_group(agent.pk)]
        for group in self.joined:
            await self.channel_layer.group_add(group, self.channel_name)
        await self.accept()
        await self.send_json(self.last)

    async def disconnect(self, code: int) -> None:
        for group in getattr(self, "joined", []):
            await self.channel_layer.group_discard(group, self.channel_name)

    async def receive_json(self, content: Any, **kwargs: Any) -> None:
        """The agent acts over HTTP; what it sends here changes nothing."""

    async def state_changed(self, event: dict[str, Any]) -> None:
        try:
            answer = await database_sync_to_async(plan_next)(agent=self.agent, plan_id=self.plan_id)
        except NotFound:
            await self.close(code=4404)
            return
        if answer != self.last:
            self.last = answer
            await self.send_json(answer)
