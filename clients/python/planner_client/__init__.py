"""A client for the agent planner's API (/api/v1/): your agent plans, an operator watches and steers.

Sync (`Client`) and async (`AsyncClient`), both on httpx. Step start and result carry a request id made
once per call, so retrying after a lost answer never records a step twice; connection errors, 429 and
5xx answers are retried with backoff.
"""

from __future__ import annotations

from planner_client.client import (
    Action,
    AsyncClient,
    Client,
    Conflict,
    NotFound,
    PlanCancelled,
    PlanFailed,
    PlanInvalid,
    PlannerError,
    PlanRef,
    RateLimited,
    ReplanNeeded,
    Step,
    Unauthorized,
)

__all__ = [
    "Action", "AsyncClient", "Client", "Conflict", "NotFound", "PlanCancelled", "PlanFailed", "PlanInvalid",
    "PlanRef", "PlannerError", "RateLimited", "ReplanNeeded", "Step", "Unauthorized",
]
__version__ = "0.1.0"
