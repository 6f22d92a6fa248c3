"""An external agent with a token and declared tools, and a client that speaks to the API as that agent."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import pytest
from django.core.cache import cache
from django.test import Client

from agents.models import Agent, AgentToken

TOOLS = [
    {"name": "search", "description": "Search the company wiki", "risk": "safe",
     "input_schema": {"type": "object", "properties": {"query": {"type": "string"}, "limit": {"type": "integer"}},
                      "required": ["query"]}},
    {"name": "send_email", "description": "Send an email", "risk": "risky",
     "input_schema": {"type": "object", "properties": {"to": {"type": "string"}, "body": {"type": "string"}},
                      "required": ["to", "body"]}},
]


def step(key: str, tool: str = "search", *, depends: list[str] | None = None, permission: bool = False,
         **tool_input: Any) -> dict[str, Any]:
    return {"id": key, "tool": tool, "intent": f"Step {key} with {tool}",
            "input": tool_input or {"query": f"query {key}"}, "requiresPermission": permission,
            "dependencies": depends or []}


PLAN = {"goal": "Mail the Q3 summary to Dana", "steps": [
    step("1", query="q3 report"),
    step("2", depends=["1"], query="q3 figures"),
    step("3", "send_email", depends=["2"], to="dana@example.com", body="The Q3 summary is attached."),
]}


@dataclass
class ApiClient:
    """The Django test client with the agent's bearer token; JSON in, (status, JSON) out."""

    client: Client
    token: str

    def call(self, method: str, path: str, body: Any = None, *, token: str | None = None,
             raw: bytes | str | None = None) -> tuple[int, Any]:
        headers = {"Authorization": f"Bearer {self.token if token is None else token}"} if token != "" else {}
        data = raw if raw is not None else (json.dumps(body) if body is not None else None)
        kwargs: dict[str, Any] = {"headers": headers}
        if data is not None:
            kwargs |= {"data": data, "content_type": "application/json"}
        response = getattr(self.client, method.lower())(path, **kwargs)
        content = json.loads(response.content) if response.content else None
        self.last = response
        return response.status_code, content

    def get(self, path: str, **kw: Any) -> tuple[int, Any]:
        return self.call("GET", path, **kw)

    def post(self, path: str, body: Any = None, **kw: Any) -> tuple[int, Any]:
        return self.call("POST", path, body, **kw)

    def put(self, path: str, body: Any = None, **kw: Any) -> tuple[int, Any]:
        return self.call("PUT", path, body, **kw)


@pytest.fixture(autouse=True)
def rate_counters_cleared() -> None:
    cache.clear()


@pytest.fixture
def external_agent(db: None) -> Agent:
    return Agent.objects.create(name="Research bot", kind=Agent.Kind.EXTERNAL, cycle_interval=0)


@pytest.fixture
def raw_token(external_agent: Agent) -> str:
    return AgentToken.issue(agent=external_agent, label="tests")[1]


@pytest.fixture
def api(raw_token: str) -> ApiClient:
    return ApiClient(Client(), raw_token)


@pytest.fixture
def tooled(api: ApiClient) -> ApiClient:
    status, _ = api.put("/api/v1/agent/tools", {"tools": TOOLS})
    assert status == 200
    return api
