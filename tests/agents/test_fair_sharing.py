"""A model server shared fairly (issue 52), against a slow one-at-a-time server: at most `concurrency` calls at once
(default 1 for a server on this machine) across threads and event loops, an operator's call before the background
ones waiting, a background call that would wait longer than it may handed to the rules, and a cancelled plan's call
stopped at once."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from agents.llm.gateway import LLMError, llm_complete
from agents.llm.limits import ModelBusy, calls_for, model_concurrency, plan_calls_abort
from agents.llm.openai_provider import openai_complete
from agents.models import LLMCall
from tests.llm_server import LLMTestServer, answer


@pytest.fixture
def one_slot(settings: Any) -> Iterator[LLMTestServer]:
    """llama-cpp-python's server as it is: one request at a time, the others queue in it."""
    with LLMTestServer(slots=1) as server:
        settings.OPENAI_BASE_URL = server.base_url
        settings.OPENAI_API_KEY = ""
        settings.LLM_TIMEOUT_SECONDS = 10
        settings.LLM_MAX_RETRIES = 0
        settings.LLM_LOCAL_CONCURRENCY = 1  # the default (tests/conftest.py lifts it for the scripted server)
        settings.LLM_MODEL_SETTINGS = {}
        yield server


def said(text: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": text}]


def test_a_local_server_gets_one_call_at_a_time_unless_its_settings_say(settings: Any) -> None:
    settings.LLM_LOCAL_CONCURRENCY = 1
    settings.OPENAI_BASE_URL = "http://127.0.0.1:8080/v1"
    assert model_concurrency("SmolLM2-135M-Instruct") == 1
    settings.OPENAI_BASE_URL = "http://localhost:11434/v1"
    assert model_concurrency("qwen2.5:7b") == 1
    settings.LLM_MODEL_SETTINGS = {"qwen2.5:7b": {"concurrency": 4}}
    assert model_concurrency("QWEN2.5:7B") == 4
    settings.OPENAI_BASE_URL = "https://api.openai.com/v1"
    assert model_concurrency("gpt-4o-mini") == settings.LLM_CONCURRENCY_PER_MODEL


def test_calls_from_many_threads_reach_a_one_slot_server_one_at_a_time(one_slot: LLMTestServer) -> None:
    one_slot.script("smol", *[answer(f"answer {i}", delay=0.15) for i in range(4)])
    with ThreadPoolExecutor(max_workers=4) as pool:
        answers = list(pool.map(lambda i: openai_complete(model="smol", messages=said(f"call {i}")).text, range(4)))
    assert sorted(answers) == [f"answer {i}" for i in range(4)]
    assert one_slot.max_in_flight == 1


def test_an_operators_call_goes_before_the_persona_calls_and_the_one_holding_the_slot_gives_way(
        one_slot: LLMTestServer) -> None:
    """A persona's long answer holds the one slot and two more wait: the operator's call that comes next does not
    wait for any of them. The persona in flight stops (its streamed answer cut, so the server stops computing it)
    and its rules decide; the operator's call is the next the server answers."""
    one_slot.script("smol", answer("a long persona answer " * 20, delay=4),
                    *[answer("ok", delay=0.05) for _ in range(3)])
    order: list[str] = []
    lock = threading.Lock()

    def call(who: str, *, operator: bool) -> None:
        try:
            with calls_for(operator=operator):
                openai_complete(model="smol", messages=said(who))
            outcome = who
        except ModelBusy as exc:
            outcome = f"{who} gave way" if "operator's call" in str(exc) else f"{who}: {exc}"
        with lock:
            order.append(outcome)

    threads = [threading.Thread(target=call, args=("persona 1",), kwargs={"operator": False})]
    threads[0].start()
    time.sleep(0.3)  # persona 1 holds the one slot
    for who in ("persona 2", "persona 3"):
        threads.append(threading.Thread(target=call, args=(who,), kwargs={"operator": False}))
        threads[-1].start()
    time.sleep(0.3)  # both wait
    threads.append(threading.Thread(target=call, args=("operator",), kwargs={"operator": True}))
    threads[-1].start()
    for thread in threads:
        thread.join(timeout=10)
    served = [r.messages[0]["content"] for r in one_slot.requests]
    assert served[:2] == ["persona 1", "operator"], served
    assert order[:2] == ["persona 1 gave way", "operator"], order
    assert sorted(order[2:]) == ["persona 2", "persona 3"]
    assert one_slot.streams_cut == 1  # the server stopped computing the answer nobody waited for
    assert all(r.body.get("stream") is True for r in one_slot.requests)  # a local server's calls are streamed


def arrived(server: LLMTestServer, count: int = 1) -> None:
    """Wait until the server has received `count` requests: the calls that sent them hold their model slots."""
    deadline = time.monotonic() + 10
    while len(server.requests) < count:
        assert time.monotonic() < deadline, "the first call never reached the model server"
        time.sleep(0.005)


@pytest.mark.django_db(transaction=True)
def test_a_persona_call_that_would_wait_past_its_cycle_is_handed_to_the_rules_and_says_so(
        one_slot: LLMTestServer) -> None:
    one_slot.script("smol", answer("long answer", delay=1.5))
    busy = threading.Thread(target=lambda: openai_complete(model="smol", messages=said("operator's plan")))
    busy.start()
    arrived(one_slot)  # the operator's call holds the slot (a fixed sleep lost the race on a busy host)
    started = time.monotonic()
    with calls_for(wait_limit=0.3), pytest.raises(LLMError) as failed:  # a persona with a 0.3 s cycle
        llm_complete(purpose="decide", messages=said("what next?"), models=["smol"])
    waited = time.monotonic() - started
    busy.join(timeout=5)
    assert waited < 1.0  # not the 1.3 s the operator's call still had to run
    assert "ModelBusy" in str(failed.value) and "the rules decide instead" in str(failed.value)
    call = LLMCall.objects.get(purpose="decide")
    assert call.error.startswith("ModelBusy:") and "0.3 s" in call.error
    assert len(one_slot.requests) == 1  # the persona's call never reached the server


def test_model_busy_is_raised_by_the_provider_itself(one_slot: LLMTestServer) -> None:
    one_slot.script("smol", answer("slow", delay=0.8))
    busy = threading.Thread(target=lambda: openai_complete(model="smol", messages=said("first")))
    busy.start()
    arrived(one_slot)
    with calls_for(wait_limit=0.1), pytest.raises(ModelBusy):
        openai_complete(model="smol", messages=said("second"))
    busy.join(timeout=5)


@pytest.mark.django_db(transaction=True)
def test_a_cancelled_plans_call_in_flight_stops_at_once(one_slot: LLMTestServer, settings: Any) -> None:
    from tests.factories import PlanFactory

    settings.LLM_ABORT_POLL_SECONDS = 0.05
    plan = PlanFactory()
    one_slot.script("smol", answer("a long plan", delay=5), answer("next", delay=0.05))
    threading.Timer(0.3, plan_calls_abort, args=(plan.pk,)).start()
    started = time.monotonic()
    with pytest.raises(LLMError, match="CallAborted"):
        llm_complete(purpose="plan", messages=said("plan it"), models=["smol", "other-model"], plan_id=plan.pk)
    assert time.monotonic() - started < 1.5
    assert [r.model for r in one_slot.requests] == ["smol"]  # no other model asked for a cancelled plan
    # Our side of the slot is free at once: the next call goes out without waiting for the aborted one's 5 s (the
    # server may still be computing the abandoned answer, as llama.cpp does).
    following = threading.Thread(target=lambda: openai_complete(model="smol", messages=said("next")))
    following.start()
    time.sleep(0.3)
    assert [r.messages[0]["content"] for r in one_slot.requests] == ["plan it", "next"]
    one_slot.released.set()
    following.join(timeout=5)


@pytest.mark.django_db(transaction=True)
def test_cancelling_a_plan_while_it_is_planned_marks_its_calls_to_stop() -> None:
    from agents.llm.limits import plan_calls_aborted
    from planning.models import Plan
    from planning.services import plan_cancel
    from tests.factories import PlanFactory

    plan = PlanFactory(status=Plan.Status.VALIDATING)
    assert not plan_calls_aborted(plan.pk)
    plan_cancel(plan=plan, user=None, actor_label="operator olga")
    assert plan_calls_aborted(plan.pk)


@pytest.mark.django_db(transaction=True)
def test_a_stopping_runner_stops_its_cycles_model_calls_instead_of_waiting_its_grace(
        one_slot: LLMTestServer, settings: Any, caplog: pytest.LogCaptureFixture) -> None:
    """SIGTERM while a plan's call waits on a busy one-at-a-time server: the call (and the one waiting behind it)
    stops at once with the reason, the runner ends without spending its grace, and no other model is asked."""
    import asyncio
    import logging

    from agents.models import Agent
    from planning.models import Plan
    from runtime.embedded import Scheduler
    from tests.factories import AgentFactory, GoalFactory

    settings.LLM_MODELS = {"planner": ["smol", "other-model"], "fast": ["smol"]}
    settings.LLM_PURPOSE_MODELS = {}
    settings.RUNNER_SHUTDOWN_GRACE_SECONDS = 60
    settings.LLM_TIMEOUT_SECONDS = 120
    settings.PLAN_DEADLINE_SECONDS = 120
    for name in ("Anna", "Ben"):
        agent = AgentFactory(name=name, kind=Agent.Kind.TOOL, cycle_interval=0, rules_planner=False)
        GoalFactory(agent=agent, description="Write a haiku about tea into tea.txt", source_needs=[])
    one_slot.script("smol", answer("a plan that takes long", delay=90), answer("never sent", delay=90))

    async def run_and_stop() -> float:
        scheduler = Scheduler(runner_id="stopping", tick=0.01)
        running = asyncio.ensure_future(scheduler.run())
        while not one_slot.requests:  # the first call reached the server; the second waits for the slot
            await asyncio.sleep(0.05)
        await asyncio.sleep(0.3)
        scheduler.stop()  # what SIGTERM does
        stopped_at = asyncio.get_running_loop().time()
        await asyncio.wait_for(running, timeout=50)  # before the grace (60 s) and the server's answer (90 s)
        return asyncio.get_running_loop().time() - stopped_at

    with caplog.at_level(logging.WARNING, logger="planner.runner"):
        asyncio.run(run_and_stop())
    one_slot.released.set()
    assert not [r for r in caplog.records if "still under way" in r.getMessage()]
    calls = list(LLMCall.objects.values_list("model", "error"))
    # Each plan's restatement stopped, its plan call refused before it went out; no other model asked.
    assert len(calls) == 4 and all(model == "smol" for model, _error in calls)
    assert all("CallAborted" in error and "runner is stopping" in error for _model, error in calls)
    assert len(one_slot.requests_for("smol")) == 1  # the call waiting for the slot never went out
    for plan in Plan.objects.all():  # failed with the reason, retried by the agent's policy when a runner is back
        assert plan.status == Plan.Status.FAILED and plan.retry_at is not None
        assert "planning stopped" in plan.failure_reason


def test_on_one_event_loop_a_persona_call_in_flight_gives_way_to_an_operators_at_once(one_slot: LLMTestServer) -> None:
    """The runner's cycles share one event loop: the operator's call takes the slot from the persona's call there
    without waiting for a poll."""
    import asyncio

    from agents.llm.limits import BACKGROUND, OPERATOR, model_call_bounded
    from agents.llm.openai_provider import openai_acomplete
    from agents.llm.structured import CallOptions

    one_slot.script("smol", answer("a long persona answer " * 20, delay=4), answer("the plan", delay=0.05))

    async def both() -> tuple[BaseException | None, str, float]:
        persona = asyncio.ensure_future(model_call_bounded(
            openai_acomplete, model="smol", messages=said("persona"), options=CallOptions(stream=True),
            priority=BACKGROUND))
        while not one_slot.requests:
            await asyncio.sleep(0.02)
        await asyncio.sleep(0.2)
        operator = await model_call_bounded(openai_acomplete, model="smol", messages=said("operator"),
                                            priority=OPERATOR)
        gave_way = await asyncio.gather(persona, return_exceptions=True)
        error = gave_way[0] if isinstance(gave_way[0], BaseException) else None
        return error, operator.text, 0.0

    error, text, _ = asyncio.run(both())
    assert text == "the plan"
    assert isinstance(error, ModelBusy) and "needed for an operator's call" in str(error)
    assert one_slot.streams_cut == 1


def test_a_call_past_its_deadline_stops_the_server_computing_its_answer(one_slot: LLMTestServer) -> None:
    """A plan whose deadline passes hangs up on the local server, which stops computing the answer (streamed) instead
    of holding its one slot for nobody until max_tokens."""
    from agents.llm.openai_provider import ProviderTimeout

    one_slot.script("smol", answer("a long plan " * 40, delay=4), answer("next", delay=0.05))
    with pytest.raises(ProviderTimeout):
        openai_complete(model="smol", messages=said("plan it"), ends_at=time.monotonic() + 0.5)
    assert openai_complete(model="smol", messages=said("next")).text == "next"
    assert one_slot.streams_cut == 1


def operator_holds_the_slot(one_slot: LLMTestServer) -> threading.Thread:
    """An operator's plan call that holds the one slot for 2 s, under way when this returns."""
    one_slot.script("smol", answer("the operator's long plan", delay=2))

    def operators_plan() -> None:
        with calls_for(operator=True):
            openai_complete(model="smol", messages=said("operator's plan"))

    busy = threading.Thread(target=operators_plan)
    busy.start()
    while not one_slot.requests:
        time.sleep(0.02)
    return busy


@pytest.mark.django_db(transaction=True)
def test_a_personas_plan_whose_model_stays_busy_is_made_by_its_rules_and_says_so(
        one_slot: LLMTestServer, settings: Any) -> None:
    """An operator's plan holds the one slot past the persona's cycle: the persona's plan is not failed, its rules
    plan it (the plan's model says "offline-rules"), and the call log says the model was busy."""
    from agents.models import Agent
    from planning.models import Plan
    from planning.planner import plan_generate
    from tests.factories import AgentFactory

    settings.LLM_MODELS = {"planner": ["smol"], "fast": ["smol"]}
    settings.LLM_PURPOSE_MODELS = {}
    persona = AgentFactory(name="Jo", kind=Agent.Kind.PERSONA)
    busy = operator_holds_the_slot(one_slot)
    with calls_for(wait_limit=0.3):
        plan = plan_generate(agent=persona, goal_text="Get something to eat")
    busy.join(timeout=5)
    assert plan.status != Plan.Status.FAILED, plan.failure_reason
    assert plan.model == "offline-rules"
    assert LLMCall.objects.filter(agent=persona, model="smol", error__startswith="ModelBusy:").exists()
    assert [r.messages[0]["content"] for r in one_slot.requests] == ["operator's plan"]  # the persona's never went


@pytest.mark.django_db(transaction=True)
def test_a_personas_replan_made_by_its_rules_while_the_model_is_busy_keeps_the_operators_feedback(
        one_slot: LLMTestServer, settings: Any) -> None:
    """The rules that stand in for a busy model replan with what the operator said, as the model would have."""
    import json

    from agents.models import Agent
    from planning.models import Plan, PlanStep
    from planning.planner import plan_generate
    from tests.factories import AgentFactory, PlanFactory, PlanStepFactory

    settings.LLM_MODELS = {"planner": ["smol"], "fast": ["smol"]}
    settings.LLM_PURPOSE_MODELS = {}
    persona = AgentFactory(name="Jo", kind=Agent.Kind.PERSONA)
    previous = PlanFactory(agent=persona, goal_text="Get something to eat", status=Plan.Status.ACTIVE)
    PlanStepFactory(plan=previous, description="Order a takeaway", action_hint="buy food",
                    status=PlanStep.Status.DECLINED)
    busy = operator_holds_the_slot(one_slot)
    with calls_for(wait_limit=0.3):
        plan = plan_generate(agent=persona, goal_text="Get something to eat", previous=previous,
                             reason="a step was declined", feedback=["no takeaway tonight, cook at home"])
    busy.join(timeout=5)
    assert plan.model == "offline-rules", plan.failure_reason
    asked = LLMCall.objects.filter(agent=persona, model="offline-rules").latest("pk")
    assert "no takeaway tonight, cook at home" in json.dumps(asked.prompt)
    assert "a step was declined" in json.dumps(asked.prompt)  # why it replans, as the model would be told
