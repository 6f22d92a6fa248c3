"""Agent cycles through the real services and the offline planner, as a user watching would see them."""

from __future__ import annotations

import json
import os

import pytest

from agents.models import Agent, Experience, LLMCall
from goals.models import Goal
from planning import services
from planning.models import Plan, PlanEvent, PlanStep
from runtime.cycle import agent_cycle
from tests.factories import AgentFactory, GoalFactory, NeedFactory, PlanFactory, PlanStepFactory

pytestmark = pytest.mark.django_db


def hungry_persona() -> Agent:
    agent = AgentFactory(name="Jen", kind=Agent.Kind.PERSONA)
    for name, value in {"hunger": 0.3, "money": 0.05, "energy": 0.8, "social": 0.6, "fun": 0.6}.items():
        NeedFactory(agent=agent, name=name, satisfaction=value, decay_per_hour=0.01)
    GoalFactory(agent=agent, description="Get something to eat", source_needs=["hunger"],
                recommended_actions=["look for work", "work", "buy food", "eat"])
    return agent


def cycles_until(agent: Agent, predicate, limit: int = 30) -> int:  # type: ignore[no-untyped-def]
    for n in range(1, limit + 1):
        agent_cycle(agent_id=agent.pk, runner="runner-test")
        if predicate():
            return n
    raise AssertionError(f"condition not reached in {limit} cycles")


def test_persona_plans_its_goal_and_follows_steps() -> None:
    agent = hungry_persona()
    agent_cycle(agent_id=agent.pk, runner="runner-test")
    plan = Plan.objects.get(agent=agent)
    assert plan.status == Plan.Status.ACTIVE
    assert plan.steps.count() >= 2
    experience = Experience.objects.get(agent=agent)
    assert experience.followed_plan and experience.action == plan.steps.first().action_hint
    assert PlanEvent.objects.filter(plan=plan, kind=PlanEvent.Kind.CREATED).exists()
    agent.refresh_from_db()
    assert agent.cycle_count == 1


def test_persona_cycle_following_a_step_makes_no_llm_call() -> None:
    agent = hungry_persona()
    agent_cycle(agent_id=agent.pk, runner="runner-test")
    calls = LLMCall.objects.count()
    agent_cycle(agent_id=agent.pk, runner="runner-test")
    assert LLMCall.objects.count() == calls


def test_persona_needs_decay_and_each_experience_keeps_the_curve_points() -> None:
    agent = hungry_persona()
    energy = agent.needs.get(name="energy").satisfaction
    cycles_until(agent, lambda: Experience.objects.filter(agent=agent).count() >= 3)
    assert agent.needs.get(name="energy").satisfaction != energy
    goal = Goal.objects.get(agent=agent, description="Get something to eat")
    latest = Experience.objects.filter(agent=agent).order_by("-cycle").first()
    assert latest is not None
    assert latest.needs_after == pytest.approx({n.name: n.satisfaction for n in agent.needs.all()})
    assert latest.goals_after[str(goal.pk)] == pytest.approx([goal.progress, goal.confidence])


def test_spending_money_waits_for_operator_then_runs_after_approval(operator: object) -> None:
    agent = hungry_persona()
    cycles_until(agent, lambda: PlanStep.objects.filter(plan__agent=agent, status="awaiting_approval").exists())
    step = PlanStep.objects.get(plan__agent=agent, status="awaiting_approval")
    assert step.requires_permission
    agent.refresh_from_db()
    assert "awaits approval" in agent.waiting_reason
    for _ in range(5):  # the person lives on meanwhile, but never does what awaits the operator's yes
        agent_cycle(agent_id=agent.pk, runner="runner-test")
    assert not Experience.objects.filter(agent=agent, action=step.action_hint).exists()
    assert PlanStep.objects.get(pk=step.pk).status == PlanStep.Status.AWAITING_APPROVAL
    services.step_approve(step=step, user=operator)
    cycles_until(agent, lambda: PlanStep.objects.get(pk=step.pk).status == PlanStep.Status.COMPLETED)


def test_decline_makes_version_two_that_keeps_completed_steps(operator: object) -> None:
    agent = hungry_persona()
    cycles_until(agent, lambda: PlanStep.objects.filter(plan__agent=agent, status="awaiting_approval").exists())
    v1 = Plan.objects.get(agent=agent, goal__description="Get something to eat")
    completed = list(v1.steps.filter(status="completed").values_list("key", "description"))
    assert completed
    step = v1.steps.get(status="awaiting_approval")
    services.step_decline(step=step, user=operator, feedback="Cook at home instead of buying food")
    agent_cycle(agent_id=agent.pk, runner="runner-test")
    v1.refresh_from_db()
    assert v1.status == Plan.Status.REPLANNED
    v2 = Plan.objects.get(previous=v1)
    assert v2.version == 2 and v2.times_replanned == 1
    kept = list(v2.steps.filter(carried_over=True).values_list("key", "description"))
    assert kept == completed
    assert all(s.status == "completed" for s in v2.steps.filter(carried_over=True))
    validated = v2.events.get(kind=PlanEvent.Kind.VALIDATED)
    assert set(validated.detail["diff"]["kept"]) >= {k for k, _ in completed}
    replan_call = LLMCall.objects.filter(plan=v2, purpose="replan").first()
    assert replan_call is not None and "Cook at home" in json.dumps(replan_call.prompt)


def test_tool_agent_plan_waits_for_approval_then_converts_csv(operator: object) -> None:
    agent = AgentFactory(name="Archivist", kind=Agent.Kind.TOOL)
    agent.workspace.mkdir(parents=True)
    (agent.workspace / "data.csv").write_text("name,city\nAda,London\nGrace,Arlington\n")
    GoalFactory(agent=agent, description="Convert data.csv to JSON", source_needs=[])
    agent_cycle(agent_id=agent.pk, runner="runner-test")
    plan = Plan.objects.get(agent=agent)
    assert plan.status == Plan.Status.AWAITING_APPROVAL
    assert plan.what or plan.who  # the restatement is shown to the operator
    agent_cycle(agent_id=agent.pk, runner="runner-test")
    assert not PlanStep.objects.filter(plan=plan).exclude(status="pending").exists()  # nothing runs unapproved
    services.plan_approve(plan=plan, user=operator, mode="all")

    def finished() -> bool:
        for step in PlanStep.objects.filter(plan=plan, status="awaiting_approval"):
            services.step_approve(step=step, user=operator)
        return Plan.objects.get(pk=plan.pk).status == Plan.Status.COMPLETED

    cycles_until(agent, finished)
    outputs = list(agent.workspace.glob("*.json"))
    assert outputs, "the plan should have written a JSON file into the workspace"
    assert json.loads(outputs[0].read_text()) == [{"name": "Ada", "city": "London"}, {"name": "Grace", "city": "Arlington"}]
    assert Goal.objects.get(agent=agent).status == Goal.Status.COMPLETED


def test_paused_agent_does_nothing(operator: object) -> None:
    agent = hungry_persona()
    services.agent_set_status(agent=agent, user=operator, status="paused")
    assert agent_cycle(agent_id=agent.pk, runner="runner-test") == "not running"
    assert not Plan.objects.filter(agent=agent).exists()


def test_urgent_need_asks_the_model_which_overrides_the_step() -> None:
    agent = hungry_persona()
    agent_cycle(agent_id=agent.pk, runner="runner-test")  # plans; the step is followed without a model call
    assert not LLMCall.objects.filter(purpose="decide").exists()
    agent.needs.filter(name="energy").update(satisfaction=0.05)
    agent_cycle(agent_id=agent.pk, runner="runner-test")
    assert LLMCall.objects.filter(agent=agent, purpose="decide").count() == 1
    latest = Experience.objects.filter(agent=agent).order_by("-cycle").first()
    assert latest is not None and latest.action == "sleep" and not latest.followed_plan
    assert latest.override_reason


def test_an_urgent_decision_for_an_unchanged_situation_is_not_asked_again() -> None:
    agent = hungry_persona()
    agent_cycle(agent_id=agent.pk, runner="runner-test")  # plans; the step is followed without a model call
    for _ in range(3):  # the same urgent need, the same step, the same actions out of reach
        agent.needs.filter(name="energy").update(satisfaction=0.05)
        agent_cycle(agent_id=agent.pk, runner="runner-test")
    assert LLMCall.objects.filter(agent=agent, purpose="decide").count() == 1
    latest = Experience.objects.filter(agent=agent).order_by("-cycle")[:3]
    assert [(e.action, e.followed_plan) for e in latest] == [("sleep", False)] * 3
    assert len({e.override_reason for e in latest}) == 1  # the decision taken, with its reason
    agent.needs.filter(name="energy").update(satisfaction=1.0)
    agent.needs.filter(name="fun").update(satisfaction=0.05)  # another situation: asked
    agent_cycle(agent_id=agent.pk, runner="runner-test")
    assert LLMCall.objects.filter(agent=agent, purpose="decide").count() == 2


def test_unusable_decision_falls_back_to_the_world_rules(settings: object, llm_server: object) -> None:
    from tests.llm_server import answer

    settings.LLM_MODELS = {"planner": ["offline-rules"], "fast": ["fast-model"]}  # type: ignore[attr-defined]
    llm_server.script("fast-model", answer('<json>{"action": "launch rockets", "reason": "why not"}</json>'))  # type: ignore[attr-defined]
    agent = AgentFactory(kind=Agent.Kind.PERSONA)
    NeedFactory(agent=agent, name="energy", satisfaction=0.05, decay_per_hour=0)
    agent_cycle(agent_id=agent.pk, runner="runner-test")
    experience = Experience.objects.get(agent=agent)
    assert experience.action == "sleep"  # the rules relieve the urgent need; the unknown action is ignored


def tool_plan_agent(steps: list[dict[str, object]]) -> tuple[Agent, Plan]:
    agent = AgentFactory(kind=Agent.Kind.TOOL)
    agent.workspace.mkdir(parents=True)
    goal = GoalFactory(agent=agent, description="Read the notes", source_needs=[])
    plan = Plan.objects.create(agent=agent, goal=goal, goal_text=goal.description, status=Plan.Status.ACTIVE,
                               approval_mode=Plan.ApprovalMode.ALL)
    for position, spec in enumerate(steps, start=1):
        PlanStep.objects.create(plan=plan, position=position, **spec)  # type: ignore[arg-type]
    return agent, plan


def test_independent_tool_steps_start_together_and_dependents_wait() -> None:
    agent, plan = tool_plan_agent([
        {"key": "a", "description": "List", "tool": "file.list", "tool_input": {"path": "."}},
        {"key": "b", "description": "List again", "tool": "file.list", "tool_input": {"path": "."}},
        {"key": "c", "description": "After both", "tool": "file.list", "tool_input": {"path": "."}, "depends_on": ["a", "b"]},
    ])
    agent_cycle(agent_id=agent.pk, runner="runner-test")
    status = dict(plan.steps.values_list("key", "status"))
    assert status == {"a": "completed", "b": "completed", "c": "pending"}
    agent_cycle(agent_id=agent.pk, runner="runner-test")
    assert plan.steps.get(key="c").status == "completed"


def test_failing_tool_step_is_retried_then_replanned_keeping_done_work() -> None:
    agent, plan = tool_plan_agent([
        {"key": "1", "description": "List the files", "tool": "file.list", "tool_input": {"path": "."}},
        {"key": "2", "description": "Read missing.txt", "tool": "file.read", "tool_input": {"path": "missing.txt"},
         "depends_on": ["1"], "max_retries": 2},
    ])
    cycles_until(agent, lambda: Plan.objects.filter(previous=plan).exists(), limit=10)
    failed = plan.steps.get(key="2")
    assert failed.status == PlanStep.Status.FAILED and failed.retries == 2
    assert "missing.txt" in failed.error
    kinds = list(plan.events.values_list("kind", flat=True))
    assert kinds.count(PlanEvent.Kind.STEP_RETRIED) == 2 and PlanEvent.Kind.STEP_FAILED in kinds
    v2 = Plan.objects.get(previous=plan)
    assert v2.steps.get(key="1").carried_over


def test_step_left_running_by_a_dead_runner_counts_as_a_failed_try() -> None:
    agent, plan = tool_plan_agent([
        {"key": "1", "description": "List", "tool": "file.list", "tool_input": {"path": "."}, "status": "running"},
    ])
    agent_cycle(agent_id=agent.pk, runner="runner-new")
    step = plan.steps.get()
    assert step.retries == 1
    assert step.status == PlanStep.Status.COMPLETED  # retried at once by the new runner
    assert plan.events.filter(kind=PlanEvent.Kind.STEP_RETRIED, reason__contains="interrupted").exists()


def test_failed_action_teaches_a_lesson_once_and_moods_follow_needs() -> None:
    agent = AgentFactory(kind=Agent.Kind.PERSONA, emotions={"worry": 0.1})
    NeedFactory(agent=agent, name="hunger", satisfaction=0.4, decay_per_hour=0)
    NeedFactory(agent=agent, name="money", satisfaction=0.0, decay_per_hour=0)
    plan = PlanFactory(agent=agent, goal=GoalFactory(agent=agent, source_needs=["hunger"]))
    PlanStepFactory(plan=plan, key="1", position=1, action_hint="eat", estimated_cycles=5)
    for _ in range(3):  # the step says "eat", which needs money she does not have
        agent_cycle(agent_id=agent.pk, runner="runner-test")
    assert list(agent.lessons.values_list("description", flat=True)) == ["To eat I need money at 10% or more."]
    agent.refresh_from_db()
    assert agent.emotions["worry"] > 0.5 and agent.emotions["frustration"] > 0.5


SIMULATED_CYCLES = 1000
STEADY_STATE = 500  # the last cycles, where model calls are counted
MAX_CALLS_PER_CYCLE = 0.2


def test_thousand_cycles_of_a_demo_persona_keep_every_invariant(operator: object) -> None:
    """The demo's Jenbina, offline model, an operator who approves what waits: checked after every cycle."""
    from django.core.management import call_command
    from django.db.models import Count, Sum

    call_command("seed_demo", no_users=True, interval=0, stdout=open(os.devnull, "w"))  # noqa: SIM115
    agent = Agent.objects.get(name="Jenbina")
    calls_before_steady = 0
    for n in range(1, SIMULATED_CYCLES + 1):
        agent_cycle(agent_id=agent.pk, runner="runner-sim")
        for step in PlanStep.objects.filter(plan__agent=agent, status=PlanStep.Status.AWAITING_APPROVAL):
            services.step_approve(step=step, user=operator)
        assert not agent.needs.exclude(satisfaction__gte=0.0, satisfaction__lte=1.0).exists(), n
        assert Goal.objects.filter(agent=agent, status=Goal.Status.ACTIVE).count() <= 10, n
        open_plans = Plan.objects.filter(agent=agent).open()
        per_horizon = list(open_plans.values("goal__horizon").annotate(n=Count("pk")).values_list("n", flat=True))
        assert sum(per_horizon) <= 3 and max(per_horizon, default=0) <= 1, n
        assert not open_plans.exclude(goal__status=Goal.Status.ACTIVE).exists(), n
        counted = PlanStep.objects.filter(plan__agent=agent, carried_over=False).aggregate(c=Sum("actual_cycles"))["c"]
        experiences = Experience.objects.filter(agent=agent)
        assert (counted or 0) == experiences.filter(step__isnull=False).count(), n
        assert Agent.objects.get(pk=agent.pk).cycle_count == experiences.count() == n
        if n == SIMULATED_CYCLES - STEADY_STATE:
            calls_before_steady = LLMCall.objects.filter(agent=agent).count()
    steady_calls = LLMCall.objects.filter(agent=agent).count() - calls_before_steady
    assert steady_calls / STEADY_STATE <= MAX_CALLS_PER_CYCLE


def tool_agent_to_plan(settings: object, llm_server: object, monkeypatch: pytest.MonkeyPatch,
                       request: pytest.FixtureRequest) -> Agent:
    """A tool agent with a goal to plan, the models scripted for one planning (restatement, a plan of 4 steps),
    the policies read beforehand (their read is not the cycle's)."""
    from tests.llm_server import answer

    settings.LLM_MODELS = {"planner": ["planner-model"], "fast": ["fast-model"]}  # type: ignore[attr-defined]
    restate = '<json>{"who": "me", "what": "read notes", "when": "now", "where": "workspace", "why": "asked"}</json>'
    # Four different steps (the same step four times is refused as a duplicate, issue 52).
    steps = [{"id": str(i), "tool": "file.list", "intent": f"List the files ({i})", "input": {"path": f"folder{i}"},
              "requiresPermission": False} for i in range(1, 5)]
    plan_text = "<json>" + json.dumps({"goal": "Read the notes", "steps": steps}) + "</json>"
    llm_server.script("fast-model", answer(restate))  # type: ignore[attr-defined]
    llm_server.script("planner-model", answer(plan_text))  # type: ignore[attr-defined]
    agent = AgentFactory(kind=Agent.Kind.TOOL)
    GoalFactory(agent=agent, description="Read the notes and list what they say", source_needs=[])
    from policies import services as policy_services

    # Policies and budgets are read again only after a change (each use reads their version, no statement), not
    # per cycle.
    policy_services.policies_forget()
    request.addfinalizer(policy_services.policies_forget)  # the next tests read their own policies again
    policy_services.policy_state()
    return agent


def test_tool_agent_planning_cycle_costs_a_bounded_number_of_queries(
        settings: object, llm_server: object, monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest) -> None:
    """One planning cycle (restatement, plan, accepted) through the real HTTP client: the statements do not
    grow with the plan's steps (they are stored together) and stay within the bound the runner's pace needs (one
    of them locks the agent's row and looks for a plan of the goal begun meanwhile: a start pass may meet this
    cycle, runtime/tasks.py)."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    agent = tool_agent_to_plan(settings, llm_server, monkeypatch, request)
    with CaptureQueriesContext(connection) as queries:
        agent_cycle(agent_id=agent.pk, runner="runner-test")

    plan = Plan.objects.get(agent=agent)
    assert plan.status == Plan.Status.AWAITING_APPROVAL and plan.steps.count() == 4
    statements = [q["sql"] for q in queries.captured_queries
                  if not q["sql"].upper().startswith(("BEGIN", "SAVEPOINT", "RELEASE", "COMMIT"))]
    assert len(statements) <= 17, "\n".join(statements)
    assert sum(s.startswith('INSERT INTO "planning_planstep"') for s in statements) == 1


def test_tool_agent_planning_cycle_as_the_runner_runs_it_costs_two_transactions(
        settings: object, llm_server: object, monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest) -> None:
    """The same cycle as the embedded runner runs it (cycle_run, given the kind it read with the agent's due
    time): no persona read for a tool agent, and transactions only where a write needs one (the version started,
    the plan accepted); the restatement and the cycle's count are one statement each, atomic on their own."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from runtime.cycles import cycle_run

    agent = tool_agent_to_plan(settings, llm_server, monkeypatch, request)
    with CaptureQueriesContext(connection) as queries:
        cycle_run(agent.pk, "runner-test", Agent.Kind.TOOL)

    assert Plan.objects.get(agent=agent).status == Plan.Status.AWAITING_APPROVAL
    statements = [q["sql"] for q in queries.captured_queries]
    assert sum(s.upper().startswith("SAVEPOINT") for s in statements) == 2, "\n".join(statements)
    assert not any('FROM "agents_need"' in s for s in statements), "\n".join(statements)
    # 16 statements and the two transactions' SAVEPOINT and RELEASE (inside the test's transaction); 25 when a
    # tool agent's cycle read its needs and the restatement and the count had transactions of their own.
    assert len(statements) <= 20, "\n".join(statements)
