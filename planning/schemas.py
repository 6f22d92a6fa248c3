"""The API's answers that the services build: a step as outside agents read it, over the REST API and the MCP server
alike (planning/services/reported.py `step_data`; planning/api.py declares it as its answers' type). Read from
the stored row, in the names an agent submits a step with (`StepIn`): one mapping of the row's names to the
API's, here. Who reads which rendering of a step: docs/architecture.md, "One step"."""

from __future__ import annotations

from typing import Any

from ninja import Field, Schema
from pydantic import ConfigDict


class StepOut(Schema):
    """A step in the names the agent submits it with (StepIn), and what became of it."""

    # Built from a PlanStep (the row's names, validation_alias) and checked again as the API's answer (its own).
    model_config = ConfigDict(populate_by_name=True)

    id: int = Field(..., description="The step's id in the dashboard: start it and report its result by this id")
    key: str = Field(..., description="The step's id in the plan, as submitted")
    tool: str
    intent: str = Field(..., validation_alias="description")
    input: dict[str, Any] = Field(..., validation_alias="tool_input")
    requiresPermission: bool = Field(..., validation_alias="requires_permission")
    dependencies: list[str] = Field(..., validation_alias="depends_on")
    risk: str
    expects: str = Field(..., validation_alias="expected_outcome")
    status: str = Field(..., description="pending, awaiting_approval, approved, running, completed, failed, skipped, "
                                         "declined, cancelled")
    result: str
    error: str
    retries: int
    carried_over: bool = Field(..., description="Completed in an earlier version and kept")
