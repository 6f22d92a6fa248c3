"""Nothing an operator decides is lost to a runner writing at the same time: a persona cycle that read its
step before an operator cancelled the plan does not bring the step (or the plan) back."""

from __future__ import annotations

from typing import Any

import pytest

import agents.cycle as cycle
from agents.cycle import agent_cycle
from planning import services
from planning.models import Plan, PlanEvent, PlanStep
from tests.agents.test_cycle import hungry_persona

pytestmark = pytest.mark.django_db


def test_a_cancel_during_a_persona_cycle_is_not_overwritten(operator: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    agent = hungry_persona()
    agent_cycle(agent_id=agent.pk, runner="runner-test")  # plans, and starts the first step
    plan = Plan.objects.get(agent=agent)
    real_apply = cycle.action_apply

    def apply_while_operator_cancels(action: str, needs: Any) -> Any:
        services.plan_cancel(plan=plan, user=operator, reason="not this plan")  # between the read and the write
        return real_apply(action, needs)

    monkeypatch.setattr(cycle, "action_apply", apply_while_operator_cancels)
    agent_cycle(agent_id=agent.pk, runner="runner-test")
    plan.refresh_from_db()
    assert plan.status == Plan.Status.CANCELLED
    unfinished = plan.steps.exclude(status__in=[PlanStep.Status.COMPLETED, PlanStep.Status.SKIPPED,
                                                PlanStep.Status.FAILED, PlanStep.Status.DECLINED])
    assert not unfinished.exists(), list(unfinished.values_list("key", "status"))
    cancelled_at = PlanEvent.objects.get(plan=plan, kind=PlanEvent.Kind.PLAN_CANCELLED).pk
    after = PlanEvent.objects.filter(plan=plan, pk__gt=cancelled_at).values_list("kind", flat=True)
    assert not set(after) & {PlanEvent.Kind.STEP_STARTED, PlanEvent.Kind.STEP_COMPLETED, PlanEvent.Kind.PLAN_COMPLETED}
