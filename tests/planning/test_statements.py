"""Statements compiled once give what the ORM gives: the dashboard's counts, the inbox count, converted rows."""

from __future__ import annotations

import pytest
from django.db.models import Count, Q

from agents.models import Agent
from planner_site.statements import Statement
from planning.models import Plan, PlanStep
from planning.selectors import dashboard_counts, failing_q
from planning.steer_selectors import inbox_count
from tests.factories import AgentFactory, PlanFactory, PlanStepFactory

pytestmark = pytest.mark.django_db


def agents_of_every_kind() -> None:
    AgentFactory(status="running")
    AgentFactory(status="paused", waiting_reason="step 2 awaits approval")
    PlanFactory(agent=AgentFactory(), status=Plan.Status.FAILED)
    PlanStepFactory(plan=PlanFactory(agent=AgentFactory()), retries=1)
    PlanStepFactory(plan=PlanFactory(agent=AgentFactory()), status=PlanStep.Status.FAILED)
    recovered = AgentFactory()  # an old failure does not count once a newer plan exists
    PlanFactory(agent=recovered, status=Plan.Status.FAILED)
    PlanStepFactory(plan=PlanFactory(agent=recovered, status=Plan.Status.ACTIVE), status=PlanStep.Status.AWAITING_APPROVAL)
    PlanFactory(agent=AgentFactory(), status=Plan.Status.AWAITING_APPROVAL)


def test_dashboard_counts_match_the_orm_aggregate_as_agents_change() -> None:
    def orm() -> dict[str, int]:
        return Agent.objects.aggregate(
            agents=Count("pk"), running=Count("pk", filter=Q(status=Agent.Status.RUNNING)),
            paused=Count("pk", filter=Q(status=Agent.Status.PAUSED)), waiting=Count("pk", filter=~Q(waiting_reason="")),
            failing=Count("pk", filter=failing_q()))

    assert dashboard_counts() == orm() == {"agents": 0, "running": 0, "paused": 0, "waiting": 0, "failing": 0}
    agents_of_every_kind()
    assert dashboard_counts() == orm()
    assert dashboard_counts()["failing"] == 3 and dashboard_counts()["waiting"] == 1
    Agent.objects.filter(status="paused").update(status="running")  # the kept statement reads the new rows
    assert dashboard_counts() == orm() and dashboard_counts()["paused"] == 0


def test_inbox_count_counts_plans_and_steps_awaiting_a_person() -> None:
    assert inbox_count() == 0
    agents_of_every_kind()
    assert inbox_count() == 2


def test_statement_rows_are_converted_like_the_orm_values() -> None:
    step = PlanStepFactory(depends_on=["a", "b"], tool_input={"path": "x.txt"})
    query = PlanStep.objects.filter(plan=step.plan).values_list("pk", "depends_on", "tool_input", "updated_at", "status")
    assert Statement(query).rows() == list(query) == [
        (step.pk, ["a", "b"], {"path": "x.txt"}, step.updated_at, step.status)]
