"""Seed rules that a one-line break of the code once left unnoticed (docs/mutation.md), each tested at the point
where the break changes what a person watching the agent would see: a boundary at its exact value, "improved"
told apart from "changed", a loop written without its dependency, a persona's list answer, a parked or failed
plan's goal, the third attempt of a model."""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone

from agents.models import Agent, Experience, Need
from agents.persona import PLAN_NEEDS_BELOW, goal_plan_waits_for, goal_plannable, routine_keeps
from agents.world import (
    ACTIONS,
    URGENT_BELOW,
    ActionOutcome,
    action_apply,
    action_choose,
    action_lesson,
    action_needs_permission,
    relief_action,
)
from goals.system import (
    MILESTONE_CHECK_THRESHOLD,
    GoalState,
    goal_after_experience,
    goal_horizon_placed,
    goal_stats,
)
from planning.engine.parse import plan_parse
from planning.engine.schedule import steps_blocked, steps_runnable
from planning.engine.validate import plan_validate
from planning.models import Plan, PlanEvent, PlanStep
from planning.planner import plan_generate
from runtime.cycle import agent_cycle
from tests.factories import AgentFactory, GoalFactory, NeedFactory, PlanFactory, PlanStepFactory
from tests.llm_server import LLMTestServer, answer

CALM = {"hunger": 0.7, "money": 0.7, "energy": 0.7, "social": 0.7, "fun": 0.7}


def person(needs: dict[str, float] | None = None) -> Agent:
    agent = AgentFactory(kind=Agent.Kind.PERSONA)
    for name, value in (needs or CALM).items():
        NeedFactory(agent=agent, name=name, satisfaction=value, decay_per_hour=0.0)
    return agent


def cycle(agent: Agent) -> Experience:
    agent_cycle(agent_id=agent.pk, runner="runner-test")
    latest = Experience.objects.filter(agent=agent).order_by("-cycle").first()
    assert latest is not None
    return latest


def one_step_plan(agent: Agent, hint: str, *, source: str, horizon: str = "short_term") -> Plan:
    goal = GoalFactory(agent=agent, horizon=horizon, source_needs=[source], description=f"Goal of {hint}")
    plan = PlanFactory(agent=agent, goal=goal)
    PlanStepFactory(plan=plan, key="1", position=1, action_hint=hint, estimated_cycles=1)
    return plan


# -- seed 000: a step completes only when followed and a need improved ----------------------------------------


@pytest.mark.django_db
def test_a_followed_step_whose_action_only_lowers_needs_does_not_complete() -> None:
    """Working with a full purse changes needs (energy and fun go down) but raises none: followed and
    succeeded, the step is not done; once the pay raises money, it is."""
    agent = person({**CALM, "money": 1.0})
    plan = one_step_plan(agent, "work", source="money")
    experience = cycle(agent)
    assert experience.followed_plan and experience.outcome == "earned a wage"
    assert experience.need_deltas == {"energy": -0.06, "fun": -0.02}  # changed, none improved
    assert plan.steps.get().status == PlanStep.Status.RUNNING
    Need.objects.filter(agent=agent, name="money").update(satisfaction=0.5)
    assert cycle(agent).need_deltas["money"] == 0.15
    assert plan.steps.get().status == PlanStep.Status.COMPLETED


# -- seed 000: mid- and long-term goals wait until a source need drops below 50% ------------------------------


def test_mid_and_long_term_goals_wait_at_exactly_half_and_plan_just_below() -> None:
    assert PLAN_NEEDS_BELOW == 0.5
    for horizon in ("mid_term", "long_term"):
        assert not goal_plannable(horizon=horizon, source_needs=["social"], needs={"social": 0.5})
        assert goal_plan_waits_for(horizon=horizon, source_needs=["social"], needs={"social": 0.5}) == {"social": 0.5}
        assert goal_plannable(horizon=horizon, source_needs=["social"], needs={"social": 0.49})
        assert goal_plan_waits_for(horizon=horizon, source_needs=["social"], needs={"social": 0.49}) == {}
    # a short-term goal waits for nothing, however fine its needs
    assert goal_plannable(horizon="short_term", source_needs=["social"], needs={"social": 1.0})
    # one low source need of two is enough; the goal waits for both while neither is low
    needs = {"social": 0.9, "fun": 0.3}
    assert goal_plannable(horizon="mid_term", source_needs=["social", "fun"], needs=needs)
    assert goal_plannable(horizon="mid_term", source_needs=["fun", "social"], needs=needs)
    assert goal_plan_waits_for(horizon="long_term", source_needs=["social", "fun"],
                               needs={"social": 0.9, "fun": 0.6}) == {"social": 0.9, "fun": 0.6}
    # a need the person does not have is no reason to wait or to plan
    assert goal_plan_waits_for(horizon="mid_term", source_needs=["social", "luck"],
                               needs={"social": 0.8}) == {"social": 0.8}


@pytest.mark.django_db
def test_a_long_term_goal_waits_while_its_need_is_at_half_and_is_planned_below() -> None:
    agent = person({**CALM, "social": 0.5})
    goal = GoalFactory(agent=agent, horizon="long_term", source_needs=["social"], description="Make a new friend")
    cycle(agent)
    assert not Plan.objects.filter(goal=goal).exists()
    Need.objects.filter(agent=agent, name="social").update(satisfaction=0.49)
    cycle(agent)
    assert Plan.objects.filter(goal=goal).exists()


# -- seed 000: a goal is planned only if it has no plan yet --------------------------------------------------


@pytest.mark.django_db
def test_a_goal_whose_plan_waits_or_failed_is_not_planned_again_though_its_horizon_is_free() -> None:
    """A plan waiting for an operator's yes is parked (its horizon is free for another goal), and a failed
    planning waits for its retry: neither goal gets a second plan meanwhile."""
    agent = person()
    waiting = GoalFactory(agent=agent, horizon="short_term", source_needs=["hunger"], description="Get something to eat")
    parked = PlanFactory(agent=agent, goal=waiting)
    PlanStepFactory(plan=parked, key="1", position=1, action_hint="buy food", requires_permission=True,
                    status=PlanStep.Status.AWAITING_APPROVAL)
    failed_goal = GoalFactory(agent=agent, horizon="mid_term", source_needs=[], description="Learn to paint")
    PlanFactory(agent=agent, goal=failed_goal, status=Plan.Status.FAILED, failure_reason="no model answered",
                retry_at=timezone.now() + timedelta(hours=1))
    for _ in range(3):
        cycle(agent)
    assert Plan.objects.filter(goal=waiting).count() == 1
    assert Plan.objects.filter(goal=failed_goal).count() == 1


# -- seed 001: progress reaching 0.85 asks for the milestone check --------------------------------------------


def crossed(before: float, delta: float) -> bool:
    return goal_after_experience(state=GoalState(progress=before, confidence=0.9), horizon="short_term",
                                 source_needs=["hunger"], need_deltas={"hunger": delta}, hours=1).crossed_milestone


def test_milestone_is_asked_when_progress_reaches_exactly_085() -> None:
    assert MILESTONE_CHECK_THRESHOLD == 0.85
    food = ACTIONS["buy food"].effects["hunger"]  # 0.1
    reached = goal_after_experience(state=GoalState(progress=0.75, confidence=0.9), horizon="short_term",
                                    source_needs=["hunger"], need_deltas={"hunger": food}, hours=1)
    assert reached.progress == 0.85 and reached.crossed_milestone  # 0.75 + 0.1, exactly the line
    assert not crossed(0.74, food)  # 0.84: not yet
    assert not crossed(0.85, 0.05)  # it was asked when it got to 0.85: not again
    assert not crossed(0.85, 0.0)


# -- seed 002: a for-each step waits for its listing step ------------------------------------------------------


def test_a_for_each_written_without_depends_on_waits_for_its_listing() -> None:
    answer_text = ('<json>{"steps": [{"id": "1", "tool": "file.list", "intent": "List the notes", '
                   '"input": {"path": "notes"}, "requiresPermission": false}, {"id": "2", "tool": "text.summarize", '
                   '"intent": "Summarize each note", "input": {"path": "{item}"}, "requiresPermission": false, '
                   '"forEach": "1"}]}</json>')
    result = plan_validate(plan_parse(answer_text).data, kind="tool")
    assert result.ok and result.plan is not None
    listing, loop = result.plan.steps
    assert loop.depends_on == ["1"]
    steps = [(listing.key, "pending", listing.depends_on), (loop.key, "pending", loop.depends_on)]
    assert steps_runnable(steps, limit=2) == ["1"]  # never beside the listing
    assert steps_blocked([(listing.key, "failed", listing.depends_on), (loop.key, "pending", loop.depends_on)]) == ["2"]


# -- seed 004: a persona's numbered-list answer still names its actions ----------------------------------------


@pytest.fixture
def planner_model(settings: Any, llm_server: LLMTestServer) -> LLMTestServer:
    settings.LLM_MODELS = {"planner": ["big-model"], "fast": ["fast-model"]}
    return llm_server


RESTATE = ('<json>{"who": "Maria", "what": "get something to eat", "when": "today", "where": "at home", '
           '"why": "she is hungry"}</json>')


@pytest.mark.django_db
def test_a_personas_numbered_list_answer_is_planned_as_its_actions(planner_model: LLMTestServer) -> None:
    agent = person({**CALM, "hunger": 0.2})
    goal = GoalFactory(agent=agent, horizon="short_term", source_needs=["hunger"], description="Get something to eat")
    planner_model.script("fast-model", answer(RESTATE), answer(RESTATE))
    planner_model.script("big-model", answer("Here is my plan:\n1. go to the store\n2. buy food\n3. eat\n"))
    plan = plan_generate(agent=agent, goal_text=goal.description, goal=goal)
    assert plan.status in (Plan.Status.ACTIVE, Plan.Status.AWAITING_APPROVAL), plan.failure_reason
    assert list(plan.steps.order_by("position").values_list("action_hint", flat=True)) == [
        "go to the store", "buy food", "eat"]
    assert not plan.events.filter(kind=PlanEvent.Kind.ATTEMPT_REJECTED).exists()
    assert len(planner_model.requests_for("big-model")) == 1


# -- seed 003: three attempts per model, then the simpler request --------------------------------------------


TOOL_GOOD = (
    '<json>{"goal": "List the workspace", "thinking_summary": "Look before acting.", "confidence": 0.8, '
    '"steps": [{"id": "1", "tool": "file.list", "intent": "List the files", "input": {"path": "."}, '
    '"requiresPermission": false}], "risks": []}</json>'
)
TOOL_RESTATE = ('<json>{"who": "Archivist", "what": "list the workspace", "when": "now", "where": "its workspace", '
                '"why": "to know what is there"}</json>')


@pytest.mark.django_db
def test_a_model_gets_three_attempts_before_the_simpler_request(planner_model: LLMTestServer) -> None:
    agent = AgentFactory(name="Archivist", kind=Agent.Kind.TOOL)
    agent.workspace.mkdir(parents=True, exist_ok=True)
    unknown = TOOL_GOOD.replace("file.list", "file.delete_all")
    planner_model.script("fast-model", answer(TOOL_RESTATE))
    planner_model.script("big-model", answer(unknown), answer(unknown), answer(TOOL_GOOD), answer(TOOL_GOOD))
    plan = plan_generate(agent=agent, goal_text="List the workspace")
    assert plan.status == Plan.Status.AWAITING_APPROVAL
    prompts = [json.dumps(r.messages) for r in planner_model.requests_for("big-model")]
    assert len(prompts) == 3 and not any("SIMPLER REQUEST" in p for p in prompts)  # the third is a full attempt
    assert plan.events.filter(kind=PlanEvent.Kind.ATTEMPT_REJECTED).count() == 2
    assert "accepted from a simpler request after rejected answers" not in (
        plan.events.get(kind=PlanEvent.Kind.VALIDATED).detail["flags"])


# -- seed 001: survivors of `make mutate` on goals/system.py ---------------------------------------------------


def test_a_goal_of_a_horizon_the_seeds_do_not_know_is_placed_nowhere() -> None:
    """A goal "for someday" has no share of the horizon mix and no nearest horizon: it is placed nowhere, neither
    a crash nor a made-up horizon (goals_create also skips a horizon it does not know before asking)."""
    assert goal_horizon_placed(horizon="someday", active={}) is None
    assert goal_horizon_placed(horizon="someday", active={"someday": 0, "short_term": 0}) is None
    assert goal_horizon_placed(horizon="mid_term", active={}) == "mid_term"


def test_goal_stats_mean_progress_keeps_four_places() -> None:
    stats = goal_stats([("active", "short_term", 0.123456, 0, 0), ("completed", "mid_term", 1.0, 2, 0)])
    assert stats.mean_progress == 0.1235


# -- seed 000: survivors of `make mutate` on agents/world.py and agents/persona.py -------------------------------


def test_a_hungry_person_without_a_plan_eats_with_money_and_cooks_without() -> None:
    """Hunger is relieved by eating out only when the money is there (the urgent path), and without a plan step
    the lowest need below half is relieved the same way."""
    fed = {"hunger": 0.3, "money": 0.5, "energy": 0.9}
    assert action_choose(suggested=None, needs=fed) == ("eat", "no plan step; hunger is lowest")
    assert action_choose(suggested="work", needs={"hunger": 0.1, "money": 0.05}) == ("cook", "hunger is urgent (10%)")
    assert relief_action("hunger", {"hunger": URGENT_BELOW - 0.05, "money": 0.5}) == "eat"
    assert relief_action("hunger", {"hunger": URGENT_BELOW - 0.05, "money": 0.0}) == "cook"
    assert relief_action("energy", {"energy": 0.0, "money": 0.0}) == "sleep"


def test_buying_food_and_meeting_a_friend_wait_for_an_operators_yes() -> None:
    assert [a for a in ACTIONS if action_needs_permission(a)] == ["buy food", "meet friend"]
    assert not action_needs_permission("fly to the moon")


def test_a_failed_action_names_itself_and_teaches_only_below_its_requirement() -> None:
    assert action_apply("eat", {"hunger": 0.2, "money": 0.05}) == ActionOutcome(
        "eat", False, {}, "could not eat: not enough money")
    assert action_lesson("eat", {"money": 0.1}) is None  # exactly the requirement: eating works, nothing to learn
    assert action_apply("eat", {"hunger": 0.2, "money": 0.1}).succeeded
    assert action_lesson("eat", {"money": 0.09}) == "To eat I need money at 10% or more."
    assert action_lesson("eat", {"hunger": 0.2}) is None  # a person without money as a need is never short of it


def test_a_routine_leaves_out_work_only_while_money_is_plentiful() -> None:
    work = ACTIONS["work"].effects
    assert not routine_keeps(effects=work, source_needs=["hunger"], needs={"money": 0.8}, fine_above=0.8)
    assert routine_keeps(effects=work, source_needs=["hunger"], needs={"money": 0.79}, fine_above=0.8)
    assert routine_keeps(effects=work, source_needs=["money"], needs={"money": 0.95}, fine_above=0.8)
    assert routine_keeps(effects=ACTIONS["eat"].effects, source_needs=["hunger"], needs={"hunger": 0.9,
                         "energy": 0.9, "money": 0.9}, fine_above=0.8)
    assert routine_keeps(effects=ACTIONS["idle"].effects, source_needs=["fun"], needs={"fun": 0.9}, fine_above=0.8)
    assert routine_keeps(effects={"energy": -0.1}, source_needs=["fun"], needs={}, fine_above=0.8)
    assert not routine_keeps(effects=ACTIONS["call a friend"].effects, source_needs=["hunger"], needs={},
                             fine_above=0.8)  # a need the person does not have counts as fine


# -- seed 004: survivors of `make mutate` on planning/engine/schedule.py -----------------------------------------


def test_a_step_waiting_on_later_steps_is_not_blocked_while_they_can_finish() -> None:
    """Dependencies may name later steps (only unknown ones, a step itself and cycles are refused): a step whose
    dependency waits on a step further down is not declared blocked while that one runs, and is once it fails."""
    chain = [("1", "pending", ["2"]), ("2", "pending", ["3"]), ("3", "running", [])]
    assert steps_blocked(chain) == []
    assert steps_runnable(chain, limit=3) == []
    assert steps_blocked([("1", "pending", ["2"]), ("2", "pending", ["3"]), ("3", "failed", [])]) == ["1", "2"]
    assert steps_runnable([("1", "pending", ["2"]), ("2", "pending", ["3"]), ("3", "completed", [])]) == ["2"]


# -- seed 004: survivors of `make mutate` on planning/engine/parse.py --------------------------------------------


def test_a_list_answer_keeps_each_lines_words_but_a_trailing_colon() -> None:
    parsed = plan_parse("Steps:\n1. **Read the report:**\n2. Export it as XLSX\n- go to the store\n")
    assert parsed.method == "text_list" and parsed.repaired == []
    assert parsed.data["steps"] == [{"description": "Read the report"}, {"description": "Export it as XLSX"},
                                    {"description": "go to the store"}]
