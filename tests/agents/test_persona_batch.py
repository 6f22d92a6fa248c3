"""Persona cycles in batches (runtime/cycle.py persona_cycles, planning/services/cycles.py persona_cycles_record), as the
scale-out runtime drives personas: the same rules as one agent's cycle, every cycle of a batch recorded in one
transaction in a fixed number of statements, an operator's decision or another runner's cycle made meanwhile
standing, and the uncommon cycles (a model call, a plan to make) left to the agent's own cycle."""

from __future__ import annotations

import json
import re
from typing import Any
from unittest import mock

import pytest
from django.contrib.auth.models import User
from django.core.cache import cache
from django.db import connection
from django.db.models import F
from django.test.utils import CaptureQueriesContext

from agents.llm.context import needs_text
from agents.models import Agent, Experience, LLMCall, Need
from goals.models import Goal
from goals.system import GENERATION_INTERVAL
from planning import planner as planner_module
from planning.models import Plan, PlanEvent, PlanStep
from planning.services import step_skip
from policies import services as policies
from runtime import cycle as cycle_module
from runtime.cycle import agent_cycle, persona_cycles
from tests.factories import (
    AgentFactory,
    GoalFactory,
    LessonFactory,
    NeedFactory,
    PlanFactory,
    PlanStepFactory,
)

pytestmark = pytest.mark.django_db

ALIKE = 8  # personas alike in a batch: enough that the commonest change of each column is shared


def person(*, money: float = 0.3, hunger: float = 0.7, steps: tuple[tuple[str, int], ...] = (("work", 2), ("eat", 1)),
           cycle_count: int = 1) -> Agent:
    """A persona following a plan for its short-term goal, with nothing else to plan (its other needs fine)."""
    agent = AgentFactory(kind=Agent.Kind.PERSONA, cycle_count=cycle_count, emotions={"hope": 0.5})
    for name, value in {"money": money, "hunger": hunger, "energy": 0.8, "social": 0.9, "fun": 0.9}.items():
        NeedFactory(agent=agent, name=name, satisfaction=value, decay_per_hour=0.02)
    goal = GoalFactory(agent=agent, description="Keep fed", horizon=Goal.Horizon.SHORT, source_needs=["hunger"])
    plan = PlanFactory(agent=agent, goal=goal)
    for position, (hint, estimate) in enumerate(steps, start=1):
        PlanStepFactory(plan=plan, key=str(position), position=position, action_hint=hint, description=f"Go {hint}",
                        estimated_cycles=estimate, depends_on=[str(position - 1)] if position > 1 else [])
    return agent


def seen(agent: Agent) -> dict[str, Any]:
    """What an operator sees of a persona after its cycles (its pages, timeline and audit)."""
    agent.refresh_from_db()
    return {
        "cycles": agent.cycle_count,
        "emotions": agent.emotions,
        "needs": {n.name: round(n.satisfaction, 4) for n in Need.objects.filter(agent=agent)},
        "experiences": list(Experience.objects.filter(agent=agent).order_by("cycle").values_list(
            "cycle", "action", "outcome", "followed_plan", "override_reason")),
        "steps": list(PlanStep.objects.filter(plan__agent=agent).order_by("plan_id", "position").values_list(
            "plan__status", "key", "status", "actual_cycles", "overrides")),
        "goals": list(Goal.objects.filter(agent=agent).order_by("pk").values_list(
            "status", "progress", "confidence", "times_advanced", "times_regressed")),
        "events": [(kind, re.sub(r"#\d+", "#", reason)) for kind, reason in  # plan ids differ
                   PlanEvent.objects.filter(agent=agent).order_by("pk").values_list("kind", "reason")],
        "lessons": sorted(agent.lessons.values_list("description", flat=True)),
    }


def test_a_batch_does_to_each_persona_what_its_own_cycles_do() -> None:
    shapes: list[dict[str, Any]] = [{}, {"money": 0.05}, {"hunger": 0.45, "steps": (("eat", 1),)},
                                    {"steps": (("relax", 1), ("work", 3))}]
    batched = [person(**shape) for shape in shapes]
    alone = [person(**shape) for shape in shapes]
    recorded_here = 0
    for _ in range(6):
        done, own = persona_cycles([a.pk for a in batched], runner="runner test")
        recorded_here += len(done)
        for agent_id in own:  # as the runtime does: the uncommon cycle runs as the agent's own
            agent_cycle(agent_id=agent_id, runner="runner test")
        for agent in alone:
            agent_cycle(agent_id=agent.pk, runner="runner test")
    assert recorded_here >= 12  # most cycles took the batch's path
    for one, other in zip(batched, alone, strict=True):
        assert seen(one) == seen(other)
    assert all(seen(a)["cycles"] == 7 for a in batched)


def test_a_batch_whose_rows_move_alike_does_to_each_persona_what_its_own_cycles_do() -> None:
    """Personas alike, whose needs, goals and steps a pass writes one statement for each change (needs_move,
    goals_shifted, steps_moved): the same values, to the last bit, as each persona's own cycles write."""
    alike = ALIKE
    shapes: list[dict[str, Any]] = [{}, {"money": 0.05}]
    batched = [person(**shape) for shape in shapes for _ in range(alike)]
    alone = [person(**shape) for shape in shapes]
    for _ in range(4):
        done, own = persona_cycles([a.pk for a in batched], runner="runner test")
        assert own == [] and set(done) == {a.pk for a in batched}
        for agent in alone:
            agent_cycle(agent_id=agent.pk, runner="runner test")
    exact = {"needs": lambda a: dict(Need.objects.filter(agent=a).values_list("name", "satisfaction"))}
    for index, one in enumerate(batched):
        other = alone[index // alike]
        assert seen(one) == seen(other)
        assert exact["needs"](one) == exact["needs"](other)


def test_an_operators_edit_of_needs_and_goals_made_meanwhile_is_moved_not_overwritten() -> None:
    """The pass read a need and a goal, an operator set them meanwhile; the cycle's change is applied to
    what the operator set (as their rows move alike, one statement for each change)."""
    agents = [person() for _ in range(ALIKE)]
    first = agents[0]
    twin = agents[1]

    def operator_edits() -> None:
        Need.objects.filter(agent=first, name="social").update(satisfaction=0.4)
        Goal.objects.filter(agent=first).update(confidence=0.5)

    with records_then(operator_edits):
        persona_cycles([a.pk for a in agents], runner="runner test")
    social = {a.pk: Need.objects.get(agent=a, name="social").satisfaction for a in (first, twin)}
    confidence = {a.pk: Goal.objects.get(agent=a).confidence for a in (first, twin)}
    assert social[twin.pk] < 0.9 and confidence[twin.pk] < 1.0  # the twin moved from what was read
    assert social[first.pk] == pytest.approx(0.4 - (0.9 - social[twin.pk]))  # moved from the operator's 40 %
    assert confidence[first.pk] == pytest.approx(0.5 - (1.0 - confidence[twin.pk]))


def records_then(meanwhile: Any) -> Any:
    """persona_cycles_record, with something happening between the batch's read and its write (once: a persona's
    own cycle happening meanwhile records through the same service)."""
    real = cycle_module.persona_cycles_record
    pending = [meanwhile]

    def record(records: Any) -> Any:
        while pending:
            pending.pop()()
        return real(records)

    return mock.patch.object(cycle_module, "persona_cycles_record", record)


def test_a_step_an_operator_skipped_meanwhile_stays_skipped_and_the_rest_is_recorded() -> None:
    agent, other = person(), person()
    step = PlanStep.objects.get(plan__agent=agent, key="1")
    operator = User.objects.create_user("olivia", password="pw-123456789")
    with records_then(lambda: step_skip(step=step, user=operator, reason="not today")):
        done, own = persona_cycles([agent.pk, other.pk], runner="runner test")
    assert set(done) == {agent.pk, other.pk} and own == []
    step.refresh_from_db()
    assert step.status == PlanStep.Status.SKIPPED and step.actual_cycles == 0
    assert not PlanEvent.objects.filter(step=step, kind=PlanEvent.Kind.STEP_STARTED).exists()
    assert Experience.objects.filter(agent=agent).count() == 1  # the experience itself happened
    assert PlanStep.objects.get(plan__agent=other, key="1").status == PlanStep.Status.RUNNING


def test_a_cycle_another_runner_recorded_meanwhile_is_not_recorded_twice() -> None:
    agent, other = person(), person()

    def another_runner() -> None:
        agent_cycle(agent_id=agent.pk, runner="runner elsewhere")

    with records_then(another_runner):
        done, _ = persona_cycles([agent.pk, other.pk], runner="runner test")
    assert set(done) == {other.pk}
    assert list(Experience.objects.filter(agent=agent).values_list("cycle", flat=True)) == [2]
    agent.refresh_from_db()
    assert agent.cycle_count == 2
    assert PlanStep.objects.get(plan__agent=agent, key="1").actual_cycles == 1  # moved once


def uncommon() -> list[Agent]:
    """Personas whose cycle needs more than the common path."""
    to_plan = person()
    Plan.objects.filter(agent=to_plan).delete()  # its goal has no plan: the cycle plans it
    to_ask = person(steps=(("buy food", 1),))
    PlanStep.objects.filter(plan__agent=to_ask).update(requires_permission=True)  # it must ask an operator first
    starving = person(hunger=0.05)  # urgent: the model decides, and no decision stands for it yet
    retrying = person()
    Agent.objects.filter(pk=retrying.pk).update(plan_retry_at="2000-01-01T00:00:00Z")
    return [to_plan, to_ask, starving, retrying]


def near_milestone() -> Agent:
    """A persona whose next meal takes its goal's progress over the milestone line."""
    agent = person(steps=(("eat", 1),))
    Goal.objects.filter(agent=agent).update(progress=0.84)
    return agent


def test_cycles_that_may_wait_on_a_model_server_are_left_to_run_apart(settings: Any) -> None:
    settings.LLM_MODELS = {"planner": ["gpt-4o-mini"], "fast": ["gpt-4o-mini"]}  # served over the network
    to_plan, to_ask, starving, retrying = uncommon()
    milestone = near_milestone()
    common = person()
    ids = [to_plan.pk, to_ask.pk, starving.pk, retrying.pk, milestone.pk, common.pk]
    done, own = persona_cycles(ids, runner="runner test")
    assert set(done) == {common.pk, to_ask.pk}  # putting a step in the inbox asks no model
    assert sorted(own) == sorted([to_plan.pk, starving.pk, retrying.pk, milestone.pk])
    for agent in (to_plan, starving, retrying, milestone):  # nothing of theirs written by the pass
        assert seen(agent)["cycles"] == 1 and seen(agent)["experiences"] == []
    assert not Plan.objects.filter(agent=to_plan).exists()
    assert PlanStep.objects.get(plan__agent=to_ask).status == PlanStep.Status.AWAITING_APPROVAL
    assert not LLMCall.objects.exists()


def test_cycles_whose_models_answer_at_once_run_in_the_pass_as_their_own() -> None:
    to_plan, to_ask, starving, retrying = uncommon()
    milestone = near_milestone()
    done, own = persona_cycles([to_plan.pk, to_ask.pk, starving.pk, milestone.pk], runner="runner test")
    assert own == [] and set(done) == {to_plan.pk, to_ask.pk, starving.pk, milestone.pk}
    assert Plan.objects.filter(agent=to_plan).exists()  # planned by the offline model
    assert PlanStep.objects.get(plan__agent=to_ask).status == PlanStep.Status.AWAITING_APPROVAL  # in the inbox
    assert all(seen(a)["cycles"] == 2 for a in (to_plan, to_ask, starving, milestone))
    # The milestone crossed was checked once its experience was recorded.
    assert PlanEvent.objects.filter(agent=milestone, kind=PlanEvent.Kind.MILESTONE_CHECKED).count() == 1
    assert Goal.objects.get(agent=milestone).milestone_checked_at is not None


def test_an_urgent_decision_that_stands_for_the_situation_is_taken_in_the_batch() -> None:
    starving = person(hunger=0.05)
    agent_cycle(agent_id=starving.pk, runner="runner test")  # asks the model once; the decision stands
    Need.objects.filter(agent=starving, name="hunger").update(satisfaction=0.05)
    done, own = persona_cycles([starving.pk], runner="runner test")
    assert own == [] and set(done) == {starving.pk}
    actions = list(Experience.objects.filter(agent=starving).order_by("cycle").values_list("action", flat=True))
    assert actions[0] == actions[1]
    cache.clear()


def test_the_decisions_a_pass_asks_the_model_are_logged_in_one_insert() -> None:
    """Two starving personas in situations not met before: the pass asks the model for each decision, and
    both calls are in the log (with their agents), written by one INSERT."""
    cache.clear()
    starving = [person(hunger=0.05), person(hunger=0.04)]
    with CaptureQueriesContext(connection) as queries:
        done, own = persona_cycles([a.pk for a in starving], runner="runner test")
    assert own == [] and set(done) == {a.pk for a in starving}
    calls = LLMCall.objects.filter(purpose="decide")
    assert sorted(calls.values_list("agent_id", flat=True)) == sorted(a.pk for a in starving)
    assert sum(q["sql"].startswith('INSERT INTO "agents_llmcall"') for q in queries) == 1
    cache.clear()


def lesson_reads(queries: CaptureQueriesContext) -> int:
    """The reads of lessons a pass made for its decision prompts (not the check of lessons it learned)."""
    return sum(q["sql"].startswith("SELECT") and 'FROM "agents_lesson"' in q["sql"]
               and '"agents_lesson"."description" IN' not in q["sql"] for q in queries)


def test_the_lessons_a_passs_decisions_quote_are_read_once_for_every_persona_that_asks() -> None:
    """Starving personas in situations not met before each ask the model for a decision, whose prompt quotes the
    person's own five newest lessons: the pass reads them for all its personas in one query, however many ask."""
    reads = []
    for n in (2, 5):
        cache.clear()
        starving = [person(hunger=0.05) for _ in range(n)]
        for agent in starving:
            for k in range(7):
                LessonFactory(agent=agent, description=f"lesson {k} of {agent.name}")
        with CaptureQueriesContext(connection) as queries:
            done, own = persona_cycles([a.pk for a in starving], runner="runner test")
        assert own == [] and set(done) == {a.pk for a in starving}
        reads.append(lesson_reads(queries))
        for agent in starving:
            prompt = json.dumps(LLMCall.objects.get(agent=agent, purpose="decide").prompt)
            assert [k for k in range(7) if f"lesson {k} of {agent.name}" in prompt] == [2, 3, 4, 5, 6]
            assert not any(f"of {other.name}" in prompt for other in starving if other != agent)
    assert reads == [1, 1]
    cache.clear()


def test_a_persona_cycle_of_its_own_quotes_its_five_newest_lessons() -> None:
    cache.clear()
    starving = person(hunger=0.05)
    for k in range(7):
        LessonFactory(agent=starving, description=f"lesson {k}")
    agent_cycle(agent_id=starving.pk, runner="runner test")
    prompt = json.dumps(LLMCall.objects.get(agent=starving, purpose="decide").prompt)
    assert "LEARNED LESSONS" in prompt
    assert [k for k in range(7) if f"lesson {k}" in prompt] == [2, 3, 4, 5, 6]
    cache.clear()


def passes_statements(*batches: list[Agent]) -> list[int]:
    """The statements of one pass of each batch, every cycle of which ran in the pass."""
    counts = []
    for agents in batches:
        # The policies' state is read again after a change only (its version is read at each use): read just
        # before each pass measured, so both passes find it current.
        policies.policy_state_drop()
        policies.policy_state()
        with CaptureQueriesContext(connection) as queries:
            done, own = persona_cycles([a.pk for a in agents], runner="runner test")
        assert own == [] and set(done) == {a.pk for a in agents}
        counts.append(len(queries))
    return counts


def test_a_batch_costs_the_same_statements_whatever_its_size() -> None:
    """A pass's needs, goals and steps are moved by one UPDATE each, however many personas and however their
    changes differ: no statement more however many personas."""
    small, large, larger = passes_statements([person() for _ in range(2)], [person() for _ in range(ALIKE)],
                                             [person() for _ in range(3 * ALIKE)])
    assert small == large == larger


def test_routines_start_in_the_pass_and_are_followed_in_the_same_cycle() -> None:
    """Seed 000 plans a goal once: a goal whose plan completed repeats it, without a model call, for every
    persona of the pass together, and each follows its routine's first step in that cycle."""
    agents = [person(), person()]
    Plan.objects.filter(agent__in=agents).update(status=Plan.Status.COMPLETED)
    PlanStep.objects.filter(plan__agent__in=agents).update(status=PlanStep.Status.COMPLETED)
    done, own = persona_cycles([a.pk for a in agents], runner="runner test")
    assert own == [] and set(done) == {a.pk for a in agents}
    for agent in agents:
        routine = Plan.objects.filter(agent=agent, status=Plan.Status.ACTIVE).get()
        assert routine.events.filter(kind=PlanEvent.Kind.CREATED, reason__startswith="repeats plan #").exists()
        assert list(routine.steps.values_list("action_hint", flat=True)) == ["work", "eat"]
        experience = Experience.objects.get(agent=agent)
        assert experience.followed_plan and experience.action == "work"
    assert not LLMCall.objects.exists()  # no model call


def test_routines_of_two_goals_of_one_persona_each_repeat_their_own_plan() -> None:
    """Routines started together for two goals of the same persona (a pass plans one goal of each, so this is
    the other path): each goal repeats the plan that completed for it, not the other's."""
    from runtime.cycle import persona_routines_start, persona_rows_many, persona_state

    agent = person(steps=(("work", 1),))
    Plan.objects.filter(agent=agent).update(status=Plan.Status.COMPLETED)
    PlanStep.objects.filter(plan__agent=agent).update(status=PlanStep.Status.COMPLETED)
    fed = Goal.objects.get(agent=agent)
    rested = GoalFactory(agent=agent, description="Rest well", horizon=Goal.Horizon.SHORT, source_needs=["energy"])
    source = PlanFactory(agent=agent, goal=rested, goal_text="Rest well", status=Plan.Status.COMPLETED)
    PlanStepFactory(plan=source, key="1", position=1, action_hint="sleep", status=PlanStep.Status.COMPLETED)
    Need.objects.filter(agent=agent).update(satisfaction=0.2)  # every need low: no step is left out
    state = persona_state(agent, persona_rows_many([agent.pk])[agent.pk], at_once=True)
    started = persona_routines_start([(state, fed), (state, rested)], runner="runner test")
    assert {goal: [s.action_hint for s in steps] for goal, (_, steps) in started.items()} == {
        fed.pk: ["work"], rested.pk: ["sleep"]}


def test_a_cycle_run_late_keeps_the_agents_pace_and_one_far_behind_starts_afresh() -> None:
    from datetime import timedelta

    from django.utils import timezone

    from agents.services import cycle_next_at

    now = timezone.now()
    agent = Agent(cycle_interval=2.0, next_cycle_at=now - timedelta(seconds=0.5))  # this cycle ran 0.5 s late
    assert cycle_next_at(agent, now) == now + timedelta(seconds=1.5)  # still one cycle every 2 s
    agent.next_cycle_at = now - timedelta(seconds=10)  # far behind (paused, no runner): no burst to catch up
    assert cycle_next_at(agent, now) == now + timedelta(seconds=2)
    agent.next_cycle_at = None  # its first cycle
    assert cycle_next_at(agent, now) == now + timedelta(seconds=2)


def test_a_plan_an_operator_cancelled_meanwhile_stays_cancelled() -> None:
    """A pass completes plans in its one transaction; an operator's cancel made after the pass read the plan
    wins, as it does against a single cycle: the plan stays cancelled, its step as the cancel left it, and its
    goal as the cancel left it."""
    from planning.services import plan_cancel

    agent, other = person(steps=(("eat", 1),)), person(steps=(("eat", 1),))
    plan = Plan.objects.get(agent=agent)
    operator = User.objects.create_user("olivia", password="pw-123456789")
    with records_then(lambda: plan_cancel(plan=Plan.objects.get(pk=plan.pk), user=operator, reason="not now")):
        done, own = persona_cycles([agent.pk, other.pk], runner="runner test")
    assert set(done) == {agent.pk, other.pk} and own == []
    assert Plan.objects.get(agent=other).status == Plan.Status.COMPLETED  # the pass did complete a plan
    plan.refresh_from_db()
    assert plan.status == Plan.Status.CANCELLED
    assert not plan.events.filter(kind=PlanEvent.Kind.PLAN_COMPLETED).exists()
    assert not plan.steps.filter(status=PlanStep.Status.COMPLETED).exists()
    assert Experience.objects.filter(agent=agent).count() == 1  # the experience itself happened
    goal = Goal.objects.get(agent=agent)
    assert (goal.status, goal.progress) == (Goal.Status.ABANDONED, 0.0)  # as the operator's cancel left it


def test_a_plan_kept_from_completing_in_a_pass_gives_its_goal_no_bonus() -> None:
    """The step a plan's completion hung on changed after the pass read it (behind the services' back, so the
    plan stays open): the plan is not completed and its goal moves by the experience alone."""
    from goals.system import PLAN_COMPLETION_BONUS

    agent, other = person(steps=(("eat", 1),)), person(steps=(("eat", 1),))
    plan = Plan.objects.get(agent=agent)
    with records_then(lambda: PlanStep.objects.filter(plan=plan).update(status=PlanStep.Status.SKIPPED)):
        done, _ = persona_cycles([agent.pk, other.pk], runner="runner test")
    assert set(done) == {agent.pk, other.pk}
    assert Plan.objects.get(pk=plan.pk).status == Plan.Status.ACTIVE
    assert not plan.events.filter(kind=PlanEvent.Kind.PLAN_COMPLETED).exists()
    rewarded, unrewarded = Goal.objects.get(agent=other), Goal.objects.get(agent=agent)
    assert Plan.objects.get(agent=other).status == Plan.Status.COMPLETED
    assert unrewarded.status == Goal.Status.ACTIVE
    assert rewarded.progress == pytest.approx(unrewarded.progress + PLAN_COMPLETION_BONUS, abs=0.001)


def test_a_plan_whose_cycle_another_runner_took_meanwhile_is_left_as_it_was() -> None:
    """The pass marks the plans its cycles complete first (plans_claimed); a cycle it then drops, because another
    runner counted the agent's cycle meanwhile, gives its plan back the status it had: no plan completed, no
    event, and the plan's step untouched."""
    agent = person(steps=(("eat", 1),))
    plan = Plan.objects.get(agent=agent)
    with records_then(lambda: Agent.objects.filter(pk=agent.pk).update(cycle_count=F("cycle_count") + 1)):
        done, _ = persona_cycles([agent.pk], runner="runner test")
    assert done == {}
    plan.refresh_from_db()
    assert plan.status == Plan.Status.ACTIVE
    assert not plan.events.exists()
    assert plan.steps.get().status == PlanStep.Status.PENDING
    assert not Experience.objects.filter(agent=agent).exists()


@pytest.mark.django_db(transaction=True)
def test_a_pass_is_one_push_to_the_open_pages_naming_every_persona_it_moved(monkeypatch: pytest.MonkeyPatch) -> None:
    """The runner's pass (personas_run) commits its personas' cycles, then tells the open pages once, naming every
    agent and plan it changed: not once per transaction or per persona."""
    from planner_site import events
    from runtime.cycles import personas_run

    sent: list[tuple[set[int], set[int]]] = []
    monkeypatch.setattr(events.publisher, "publish", lambda *, agents, plans: sent.append((set(agents), set(plans))))
    people = [person(), person(money=0.5), person(hunger=0.4)]
    done, apart = personas_run([p.pk for p in people], "runner-test")
    assert set(done) == {p.pk for p in people} and not apart
    assert len(sent) == 1, sent
    agents, plans = sent[0]
    assert agents == {p.pk for p in people}
    assert plans <= set(Plan.objects.filter(agent__in=people).values_list("pk", flat=True)) and plans


def due_for_goals(*, done: bool = True) -> Agent:
    """A persona whose goals are re-evaluated this cycle, with money low and no goal serving it; `done`: it
    earned money before (a completed goal that served it)."""
    agent = person(money=0.2, cycle_count=GENERATION_INTERVAL)
    if done:
        GoalFactory(agent=agent, description="Earn some money", horizon=Goal.Horizon.MID, source_needs=["money"],
                    recommended_actions=["work"], status=Goal.Status.COMPLETED, progress=1.0)
    return agent


def test_goals_recur_in_the_pass_for_every_persona_in_a_fixed_number_of_statements() -> None:
    """Seed 001's re-evaluation with recurring goals: a need low again brings back the goal that served it,
    for every persona of the pass together, without a model call; its event says which goal, for which need."""
    small = [due_for_goals() for _ in range(2)]
    large = [due_for_goals() for _ in range(6)]
    small_statements, large_statements = passes_statements(small, large)
    assert small_statements == large_statements
    for agent in [*small, *large]:
        recurred = Goal.objects.get(agent=agent, description="Earn some money", status=Goal.Status.ACTIVE)
        assert recurred.source_needs == ["money"] and recurred.horizon == Goal.Horizon.SHORT  # money is at 20 %
        event = PlanEvent.objects.get(agent=agent, kind=PlanEvent.Kind.GOALS_GENERATED)
        assert event.detail["goals"] == [{"description": "Earn some money", "horizon": Goal.Horizon.SHORT, "source_needs": ["money"]}]
        assert seen(agent)["cycles"] == GENERATION_INTERVAL + 1
    assert not LLMCall.objects.filter(purpose="goals").exists()


def test_a_need_no_goal_ever_served_is_the_models_in_the_same_pass() -> None:
    recurring, new = due_for_goals(), due_for_goals(done=False)
    done, own = persona_cycles([recurring.pk, new.pk], runner="runner test")
    assert own == [] and set(done) == {recurring.pk, new.pk}
    assert LLMCall.objects.filter(purpose="goals").values_list("agent_id", flat=True).get() == new.pk
    active = Goal.objects.filter(agent=new, status=Goal.Status.ACTIVE).values_list("source_needs", flat=True)
    assert any("money" in needs for needs in active)  # the offline model proposed a goal for money


def test_a_pass_records_its_milestone_checks_model_calls_in_one_insert() -> None:
    agents = [near_milestone() for _ in range(3)]
    with CaptureQueriesContext(connection) as queries:
        done, own = persona_cycles([a.pk for a in agents], runner="runner test")
    assert own == [] and set(done) == {a.pk for a in agents}
    inserts = [q["sql"] for q in queries if q["sql"].startswith('INSERT INTO "agents_llmcall"')]
    assert len(inserts) == 1
    for agent in agents:
        call = LLMCall.objects.get(agent=agent, purpose="milestone")
        assert call.response and "Keep fed" in str(call.prompt)
        assert PlanEvent.objects.filter(agent=agent, kind=PlanEvent.Kind.MILESTONE_CHECKED).count() == 1
    cache.clear()  # the verdicts stand for their situation: other tests ask again


def to_plan() -> Agent:
    """A persona whose short-term goal has no plan and no routine: the model plans it this cycle."""
    agent = person()
    Plan.objects.filter(agent=agent).delete()
    return agent


def test_a_pass_plans_its_personas_goals_together_in_a_fixed_number_of_statements() -> None:
    """The fleet's first cycles: every persona plans a goal. The pass plans them together, each as
    plan_generate would (its model asked, the answer validated, the plan started at once), and each follows
    its new plan's first step in the same cycle."""
    small = [to_plan() for _ in range(2)]
    large = [to_plan() for _ in range(6)]
    persona_cycles([to_plan().pk], runner="runner test")  # the policies' state, read once per few seconds
    small_statements, large_statements = passes_statements(small, large)
    assert small_statements == large_statements
    for agent in [*small, *large]:
        plan = Plan.objects.get(agent=agent)
        assert plan.status == Plan.Status.ACTIVE and plan.model == "offline-rules" and plan.steps.exists()
        assert list(plan.events.values_list("kind", flat=True).order_by("pk")) == [
            PlanEvent.Kind.CREATED, PlanEvent.Kind.VALIDATED, PlanEvent.Kind.STEP_STARTED]
        assert LLMCall.objects.get(agent=agent, purpose="plan").plan_id == plan.pk
        assert Experience.objects.get(agent=agent).followed_plan  # its first step, in the same cycle


def test_a_plan_accepted_in_a_pass_is_followed_without_reading_its_persona_again() -> None:
    """Nothing but the new plan changed for a persona whose first answer was a plan: its cycle goes on with the
    state in hand and the plan added, as a routine's does; its steps, goals and needs are not read again."""
    persona_cycles([to_plan().pk], runner="runner test")  # the policies' state, read once per few seconds
    agents = [to_plan() for _ in range(3)]
    Need.objects.filter(agent=agents[1], name="energy").update(satisfaction=0.33)  # each prompt shows its own
    before = {a.pk: dict(Need.objects.filter(agent=a).values_list("name", "satisfaction")) for a in agents}
    with CaptureQueriesContext(connection) as queries:
        done, own = persona_cycles([a.pk for a in agents], runner="runner test")
    assert own == [] and set(done) == {a.pk for a in agents}
    reads = [q["sql"] for q in queries if q["sql"].startswith("SELECT")]
    assert sum(sql.startswith('SELECT "goals_goal"."id", "goals_goal"."agent_id"') for sql in reads) == 1
    assert sum(sql.startswith('SELECT "planning_plan"."id", "planning_plan"."agent_id"') for sql in reads) == 1
    # No step read again (the one read of steps is the routines' sources: completed plans for the goals to plan).
    assert [sql for sql in reads if sql.startswith('SELECT "planning_planstep"."id", "planning_planstep"."plan_id"')
            and '"goals_goal"' not in sql] == []
    # Its needs were read once, by the pass; its plan prompt shows them as stored then.
    assert sum(sql.startswith('SELECT "agents_need"."id", "agents_need"."agent_id"') for sql in reads) == 1
    for agent in agents:
        prompt = json.dumps(LLMCall.objects.get(agent=agent, purpose="plan").prompt, ensure_ascii=False)
        assert f"CURRENT NEEDS (satisfaction, lowest first): {needs_text(before[agent.pk])}" in prompt
    for agent in agents:  # and its cycle followed the new plan's first step, which is running
        step = PlanStep.objects.get(plan__agent=agent, position=1)
        assert step.status == PlanStep.Status.RUNNING and step.actual_cycles == 1
        assert Experience.objects.get(agent=agent).action == step.action_hint


def waiting_to_plan(*, stale: bool = False) -> Agent:
    """A persona with a goal to plan whose row says what waits for an operator: a step of its other plan in the
    inbox, or (stale) a plan approved since, which waits no more."""
    agent = to_plan()
    other = GoalFactory(agent=agent, description="Save money", horizon=Goal.Horizon.MID, source_needs=["money"])
    plan = PlanFactory(agent=agent, goal=other, status=Plan.Status.ACTIVE)
    PlanStepFactory(plan=plan, key="1", position=1, action_hint="work",
                    status=PlanStep.Status.COMPLETED if stale else PlanStep.Status.AWAITING_APPROVAL)
    PlanStepFactory(plan=plan, key="2", position=2, action_hint="work", depends_on=["1"])
    Agent.objects.filter(pk=agent.pk).update(waiting_reason="plan v1 awaits approval" if stale else "step 1 awaits approval")
    return agent


def test_planning_in_a_pass_leaves_each_row_saying_what_still_waits_in_a_fixed_number_of_statements() -> None:
    """A persona plans its next goal while a step of its other plan is in the inbox: its row still says so
    (the dashboard's "waiting" filter and count), the same statements for 2 or 6 of them; a row that said
    something no longer true says nothing once the agent plans."""
    small = [waiting_to_plan() for _ in range(2)]
    large = [waiting_to_plan() for _ in range(6)]
    persona_cycles([to_plan().pk], runner="runner test")  # the policies' state, read once per few seconds
    small_statements, large_statements = passes_statements(small, large)
    assert small_statements == large_statements
    for agent in [*small, *large]:
        agent.refresh_from_db()
        assert Plan.objects.filter(agent=agent, goal__description="Keep fed", status=Plan.Status.ACTIVE).exists()
        assert agent.waiting_reason == "step 1 awaits approval"
    stale = waiting_to_plan(stale=True)
    persona_cycles([stale.pk], runner="runner test")
    stale.refresh_from_db()
    assert Plan.objects.filter(agent=stale, goal__description="Keep fed").exists()
    assert stale.waiting_reason == ""


def test_a_first_answer_that_is_no_plan_goes_on_alone_as_plan_generate_would() -> None:
    agent, other = to_plan(), to_plan()
    real = planner_module.llm_complete
    asked: list[int | None] = []

    def first_answer_is_prose(**kwargs: Any) -> Any:
        result = real(**kwargs)
        if kwargs["agent_id"] == agent.pk and not asked:
            asked.append(kwargs["plan_id"])
            result.text = "I would rather not plan today."
        return result

    with mock.patch.object(planner_module, "llm_complete", first_answer_is_prose):
        done, own = persona_cycles([agent.pk, other.pk], runner="runner test")
    assert own == [] and set(done) == {agent.pk, other.pk}
    plan = Plan.objects.get(agent=agent)
    assert asked == [plan.pk] and plan.status == Plan.Status.ACTIVE  # the second answer was a plan
    kinds = list(plan.events.values_list("kind", flat=True).order_by("pk"))
    assert kinds[:3] == [PlanEvent.Kind.CREATED, PlanEvent.Kind.ATTEMPT_REJECTED, PlanEvent.Kind.VALIDATED]
    assert "no JSON plan" in plan.events.get(kind=PlanEvent.Kind.ATTEMPT_REJECTED).reason
    assert LLMCall.objects.filter(plan=plan, purpose="plan").count() == 2
    assert Plan.objects.get(agent=other).status == Plan.Status.ACTIVE


def test_goals_the_model_generates_for_a_pass_cost_the_same_statements_for_any_number() -> None:
    """Needs no achieved goal ever served: each persona's model proposes goals, asked one by one, the calls
    logged and the goals created for all of them together (and planned in the same pass)."""
    small = [due_for_goals(done=False) for _ in range(2)]
    large = [due_for_goals(done=False) for _ in range(6)]
    persona_cycles([due_for_goals(done=False).pk], runner="runner test")  # the policies' state, cached
    small_statements, large_statements = passes_statements(small, large)
    assert small_statements == large_statements
    for agent in [*small, *large]:
        assert LLMCall.objects.filter(agent=agent, purpose="goals").count() == 1
        event = PlanEvent.objects.get(agent=agent, kind=PlanEvent.Kind.GOALS_GENERATED)
        assert any("money" in goal["source_needs"] for goal in event.detail["goals"])


def test_a_pass_puts_its_personas_permission_steps_in_the_inbox_together_and_policies_decide_each(
        operator: Any, request: pytest.FixtureRequest) -> None:
    """Steps that must ask an operator first go to the inbox for every persona of the pass at once (each with its
    event and its agent's waiting reason); a policy that approves them decides each, as for one."""
    request.addfinalizer(policies.policies_forget)  # the policy switched on below is cached: the next tests have none
    asking = [person(steps=(("buy food", 1), ("eat", 1))) for _ in range(3)]
    PlanStep.objects.filter(plan__agent__in=asking, key="1").update(requires_permission=True)
    done, own = persona_cycles([a.pk for a in asking], runner="runner test")
    assert own == [] and set(done) == {a.pk for a in asking}
    for agent in asking:
        step = PlanStep.objects.get(plan__agent=agent, key="1")
        assert step.status == PlanStep.Status.AWAITING_APPROVAL
        assert step.events.get(kind=PlanEvent.Kind.STEP_AWAITING).reason == "requires permission"
        agent.refresh_from_db()
        assert agent.waiting_reason == "step 1 awaits approval"
    policy = policies.policy_save(user=operator, policy=None, name="Groceries")
    policies.rule_save(user=operator, policy=policy, rule=None, values={
        "action": "approve", "tools": "buy food", "approve_risky": True, "approve_permission": True})
    policies.policy_switch(user=operator, policy=policy, enabled=True)
    approved = [person(steps=(("buy food", 1), ("eat", 1))) for _ in range(2)]
    PlanStep.objects.filter(plan__agent__in=approved, key="1").update(requires_permission=True)
    persona_cycles([a.pk for a in approved], runner="runner test")
    for agent in approved:
        step = PlanStep.objects.get(plan__agent=agent, key="1")
        assert step.status == PlanStep.Status.PENDING and step.approved_by is not None
        assert step.events.get(kind=PlanEvent.Kind.STEP_APPROVED).actor_label == "policy: Groceries, rule 1"


def test_the_waiting_reasons_of_a_passs_steps_put_up_for_approval_cost_one_statement_for_each_reason() -> None:
    """Each persona whose step goes to the inbox is told which step waits, one UPDATE for each reason (the step's
    key), however many personas: two for five personas whose steps 1 and 2 must ask first."""
    asking = [person(steps=(("buy food", 1), ("eat", 1))) for _ in range(3)]
    later = [person(steps=(("work", 1), ("buy food", 1))) for _ in range(2)]
    PlanStep.objects.filter(plan__agent__in=asking, key="1").update(requires_permission=True)
    PlanStep.objects.filter(plan__agent__in=later, key="1").update(status=PlanStep.Status.COMPLETED)
    PlanStep.objects.filter(plan__agent__in=later, key="2").update(requires_permission=True)
    with CaptureQueriesContext(connection) as queries:
        done, own = persona_cycles([a.pk for a in asking + later], runner="runner test")
    assert own == [] and set(done) == {a.pk for a in asking + later}
    for agents, key in ((asking, "1"), (later, "2")):
        for agent in agents:
            agent.refresh_from_db()
            assert agent.waiting_reason == f"step {key} awaits approval"
            assert PlanStep.objects.get(plan__agent=agent, key=key).status == PlanStep.Status.AWAITING_APPROVAL
    told = [q for q in queries if q["sql"].startswith('UPDATE "agents_agent" SET "waiting_reason"')]
    assert len(told) == 2


def test_a_pass_never_moves_a_step_the_state_machine_forbids() -> None:
    """A pass's step moves go through the one state machine (planning/engine/schedule.py), each step's in order:
    a move it refuses (a completed step started again) is not written, its step left as it was, while the rest
    of the pass is written in the same statement."""
    from django.utils import timezone

    from planning.services.cycles import steps_moved

    done_step = PlanStepFactory(status=PlanStep.Status.COMPLETED, actual_cycles=3, result="ate")
    fresh_step = PlanStepFactory(status=PlanStep.Status.PENDING)
    now = timezone.now()
    moves = [(step, {"actual_cycles": step.actual_cycles + 1, "overrides": 0}, [PlanStep.Status.RUNNING])
             for step in (done_step, fresh_step)]
    with CaptureQueriesContext(connection) as queries:
        written = steps_moved(moves, now=now)
    assert written == {fresh_step.pk}
    assert sum(q["sql"].startswith('UPDATE "planning_planstep"') for q in queries.captured_queries) == 1
    done_step.refresh_from_db()
    fresh_step.refresh_from_db()
    assert (done_step.status, done_step.actual_cycles, done_step.result) == (PlanStep.Status.COMPLETED, 3, "ate")
    assert (fresh_step.status, fresh_step.actual_cycles) == (PlanStep.Status.RUNNING, 1)
    # A running step a cycle gives up on fails; a failed step is final.
    assert steps_moved([(fresh_step, {"actual_cycles": 2, "overrides": 0}, [PlanStep.Status.FAILED])],
                       now=timezone.now()) == {fresh_step.pk}
    fresh_step.refresh_from_db()
    assert fresh_step.status == PlanStep.Status.FAILED
    assert steps_moved([(fresh_step, {"actual_cycles": 3, "overrides": 0}, [PlanStep.Status.PENDING])],
                       now=timezone.now()) == set()  # failed is final
