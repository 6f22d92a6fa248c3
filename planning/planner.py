"""Making plans: restate the goal, ask the model chain, parse, repair, validate, retry with reasons.

LLM calls happen outside transactions (they take seconds); each write is a service of
planning/services/versions.py (its own short transaction, its event, a push after commit), so the plan page
shows "validating" and every rejected attempt while the planner works.

One deadline (PLAN_DEADLINE_SECONDS) covers the whole of one plan: the restatement, every attempt,
every reflection, every model of the chain; each call may wait only for what remains. A plan that
fails is tried again later by the agent's retry policy, or waits for an operator; a plan left in
"validating" by a runner that died is failed with that reason when the agent's next cycle starts.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import re
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from asgiref.sync import async_to_sync, sync_to_async
from django.conf import settings
from django.db.models import OuterRef, Subquery, prefetch_related_objects
from django.utils import timezone

from agents.connections import connection_release
from agents.declared_tools import agent_plan_terms
from agents.llm.extract import ExtractError, json_extract
from agents.llm.gateway import (
    Deadline,
    LLMDeadlineError,
    LLMError,
    LLMResult,
    answers_at_once,
    calls_recorded_together,
    llm_complete,
    model_chain,
)
from agents.llm.placeholders import placeholder_or_example
from agents.llm.schemas import PathChoices, plan_or_say_schema, plan_schema, reflect_schema, restate_schema
from agents.llm.structured import model_profile, prompt_budget, provider_name, tokens_estimate
from agents.models import Agent
from agents.tools import TOOLS, workspace_listing
from agents.world import ACTIONS, persona_situation
from goals.models import Goal
from planning.engine.complexity import should_plan, tool_single_step
from planning.engine.meaning import goal_paths
from planning.engine.parse import NO_JSON_PLAN, plan_parse
from planning.engine.prompts import RESTATE_KEYS, prompt_plan, prompt_reflect, prompt_replan, prompt_restate
from planning.engine.validate import PlanSpec, plan_validate, step_plan_data, steps_repeating_declined
from planning.goal_terms import goal_plan_check, goal_reach
from planning.models import Plan, PlanEvent, PlanStep
from planning.services import (
    Acceptance,
    PlanNoLongerValidating,
    attempt_reject,
    plan_accept,
    plan_ask,
    plan_fail,
    plan_restatement_save,
    plan_retry_start,
    plan_start,
    plans_accept,
    plans_first_start,
)

logger = logging.getLogger("planner.planner")

MAX_REPLANS = 3  # seed 000: a plan replanned this often is abandoned
RECENT_REASONS = 6  # rejection reasons carried into the next prompt
SIMPLE_GOAL_FLAG = "simple goal: one step, no planning call"
RULES_PLANNER = "rules"  # the planner named on the plans the one-step shortcut makes (Plan.model)
PERSONA_LESSONS_IN_PROMPT = 5


@dataclass
class RetryContext:
    """What earlier attempts taught, kept across attempts and models (seed 002 failure memory)."""

    reasons: list[str] = field(default_factory=list)  # the validator's, never the operator's
    hints: list[str] = field(default_factory=list)
    last_output: str = ""
    rejected: int = 0  # answers rejected
    cannot: list[str] = field(default_factory=list)  # "model: why", each model that said the goal cannot be done
    errors: int = 0  # models that did not answer
    answered_by: str = ""  # the last model that answered at all
    unreached: list[str] = field(default_factory=list)  # the last rejection's reasons, when the plan missed its goal
    stopped: bool = False  # a call was stopped (the plan cancelled, the runner stopping): ask nothing more
    busy: bool = False  # a model was busy past the time a (persona's) call may wait for it


@dataclass
class Check:
    """One model answer judged: a plan, or problems; maybe a question for the operator instead."""

    problems: list[str]
    spec: PlanSpec | None = None
    flags: list[str] = field(default_factory=list)
    question: str = ""
    unreached: bool = False  # rejected because the plan cannot reach its goal (planning/engine/goal_check.py)
    cannot: str = ""  # the model says why the goal cannot be done


def plan_generate(
    *,
    agent: Agent,
    goal_text: str,
    goal: Goal | None = None,
    previous: Plan | None = None,
    reason: str = "",
    feedback: Sequence[str] = (),
    actor_label: str = "runner",
    exclusive: bool = False,
) -> Plan:
    """Make a validated plan (or a failed one with every reason) for a goal; a replan when `previous` is given.
    `exclusive`: a tool agent's first plan of its goal, refused when another planner began one (plan_start)."""
    deadline = Deadline.after(float(settings.PLAN_DEADLINE_SECONDS))
    if previous is not None and previous.clarification_answer:
        # Seed 003: the operator's answer to the planner's question is part of the goal from now on.
        goal_text = f"{goal_text} ({previous.clarification_answer})"[:500]
    plan = plan_start(agent=agent, goal_text=goal_text, goal=goal, previous=previous, reason=reason,
                      actor_label=actor_label, exclusive=exclusive)
    return plan_continue(agent=agent, plan=plan, goal_text=goal_text, goal=goal, previous=previous, reason=reason,
                         feedback=feedback, actor_label=actor_label, deadline=deadline)


def plan_continue(*, agent: Agent, plan: Plan, goal_text: str, goal: Goal | None, previous: Plan | None = None,
                  reason: str = "", feedback: Sequence[str] = (), actor_label: str, deadline: Deadline,
                  first: Asked | None = None, restatement: dict[str, str] | None = None) -> Plan:
    """The planning of a version started (plan_start), to its end: accepted, a question, or failed. `first`:
    the first model's answer, already asked (plans_first), with the `restatement` it was asked with."""
    try:
        return plan_attempts(agent=agent, plan=plan, goal_text=goal_text, goal=goal, previous=previous,
                             reason=reason, feedback=feedback, actor_label=actor_label, deadline=deadline,
                             first=first, restatement=restatement)
    except PlanNoLongerValidating:
        plan.refresh_from_db()
        return plan


@dataclass
class First:
    """A first plan's first ask, before anything of it is written: its restatement and the first model's answer,
    or the one step of a simple goal (plan_direct: no call)."""

    agent: Agent
    goal: Goal
    plan: Plan
    restatement: dict[str, str] = field(default_factory=dict)
    asked: Asked | None = None
    direct: tuple[PlanSpec, list[str]] | None = None

    def accepted(self) -> tuple[PlanSpec, list[str], str] | None:
        """The plan to accept as it is, with its flags and model; None when its planning goes on (plan_continue)."""
        if self.direct is not None:
            spec, flags = self.direct
            return spec, [*flags, SIMPLE_GOAL_FLAG], RULES_PLANNER
        if self.asked is not None and self.asked.check is not None and self.asked.check.spec is not None:
            return self.asked.check.spec, list(self.asked.check.flags), self.asked.model
        return None


def plans_first(wanted: Sequence[tuple[Agent, Goal]], *, actor_label: str,
                needs: Mapping[int, Mapping[str, float]] | None = None, exclusive: bool = False,
                ) -> tuple[dict[int, tuple[Plan, list[PlanStep]]], list[First]]:
    """plan_generate for the first plans of many agents' goals at once (a runner's pass): the versions started
    together (plans_first_start; `exclusive` for tool agents, whose goals another planner may have begun), each goal
    restated and asked of its chain's first model as plan_attempts asks it, the calls recorded in one INSERT, and
    the plans whose answer is a valid plan (or a simple goal's one step) accepted together with their
    restatements (plans_accept). Models that answer at once (the offline rules) are asked one after
    another; any other's asks are made side by side (asks_together), so a hundred agents wait for their models
    once, not a hundred times (round_100_agents). `needs`: the needs each persona's prompt shows, by agent, when
    the caller has just read them (a pass); otherwise they are read. Returns the plans accepted with their steps,
    by goal, and the others with their first ask (restatement stored), for the caller to take on one by one
    (plan_continue: a rejection, a question, a model error)."""
    if not wanted:
        return {}, []
    deadline = Deadline.after(float(settings.PLAN_DEADLINE_SECONDS))
    started = plans_first_start(wanted, actor_label=actor_label, exclusive=exclusive)
    firsts = [First(agent=agent, goal=goal, plan=plan) for (agent, goal), plan in zip(wanted, started, strict=True)
              if plan is not None]
    # What each persona's prompt shows (plan_messages: needs, lessons), read for all at once.
    personas = [first.agent for first in firsts if first.agent.kind == Agent.Kind.PERSONA]
    if personas:
        prefetch_related_objects(personas, *(["lessons"] if needs is not None else ["needs", "lessons"]))

    def ask(first: First) -> First:
        """No database here: the asks may run side by side in threads; what they learn is written after."""
        agent, goal = first.agent, first.goal
        if not goal_reach(agent, goal.description).ok:
            return first  # refused or a question, before any plan (plan_attempts says which)
        first.direct = plan_direct(agent=agent, goal=goal, goal_text=goal.description)
        if first.direct is not None:
            return first
        first.restatement = plan_restatement(agent=agent, plan=first.plan, previous=None, goal_text=goal.description,
                                             deadline=deadline, save=False)
        first.asked = plan_ask_model(
            agent=agent, plan=first.plan, model=model_chain("plan", agent_models=agent.planner_models)[0],
            purpose="plan", goal_text=goal.description, restatement=first.restatement, previous=None, kept=[],
            reason="", feedback=(), memory=RetryContext(), deadline=deadline,
            needs=needs.get(agent.pk, {}) if needs is not None and agent.kind == Agent.Kind.PERSONA else None)
        return first

    with calls_recorded_together():
        firsts = firsts_each(ask, firsts)
    for first in firsts:
        for key in RESTATE_KEYS:
            setattr(first.plan, key, first.restatement.get(key, ""))
    ready = [(first, first.accepted()) for first in firsts]
    accepted = plans_accept([Acceptance(first.plan, *plan, restatement=first.restatement)
                             for first, plan in ready if plan is not None], actor_label=actor_label)
    rest = [first for first in firsts if first.plan.pk not in accepted]
    for first in rest:
        if any(first.restatement.values()):
            plan_restatement_save(plan=first.plan, restatement=first.restatement)
    return {plan.goal_id: (plan, steps) for plan, steps in accepted.values() if plan.goal_id is not None}, rest


def firsts_each[R](work: Callable[[First], R], firsts: Sequence[First]) -> list[R]:
    """`[work(first) for first in firsts]`: one after another when every agent's models answer at once (the offline
    rules: nothing to wait for), else side by side (asks_together)."""
    if all(answers_at_once(agent_models=first.agent.planner_models) for first in firsts):
        return [work(first) for first in firsts]
    return asks_together(work, firsts)


@functools.cache
def asks_executor() -> ThreadPoolExecutor:
    """The threads asks run in, RUNNER_CONCURRENCY of them in a process: not the loop's default executor, whose
    threads the loop itself needs meanwhile (a host name to resolve, the SDK's platform lookup): asks filling it
    while they wait for the loop would wait for good."""
    return ThreadPoolExecutor(max_workers=max(1, settings.RUNNER_CONCURRENCY), thread_name_prefix="ask")


def asks_together[T, R](ask: Callable[[T], R], items: Sequence[T]) -> list[R]:
    """`[ask(item) for item in items]`, each in a thread of its own (asks_executor), at most RUNNER_CONCURRENCY at
    once: their model calls are awaited side by side on the event loop (the runner's own, where a pass runs; a loop
    of its own elsewhere). Each thread gives back any database connection it opened."""
    def alone(item: T) -> R:
        try:
            return ask(item)
        finally:
            connection_release()

    async def together() -> list[R]:
        ask_in_thread = sync_to_async(alone, thread_sensitive=False, executor=asks_executor())
        return list(await asyncio.gather(*(ask_in_thread(item) for item in items)))

    connection_release()  # the wait holds no connection of this thread either (outside a transaction)
    return async_to_sync(together)()


def plan_attempts(*, agent: Agent, plan: Plan, goal_text: str, goal: Goal | None, previous: Plan | None,
                  reason: str, feedback: Sequence[str], actor_label: str, deadline: Deadline,
                  first: Asked | None = None, restatement: dict[str, str] | None = None) -> Plan:
    base = plan_with_steps(previous)
    kept = list(base.steps.filter(status__in=PlanStep.DONE_STATUSES)) if base else []
    declined = steps_declined(previous)

    reach = goal_reach(agent, goal_text)
    if reach.cannot:
        # Seed 003: a goal the agent's tools cannot reach ends before approval, said as such.
        return plan_fail(plan=plan, headline=reach.cannot, actor_label=actor_label, retry=False)
    if reach.question:
        return plan_ask(plan=plan, question=reach.question, model="", actor_label=actor_label)

    direct = plan_direct(agent=agent, goal=goal, goal_text=goal_text) if previous is None else None
    if direct is not None:
        spec, flags = direct
        return plan_accept(plan=plan, spec=spec, flags=[*flags, SIMPLE_GOAL_FLAG], model=RULES_PLANNER, kept=[],
                           actor_label=actor_label)

    if restatement is None:
        restatement = plan_restatement(agent=agent, plan=plan, previous=previous, goal_text=goal_text,
                                       deadline=deadline)
    purpose = "replan" if previous is not None else "plan"
    chain = model_chain(purpose, agent_models=agent.planner_models)
    memory = RetryContext()
    for index, model in enumerate(chain):
        for attempt in range(1, settings.PLAN_ATTEMPTS_PER_MODEL + 1):
            outcome = plan_attempt(agent=agent, plan=plan, model=model, purpose=purpose, goal_text=goal_text,
                                   restatement=restatement, previous=base, kept=kept, reason=reason,
                                   feedback=feedback, memory=memory, deadline=deadline, actor_label=actor_label,
                                   declined=declined, asked=first if first is not None and first.model == model
                                   and index == 0 and attempt == 1 else None)
            if outcome is None and deadline.expired:
                return plan_fail(plan=plan, headline=deadline_headline(deadline, memory), actor_label=actor_label)
            if memory.stopped:
                # The plan was cancelled, or the runner stops (its calls were stopped): no other model is asked.
                return plan_fail(plan=plan, headline="planning stopped before a model answered",
                                 actor_label=actor_label)
            if outcome is None:
                break  # an error (or "cannot") hands over to the next model at once
            if isinstance(outcome, Plan):
                return outcome
            # Every attempt that reaches here was rejected, so the attempt number counts rejections in a row;
            # the last model of the chain has nobody to hand over to and uses all its attempts.
            if attempt >= settings.PLAN_REJECTIONS_BEFORE_FALLBACK and index < len(chain) - 1:
                break  # seed 002: after repeated rejections, the next model in the chain
    if memory.busy and agent.kind == Agent.Kind.PERSONA and BUSY_RULES_MODEL not in chain and provider_name(
            BUSY_RULES_MODEL):
        # A persona's model was busy with an operator's work past its cycle: its rules plan instead, and the plan
        # says so (its model is the rules model's name).
        outcome = plan_attempt(agent=agent, plan=plan, model=BUSY_RULES_MODEL, purpose=purpose, goal_text=goal_text,
                               restatement=restatement, previous=base, kept=kept, reason=reason, feedback=feedback,
                               memory=memory, deadline=deadline, actor_label=actor_label, declined=declined)
        if isinstance(outcome, Plan):
            return outcome
    if memory.cannot and not memory.rejected:
        # Every model that answered said why it cannot: the operator decides, no automatic retry asks again.
        why = memory.cannot[-1].split(": ", 1)[-1]
        return plan_fail(plan=plan, headline=f"the planner says it cannot be done: {why[:300]}",
                         actor_label=actor_label, retry=False)
    if memory.rejected and not deadline.expired:
        # Seed 003's "fallback to a simpler request": one last, smaller ask of the model that last answered.
        outcome = plan_attempt(agent=agent, plan=plan, model=memory.answered_by, purpose=purpose, goal_text=goal_text,
                               restatement=restatement, previous=base, kept=kept, reason=reason, feedback=feedback,
                               memory=memory, deadline=deadline, actor_label=actor_label, simple=True,
                               declined=declined)
        if isinstance(outcome, Plan):
            return outcome
    if deadline.expired:
        return plan_fail(plan=plan, headline=deadline_headline(deadline, memory), actor_label=actor_label)
    if not memory.rejected:
        return plan_fail(plan=plan, headline="no model answered", actor_label=actor_label)
    if memory.unreached:
        # No model made a plan that reaches the goal: the operator is asked how, never shown a plan that misses it.
        return plan_ask(plan=plan, question=unreached_question(memory.unreached), model=memory.answered_by,
                        actor_label=actor_label)
    return plan_fail(plan=plan, headline=f"no acceptable plan: {counted(memory.rejected, 'answer')} rejected"
                     + (f", {counted(memory.errors, 'model error')}" if memory.errors else ""), actor_label=actor_label)


def unreached_question(reasons: Sequence[str]) -> str:
    return ("No plan could be made that does what the goal asks (" + "; ".join(reasons[:3]) + "). "
            "How should it be done, or what should be done instead?")


def counted(n: int, noun: str) -> str:
    return f"{n} {noun}{'' if n == 1 else 's'}"


def deadline_headline(deadline: Deadline, memory: RetryContext) -> str:
    if not memory.rejected:
        return f"no model answered within {deadline.seconds:g} s"
    return f"no acceptable plan within {deadline.seconds:g} s: {counted(memory.rejected, 'answer')} rejected"


@dataclass
class Asked:
    """One ask of one model, before anything of it is written: the answer judged, or the model's error."""

    model: str
    answer: LLMResult | None = None
    check: Check | None = None
    error: LLMError | None = None


def plan_ask_model(*, agent: Agent, plan: Plan, model: str, purpose: str, goal_text: str, restatement: dict[str, str],
                   previous: Plan | None, kept: list[PlanStep], reason: str, feedback: Sequence[str],
                   memory: RetryContext, deadline: Deadline, simple: bool = False,
                   declined: Sequence[dict[str, Any]] = (), needs: Mapping[str, float] | None = None) -> Asked:
    """Ask one model for the plan and judge its answer (plan_check); the call is recorded, nothing else is
    written. `needs`: the persona's needs, when the caller has them (plan_messages)."""
    messages = plan_messages_fitted(
        model=model, purpose=purpose, agent=agent, goal_text=goal_text, restatement=restatement, previous=previous,
        kept=kept, reason=reason, feedback=feedback, memory=memory, simple=simple, declined=declined, needs=needs)
    try:
        answer = llm_complete(purpose=purpose, messages=messages, models=[model], agent_id=agent.pk,
                              plan_id=plan.pk, deadline=deadline, schema=plan_answer_schema(agent, goal_text, model))
    except LLMError as exc:
        return Asked(model=model, error=exc)
    return Asked(model=model, answer=answer, check=plan_check(
        agent=agent, text=answer.text, kept=kept, declined=declined, goal_text=goal_text, answer=answer,
        steered=bool(feedback or declined)))


def plan_attempt(*, agent: Agent, plan: Plan, model: str, purpose: str, goal_text: str, restatement: dict[str, str],
                 previous: Plan | None, kept: list[PlanStep], reason: str, feedback: Sequence[str],
                 memory: RetryContext, deadline: Deadline, actor_label: str, simple: bool = False,
                 declined: Sequence[dict[str, Any]] = (), asked: Asked | None = None) -> Plan | bool | None:
    """One ask of one model (or its answer `asked` already): the accepted (or clarifying) plan, False when
    rejected, None when it did not answer."""
    if asked is None:
        asked = plan_ask_model(agent=agent, plan=plan, model=model, purpose=purpose, goal_text=goal_text,
                               restatement=restatement, previous=previous, kept=kept, reason=reason,
                               feedback=feedback, memory=memory, deadline=deadline, simple=simple, declined=declined)
    if asked.error is not None:
        exc = asked.error
        if isinstance(exc, LLMDeadlineError) and not exc.failures:
            return None  # nothing was asked: the time was up before
        memory.errors += 1
        memory.stopped = memory.stopped or exc.aborted
        memory.busy = memory.busy or any(error.startswith("ModelBusy:") for _model, error in exc.failures)
        attempt_reject(plan=plan, model=model, reasons=[f"model error: {exc.reason}"], output="", hints=[],
                       actor_label=actor_label)
        return None
    answer, check = asked.answer, asked.check
    assert answer is not None and check is not None  # an ask without an error has both
    memory.answered_by = model
    if check.spec is not None:
        flags = [*check.flags, *(["accepted from a simpler request after rejected answers"] if simple else [])]
        return plan_accept(plan=plan, spec=check.spec, flags=flags, model=model, kept=kept, actor_label=actor_label)
    if check.question:
        return plan_ask(plan=plan, question=check.question, model=model, actor_label=actor_label)
    if check.cannot:
        # Said, not rejected: the attempt is logged with the model's reason, the next model of the chain may try.
        memory.cannot.append(f"{model}: {check.cannot}")
        attempt_reject(plan=plan, model=model, reasons=check.problems, output=answer.text, hints=[],
                       actor_label=actor_label)
        return None
    memory.rejected += 1
    memory.unreached = list(check.problems) if check.unreached else []
    hints: list[str] = []
    if reflection_helps(model, check.problems):
        hints = plan_reflect(agent=agent, plan=plan, output=answer.text, reasons=check.problems, deadline=deadline)
    attempt_reject(plan=plan, model=model, reasons=check.problems, output=answer.text, hints=hints,
                   actor_label=actor_label)
    memory.reasons = [*memory.reasons, *check.problems][-RECENT_REASONS:]
    memory.hints = hints or memory.hints  # a failed reflection keeps the hints we had
    memory.last_output = answer.text
    return False


BUSY_RULES_MODEL = "offline-rules"  # plans a persona's goal when its model is busy (agents/offline_model.py)
MIN_WORDS_SAID = 2  # a question or reason for the operator has at least this many words

TRUNCATED = ("the answer was cut off at the token limit (finish_reason \"length\"), so it is incomplete; "
             "give fewer, shorter steps")
UNREFLECTABLE = (NO_JSON_PLAN, TRUNCATED)


def reflection_helps(model: str, problems: Sequence[str]) -> bool:
    """A reflection call is skipped where it cannot help: a small model planning or reflecting (its hints are no
    better than the reasons themselves), an answer with no JSON plan at all, or one cut off at the token limit."""
    if model_profile(model).small or model_profile(model_chain("reflect")[0]).small:
        return False  # the planner is small, or the reflecting model is (the demo's Intern plans offline)
    return not any(marker in problem for problem in problems for marker in UNREFLECTABLE)


def plan_answer_schema(agent: Agent, goal_text: str, model: str) -> dict[str, Any]:
    """The JSON Schema of a plan answer for this agent: its tools (or the persona actions), its goal; a tool
    agent's may instead ask the operator ({"ask": ...}) or say why it cannot ({"cannot": ...}). A small model's
    is narrower: every tool still (a goal's words do not say which it needs), with paths from the workspace and
    the goal, one to three steps."""
    kind, declared = agent_plan_terms(agent.kind, agent.declared_tools, agent.tools)
    registry = declared or TOOLS
    tools = list(registry.values()) if kind == Agent.Kind.TOOL else []
    paths = None
    if kind == Agent.Kind.TOOL and model_profile(model).small:
        reads, writes, sources = goal_paths(goal_text, workspace_listing(agent.workspace))
        paths = PathChoices(reads=reads, writes=writes, sources=sources)
    schema = plan_schema(kind=kind, goal=goal_text, tools=tools, actions=list(ACTIONS),
                         max_steps=settings.PLAN_MAX_STEPS, paths=paths)
    return plan_or_say_schema(schema) if kind == Agent.Kind.TOOL else schema


def plan_messages_fitted(*, model: str, purpose: str, memory: RetryContext, **kwargs: Any) -> list[dict[str, str]]:
    """The plan prompt, trimmed to leave the model room for a whole answer: what goes first is the rejected
    output (it is the longest part), then the hints, then all but the last two rejection reasons."""
    # A small model gets the compact prompt: its schema carries the shape, the prompt only the task.
    kwargs["compact"] = model_profile(model).small
    messages = plan_messages(memory=memory, **kwargs)
    budget = prompt_budget(purpose, model)
    if budget is None or tokens_estimate(messages) <= budget:
        return messages
    trimmed = RetryContext(reasons=list(memory.reasons), hints=list(memory.hints), last_output=memory.last_output)
    for cut in ("output_short", "output", "hints", "reasons"):
        if cut == "output_short":
            trimmed.last_output = trimmed.last_output[:300]
        elif cut == "output":
            trimmed.last_output = ""
        elif cut == "hints":
            trimmed.hints = []
        else:
            trimmed.reasons = trimmed.reasons[-2:]
        messages = plan_messages(memory=trimmed, **kwargs)
        if tokens_estimate(messages) <= budget:
            break
    return messages


def steps_declined(plan: Plan | None) -> list[dict[str, Any]]:
    """The steps the operator declined in this version and every earlier one, oldest first, as plain values
    with the operator's feedback: a replan may propose none of them again unchanged."""
    if plan is None:
        return []
    # The chain of versions walked in memory over one read of the agent's plans, not a query per version.
    previous = dict(Plan.objects.filter(agent_id=plan.agent_id).values_list("pk", "previous_id"))
    ids: list[int] = []
    cursor: int | None = plan.pk
    while cursor is not None and cursor not in ids:
        ids.append(cursor)
        cursor = previous.get(cursor)
    said = PlanEvent.objects.filter(step=OuterRef("pk"), kind=PlanEvent.Kind.STEP_DECLINED).order_by("-created_at", "-pk")
    steps = (PlanStep.objects.filter(plan_id__in=ids, status=PlanStep.Status.DECLINED)
             .annotate(feedback=Subquery(said.values("reason")[:1])).order_by("plan__version", "position"))
    return [s.spec().as_dict() | {"feedback": s.feedback or s.failure_reason} for s in steps]  # type: ignore[attr-defined]


def plan_with_steps(plan: Plan | None) -> Plan | None:
    """The nearest version that got as far as steps: a version that failed while planning has none, and a
    retry of it continues from the version before (its completed steps are kept, its failure explained)."""
    seen = 0
    while plan is not None and seen < 50 and not plan.steps.exists():
        plan, seen = plan.previous, seen + 1
    return plan


def plan_direct(*, agent: Agent, goal: Goal | None, goal_text: str) -> tuple[PlanSpec, list[str]] | None:
    """The rules planner (named "rules" on its plans), seed 004's should_plan: a tool agent's simple goal (one
    read-only call on a named file or folder) becomes one step without a planning call; off for an agent whose
    `rules_planner` is off, and for all with PLAN_ONE_STEP_SHORTCUT=off. Personas never get one: seed 000
    decomposes every goal into steps."""
    # Personas: seed 000 decomposes every goal into 2-6 steps; repeats of a plan cost no call (runtime/cycle.py).
    shortcut = settings.PLAN_ONE_STEP_SHORTCUT
    if agent.kind != Agent.Kind.TOOL or shortcut == "off" or not agent.rules_planner:
        return None
    chain = model_chain("plan", agent_models=agent.planner_models)
    # The everyday goals (convert, count, list, copy) skip a small model's planning; a strong one plans them.
    everyday = shortcut == "all" or (shortcut == "small" and model_profile(chain[0]).small)
    # Seed 004's should_plan gates the reads; an everyday goal's pattern names its one step whole.
    step = tool_single_step(goal_text, everyday=everyday) if everyday else (
        None if should_plan(goal_text) else tool_single_step(goal_text))
    data: dict[str, Any] | None = {"steps": [step]} if step else None
    if data is None:
        return None
    result = plan_validate(data, kind=agent.kind, allowed_actions=list(ACTIONS), goal_text=goal_text,
                           workspace=agent.workspace if agent.kind == Agent.Kind.TOOL else None)
    if result.plan is None or goal_plan_check(agent, goal_text, result.plan.steps):
        return None
    # One step is the point here, so the validator's "2-6 steps are preferred" note would only confuse.
    return result.plan, [f for f in result.flags if "preferred" not in f]


def plan_restatement(*, agent: Agent, plan: Plan, previous: Plan | None, goal_text: str,
                     deadline: Deadline, save: bool = True) -> dict[str, str]:
    """The restatement of a replan's goal is its previous version's (copied by plan_start, no call);
    a tool agent's first plan asks the fast model. Without `save`, the caller stores it (plans_first)."""
    if previous is not None:
        kept = {k: getattr(plan, k) for k in RESTATE_KEYS}
        if any(kept.values()) and not previous.clarification_answer:
            return kept
    if agent.kind != Agent.Kind.TOOL:
        return {}
    if model_profile(model_chain("restate")[0]).small:
        return {}  # a small model's restatement repeats the goal or fills in placeholders: no call
    return plan_restate(agent=agent, plan=plan, goal_text=goal_text, deadline=deadline, save=save)


def plan_restate(*, agent: Agent, plan: Plan, goal_text: str, deadline: Deadline | None = None,
                 save: bool = True) -> dict[str, str]:
    """WHO/WHAT/WHEN/WHERE/WHY by the fast model (seed 002); a failure here only loses the restatement.
    Without `save`, nothing is written (the call is recorded as every call is)."""
    try:
        answer = llm_complete(purpose="restate", messages=prompt_restate(goal=goal_text, agent_name=agent.name,
                                                                          backstory=agent.backstory),
                              agent_id=agent.pk, plan_id=plan.pk, deadline=deadline, schema=restate_schema())
        data = json_extract(answer.text).value
    except (LLMError, ExtractError) as exc:
        logger.info("restatement failed for plan %s: %s", plan.pk, exc)
        return {}
    raw = data.get("restatement", data) if isinstance(data, dict) else None
    if not isinstance(raw, dict):
        return {}
    # A placeholder ("...", the prompt's example) is no restatement: such a line is left empty, and an
    # answer with nothing else is not stored at all.
    restatement = {k: ("" if placeholder_or_example(str(raw.get(k, "")), goal=goal_text) else
                       " ".join(str(raw.get(k, "")).split())[:300]) for k in RESTATE_KEYS}
    if not any(restatement.values()):
        logger.info("restatement for plan %s held only placeholders", plan.pk)
        return {}
    if save:
        plan_restatement_save(plan=plan, restatement=restatement)
    return restatement


def plan_messages(*, agent: Agent, goal_text: str, restatement: dict[str, str], previous: Plan | None,
                  kept: list[PlanStep], reason: str, feedback: Sequence[str], memory: RetryContext,
                  simple: bool = False, declined: Sequence[dict[str, Any]] = (),
                  compact: bool = False, needs: Mapping[str, float] | None = None) -> list[dict[str, str]]:
    """The plan prompt. `needs`: the persona's needs by name, as read just now by the caller (read here
    otherwise)."""
    kind, declared = agent_plan_terms(agent.kind, agent.declared_tools, agent.tools)
    # A tool plan's prompt shows no needs (and tool agents have none): no query for them.
    if kind == Agent.Kind.TOOL:
        needs = {}
    elif needs is None:
        needs = {n.name: n.satisfaction for n in agent.needs.all()}
    else:
        needs = dict(sorted(needs.items()))  # as the query gives them: by name
    tools = list((declared or TOOLS).values()) if kind == Agent.Kind.TOOL else None
    files = workspace_listing(agent.workspace) if agent.kind == Agent.Kind.TOOL else []
    backstory = agent.backstory
    if agent.kind == Agent.Kind.PERSONA:  # seed 000's plan inputs: emotions and learned lessons too
        lessons = [lesson.description for lesson in agent.lessons.all()[:PERSONA_LESSONS_IN_PROMPT]]
        backstory = "\n".join([backstory, *persona_situation(emotions=agent.emotions, lessons=lessons)]).strip()
    common: dict[str, Any] = {
        "kind": kind, "goal": goal_text, "agent_name": agent.name, "backstory": backstory, "tools": tools,
        "allowed_actions": list(ACTIONS), "needs": needs, "max_steps": settings.PLAN_MAX_STEPS,
        "workspace_files": files, "restatement": restatement or None, "feedback": list(feedback),
        "rejection_reasons": memory.reasons, "last_rejected_output": memory.last_output,
        "retry_hints": memory.hints, "simple": simple, "compact": compact,
    }
    if previous is not None:
        failed = previous.steps.filter(status__in=[PlanStep.Status.FAILED, PlanStep.Status.DECLINED]).first()
        return prompt_replan(
            **common, completed_steps=[s.spec().as_dict() for s in kept],
            failed_step=failed.spec().as_dict() | {"failure_reason": failed.failure_reason} if failed else None,
            reason=reason, declined_steps=declined,
        )
    return prompt_plan(**common)


def plan_check(*, agent: Agent, text: str, kept: list[PlanStep], declined: Sequence[dict[str, Any]] = (),
               goal_text: str = "", answer: LLMResult | None = None, steered: bool = False) -> Check:
    """Parse and validate one model answer. Never raises on bad output. A replan that proposes a step the
    operator declined, unchanged, is rejected with the operator's words as the reason.

    An answer cut off at the token limit is rejected as such; prose is "no JSON plan in the answer", never
    steps; with `goal_text` the plan must mean the goal (planning/engine/meaning.py)."""
    kind, tools = agent_plan_terms(agent.kind, agent.declared_tools, agent.tools)
    if answer is not None and answer.truncated:
        return Check([TRUNCATED])
    try:
        # A persona's numbered list still names its actions (each is checked); a tool plan is JSON or nothing.
        parsed = plan_parse(text, allow_single_step=False, allow_text_list=kind != Agent.Kind.TOOL)
    except ExtractError as exc:
        return Check([exc.reason if exc.reason == NO_JSON_PLAN else f"unparseable output: {exc.reason}"])
    data = dict(parsed.data)
    steps = data.get("steps")
    if answer is not None and answer.response_format and isinstance(steps, list):
        # A constrained answer may hold "\n" escapes in a one-line text: joined, and said so.
        joined = steps_texts_joined(steps)
        if joined:
            parsed.repaired.append(f"joined {counted(joined, 'multi-line text')} into one line")
    if kept and isinstance(steps, list):
        kept_keys = {s.key for s in kept}
        # The model may repeat completed steps; they are kept as they were, never redone.
        new = [s for s in steps if not (isinstance(s, dict) and str(s.get("id", "")) in kept_keys)]
        data["steps"] = [step_plan_data(s.spec(), kind) for s in kept] + new
        if not new:
            return Check(["replan has no remaining steps"])
    workspace = agent.workspace if agent.kind == Agent.Kind.TOOL else None
    if workspace is not None:
        workspace.mkdir(parents=True, exist_ok=True)
    result = plan_validate(data, kind=kind, workspace=workspace, max_steps=settings.PLAN_MAX_STEPS,
                           allowed_actions=list(ACTIONS), tools=tools, goal_text=goal_text, steered=steered)
    # Structured output has no tags to forget: the server sent the JSON alone, as asked (an answer with text
    # around its JSON was not constrained, whatever the server accepted).
    structured = answer is not None and bool(answer.response_format) and text.lstrip()[:1] in ("{", "[")
    notes = [f"repaired: {r}" for r in parsed.repaired] + ([] if structured else parsed.flags)
    if structured:
        notes.append(f"structured output ({answer.response_format if answer else ''})")
    elif parsed.method not in ("json_tag", "fenced", "balanced"):
        notes.append(f"parsed from {parsed.method.replace('_', ' ')}")
    if result.clarification or result.cannot:
        said = result.clarification or result.cannot
        if placeholder_or_example(said, goal=goal_text):
            return Check([f"the answer's {'question' if result.clarification else 'reason'} is a placeholder "
                          f"({said[:80]!r}): give a real one, or the plan"])
        if len(re.findall(r"[^\W\d_]{2,}", said)) < MIN_WORDS_SAID:
            # SmolLM2 asked "10": no operator can answer that, and the inbox must not show it as a question.
            return Check([f"the answer's {'question' if result.clarification else 'reason'} says nothing "
                          f"({said[:80]!r}): ask in words, or give the plan"])
        if result.cannot:
            return Check(result.problems, cannot=result.cannot)
        return Check(result.problems, question=result.clarification)
    if result.steps_over_limit:
        # Seed 003: "too many steps: ask the user to clarify", rather than re-prompting in silence.
        question = (f"The plan needs {result.steps_over_limit} steps, more than the limit of {settings.PLAN_MAX_STEPS}. "
                    "Which part should be done first, or how can the goal be narrowed?")
        return Check(result.problems, question=question)
    if not result.ok or result.plan is None:
        return Check(result.problems)
    kept_keys = {s.key for s in kept}
    existing = workspace_listing(workspace) if workspace is not None and declined else []
    repeats = steps_repeating_declined([s for s in result.plan.steps if s.key not in kept_keys], declined, existing)
    if repeats:
        return Check(repeats)
    unreached = goal_plan_check(agent, goal_text, result.plan.steps, steered=steered, inputs_kept=kept_keys)
    if unreached:
        return Check(unreached, unreached=True)
    return Check([], result.plan, [*notes, *result.flags])


def steps_texts_joined(steps: list[Any]) -> int:
    """Join the lines of each step's intent/description/expects in place; how many were joined."""
    joined = 0
    for step in steps:
        if not isinstance(step, dict):
            continue
        for key in ("intent", "description", "expects", "expected_outcome"):
            value = step.get(key)
            if isinstance(value, str) and ("\n" in value or "\r" in value):
                step[key] = " ".join(value.split())
                joined += 1
    return joined


def plan_reflect(*, agent: Agent, plan: Plan, output: str, reasons: list[str],
                 deadline: Deadline | None = None) -> list[str]:
    """Seed 002's failure reflection: the fast model turns rejection reasons into fix hints (RETRY_HINTS)."""
    try:
        answer = llm_complete(purpose="reflect", messages=prompt_reflect(output=output[:3000], reasons=reasons),
                              agent_id=agent.pk, plan_id=plan.pk, deadline=deadline, schema=reflect_schema())
        data = json_extract(answer.text).value
    except (LLMError, ExtractError):
        return []
    hints = data.get("hints") if isinstance(data, dict) else data
    if not isinstance(hints, list):
        steps = data.get("steps") if isinstance(data, dict) else None
        hints = steps if isinstance(steps, list) else []
    return [str(h)[:300] for h in hints
            if isinstance(h, str | int | float) and not placeholder_or_example(str(h))][:6]


def plan_retry_due(*, agent: Agent, runner: str) -> None:
    """At the start of a cycle: a failed plan whose automatic retry is due gets a replan request, which
    this very cycle carries out. Costs no query unless a retry is due (the time is on the agent row)."""
    if agent.plan_retry_at is None or agent.plan_retry_at > timezone.now():
        return
    plan_retry_start(agent=agent, runner=runner)


def plans_interrupted_fail(*, agent_ids: Sequence[int], runner: str) -> int:
    """For agents whose cycle is about to start: a plan still "validating" lost its planner (an agent runs one
    cycle at a time, and this one is not planning yet), so it fails, saying which runner stopped."""
    plans = Plan.objects.filter(agent_id__in=list(agent_ids), status=Plan.Status.VALIDATING)
    return sum(plan_interrupted_fail(plan=plan, runner=runner) for plan in plans)


def plan_interrupted_fail(*, plan: Plan, runner: str) -> bool:
    """Fail one plan found "validating" as its agent's cycle starts (plans_interrupted_fail); False when it
    left "validating" meanwhile."""
    started_by = plan.events.filter(kind=PlanEvent.Kind.CREATED).values_list("actor_label", flat=True).first()
    if started_by == runner:  # this runner's own planning cycle broke off (its log says why)
        headline = f"planning interrupted: the cycle of {runner} ended before planning finished"
    else:
        headline = f"planning interrupted: {started_by or 'a runner'} stopped before it finished"
    try:
        plan_fail(plan=plan, headline=headline, actor_label=runner)
    except PlanNoLongerValidating:
        return False
    return True
