"""The dashboard's glance (planning/selectors.py dashboard_glance, agents/selectors.py personas_goal_most_urgent) and
the agent page's charts over a goal's whole history."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from django.test import Client
from django.urls import reverse

from agents.models import Agent, Experience
from agents.selectors import personas_goal_most_urgent
from planning.models import PlanEvent
from planning.selectors import fleet_last_hour
from tests.factories import AgentFactory, GoalFactory, PlanFactory

pytestmark = pytest.mark.django_db

NOW = datetime(2026, 12, 7, 10, 42, 30, tzinfo=UTC)


def event(plan: Any, kind: str, minutes_ago: float, **fields: Any) -> PlanEvent:
    e = PlanEvent.objects.create(plan=plan, agent=plan.agent, kind=kind, actor_label="someone", **fields)
    PlanEvent.objects.filter(pk=e.pk).update(created_at=NOW - timedelta(minutes=minutes_ago))
    return e


def test_fleet_counts_each_kind_in_its_five_minutes(operator: Any) -> None:
    persona_plan = PlanFactory()
    tool_plan = PlanFactory(agent=AgentFactory(kind=Agent.Kind.TOOL))
    event(persona_plan, PlanEvent.Kind.CREATED, 1)  # 10:41:30, in the bucket under way (10:40-now)
    event(persona_plan, PlanEvent.Kind.CREATED, 3)  # 10:39:30, 10:35-10:40
    event(persona_plan, PlanEvent.Kind.STEP_AWAITING, 2)
    event(persona_plan, PlanEvent.Kind.CLARIFICATION_ASKED, 2)
    event(tool_plan, PlanEvent.Kind.VALIDATED, 2)  # a tool plan validated: it waits for approval
    event(persona_plan, PlanEvent.Kind.VALIDATED, 2)  # a persona's plan starts at once: nothing waits
    event(persona_plan, PlanEvent.Kind.STEP_APPROVED, 20, actor=operator)
    event(persona_plan, PlanEvent.Kind.PLAN_CANCELLED, 20)  # no actor: the runner's, not a decision
    event(persona_plan, PlanEvent.Kind.CREATED, 70)  # more than an hour ago
    fleet = fleet_last_hour(now=NOW)
    assert fleet.starts[-1] == NOW.replace(minute=40, second=0) and len(fleet.starts) == 12
    assert fleet.counts["plans"][-2:] == [1, 1] and sum(fleet.counts["plans"]) == 2
    assert fleet.counts["waiting"][-1] == 3 and sum(fleet.counts["waiting"]) == 3
    assert sum(fleet.counts["decisions"]) == 1 and fleet.counts["decisions"][-5] == 1  # 10:22:30 in 10:20-10:25


def test_most_urgent_goal_is_the_one_with_the_fewest_hours_before_abandonment() -> None:
    agent = AgentFactory(cycle_count=30)
    GoalFactory(agent=agent, horizon="short_term", confidence=0.4)  # (0.4 - 0.1) / 0.03 = 10 h
    slow = GoalFactory(agent=agent, horizon="long_term", confidence=0.06, description="Learn <b>Greek</b>")  # 5 h
    GoalFactory(agent=agent, horizon="long_term", confidence=0.01, status="abandoned")
    other = AgentFactory(cycle_count=3)
    calm = GoalFactory(agent=other, horizon="mid_term", confidence=0.9)
    tool = AgentFactory(kind=Agent.Kind.TOOL)
    GoalFactory(agent=tool, horizon="short_term", confidence=0.11)
    Experience.objects.bulk_create(
        [Experience(agent=agent, cycle=c, goals_after={str(slow.pk): [0.1, 0.3 - c / 100]}) for c in range(1, 31)]
        + [Experience(agent=other, cycle=c, goals_after={}) for c in range(1, 4)])
    urgent = personas_goal_most_urgent([agent.pk, other.pk, tool.pk])
    assert [u.goal.pk for u in urgent] == [slow.pk, calm.pk]  # most urgent first; the tool agent has none
    first = urgent[0]
    assert first.hours_left == pytest.approx(5.0) and first.near and not urgent[1].near
    assert len(first.confidences) == 24 and first.confidences[0] == pytest.approx(0.3 - 7 / 100)  # the last 24 cycles
    assert first.confidences[-1] == pytest.approx(0.0)
    assert urgent[1].confidences == [0.9]  # no experience names it yet: its confidence now


def test_glance_shows_the_fleet_and_each_personas_goal_with_a_fixed_number_of_queries(
        viewer_client: Client, django_assert_max_num_queries: Any) -> None:
    def personas(first: int, last: int) -> list[int]:
        ids = []
        for i in range(first, last):
            agent = AgentFactory(cycle_count=5)
            goal = GoalFactory(agent=agent, confidence=0.5 - i / 100, description=f"Goal <i>{i}</i>")
            Experience.objects.bulk_create([Experience(agent=agent, cycle=c, goals_after={str(goal.pk): [0.1, 0.6 - c / 50]})
                                            for c in range(1, 6)])
            PlanEvent.objects.create(plan=PlanFactory(agent=agent), kind=PlanEvent.Kind.CREATED, actor_label="x")
            ids.append(agent.pk)
        return ids

    ids = personas(0, 2)
    url = reverse("dashboard-glance")
    with django_assert_max_num_queries(9) as few:
        html = viewer_client.get(url, {"agents": ",".join(map(str, ids))}).content.decode()
    assert html.count('class="sparkline"') == 2 and "Goal &lt;i&gt;1&lt;/i&gt;" in html
    assert "abandoned below 10%" in html and "plans made: 2 (" in html and "2 in the hour" in html
    assert 'hx-trigger="every 15s"' in html
    ids += personas(2, 22)
    with django_assert_max_num_queries(len(few.captured_queries)):
        html = viewer_client.get(url, {"agents": ",".join(map(str, ids))}).content.decode()
    assert html.count('class="sparkline"') == 22
    assert html.index("Goal &lt;i&gt;21&lt;/i&gt;") < html.index("Goal &lt;i&gt;0&lt;/i&gt;")  # most urgent first


def test_glance_ignores_what_is_not_an_agent_id(viewer_client: Client) -> None:
    response = viewer_client.get(reverse("dashboard-glance"), {"agents": "1,x,<script>,-3"})
    assert response.status_code == 200 and "<script>" not in response.content.decode()


def test_glance_needs_a_login(client: Client) -> None:
    assert client.get(reverse("dashboard-glance")).status_code == 302


def test_dashboard_loads_the_glance_for_the_agents_it_shows(viewer_client: Client) -> None:
    agents = [AgentFactory() for _ in range(2)]
    html = viewer_client.get("/").content.decode()
    assert 'id="dashboard-glance"' in html and 'hx-trigger="load"' in html
    assert f"/glance/?agents={agents[0].pk}%2C{agents[1].pk}" in html or f"/glance/?agents={agents[1].pk}%2C{agents[0].pk}" in html


def test_agent_page_draws_a_goals_whole_history_not_only_its_last_cycles(viewer_client: Client) -> None:
    agent = AgentFactory(cycle_count=300)
    goal = GoalFactory(agent=agent, horizon="long_term", confidence=0.4)
    Experience.objects.bulk_create([
        Experience(agent=agent, cycle=c, hours=1.0, needs_after={"hunger": 0.5},
                   goals_after={str(goal.pk): [c / 1000, 1 - c / 500]} if c > 20 else {})
        for c in range(1, 301)])
    html = viewer_client.get(reverse("agent-detail", args=[agent.pk])).content.decode()
    chart = html[html.index(f'id="chart-goal-{goal.pk}"'):]
    chart = chart[:chart.index("</figure>")]
    assert "(100 of 280 samples)" in chart or "of 280 samples" in chart  # cycles 21-300: its whole life, sampled
    assert "<td>-279 h</td>" in chart  # its first experience, 279 simulated hours before the latest
    assert "-192 h</text>" in chart and "latest</text>" in chart  # the time axis spans it, a tick every 96 h
    assert "confidence 40%</text>" in chart and "progress 30%</text>" in chart


def test_agent_page_says_which_goals_are_about_to_be_abandoned(viewer_client: Client) -> None:
    agent = AgentFactory(kind=Agent.Kind.PERSONA)
    soon = GoalFactory(agent=agent, horizon="short_term", confidence=0.25, description="Eat soon")  # 5 h left
    later = GoalFactory(agent=agent, horizon="long_term", confidence=0.9, description="Learn Greek")  # 425 h left
    html = viewer_client.get(reverse("agent-detail", args=[agent.pk])).content.decode()
    block = html[html.index(f'id="goal-{soon.pk}"'):html.index(f'id="goal-{later.pk}"')]
    assert ('<div class="small abandon-forecast warn">Confidence falls 3 points a simulated hour: below 10% '
            "(abandoned) in about 5 simulated hours unless its plan waits for a person.</div>") in block
    assert "abandon-forecast\">Confidence falls 0.2 points a simulated hour: below 5% (abandoned) in about 425" in html
    tool = AgentFactory(kind=Agent.Kind.TOOL)
    GoalFactory(agent=tool, confidence=0.2)  # a tool agent's goal does not decay: nothing to forecast
    assert "abandon-forecast" not in viewer_client.get(reverse("agent-detail", args=[tool.pk])).content.decode()
