"""Remote A2A agents (docs/a2a-agents.md): an operator adds one by its agent card's address; the runner gives
each of its goals to the agent as an A2A message and follows the task it starts, one plan per task.

- The task's agent messages and artifacts become the plan's completed steps, each with its text as the result.
- Each new task state is a "Remote task state changed" event with the diff of the state.
- `input-required` or `auth-required`: the plan needs clarification, with the agent's question; it is in the
  inbox like a planner's question, and the operator's answer (plan_clarify) goes back to the agent as a message
  on the same task at the agent's next cycle.
- A cancelled plan's task is cancelled on the agent at the next cycle.
- `completed` completes the plan and its goal; `failed` or `rejected` fails the plan (the goal is abandoned: the
  agent said it would not or could not); `canceled` by the agent cancels the plan.
- An agent whose card offers streaming is sent its goals and answers by SendStreamingMessage, and a task under
  way is followed by SubscribeToTask: each event is recorded as it arrives, in the runner's cycle.
- An agent whose card offers push notifications (and not streaming) is asked, once its task starts, to POST the
  task's updates to the dashboard's webhook with a token of that task (task_push_register); each update is
  recorded by task_push_record, as a streamed event is, and the task is read only every A2A_PUSH_POLL_SECONDS in
  case a notification was lost. Other agents' tasks are polled (GetTask), one read a cycle.

The network calls are made outside any transaction; what they return is written in one transaction each."""

from __future__ import annotations

import hashlib
import hmac
import logging
import secrets
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.conf import settings
from django.contrib.auth.models import User
from django.db import IntegrityError, transaction
from django.urls import reverse
from django.utils import timezone

from agents import a2a_remote
from agents.a2a_remote import ASKING, TERMINAL, Remote, RemoteError, TaskView
from agents.models import Agent
from agents.signals import events_may_notify_on_commit, operator_acted_on_commit
from goals.models import Goal
from planner_site.events import published_apart
from planning.models import A2ATask, Plan, PlanEvent, PlanStep
from planning.services.agents import agent_waiting_set
from planning.services.errors import DecisionError
from planning.services.events import event_agent_record, event_record
from planning.services.plans import plan_closed_steps_said, plans_steps_close
from planning.services.steps import StepReport, steps_reported
from planning.services.transactions import plan_lock
from planning.services.versions import plans_create
from planning.trace_spans import events_traced

logger = logging.getLogger("planner.a2a")


def agent_label(agent: Agent) -> str:
    return f"{agent.name} (A2A)"


def remote_of(agent: Agent) -> Remote:
    return Remote(card_json=agent.a2a_card, url=agent.a2a_url, credential=agent.a2a_credential)


def agent_a2a_add(*, user: User, url: str, credential: str = "") -> Agent:
    """Add a remote A2A agent by the address of its agent card (read now, through the outbound guard): named
    as its card names it, running. A card that asks for a credential needs the operator's (kept, never shown,
    sent only to the card's origin); one that asks for none takes none. Recorded as an `Agent created` event
    naming the operator (and whether a credential was given, never the credential)."""
    if not url.strip():
        raise DecisionError("Give the agent card's address. Nothing was changed.")
    credential = credential.strip()
    if credential:
        credential_check(credential)
    try:
        card = a2a_remote.card_fetch(url)
    except RemoteError as exc:
        raise DecisionError(str(exc)) from None
    if card.credential and not credential:
        raise DecisionError(f"The agent card asks for {card.credential}: give it as the credential. "
                            "Nothing was changed.")
    if credential and not card.credential:
        raise DecisionError("The agent card asks for no credential: leave the credential empty, it would be sent "
                            "nowhere. Nothing was changed.")
    name = " ".join(card.name.split())[:100]
    if Agent.objects.filter(name__iexact=name).exists():
        raise DecisionError(f"An agent named {name} already exists. Nothing was changed.")
    try:
        with transaction.atomic():
            agent = Agent.objects.create(name=name, backstory=card.description[:2000], kind=Agent.Kind.A2A,
                                         a2a_url=card.url, a2a_card=card.card_json, a2a_credential=credential)
            with_credential = f", with {card.credential}" if credential else ""
            event_agent_record(agent=agent, kind=PlanEvent.Kind.AGENT_CREATED, actor=user,
                               reason=f"Remote A2A agent {name} added from {card.url}{with_credential}",
                               detail={"a2a_url": card.url, "credential": bool(credential),
                                       "diff": {"created": ["", name]}})
    except IntegrityError:
        raise DecisionError(f"An agent named {name} already exists. Nothing was changed.") from None
    return agent


def credential_check(credential: str) -> None:
    if not credential or len(credential) > 2000 or any(c in credential for c in "\r\n\x00"):
        raise DecisionError("The credential must be one line of at most 2000 characters. Nothing was changed.")


def agent_a2a_credential_set(*, user: User, agent: Agent, credential: str = "", remove: bool = False) -> None:
    """Replace the credential sent to a remote A2A agent (its card must ask for one), or remove it: the agent's
    next request carries the new one, or none. Kept as at adding, never shown; recorded as a `Credential changed`
    event naming the operator and what was done, never the credential."""
    credential = credential.strip()
    if not remove:
        credential_check(credential)
        try:
            asked = a2a_remote.credential_asked(a2a_remote.card_parse(agent.a2a_card))
        except RemoteError as exc:
            raise DecisionError(str(exc)) from None
        if not asked:
            raise DecisionError("The agent card asks for no credential: it would be sent nowhere. "
                                "Nothing was changed.")
    with transaction.atomic():
        locked = Agent.objects.select_for_update().get(pk=agent.pk)
        if locked.kind != Agent.Kind.A2A:
            raise DecisionError(f"{locked.name} is not a remote A2A agent. Nothing was changed.")
        if remove and not locked.a2a_credential:
            raise DecisionError(f"No credential is kept for {locked.name}. Nothing was changed.")
        before = "kept" if locked.a2a_credential else "none"
        locked.a2a_credential = "" if remove else credential
        locked.save(update_fields=["a2a_credential"])
        done = "removed" if remove else "replaced"
        event_agent_record(agent=locked, kind=PlanEvent.Kind.CREDENTIAL_CHANGED, actor=user,
                           reason=f"Credential of remote A2A agent {locked.name} {done} (not shown)",
                           detail={"credential": done, "diff": {"credential": [before, done]}})


def a2a_cycle(*, agent: Agent, runner: str) -> str:
    """One cycle of a remote A2A agent: cancel the tasks of cancelled plans, then give the next goal to the
    agent, or send the operator's answer, or read the open task (or follow it, when the agent streams); what is
    new is recorded."""
    remote = remote_of(agent)
    for cancelled in A2ATask.objects.filter(plan__agent=agent, plan__status=Plan.Status.CANCELLED).exclude(
            state__in=TERMINAL).select_related("plan"):
        try:
            view = a2a_remote.task_cancel(remote, cancelled.task_id)
        except RemoteError as exc:
            return f"cancel failed: {exc}"
        task_apply(task_id=cancelled.pk, view=view, agent=agent)
    plan = Plan.objects.filter(agent=agent, status__in=Plan.OPEN_STATUSES).order_by("created_at").first()
    if plan is None:
        goal = Goal.objects.filter(agent=agent, status=Goal.Status.ACTIVE, plans__isnull=True).order_by(
            "created_at").first()
        if goal is None:
            return "idle"
        return goal_send(agent=agent, goal=goal, remote=remote)
    task = A2ATask.objects.filter(plan=plan).first()
    if task is None:
        return "open plan without a task"
    if plan.status == Plan.Status.CLARIFYING:
        return "waits for the operator's answer"
    answer = plan.clarification_answer if task.state in ASKING else ""
    pushed = bool(task.push_token_hash)
    try:
        if remote.streams:
            return task_stream(agent=agent, task=task, answer=answer, remote=remote)
        if pushed and not answer and (safety := push_poll_due(task)) > timezone.now():
            Agent.objects.filter(pk=agent.pk).update(next_cycle_at=safety)
            return f"task {task.state} (followed by push notifications)"
        read_since = task.updated_at if pushed else None  # the agent may push what follows while we read
        if answer:
            view = a2a_remote.message_send(remote, answer, task_id=task.task_id, context_id=task.context_id)
            # Never sent twice; a state the agent pushed meanwhile (it took the answer) stays.
            A2ATask.objects.filter(pk=task.pk, state__in=ASKING).update(state=a2a_remote.ANSWERED)
        else:
            view = a2a_remote.task_get(remote, task.task_id)
    except RemoteError as exc:
        agent_waiting_set(agent_id=agent.pk, reason=f"the A2A agent did not answer: {exc}")
        return f"unreachable: {exc}"
    task_apply(task_id=task.pk, view=view, agent=agent, read_since=read_since)
    task_follow_soon(agent=agent, view=view, pushed=pushed)
    return f"task {view.state}"


def push_poll_due(task: A2ATask) -> datetime:
    """When a task whose updates the agent pushes is read all the same (a notification may be lost): once no
    update was recorded for A2A_PUSH_POLL_SECONDS."""
    return task.updated_at + timedelta(seconds=settings.A2A_PUSH_POLL_SECONDS)


def task_follow_soon(*, agent: Agent, view: TaskView, pushed: bool = False) -> None:
    """While the agent works on its task (neither asking nor ended), its next cycle reads the task again after
    A2A_FOLLOW_SECONDS when its cycle interval is longer (the runtime defers the next cycle at the agent's
    `next_cycle_at`): a question it comes to reaches the inbox within about that long, not a whole interval. A task
    whose updates the agent pushes is read again only after A2A_PUSH_POLL_SECONDS: its notifications wake the
    runner when there is something to do."""
    if pushed:
        if view.state not in TERMINAL and agent.cycle_interval < settings.A2A_PUSH_POLL_SECONDS:
            Agent.objects.filter(pk=agent.pk).update(
                next_cycle_at=timezone.now() + timedelta(seconds=settings.A2A_PUSH_POLL_SECONDS))
        return
    follow = settings.A2A_FOLLOW_SECONDS
    if view.state in TERMINAL or view.state in ASKING or not 0 < follow < agent.cycle_interval:
        return
    Agent.objects.filter(pk=agent.pk).update(next_cycle_at=timezone.now() + timedelta(seconds=follow))


def task_stream(*, agent: Agent, task: A2ATask, answer: str, remote: Remote) -> str:
    """Follow a streaming agent's task: the operator's answer sent on it by SendStreamingMessage (marked sent at
    its first event: never sent twice), else the task subscribed to; each event recorded as it arrives, each
    change pushed to the open pages as it commits. A task the agent no longer streams (it waits or ended) is read
    once instead. RemoteError when the agent could not be reached."""
    if answer:
        views = a2a_remote.message_stream(remote, answer, task_id=task.task_id, context_id=task.context_id)
    else:
        views = a2a_remote.task_subscribe(remote, task.task_id)
    state = task.state
    with published_apart():
        try:
            for view in views:
                if answer and state in ASKING:
                    A2ATask.objects.filter(pk=task.pk).update(state=a2a_remote.ANSWERED)
                task_apply(task_id=task.pk, view=view, agent=agent)
                state = view.state
        except RemoteError:
            if answer and state in ASKING:
                raise
            view = a2a_remote.task_get(remote, task.task_id)  # no stream to follow (it ended): read it
            task_apply(task_id=task.pk, view=view, agent=agent)
            state = view.state
    return f"task {state} (streamed)"


def goal_send(*, agent: Agent, goal: Goal, remote: Remote) -> str:
    """A plan for the goal, then the goal sent to the agent as a message (streamed when its card offers it: the
    task followed as it streams); a send that fails fails the plan."""
    label = agent_label(agent)
    with transaction.atomic():
        (plan,) = plans_create([(Plan(agent=agent, goal=goal, goal_text=goal.description[:500],
                                      status=Plan.Status.ACTIVE, model=f"remote A2A agent {agent.name}",
                                      approval_mode=Plan.ApprovalMode.ALL),
                                 "goal sent to the remote agent as an A2A message")], actor_label=label)
    try:
        if remote.streams:
            return goal_stream(agent=agent, plan=plan, goal=goal, remote=remote)
        view = a2a_remote.message_send(remote, goal.description)
    except RemoteError as exc:
        with transaction.atomic():
            locked = plan_lock(plan.pk)
            locked.status = Plan.Status.FAILED
            locked.failure_reason = str(exc)
            locked.save(update_fields=["status", "failure_reason", "updated_at"])
            # Abandoned, so that the operator may give it again when the agent is back.
            Goal.objects.filter(pk=goal.pk, status=Goal.Status.ACTIVE).update(status=Goal.Status.ABANDONED)
            event_record(plan=locked, kind=PlanEvent.Kind.PLAN_FAILED, actor_label=label, reason=str(exc))
        return f"send failed: {exc}"
    task = A2ATask.objects.create(plan=plan, task_id=view.task_id, context_id=view.context_id)
    task_apply(task_id=task.pk, view=view, agent=agent)
    pushed = False
    if view.state not in TERMINAL and remote.pushes and settings.A2A_PUSH_BASE_URL:
        pushed, view = task_push_register(agent=agent, task=task, remote=remote, view=view)
    task_follow_soon(agent=agent, view=view, pushed=pushed)
    return f"task {view.state}" + (" (followed by push notifications)" if pushed else "")


def push_token_hash(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def task_push_register(*, agent: Agent, task: A2ATask, remote: Remote, view: TaskView) -> tuple[bool, TaskView]:
    """Ask the agent to POST the task's updates to the dashboard's webhook for this task, with a new secret token
    (only its hash is kept), then read the task once: what happened before the agent took the request is recorded
    too. An agent that refuses (or cannot be reached) leaves the task polled, as if it offered no push. Whether
    push is used, and the task as last read."""
    token = secrets.token_urlsafe(32)
    A2ATask.objects.filter(pk=task.pk).update(push_token_hash=push_token_hash(token))
    url = settings.A2A_PUSH_BASE_URL + reverse("a2a-push", args=[task.pk])
    try:
        a2a_remote.push_register(remote, task.task_id, url=url, token=token)
    except RemoteError as exc:
        A2ATask.objects.filter(pk=task.pk).update(push_token_hash="")
        logger.warning("A2A agent %s refused push notifications for task %s, polled instead: %s", agent.pk,
                       task.task_id, exc)
        return False, view
    read_since = A2ATask.objects.values_list("updated_at", flat=True).get(pk=task.pk)
    try:
        view = a2a_remote.task_get(remote, task.task_id)
    except RemoteError:
        return True, view  # read at the next safety read
    task_apply(task_id=task.pk, view=view, agent=agent, read_since=read_since)
    return True, view


class PushRefused(Exception):
    """A push notification the webhook does not record: the HTTP status and why (nothing was changed)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


@dataclass(frozen=True)
class PushOutcome:
    recorded: bool  # False: the update was known already (a notification delivered twice)
    state: str


def task_push_record(*, task_pk: int, token: str, body: bytes) -> PushOutcome:
    """Record an update a remote agent POSTed for its task (A2A push notification): the token it carries must be
    the task's (compared in constant time), the body one A2A StreamResponse about this very task. The update is
    applied to the task as last known, as a streamed event is, and recorded by task_apply, the write path of
    every read; an update already known (the same one twice) changes nothing. What changed is pushed to the open
    pages, and the agent's next cycle is brought forward (its plan may have ended: the next goal is sent).
    PushRefused (404 unknown task, 401 wrong token, 400 a body that is no update of this task) changes nothing."""
    task = A2ATask.objects.filter(pk=task_pk).exclude(push_token_hash="").first()
    if task is None:
        raise PushRefused(404, "No A2A task of this dashboard takes push notifications here. Nothing was changed.")
    if not token or not hmac.compare_digest(push_token_hash(token), task.push_token_hash):
        raise PushRefused(401, "The notification's token (X-A2A-Notification-Token) is not this task's. "
                               "Nothing was changed.")
    try:
        event = a2a_remote.push_parse(body)
    except RemoteError as exc:
        raise PushRefused(400, str(exc)) from None
    if a2a_remote.push_task_id(event) != task.task_id:
        raise PushRefused(400, "The notification is about another task. Nothing was changed.")
    with transaction.atomic():
        task = A2ATask.objects.select_for_update().select_related("plan__agent").get(pk=task.pk)
        known = a2a_remote.task_of(task.snapshot)
        updated = a2a_remote.task_of(task.snapshot)
        try:
            a2a_remote.task_follow(updated, event)
        except RemoteError as exc:
            raise PushRefused(400, str(exc)) from None
        if updated == known:
            return PushOutcome(recorded=False, state=task.state)
        view = a2a_remote.task_view(updated)
        task_apply(task_id=task.pk, view=view, agent=task.plan.agent)
        operator_acted_on_commit(task.plan.agent_id)
    return PushOutcome(recorded=True, state=view.state)


def goal_stream(*, agent: Agent, plan: Plan, goal: Goal, remote: Remote) -> str:
    """The goal sent by SendStreamingMessage: the task recorded at its first event, each event after as it
    arrives. A stream that breaks after the task started leaves the plan to the next cycle (it subscribes)."""
    task: A2ATask | None = None
    state = ""
    with published_apart():
        try:
            for view in a2a_remote.message_stream(remote, goal.description):
                if task is None:
                    task = A2ATask.objects.create(plan=plan, task_id=view.task_id, context_id=view.context_id)
                task_apply(task_id=task.pk, view=view, agent=agent)
                state = view.state
        except RemoteError as exc:
            if task is None:
                raise
            agent_waiting_set(agent_id=agent.pk, reason=f"the A2A agent's stream broke: {exc}")
            return f"stream broke: {exc}"
    if task is None:
        raise RemoteError("The A2A agent answered nothing.")
    return f"task {state} (streamed)"


@transaction.atomic
def task_apply(*, task_id: int, view: TaskView, agent: Agent, read_since: datetime | None = None) -> None:
    """Record what is new in the task: its agent messages and artifacts as completed steps, its new state as an
    event with the diff, and what the state means for the plan; the task as read kept as its snapshot. A read
    begun when the task was as recorded at `read_since` is dropped when a pushed update was recorded since: it may
    be older than that update (the next read or notification brings what is newer)."""
    task = A2ATask.objects.select_for_update().get(pk=task_id)
    if read_since is not None and task.updated_at != read_since:
        return
    plan = plan_lock(task.plan_id)
    label = agent_label(agent)
    new_steps: list[tuple[str, str, str]] = []  # key, description, result
    # A message is known by its id, whichever way it came (read, streamed or pushed, in whatever order); a task
    # recorded before ids were kept knows its first `messages_seen` messages by their place.
    by_place = not task.message_ids_seen
    seen = set(task.message_ids_seen)
    for index, ((role, text), message_id) in enumerate(zip(view.messages, view.message_ids, strict=True)):
        if message_id in seen:
            continue
        seen.add(message_id)
        task.message_ids_seen.append(message_id)
        if by_place and index < task.messages_seen:
            continue
        if role == "agent" and text and text != plan.clarification_question:
            new_steps.append((f"m{len(task.message_ids_seen)}", text, text))
    for artifact_id, name, text in view.artifacts:
        if artifact_id not in task.artifacts_seen:
            task.artifacts_seen.append(artifact_id)
            new_steps.append((f"a{len(task.artifacts_seen)}", f"Artifact {name or artifact_id}", text))
    steps_reported(plan=plan, actor_label=label, reported=[
        StepReport(PlanStep(key=key[:32], description=description[:500], status=PlanStep.Status.COMPLETED,
                            result=result[:20000]), description) for key, description, result in new_steps])
    task.messages_seen = max(task.messages_seen, len(view.messages))
    task.snapshot = view.task_json or task.snapshot
    old_state, task.state = task.state, view.state
    task.save(update_fields=["messages_seen", "message_ids_seen", "artifacts_seen", "snapshot", "state",
                             "updated_at"])
    if old_state == view.state:
        return
    event_record(plan=plan, kind=PlanEvent.Kind.TASK_STATE, actor_label=label, reason=view.status_text[:4000],
                 detail={"task": view.task_id, "diff": {"state": [old_state, view.state]}})
    if view.state in ASKING and plan.is_open:
        question = view.status_text or f"The agent's task is {view.state}; it gave no question."
        plan.status = Plan.Status.CLARIFYING
        plan.clarification_question = question[:4000]
        plan.clarification_answer = ""
        plan.replan_reason = ""
        plan.save(update_fields=["status", "clarification_question", "clarification_answer", "replan_reason",
                                 "updated_at"])
        agent_waiting_set(agent_id=agent.pk, reason=f"plan v{plan.version} asks: {question}")
        event_record(plan=plan, kind=PlanEvent.Kind.CLARIFICATION_ASKED, actor_label=label, reason=question[:4000],
                     detail={"question": question, "task_state": view.state})
    elif view.state not in TERMINAL:
        if plan.replan_reason:  # an answer the agent has now received
            plan.replan_reason = ""
            plan.save(update_fields=["replan_reason", "updated_at"])
        agent_waiting_set(agent_id=agent.pk, reason="")
    elif plan.is_open:
        terminal_apply(plan=plan, view=view, label=label)


def terminal_apply(*, plan: Plan, view: TaskView, label: str) -> None:
    """The task ended on the agent's side: the plan ends as the task did."""
    if view.state == a2a_remote.COMPLETED:
        plan.status, kind, goal_status = Plan.Status.COMPLETED, PlanEvent.Kind.PLAN_COMPLETED, Goal.Status.COMPLETED
    elif view.state == a2a_remote.CANCELED:
        plan.status, kind, goal_status = Plan.Status.CANCELLED, PlanEvent.Kind.PLAN_CANCELLED, Goal.Status.ABANDONED
    else:
        plan.status, kind, goal_status = Plan.Status.FAILED, PlanEvent.Kind.PLAN_FAILED, Goal.Status.ABANDONED
        plan.failure_reason = view.status_text or f"the agent's task is {view.state}"
    plan.replan_reason = ""
    plan.save(update_fields=["status", "failure_reason", "replan_reason", "updated_at"])
    steps = plans_steps_close([plan], now=timezone.now()).get(plan.pk, [])
    if plan.goal_id:
        Goal.objects.filter(pk=plan.goal_id, status=Goal.Status.ACTIVE).update(status=goal_status)
    agent_waiting_set(agent_id=plan.agent_id, reason="")
    reason, detail, step_events = plan_closed_steps_said(plan, steps, reason=view.status_text[:3000], actor=None,
                                                         actor_label=label)
    if step_events:
        events_traced(PlanEvent.objects.bulk_create(step_events))
        events_may_notify_on_commit()
    event_record(plan=plan, kind=kind, actor_label=label, reason=reason[:4000],
                 detail={"task": view.task_id, "task_state": view.state} | (detail if steps else {}))
