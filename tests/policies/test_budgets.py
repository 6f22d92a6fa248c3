"""Budgets: a runaway agent's model calls reach its limit (per day, per plan) and it is paused, with an event and
a notice on its page; no budget costs no query."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import pytest
from django.test import Client

from agents.llm.gateway import calls_recorded_together, llm_complete
from agents.models import Agent, LLMCall
from agents.offline_model import OFFLINE_MODEL
from planning import services as planning
from planning.models import Plan, PlanEvent, PlanStep
from policies import services
from runtime.cycle import agent_cycle
from tests.factories import AgentFactory, GoalFactory, LLMCallFactory

pytestmark = pytest.mark.django_db

PRICES = {"offline-rules": [1000.0, 1000.0]}  # USD per million tokens: a tenth of a cent a word


def runaway(n_goals: int = 5) -> Agent:
    """A tool agent with many goals: each cycle plans one, each planning asks the model."""
    agent = AgentFactory(name="Spender", kind=Agent.Kind.TOOL)
    agent.workspace.mkdir(parents=True)
    (agent.workspace / "data.csv").write_text("a,b\n1,2\n")
    for n in range(n_goals):
        GoalFactory(agent=agent, description=f"Convert data.csv to JSON number {n}", source_needs=[])
    return agent


def approve_everything(user: Any) -> None:
    for plan in Plan.objects.filter(status=Plan.Status.AWAITING_APPROVAL):
        planning.plan_approve(plan=plan, user=user, mode=Plan.ApprovalMode.ALL)
    for step in PlanStep.objects.filter(status=PlanStep.Status.AWAITING_APPROVAL):
        planning.step_approve(step=step, user=user)


def test_a_daily_budget_pauses_a_runaway_agent_with_an_event_and_a_notice(
        settings: Any, operator: Any, viewer_client: Client) -> None:
    settings.LLM_PRICES = PRICES
    agent = runaway()
    agent_cycle(agent_id=agent.pk, runner="runner-test")
    first = services.calls_spend(LLMCall.objects.filter(agent=agent))
    assert first > 0
    services.budget_save(user=operator, agent=agent, daily_limit=first * 2, plan_limit=None)
    for _ in range(12):  # an operator approves everything at once: the agent plans goal after goal
        approve_everything(operator)
        agent_cycle(agent_id=agent.pk, runner="runner-test")
    agent.refresh_from_db()
    assert agent.status == Agent.Status.PAUSED
    reached = PlanEvent.objects.get(agent=agent, kind=PlanEvent.Kind.BUDGET_REACHED)
    assert reached.actor_label == "budget: this agent's" and reached.detail["scope"] == "day"
    assert Decimal(reached.detail["spent"]) >= first * 2 and Decimal(reached.detail["limit"]) == first * 2
    assert PlanEvent.objects.filter(agent=agent, kind=PlanEvent.Kind.AGENT_PAUSED, actor_label="budget: this agent's").exists()
    calls = LLMCall.objects.filter(agent=agent).count()
    assert agent_cycle(agent_id=agent.pk, runner="runner-test") == "not running"
    assert LLMCall.objects.filter(agent=agent).count() == calls  # it spends no more
    page = viewer_client.get(f"/agents/{agent.pk}/").content.decode()
    assert "Paused by its budget" in page and "budget reached: $" in page


def test_the_budget_of_every_agent_limits_each_plan(settings: Any, operator: Any) -> None:
    settings.LLM_PRICES = PRICES
    agent = runaway(1)
    services.budget_save(user=operator, agent=None, daily_limit=None, plan_limit=Decimal("0.000001"))
    agent_cycle(agent_id=agent.pk, runner="runner-test")
    agent.refresh_from_db()
    assert agent.status == Agent.Status.PAUSED
    reached = PlanEvent.objects.get(agent=agent, kind=PlanEvent.Kind.BUDGET_REACHED)
    assert reached.detail["scope"] == "plan" and reached.actor_label == "budget: every agent's"
    assert reached.plan is not None and "for plan v1" in reached.reason


def test_an_agents_own_budget_replaces_the_default(settings: Any, operator: Any) -> None:
    settings.LLM_PRICES = PRICES
    agent = runaway(1)
    services.budget_save(user=operator, agent=None, daily_limit=Decimal("0.000001"), plan_limit=None)
    services.budget_save(user=operator, agent=agent, daily_limit=Decimal("1000"), plan_limit=None)
    agent_cycle(agent_id=agent.pk, runner="runner-test")
    agent.refresh_from_db()
    assert agent.status == Agent.Status.RUNNING and LLMCall.objects.filter(agent=agent).exists()


def test_without_prices_nothing_costs_and_no_budget_is_reached(settings: Any, operator: Any) -> None:
    settings.LLM_PRICES = {}
    agent = runaway(1)
    services.budget_save(user=operator, agent=agent, daily_limit=Decimal("0"), plan_limit=None)
    LLMCallFactory(agent=agent, tokens_in=10_000, tokens_out=10_000)
    assert services.calls_spend(LLMCall.objects.filter(agent=agent)) == 0
    # A limit of 0 is reached at once, even at no cost: an operator's way to stop model calls.
    assert services.budget_after_call(agent_id=agent.pk, plan_id=None) is not None


def test_no_budget_costs_no_query_per_call(django_assert_num_queries: Any) -> None:
    agent = AgentFactory()
    services.budget_after_call(agent_id=agent.pk, plan_id=None)  # the first call of a process reads the budgets
    with django_assert_num_queries(0):
        assert services.budget_after_call(agent_id=agent.pk, plan_id=None) is None


def test_a_budget_set_is_seen_by_the_next_call_at_once(settings: Any, operator: Any) -> None:
    settings.LLM_PRICES = PRICES
    agent = AgentFactory()
    services.budget_after_call(agent_id=agent.pk, plan_id=None)  # cached: no budget
    LLMCallFactory(agent=agent, tokens_in=100, tokens_out=100)
    services.budget_save(user=operator, agent=agent, daily_limit=Decimal("0.1"), plan_limit=None)
    reached = services.budget_after_call(agent_id=agent.pk, plan_id=None)
    assert reached is not None and reached.spent == Decimal("0.2")
    agent.refresh_from_db()
    assert agent.status == Agent.Status.PAUSED


def test_calls_recorded_together_still_pause_an_agent_that_reached_its_budget(settings: Any, operator: Any) -> None:
    """A runner's pass logs its milestone checks' calls together: the budget check follows, once per agent."""
    settings.LLM_PRICES = PRICES
    spender, other = AgentFactory(name="Spender"), AgentFactory(name="Thrifty")
    services.budget_save(user=operator, agent=spender, daily_limit=Decimal("0.000001"), plan_limit=None)
    with calls_recorded_together():
        for agent in (spender, spender, other):
            llm_complete(purpose="milestone", messages=[{"role": "user", "content": "Is the goal achieved?"}],
                         models=[OFFLINE_MODEL], agent_id=agent.pk)
        assert Agent.objects.get(pk=spender.pk).status == Agent.Status.RUNNING  # checked when the block ends
    spender.refresh_from_db()
    other.refresh_from_db()
    assert (spender.status, other.status) == (Agent.Status.PAUSED, Agent.Status.RUNNING)
    assert PlanEvent.objects.filter(agent=spender, kind=PlanEvent.Kind.BUDGET_REACHED).count() == 1
