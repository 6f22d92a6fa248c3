"""Hostile input through the external agents' API: a clear 4xx, never a server error, nothing stored."""

from __future__ import annotations

import json

import pytest

from planning.models import Plan
from tests.api.conftest import (  # noqa: F401  (the API's own fixtures: an agent with a token and tools)
    PLAN,
    ApiClient,
    api,
    external_agent,
    rate_counters_cleared,
    raw_token,
    tooled,
)

pytestmark = pytest.mark.django_db

DEEP = 3_000
PLAN_JSON = json.dumps(PLAN)
HOSTILE = {
    "a NUL in the goal": PLAN_JSON.replace("Mail the Q3", "Mail\\u0000 the Q3"),
    "a lone surrogate in the goal": PLAN_JSON.replace("Mail the Q3", "Mail \\ud800 the Q3"),
    "a NUL in a step input": PLAN_JSON.replace("q3 report", "q3\\u0000report"),
    "a lone surrogate in a step input": PLAN_JSON.replace("q3 report", "\\udfff"),
    "deep nesting in a step input": PLAN_JSON.replace('"q3 report"', "[" * DEEP + "]" * DEEP),
    "a 5,000-digit integer": PLAN_JSON.replace('"q3 report"', "1" + "0" * 4_999),
    "NaN": PLAN_JSON.replace('"q3 report"', "NaN"),
    "a bidi override in the goal": PLAN_JSON.replace("Mail the Q3", "Mail \\u202eevil"),
}


@pytest.mark.parametrize("name", list(HOSTILE))
def test_api_refuses_hostile_plans(tooled: ApiClient, name: str) -> None:  # noqa: F811
    tooled.client.raise_request_exception = False
    status, body = tooled.post("/api/v1/plans", raw=HOSTILE[name])
    assert 400 <= status < 500, (status, body)
    assert body and body.get("detail")
    assert not Plan.objects.exists()
