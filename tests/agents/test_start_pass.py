"""Tool agents whose chains start (runtime/cycle.py tools_start, run by a start pass of the scale-out runtime):
the first goals of the agents starting together are planned together, their models asked side by side, and
every other agent is left to its own cycle; a goal is never planned twice when a start pass and a cycle meet."""

from __future__ import annotations

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from agents.models import Agent, LLMCall
from goals.models import Goal
from planning.models import Plan, PlanEvent
from planning.planner import plan_generate, plans_first
from planning.services import GoalAlreadyPlanned
from runtime.cycle import agent_cycle, tools_start
from tests.factories import AgentFactory, GoalFactory, PlanFactory
from tests.llm_server import answer

# The asks run in threads, each with a connection of its own: they must see the committed rows.
pytestmark = pytest.mark.django_db(transaction=True)

RESTATE = '<json>{"who": "Starter", "what": "list files", "when": "now", "where": "workspace", "why": "asked"}</json>'
PLAN = ('<json>{"goal": "List the workspace", "steps": [{"id": "1", "tool": "file.list", "intent": "List the files", '
        '"input": {"path": "."}, "requiresPermission": false}]}</json>')


@pytest.fixture
def models(settings: object, llm_server: object, monkeypatch: pytest.MonkeyPatch,
           request: pytest.FixtureRequest) -> object:
    """The scripted server as the fast and planner models; the policies' state and whether anyone listens for
    notifications (the after-commit nudge, notifications/selectors.py anyone_listening) read once beforehand: their
    reads are not the pass's, and with their usual few seconds of caching they would fall into one pass and not
    the other as the clock goes (the CI of 2026-12-02 counted 14 statements for two agents and 15 for six)."""
    from notifications import selectors as notification_selectors
    from policies import services as policy_services

    monkeypatch.setattr(notification_selectors, "LISTENING_READ_SECONDS", 600.0)
    monkeypatch.setattr(notification_selectors, "_listening", (float("-inf"), False))
    notification_selectors.anyone_listening()

    settings.LLM_MODELS = {"planner": ["planner-model"], "fast": ["fast-model"]}  # type: ignore[attr-defined]
    settings.LLM_TIMEOUT_SECONDS = 5  # type: ignore[attr-defined]  # the answers below take 0.3 s on purpose
    policy_services.policies_forget()
    request.addfinalizer(policy_services.policies_forget)
    policy_services.policy_state()
    return llm_server


def starting(n: int, *, prefix: str = "Starter") -> list[Agent]:
    agents = []
    for i in range(n):
        agent = AgentFactory(kind=Agent.Kind.TOOL, name=f"{prefix} {i}")
        GoalFactory(agent=agent, description="List the workspace and say what is there", source_needs=[])
        agents.append(agent)
    return agents


def script(server: object, n: int, *, delay: float = 0.0) -> None:
    server.script("fast-model", *[answer(RESTATE, delay=delay) for _ in range(n)])  # type: ignore[attr-defined]
    server.script("planner-model", *[answer(PLAN, delay=delay) for _ in range(n)])  # type: ignore[attr-defined]


def test_agents_starting_together_plan_their_first_goals_together_and_wait_for_their_models_once(
        models: object) -> None:
    agents = starting(6)
    script(models, 6, delay=0.3)

    planned, alone = tools_start([a.pk for a in agents], runner="runner-start")

    assert (planned, alone) == (sorted(a.pk for a in agents), [])
    assert models.max_in_flight == 6  # type: ignore[attr-defined]  # every agent's call at once, not one by one
    for agent in agents:
        plan = Plan.objects.get(agent=agent)
        assert plan.status == Plan.Status.AWAITING_APPROVAL and plan.steps.count() == 1
        assert (plan.who, plan.what) == ("Starter", "list files")  # the restatement is kept with the plan
        assert sorted(LLMCall.objects.filter(plan=plan).values_list("purpose", flat=True)) == ["plan", "restate"]
        kinds = list(PlanEvent.objects.filter(plan=plan).order_by("pk").values_list("kind", "actor_label"))
        assert kinds == [(PlanEvent.Kind.CREATED, "runner-start"), (PlanEvent.Kind.VALIDATED, "runner-start")]
        agent.refresh_from_db()
        assert agent.cycle_count == 1 and agent.next_cycle_at is not None  # the cycle counted, as its own would be
        assert agent.waiting_reason == "plan v1 awaits approval"  # the inbox and the dashboard's count see it


def test_a_start_pass_costs_the_same_statements_for_two_agents_as_for_six(models: object) -> None:
    """No N+1: what the pass reads and writes is one set of statements whatever the number of agents."""
    statements = []
    for n, prefix in ((2, "Few"), (6, "Many")):
        agents = starting(n, prefix=prefix)
        script(models, n)
        with CaptureQueriesContext(connection) as queries:
            planned, _ = tools_start([a.pk for a in agents], runner="runner-start")
        assert len(planned) == n
        statements.append([q["sql"] for q in queries.captured_queries
                           if not q["sql"].upper().startswith(("BEGIN", "SAVEPOINT", "RELEASE", "COMMIT"))])
    few, many = statements
    assert len(few) == len(many), "\n".join(["two agents:", *few, "six agents:", *many])


def test_agents_whose_cycle_does_more_than_plan_a_goal_are_left_to_their_own_cycle(models: object) -> None:
    to_plan = starting(1)[0]
    busy = AgentFactory(kind=Agent.Kind.TOOL, name="Busy")
    PlanFactory(agent=busy, status=Plan.Status.ACTIVE)  # an open plan: its cycle runs its steps
    idle = AgentFactory(kind=Agent.Kind.TOOL, name="Idle")  # no goal
    paused = starting(1, prefix="Paused")[0]
    Agent.objects.filter(pk=paused.pk).update(status=Agent.Status.PAUSED)
    persona = AgentFactory(kind=Agent.Kind.PERSONA, name="Persona")
    script(models, 1)

    planned, alone = tools_start([to_plan.pk, busy.pk, idle.pk, paused.pk, persona.pk], runner="runner-start")

    assert planned == [to_plan.pk]
    assert alone == sorted([busy.pk, idle.pk])  # running tool agents only: a paused one or a persona is no chain's
    assert not Plan.objects.filter(agent__in=[paused, idle]).exists()
    assert Plan.objects.filter(agent=busy).count() == 1


def test_a_first_answer_that_is_no_plan_is_planned_on_without_asking_for_the_restatement_again(
        models: object) -> None:
    agent = starting(1)[0]
    models.script("fast-model", answer(RESTATE))  # type: ignore[attr-defined]
    models.script("planner-model", answer("I would list the files first."), answer(PLAN))  # type: ignore[attr-defined]

    planned, _ = tools_start([agent.pk], runner="runner-start")

    assert planned == [agent.pk]
    plan = Plan.objects.get(agent=agent)
    assert plan.status == Plan.Status.AWAITING_APPROVAL and plan.who == "Starter"
    assert len(models.requests_for("fast-model")) == 1  # type: ignore[attr-defined]
    assert len(models.requests_for("planner-model")) == 2  # type: ignore[attr-defined]
    rejected = PlanEvent.objects.get(plan=plan, kind=PlanEvent.Kind.ATTEMPT_REJECTED)
    assert "no JSON plan" in rejected.reason


def test_a_goal_another_planner_began_gets_no_second_plan(models: object) -> None:
    """A start pass and a cycle of the same agent may meet (an operator's action brings its cycle forward while its
    shard's pass plans it): whichever starts the plan second finds the goal held and writes nothing."""
    agent = starting(1)[0]
    goal = Goal.objects.get(agent=agent)
    first = PlanFactory(agent=agent, goal=goal, status=Plan.Status.VALIDATING)  # the other planner's

    accepted, rest = plans_first([(agent, goal)], actor_label="runner-start", exclusive=True)
    assert (accepted, rest) == ({}, [])
    with pytest.raises(GoalAlreadyPlanned):
        plan_generate(agent=agent, goal_text=goal.description, goal=goal, actor_label="runner-cycle", exclusive=True)
    assert list(Plan.objects.filter(goal=goal).values_list("pk", flat=True)) == [first.pk]
    assert not LLMCall.objects.exists()  # no model was asked either


def test_a_cycle_that_finds_its_goal_being_planned_says_so_and_plans_nothing(models: object) -> None:
    agent = starting(1)[0]
    goal = Goal.objects.get(agent=agent)
    # The start pass began this plan just after the cycle read the goal as unplanned.
    from runtime import cycle

    real = cycle.unplanned_goals

    def read_then_overtaken(agent_id: int) -> list[Goal]:
        goals = real(agent_id)
        PlanFactory(agent=agent, goal=goal, status=Plan.Status.VALIDATING)
        return goals

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(cycle, "unplanned_goals", read_then_overtaken)
        what = agent_cycle(agent_id=agent.pk, runner="runner-cycle", kind=Agent.Kind.TOOL)

    assert what == f"'{goal.description}' already being planned"
    assert Plan.objects.filter(goal=goal).count() == 1
    assert not LLMCall.objects.exists()


def test_a_start_passs_tool_plans_are_an_operators_calls_first_in_line(models: object,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 52: a tool agent's plan, also when a start pass makes it, goes before the personas' waiting calls."""
    from agents.llm import openai_provider
    from agents.llm.limits import call_class

    seen: list[bool] = []
    real = openai_provider.openai_complete

    def spy(**kwargs: object) -> object:
        seen.append(call_class().operator)
        return real(**kwargs)  # type: ignore[arg-type]

    from agents.llm.gateway import imported

    monkeypatch.setattr(openai_provider, "openai_complete", spy)
    imported.cache_clear()  # the provider is looked up again: the spy
    agents = starting(2)
    script(models, 2)
    try:
        tools_start([a.pk for a in agents], runner="start-pass")
    finally:
        imported.cache_clear()
    assert seen and all(seen)
