"""The persona cycle's reads (runtime/cycle.py): the agent, its needs, active goals with whether a plan holds
them, open plans with their goal, their steps with their plan, in four queries for one agent; each kind comes out whole whatever the
others hold, and a tool agent's rows are not read for it."""

from __future__ import annotations

from typing import Any

import pytest
from django.db import connection
from django.db.models import Exists, Model, OuterRef
from django.test.utils import CaptureQueriesContext

from agents.models import Agent, Need
from goals.models import Goal
from planning.models import Plan, PlanStep
from runtime.cycle import persona_rows, persona_state, persona_step_choose, plans_waiting
from tests.factories import AgentFactory, GoalFactory, NeedFactory, PlanFactory, PlanStepFactory

pytestmark = pytest.mark.django_db


def values(obj: Model | None) -> dict[str, Any] | None:
    return None if obj is None else {f.attname: getattr(obj, f.attname) for f in obj._meta.get_fields() if f.concrete}


@pytest.fixture
def persona() -> Agent:
    agent = AgentFactory(kind=Agent.Kind.PERSONA, emotions={"hope": 0.5}, personality={"warm": True})
    for name, value in {"money": 0.3, "hunger": 0.61, "energy": 1.0}.items():
        NeedFactory(agent=agent, name=name, satisfaction=value)
    mid = GoalFactory(agent=agent, horizon="mid_term", source_needs=["money"], recommended_actions=["work"])
    GoalFactory(agent=agent, horizon="short_term", source_needs=["hunger"], reasoning="Hunger <b>low</b>")
    GoalFactory(agent=agent, status=Goal.Status.COMPLETED)
    plan = PlanFactory(agent=agent, goal=mid, risks=["tired"])
    PlanStepFactory(plan=plan, key="1", position=1, action_hint="work", depends_on=[], requires_permission=True)
    PlanStepFactory(plan=plan, key="2", position=2, action_hint="eat", depends_on=["1"],
                    status=PlanStep.Status.RUNNING)
    goalless = PlanFactory(agent=agent, goal=None, goal_text="Tidy the notes")
    PlanStepFactory(plan=goalless, key="a", position=1)
    PlanFactory(agent=agent, goal=mid, status=Plan.Status.COMPLETED)  # closed: not read
    return agent


def test_needs_read_is_the_queryset_with_its_agent(persona: Agent) -> None:
    expected = list(Need.objects.filter(agent_id=persona.pk).select_related("agent").order_by("name"))
    with CaptureQueriesContext(connection) as queries:
        got = persona_rows(persona.pk).needs
        assert got[0].agent.emotions == {"hope": 0.5}  # no second query for the agent
    assert len(queries) == 4  # the whole read: needs with their agent, goals, open plans, steps (none for the agent)
    assert [values(n) for n in got] == [values(n) for n in expected]
    assert values(got[0].agent) == values(expected[0].agent)
    assert all(n.agent is got[0].agent for n in got)


def expected_goals(agent: Agent) -> dict[int, tuple[dict[str, Any] | None, bool]]:
    held = Plan.objects.filter(goal=OuterRef("pk"), status__in=[*Plan.OPEN_STATUSES, Plan.Status.FAILED])
    return {g.pk: (values(g), g.planned) for g in Goal.objects.filter(agent=agent, status=Goal.Status.ACTIVE)
            .annotate(planned=Exists(held))}


def expected_steps(agent: Agent) -> list[tuple[dict[str, Any] | None, ...]]:
    steps = PlanStep.objects.filter(plan__agent=agent, plan__status__in=Plan.OPEN_STATUSES).select_related(
        "plan", "plan__goal").order_by("plan__created_at", "plan_id", "position")
    return [(values(s), values(s.plan), values(s.plan.goal)) for s in steps]


def test_goals_and_open_steps_read_are_the_querysets(persona: Agent) -> None:
    with CaptureQueriesContext(connection) as queries:
        state = persona_state(persona, persona_rows(persona.pk))
        read = [(values(s), values(s.plan), values(s.plan.goal)) for p in state.plans for s in state.steps[p.pk]]
    assert len(queries) == 4  # needs with the agent, goals, open plans given their goal, their steps
    assert all(p.goal is None or p.goal is next(g for g in state.goals if g.pk == p.goal_id) for p in state.plans)
    assert [g.horizon for g in state.goals] == ["short_term", "mid_term"]  # priority order
    assert {g.pk: (values(g), g.planned) for g in state.goals} == expected_goals(persona)  # type: ignore[attr-defined]
    assert sorted(read, key=lambda r: r[0]["id"]) == sorted(expected_steps(persona), key=lambda r: r[0]["id"])
    assert [g.planned for g in state.goals] == [False, True]  # type: ignore[attr-defined]
    assert state.plans[-1].goal is None  # a plan without a goal comes last and reads as such
    assert [s.position for s in state.steps[state.plans[0].pk]] == [1, 2]


def test_a_plan_parked_in_the_inbox_is_read_with_its_awaiting_steps_only(persona: Agent) -> None:
    """A plan whose step awaits an operator neither acts nor completes until the operator answers: of its steps
    only those that await are read, and they say it waits; the person follows its other plan meanwhile."""
    parked = PlanFactory(agent=persona, goal=GoalFactory(agent=persona, horizon="short_term", source_needs=["money"]))
    PlanStepFactory(plan=parked, key="1", position=1, status=PlanStep.Status.COMPLETED)
    asks = PlanStepFactory(plan=parked, key="2", position=2, depends_on=["1"],
                           status=PlanStep.Status.AWAITING_APPROVAL)
    PlanStepFactory(plan=parked, key="3", position=3, depends_on=["2"])
    rows = persona_rows(persona.pk)
    assert [s.pk for s in rows.steps if s.plan_id == parked.pk] == [asks.pk]
    assert values(next(s for s in rows.steps if s.pk == asks.pk)) == values(asks)  # whole, as stored
    others = [s for s in expected_steps(persona) if s[1] is not None and s[1]["id"] != parked.pk]
    assert [(values(s), values(s.plan), values(s.plan.goal)) for s in rows.steps if s.plan_id != parked.pk] == others
    state = persona_state(persona, rows)
    assert parked.goal_id in plans_waiting(state)
    plan, step = persona_step_choose(state, "runner test")
    assert plan is not None and plan.pk != parked.pk and step is not None and step.key == "2"  # the running step


def test_steps_come_in_the_querysets_order(persona: Agent) -> None:
    """Open plans oldest first, each plan's steps by position, whatever order the rows were stored in."""
    plan = PlanFactory(agent=persona, goal=None, goal_text="Later")
    for position in (3, 1, 2):
        PlanStepFactory(plan=plan, key=str(position), position=position)
    got = persona_rows(persona.pk).steps
    assert [(values(s), values(s.plan), values(s.plan.goal)) for s in got] == expected_steps(persona)


def test_each_kind_of_row_reads_whole_when_the_others_are_missing() -> None:
    """A goal whose plan is open but which is no longer active comes with its plan's steps, not as a goal;
    without needs, goals or plans, the other kinds still read whole."""
    agent = AgentFactory(kind=Agent.Kind.PERSONA)
    done = GoalFactory(agent=agent, status=Goal.Status.COMPLETED, horizon="long_term")
    PlanStepFactory(plan=PlanFactory(agent=agent, goal=done), key="1", position=1, result="done <i>well</i>")
    rows = persona_rows(agent.pk)
    assert rows.agent == agent and rows.needs == [] and rows.goals == []  # no needs: the agent's row alone
    assert [(values(s), values(s.plan), values(s.plan.goal)) for s in rows.steps] == expected_steps(agent)
    assert rows.steps[0].plan.goal.status == Goal.Status.COMPLETED  # type: ignore[union-attr]

    only_goals = AgentFactory(kind=Agent.Kind.PERSONA)
    GoalFactory(agent=only_goals, horizon="long_term", source_needs=["social"])
    rows = persona_rows(only_goals.pk)
    assert rows.steps == [] and {g.pk: (values(g), g.planned) for g in rows.goals} == expected_goals(only_goals)  # type: ignore[attr-defined]

    only_needs = AgentFactory(kind=Agent.Kind.PERSONA)
    NeedFactory(agent=only_needs, name="energy", satisfaction=0.25)
    rows = persona_rows(only_needs.pk)
    assert (rows.goals, rows.steps) == ([], [])
    assert values(rows.agent) == values(Agent.objects.get(pk=only_needs.pk))
    assert [values(n) for n in rows.needs] == [values(n) for n in Need.objects.filter(agent=only_needs)]


def test_a_tool_agents_goals_and_plans_are_not_read_for_it(persona: Agent) -> None:
    """The runner reads every agent this way first; a tool agent's cycle reads its own plan, so this read
    carries nothing of it (nor of another agent's)."""
    tool = AgentFactory(kind=Agent.Kind.TOOL)
    goal = GoalFactory(agent=tool)
    PlanStepFactory(plan=PlanFactory(agent=tool, goal=goal), key="1", position=1)
    rows = persona_rows(tool.pk)
    assert (rows.agent, rows.needs, rows.goals, rows.steps) == (tool, [], [], [])
    assert persona_rows(AgentFactory().pk).needs == []


def test_a_tool_agents_open_plans_read_is_the_queryset(persona: Agent) -> None:
    """The same rows serve a tool agent: open plans with and without a goal, closed ones left out."""
    from runtime.cycle import tool_open_plan

    expected = {p.pk: p for p in Plan.objects.filter(agent=persona).open()
                .select_related("goal")}
    with CaptureQueriesContext(connection) as queries:
        chosen = tool_open_plan(persona)
        assert chosen is not None and chosen.goal is not None  # read with its plan
    assert len(queries) == 1
    assert chosen is not None
    assert values(chosen) == values(expected[chosen.pk])
    assert values(chosen.goal) == values(expected[chosen.pk].goal)
    assert chosen.goal is not None and chosen.goal.horizon == "mid_term"  # the goal's plan before the goalless one
    assert tool_open_plan(AgentFactory(kind=Agent.Kind.TOOL)) is None


def test_a_tool_agents_unplanned_goals_read_is_the_queryset() -> None:
    from runtime.cycle import unplanned_goals

    agent = AgentFactory(kind=Agent.Kind.TOOL)
    free = GoalFactory(agent=agent, description="Free", source_needs=[], recommended_actions=["list"])
    held = GoalFactory(agent=agent, description="Held", source_needs=[])
    failed = GoalFactory(agent=agent, description="Failed once", source_needs=[])
    retired = GoalFactory(agent=agent, description="Planned before", source_needs=[])
    GoalFactory(agent=agent, description="Done", status=Goal.Status.COMPLETED)
    GoalFactory(description="Another agent's")
    PlanFactory(agent=agent, goal=held, status=Plan.Status.AWAITING_APPROVAL)
    PlanFactory(agent=agent, goal=failed, status=Plan.Status.FAILED)
    PlanFactory(agent=agent, goal=retired, status=Plan.Status.COMPLETED)  # completed: the goal may plan again
    assert sorted(g.pk for g in unplanned_goals(agent.pk)) == sorted([free.pk, retired.pk])


def test_an_open_plan_of_a_goal_no_longer_active_reads_that_goal(persona: Agent) -> None:
    """An operator completed the goal an open plan pursues: the plan is read with that goal, as it is now (the
    cycle closes such plans), in one more query; the goal is not among the active ones."""
    plan = Plan.objects.get(agent=persona, goal__horizon="mid_term", status=Plan.Status.ACTIVE)
    Goal.objects.filter(pk=plan.goal_id).update(status=Goal.Status.COMPLETED)
    with CaptureQueriesContext(connection) as queries:
        state = persona_state(persona, persona_rows(persona.pk))
    read = next(p for p in state.plans if p.pk == plan.pk)
    assert len(queries) == 5
    assert read.goal is not None and read.goal.pk == plan.goal_id and read.goal.status == Goal.Status.COMPLETED
    assert [g.horizon for g in state.goals] == ["short_term"]


def test_a_tool_agents_waiting_cycle_reads_its_row_and_open_plans_once() -> None:
    """A tool agent whose plan awaits approval: its cycle reads its row, its open plans (which also finds
    planning a dead cycle left "validating") and its active goals (a goal given while a plan waits is planned at
    once, docs/operator-decisions.md) and counts the cycle: four statements, no separate read for interrupted
    planning (round_100_agents)."""
    from runtime.cycles import cycle_run

    agent = AgentFactory(kind=Agent.Kind.TOOL)
    PlanFactory(agent=agent, goal=GoalFactory(agent=agent, source_needs=[]), status=Plan.Status.AWAITING_APPROVAL)
    with CaptureQueriesContext(connection) as queries:
        what = cycle_run(agent.pk, "runner r/1", Agent.Kind.TOOL)
    assert what == "waiting: plan awaiting approval"
    statements = [q["sql"] for q in queries.captured_queries]
    assert len(statements) == 4, statements


def test_a_tool_agents_cycle_fails_the_planning_a_dead_cycle_left_then_plans_again() -> None:
    from runtime.cycles import cycle_run

    agent = AgentFactory(kind=Agent.Kind.TOOL)
    goal = GoalFactory(agent=agent, description="List the workspace", source_needs=[])
    left = PlanFactory(agent=agent, goal=goal, status=Plan.Status.VALIDATING)
    cycle_run(agent.pk, "runner r/2", Agent.Kind.TOOL)
    left.refresh_from_db()
    assert left.status == Plan.Status.FAILED
    assert left.failure_reason.startswith("planning interrupted")
    # The goal is held by the failed plan until its retry: the cycle did not plan it a second time meanwhile.
    assert Plan.objects.filter(agent=agent).exclude(pk=left.pk).count() == 0
