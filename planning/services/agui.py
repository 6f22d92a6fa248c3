"""Remote AG-UI agents (docs/agui-agents.md): an operator adds one by its URL, a goal starts a run, the run's
events become the agent's plan (tool calls as steps, its text and state on the timeline), and a run that ends
with an interrupt puts a step up for approval per interrupt; the operator's decision (the same step_approve and
step_decline as every agent's) resumes the thread with `resume[]`, once.

The web request that gives the goal (or the decision) only records the run to start; the runner starts it at the
agent's next cycle (`agui_cycle`, brought forward by the operator's act) and reads its stream there. The events
that arrived together are written in one transaction (what the agent said and reported on the plan in one INSERT,
a push after commit), so an open plan page follows the run as it streams; the HTTP requests are made outside any
transaction. Cancelling the plan closes the run's stream (the protocol has no cancel message: closing the request
is how a client stops a run), recorded on the plan."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from typing import Any

from ag_ui.core import (
    EventType,
    ResumeEntry,
    RunAgentInput,
)
from django.contrib.auth.models import User
from django.db import IntegrityError, transaction
from django.utils import timezone
from django.utils.dateparse import parse_datetime

from agents.agui_models import AguiAgent, AguiInterrupt
from agents.agui_remote import (
    AguiError,
    RunStopped,
    arguments_parse,
    resume_entry,
    run_input,
    run_stream,
    state_patched,
)
from agents.models import Agent
from goals.models import Goal
from planner_site.events import published_apart
from planner_site.outbound import url_problem
from planner_site.validators import text_problem
from planning.models import Plan, PlanEvent, PlanStep
from planning.services.agents import agent_name_clean, agent_name_taken, agent_waiting_set
from planning.services.errors import DecisionError
from planning.services.events import actor_name, event_agent_record, events_record
from planning.services.plans import plan_abandon, plan_unverified
from planning.services.steps import StepReport, step_approve, step_decline, steps_reported
from planning.services.versions import plans_create

NOT_VERIFIED = "the AG-UI agent reported its run finished; the dashboard cannot check the outcome itself"


def agui_label(agent: Agent) -> str:
    return f"AG-UI agent {agent.name}"


# --- adding an agent, giving it a goal ------------------------------------------------------------------------


def agui_agent_create(*, user: User, name: str, url: str) -> Agent:
    """An AG-UI agent reached at `url` (checked by the outbound guard), recorded as `Agent created`."""
    name = agent_name_clean(name)
    url = url.strip()
    if len(url) > 500:
        raise DecisionError("The address is longer than 500 characters. Nothing was changed.")
    if problem := url_problem(url):
        raise DecisionError(f"The address {problem}. Nothing was changed.")
    if Agent.objects.filter(name__iexact=name).exists():
        raise agent_name_taken(name)
    try:
        with transaction.atomic():
            agent = Agent.objects.create(name=name, kind=Agent.Kind.AGUI, backstory=f"Remote AG-UI agent at {url}")
            AguiAgent.objects.create(agent=agent, url=url)
            event_agent_record(agent=agent, kind=PlanEvent.Kind.AGENT_CREATED, actor=user,
                               reason=f"AG-UI agent {name} added at {url}",
                               detail={"url": url, "diff": {"created": ["", name]}})
    except IntegrityError:
        raise agent_name_taken(name) from None
    return agent


@transaction.atomic
def agui_goal_give(*, agent: Agent, user: User, description: str) -> Plan:
    """The goal given: a Goal, the plan its run will build (active: the agent runs it itself), and the run to
    start (a new thread, the goal as the user's message), which the runner starts at the agent's next cycle."""
    description = " ".join(description.split())
    if not description:
        raise DecisionError("Describe the goal. Nothing was changed.")
    if problem := text_problem(description, max_length=500):
        raise DecisionError(f"The goal {problem}. Nothing was changed.")
    remote = AguiAgent.objects.select_for_update(of=("self",)).select_related("agent", "plan").get(agent_id=agent.pk)
    agent = remote.agent
    if agent.status != Agent.Status.RUNNING:
        raise DecisionError(f"{agent.name} is {agent.get_status_display().lower()}; resume it first. "
                            "Nothing was changed.")
    if remote.plan is not None and remote.plan.is_open:
        raise DecisionError(f"{agent.name} is still pursuing “{remote.plan.goal_text}”; cancel that plan or wait "
                            "for it to end. Nothing was changed.")
    goal = Goal.objects.create(agent=agent, description=description, confidence=1.0)
    event_agent_record(agent=agent, kind=PlanEvent.Kind.GOAL_GIVEN, actor=user, reason=goal.description,
                       detail={"goal": goal.pk})
    remote.thread_id = uuid.uuid4().hex
    (plan,) = plans_create([(Plan(agent=agent, goal=goal, goal_text=description, status=Plan.Status.ACTIVE,
                                  approval_mode=Plan.ApprovalMode.ALL, model=agui_label(agent)),
                             f"run to start at {remote.url}; the agent plans and acts itself")],
                           actor=user, details=[{"thread_id": remote.thread_id}])
    remote.plan = plan
    remote.state = {}
    remote.calls = {}
    remote.pending_run = run_input(thread_id=remote.thread_id, goal=description).model_dump(mode="json",
                                                                                           by_alias=True)
    remote.save()
    return plan


# --- the runner: starting and reading a run -------------------------------------------------------------------


@transaction.atomic
def agui_run_claim(*, agent_id: int) -> tuple[RunAgentInput | None, str]:
    """The run this cycle starts, taken once (so never sent twice), and what happened. A run a dead cycle was
    reading fails its plan (the stream is gone); a run whose plan was cancelled before it started is dropped."""
    remote, plan = remote_locked(agent_id)
    label = agui_label(remote.agent)
    if remote.run_reading:
        remote.run_reading = ""
        remote.save(update_fields=["run_reading"])
        if plan is not None and plan.is_open:
            plan_abandon(plan=plan, runner=label, reason="AG-UI run failed: the runner reading its stream stopped "
                                                          "before the run ended")
            return None, "run interrupted"
    if not remote.pending_run:
        return None, "idle"
    body = RunAgentInput.model_validate(remote.pending_run)
    remote.pending_run = {}
    if plan is None or not plan.is_open:
        remote.save(update_fields=["pending_run"])
        if plan is not None:
            events_record([PlanEvent(plan=plan, kind=PlanEvent.Kind.TASK_STATE, actor_label=label,
                                     reason="run not started: the plan ended before the runner took it",
                                     detail={"run": body.run_id, "diff": {"state": ["to start", "not started"]}})])
        return None, "run dropped"
    remote.run_reading = body.run_id
    remote.save(update_fields=["pending_run", "run_reading"])
    return body, "run started"


def agui_cycle(*, agent: Agent, runner: str) -> str:
    """One cycle of a remote AG-UI agent: the run its goal or its operator's decision asked for, started and read
    to its end or its interrupt, each event pushed to the open pages as it commits; nothing else to do: idle."""
    body, what = agui_run_claim(agent_id=agent.pk)
    if body is None:
        return what
    try:
        with published_apart():
            agui_drive(agent_id=agent.pk, body=body)
    finally:
        AguiAgent.objects.filter(agent_id=agent.pk, run_reading=body.run_id).update(run_reading="")
    return f"run {body.run_id} read"


def agui_drive(*, agent_id: int, body: RunAgentInput) -> None:
    """Read one run of the agent's current thread, the events that arrived together applied in one transaction; a
    run that cannot be read fails the plan with the reason; a plan cancelled meanwhile closes the stream, recorded."""
    remote = AguiAgent.objects.get(agent_id=agent_id)
    plan_id = remote.plan_id or 0
    texts: dict[str, str] = {}  # the agent's messages being streamed, by id: said once each ends

    def stopped() -> bool:
        return not Plan.objects.filter(pk=plan_id).open().exists()

    try:
        for events in run_stream(remote.url, body, stopped=stopped):
            if all(event.type in TEXT_PARTS for event in events):  # a message still coming: nothing to write yet
                for event in events:
                    text_apply(event, texts)
                continue
            ended = agui_events_apply(agent_id=agent_id, events=events, texts=texts)
            if ended is None:  # the plan was cancelled meanwhile
                raise RunStopped()
            if ended:
                return
        agui_failed(agent_id=agent_id, reason="the agent's event stream ended without RUN_FINISHED")
    except RunStopped:
        agui_stream_closed(plan_id=plan_id, run_id=body.run_id, agent_id=agent_id)
    except AguiError as exc:
        agui_failed(agent_id=agent_id, reason=str(exc))


@transaction.atomic
def agui_stream_closed(*, plan_id: int, run_id: str, agent_id: int) -> None:
    """The run's stream closed because its plan ended (cancelled) while the agent was running: on the timeline."""
    plan = Plan.objects.select_for_update().filter(pk=plan_id).first()
    if plan is None:
        return
    events_record([PlanEvent(
        plan=plan, kind=PlanEvent.Kind.TASK_STATE, actor_label=agui_label(plan.agent),
        reason=f"the run's stream was closed: the plan is {plan.get_status_display().lower()} (AG-UI has no cancel "
               "message; closing the stream is how a client stops a run)",
        detail={"run": run_id, "diff": {"state": ["running", "stream closed"]}})])
    agent_waiting_set(agent_id=agent_id, reason="")


def remote_locked(agent_id: int) -> tuple[AguiAgent, Plan | None]:
    remote = AguiAgent.objects.select_for_update(of=("self",)).select_related("agent").get(agent_id=agent_id)
    plan = Plan.objects.select_for_update().get(pk=remote.plan_id) if remote.plan_id else None
    return remote, plan


def agui_failed(*, agent_id: int, reason: str) -> None:
    """The run could not be read or the agent reported an error: its open plan fails with the reason."""
    remote = AguiAgent.objects.select_related("agent", "plan").get(agent_id=agent_id)
    if remote.plan is not None and remote.plan.is_open:
        plan_abandon(plan=remote.plan, runner=agui_label(remote.agent), reason=f"AG-UI run failed: {reason}"[:2000])


def step_of_call(remote: AguiAgent, call_id: str) -> PlanStep | None:
    entry = remote.calls.get(call_id)
    return PlanStep.objects.select_for_update().filter(pk=entry["step"]).first() if entry else None


RUN_ENDS = (EventType.RUN_FINISHED, EventType.RUN_ERROR)
TEXT_PARTS = (EventType.TEXT_MESSAGE_START, EventType.TEXT_MESSAGE_CONTENT, EventType.TEXT_MESSAGE_CHUNK)


@transaction.atomic
def agui_events_apply(*, agent_id: int, events: Sequence[Any], texts: dict[str, str]) -> bool | None:
    """The events of the run that arrived together, applied to the agent's plan in order: its tool calls as steps
    (steps_reported), what it said and reported on the plan (each run of them one events_record, so one INSERT),
    its end. True when the run ended (RUN_FINISHED, RUN_ERROR, a state change that does not apply), None when the
    plan is no longer open (cancelled): the stream is to be closed. `texts`: the messages being streamed, kept
    from one batch to the next."""
    remote, plan = remote_locked(agent_id)
    if plan is None or not plan.is_open:
        return True if any(event.type in RUN_ENDS for event in events) else None
    label = agui_label(remote.agent)
    said: list[PlanEvent] = []  # the plan's events not yet written: written before any other write, in order

    def reported(reason: str, detail: dict[str, Any] | None = None) -> None:
        said.append(PlanEvent(plan=plan, kind=PlanEvent.Kind.AGENT_REPORTED, actor_label=label,
                              reason=reason[:4000], detail=detail or {}))

    def said_written() -> None:
        events_record(said)
        said.clear()

    kept = False  # the agent's state or its tool calls changed: saved with the batch
    try:
        for event in events:
            if event.type in (*TEXT_PARTS, EventType.TEXT_MESSAGE_END):
                if (text := text_apply(event, texts)) is not None:
                    reported(f"said: {text}")
            elif event.type in (EventType.STATE_SNAPSHOT, EventType.STATE_DELTA):
                state_apply(remote, event, reported)
                kept = True
            elif event.type in (EventType.STEP_STARTED, EventType.STEP_FINISHED):
                verb = "started" if event.type == EventType.STEP_STARTED else "finished"
                reported(f"step {event.step_name} {verb}")
            elif event.type in (EventType.TOOL_CALL_START, EventType.TOOL_CALL_ARGS, EventType.TOOL_CALL_END,
                                EventType.TOOL_CALL_RESULT):
                said_written()
                tool_call_apply(remote, plan, event, label)
                kept = True
            elif event.type in RUN_ENDS:
                said_written()
                run_end_apply(remote, plan, event, label)
                return True
    except AguiError as exc:  # a state change that does not apply: the run fails, what came before it kept
        said_written()
        plan_abandon(plan=plan, runner=label, reason=f"AG-UI run failed: {exc}"[:2000])
        return True
    finally:
        if kept:
            remote.save(update_fields=["state", "calls"])
    said_written()
    return False


def text_apply(event: Any, texts: dict[str, str]) -> str | None:
    """A message the agent streams: its text gathered in `texts`; the whole text once it ends, else None."""
    if event.type == EventType.TEXT_MESSAGE_START:
        texts[event.message_id] = ""
    elif event.type == EventType.TEXT_MESSAGE_END:
        return texts.pop(event.message_id, "")
    else:
        key = getattr(event, "message_id", None) or ""
        texts[key] = texts.get(key, "") + (event.delta or "")
    return None


def state_apply(remote: AguiAgent, event: Any, reported: Callable[[str, dict[str, Any]], None]) -> None:
    """The agent's state, replaced (a snapshot) or patched (a delta); AguiError when the patch does not apply."""
    if event.type == EventType.STATE_SNAPSHOT:
        remote.state = event.snapshot
        reported("state snapshot", {"state": remote.state})
        return
    patch = [op.model_dump(by_alias=True) if hasattr(op, "model_dump") else op for op in event.delta]
    remote.state = state_patched(remote.state, patch)
    reported("state changed", {"patch": patch, "state": remote.state})


def tool_call_apply(remote: AguiAgent, plan: Plan, event: Any, label: str) -> None:
    """A tool call of the agent as a step: started, its arguments gathered then shown, its result completing it."""
    kind = event.type
    if kind == EventType.TOOL_CALL_START:
        (step,) = steps_reported(plan=plan, actor_label=label, reported=[StepReport(
            PlanStep(description=f"{event.tool_call_name} (a tool call of the agent)"[:500],
                     tool=event.tool_call_name[:64], status=PlanStep.Status.RUNNING),
            f"tool call {event.tool_call_name}")])
        remote.calls[event.tool_call_id] = {"step": step.pk, "args": ""}
    elif kind == EventType.TOOL_CALL_ARGS:
        if event.tool_call_id in remote.calls:
            remote.calls[event.tool_call_id]["args"] += event.delta
    elif kind == EventType.TOOL_CALL_END:
        ended = step_of_call(remote, event.tool_call_id)
        if ended is not None:
            ended.tool_input = arguments_parse(remote.calls[event.tool_call_id]["args"])
            steps_reported(plan=plan, actor_label=label, reported=[StepReport(
                ended, f"{ended.tool} {ended.tool_input}", fields=("tool_input",),
                detail={"arguments": ended.tool_input})])
    else:
        answered = step_of_call(remote, event.tool_call_id)
        if answered is not None and answered.status in (PlanStep.Status.PENDING, PlanStep.Status.RUNNING):
            content = event.content if isinstance(event.content, str) else " ".join(
                str(getattr(part, "text", "")) for part in event.content)
            answered.result = content[:20000]
            # an approved interrupt's step is pending again: the resumed run's result starts and completes it
            path = ((PlanStep.Status.RUNNING,) if answered.status == PlanStep.Status.PENDING else ()) + (
                PlanStep.Status.COMPLETED,)
            steps_reported(plan=plan, actor_label=label, reported=[StepReport(
                answered, f"the agent reported its result: {content}", path=path, fields=("result",))])


def run_end_apply(remote: AguiAgent, plan: Plan, event: Any, label: str) -> None:
    """The run ended: failed with the agent's message, or interrupted (its steps await approval), or finished
    (unverified: the dashboard cannot check what the agent did)."""
    if event.type == EventType.RUN_ERROR:
        plan_abandon(plan=plan, runner=label, reason=f"AG-UI run failed: {event.message}"[:2000])
    elif event.outcome is not None and event.outcome.type == "interrupt":
        interrupts_record(remote=remote, plan=plan, run_id=event.run_id, interrupts=event.outcome.interrupts)
    elif not plan.steps.exclude(status__in=PlanStep.DONE_STATUSES).exists():
        plan_unverified(plan=plan, runner=label, problems=[NOT_VERIFIED])
    else:
        agent_waiting_set(agent_id=remote.agent_id, reason="")


def expires_parse(value: str | None) -> datetime | None:
    if not value:
        return None
    moment = parse_datetime(value.replace("Z", "+00:00"))
    if moment is not None and timezone.is_naive(moment):
        moment = timezone.make_aware(moment, UTC)
    return moment


def interrupts_record(*, remote: AguiAgent, plan: Plan, run_id: str, interrupts: list[Any]) -> None:
    """Each interrupt a step awaiting approval: the tool call it concerns, or a step of its own."""
    reports: list[StepReport] = []
    for interrupt in interrupts:
        question = interrupt.message or interrupt.reason
        reason = f"the agent asks: {question}"
        detail = {"interrupt": interrupt.id, "expires_at": interrupt.expires_at or ""}
        step = step_of_call(remote, interrupt.tool_call_id) if interrupt.tool_call_id else None
        if step is None or step.status != PlanStep.Status.RUNNING or any(r.step.pk == step.pk for r in reports):
            reports.append(StepReport(PlanStep(description=question[:500], requires_permission=True,
                                               status=PlanStep.Status.AWAITING_APPROVAL), reason, detail=detail))
            continue
        step.requires_permission = True
        step.description = f"{step.tool}: {question}"[:500] if step.tool else question[:500]
        reports.append(StepReport(step, reason, path=(PlanStep.Status.AWAITING_APPROVAL,),
                                  fields=("requires_permission", "description"), detail=detail))
    steps = steps_reported(plan=plan, actor_label=agui_label(remote.agent), reported=reports)
    AguiInterrupt.objects.bulk_create([
        AguiInterrupt(remote=remote, step=step, run_id=run_id, interrupt_id=interrupt.id,
                      reason=interrupt.reason[:200], message=interrupt.message or "",
                      expires_at=expires_parse(interrupt.expires_at))
        for step, interrupt in zip(steps, interrupts, strict=True)])
    Agent.objects.filter(pk=remote.agent_id).update(
        waiting_reason=f"{len(interrupts)} interrupt{'s' if len(interrupts) != 1 else ''} of the agent await approval")


# --- the operator's decision ----------------------------------------------------------------------------------


@transaction.atomic
def agui_decision_record(*, step: PlanStep, user: User, approved: bool, feedback: str = "",
                         seen_steps: str | None = None) -> tuple[PlanEvent, list[ResumeEntry] | None]:
    """The decision on an interrupt's step, once: the step approved or declined (the services every agent's
    steps use) and the resume entry kept; the entries to send when every interrupt of its run is decided."""
    interrupt = AguiInterrupt.objects.select_for_update(of=("self",)).select_related("decided_by").get(step_id=step.pk)
    if interrupt.decided_at is not None:
        by = actor_name(interrupt.decided_by) if interrupt.decided_by else "an operator"
        raise DecisionError(f"This interrupt was already answered by {by}; the agent is resumed once. "
                            "Nothing was changed.")
    if interrupt.expires_at is not None and timezone.now() >= interrupt.expires_at:
        raise DecisionError(f"This interrupt expired at {interrupt.expires_at:%Y-%m-%d %H:%M:%S} UTC; the agent no "
                            "longer takes an answer to it. Nothing was changed.")
    if approved:
        event = step_approve(step=step, user=user, seen_steps=seen_steps)
    else:
        event = step_decline(step=step, user=user, feedback=feedback)
    step.refresh_from_db()
    entry = resume_entry(interrupt_id=interrupt.interrupt_id, approved=approved, arguments=step.tool_input,
                         feedback=feedback.strip())
    interrupt.decided_at = timezone.now()
    interrupt.decided_by = user
    interrupt.resume = entry.model_dump(mode="json", by_alias=True)
    interrupt.save(update_fields=["decided_at", "decided_by", "resume"])
    siblings = AguiInterrupt.objects.filter(remote_id=interrupt.remote_id, run_id=interrupt.run_id)
    if siblings.filter(decided_at__isnull=True).exists():
        return event, None
    entries = [ResumeEntry.model_validate(i.resume) for i in siblings.order_by("pk")]
    remote = AguiAgent.objects.select_for_update(of=("self",)).get(pk=interrupt.remote_id)
    remote.pending_run = run_input(thread_id=remote.thread_id, state=remote.state, resume=entries).model_dump(
        mode="json", by_alias=True)
    remote.save(update_fields=["pending_run"])
    return event, entries


def agui_step_decide(*, step: PlanStep, user: User, approved: bool, feedback: str = "",
                     seen_steps: str | None = None) -> PlanEvent:
    """Approve or decline an interrupt's step; once every interrupt of that run is decided, the thread's resumed
    run (`resume[]`) is recorded, in the same transaction, for the runner to start at the agent's next cycle."""
    event, _entries = agui_decision_record(step=step, user=user, approved=approved, feedback=feedback,
                                           seen_steps=seen_steps)
    return event


def step_approve_routed(*, step: PlanStep, user: User, seen_steps: str | None = None) -> PlanEvent:
    """Approve a step: an AG-UI agent's interrupt resumes its run; any other agent's step as ever."""
    if AguiInterrupt.objects.filter(step_id=step.pk).exists():
        return agui_step_decide(step=step, user=user, approved=True, seen_steps=seen_steps)
    return step_approve(step=step, user=user, seen_steps=seen_steps)


def step_decline_routed(*, step: PlanStep, user: User, feedback: str) -> PlanEvent:
    """Decline a step with feedback: an AG-UI agent's interrupt resumes its run with the feedback."""
    if AguiInterrupt.objects.filter(step_id=step.pk).exists():
        if not feedback.strip():
            raise DecisionError("Feedback is required to decline a step. Nothing was changed.")
        return agui_step_decide(step=step, user=user, approved=False, feedback=feedback)
    return step_decline(step=step, user=user, feedback=feedback)
