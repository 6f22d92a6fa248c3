"""Writes to an agent's row and its goals: an operator creates a tool agent, puts files into its workspace,
pauses, resumes or stops it or gives it a goal; the planner records what it waits for and its earliest automatic
retry."""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from django.conf import settings
from django.contrib.auth.models import User
from django.db import IntegrityError, transaction
from django.db.models import Subquery

from agents.models import Agent
from agents.tools import (
    TOOLS,
    ToolError,
    upload_folder_problem,
    upload_name_problem,
    workspace_resolve,
    workspace_upload_stage,
)
from goals.models import Goal
from goals.system import MAX_GOALS
from planner_site.validators import text_problem
from planning.models import Plan, PlanEvent, PlanStep
from planning.services.errors import DecisionError
from planning.services.events import event_agent_record, event_record
from planning.services.transactions import atomic_retried


@atomic_retried
def agent_set_status(*, agent: Agent, user: User, status: str) -> Agent:
    """Pause, resume or stop an agent; recorded on its open plan's timeline when it has one."""
    if status not in Agent.Status.values:
        raise DecisionError(f"Unknown status {status!r}.")
    agent = Agent.objects.select_for_update(no_key=True).get(pk=agent.pk)
    if agent.status == status:
        raise DecisionError(f"{agent.name} is already {agent.get_status_display().lower()}.")
    old = agent.status
    agent.status = status
    agent.save(update_fields=["status"])
    plan = Plan.objects.filter(agent=agent).open().order_by("-created_at").first()
    kind = {Agent.Status.RUNNING: PlanEvent.Kind.AGENT_RESUMED, Agent.Status.PAUSED: PlanEvent.Kind.AGENT_PAUSED,
            Agent.Status.STOPPED: PlanEvent.Kind.AGENT_STOPPED}[Agent.Status(status)]
    if plan is not None:
        event_record(plan=plan, kind=kind, actor=user, reason=f"{old} -> {status}")
    else:
        event_agent_record(agent=agent, kind=kind, actor=user, reason=f"{old} -> {status}")
    return agent


@atomic_retried
def agent_give_goal(*, agent: Agent, user: User, description: str, horizon: str = Goal.Horizon.SHORT) -> Goal:
    """Give an agent a goal in words; the runner plans it next cycle."""
    description = " ".join(description.split())
    if not description:
        raise DecisionError("Describe the goal. Nothing was changed.")
    if problem := text_problem(description, max_length=500):
        raise DecisionError(f"The goal {problem}. Nothing was changed.")
    if horizon not in Goal.Horizon.values:
        raise DecisionError(f"Unknown horizon {horizon!r}.")
    agent = Agent.objects.select_for_update(no_key=True).get(pk=agent.pk)
    if agent.kind == Agent.Kind.EXTERNAL:
        raise DecisionError(f"{agent.name} runs elsewhere and submits its own plans over the API; it cannot be "
                            "given a goal here. Nothing was changed.")
    if agent.kind == Agent.Kind.AGUI:  # its goal starts a run: planning/services/agui.py agui_goal_give
        raise DecisionError(f"{agent.name} is a remote AG-UI agent: give it its goal from its page, which starts "
                            "its run. Nothing was changed.")
    active = Goal.objects.filter(agent=agent).active()
    if active.filter(description__iexact=description).exists():
        raise DecisionError(f"{agent.name} already has this goal.")
    if active.count() >= MAX_GOALS:  # seed 001's cap holds for an operator's goals too
        raise DecisionError(f"{agent.name} already has {MAX_GOALS} active goals, the most an agent pursues at once; "
                            "finish or abandon one first. Nothing was changed.")
    goal = Goal.objects.create(agent=agent, description=description[:500], horizon=horizon, confidence=1.0)
    event_agent_record(agent=agent, kind=PlanEvent.Kind.GOAL_GIVEN, actor=user, reason=goal.description,
                       detail={"goal": goal.pk, "horizon": horizon})
    return goal


def agent_waiting_set(*, agent_id: int, reason: str, retry_sync: bool = False) -> None:
    """What the agent waits for, on its row (the dashboard's "waiting" filter and count); pushed with the
    caller's event. With retry_sync, the earliest automatic retry too, in the same statement (agent_retry_sync).

    An empty `reason` (what it waited for was decided, or it plans afresh) leaves on the row whatever else still
    waits for an operator (waiting_still): a persona plans its next goal while another plan's step awaits
    approval, and that step is still in the inbox. Every wait writes its reason when it starts, so a row that
    says nothing waits is left alone (one UPDATE that matches nothing, the common case, as in every planning),
    and only a row that said something is read again."""
    reason = reason[:300]
    row = Agent.objects.filter(pk=agent_id)
    if retry_sync:
        row.update(waiting_reason=reason, plan_retry_at=agent_retry_earliest(agent_id=agent_id))
        cleared = not reason  # whether it said something before is not known here: read
    else:  # a row that says so already is not written
        cleared = bool(row.exclude(waiting_reason=reason).update(waiting_reason=reason)) and not reason
    if cleared and (still := waiting_still(agent_id=agent_id)):
        row.update(waiting_reason=still[:300])


def waiting_still(*, agent_id: int) -> str:
    """What the agent still waits on (waiting_still_many, for one agent)."""
    return waiting_still_many([agent_id])[agent_id]


def waiting_still_many(agent_ids: Sequence[int]) -> dict[int, str]:
    """What each agent still waits on, as the services word it: a step awaiting approval in an active plan (the
    one waiting longest), else a plan awaiting approval, else a plan's question, else "" (what the inbox counts:
    operator_selectors.inbox_count). Two queries whatever the number of agents. (An expression computing this
    inside the UPDATE cost more CPU to build than these two queries.)"""
    still = dict.fromkeys(agent_ids, "")
    # The steps of their active plans, filtered here: a status in the query let PostgreSQL scan every waiting
    # step of the fleet (1,000 at 1,000 agents) when its statistics were young (the scale bench's first minute).
    steps = sorted((updated, pk, agent_id, key) for agent_id, key, status, updated, pk in PlanStep.objects.filter(
        plan__agent_id__in=still, plan__status=Plan.Status.ACTIVE).values_list(
        "plan__agent_id", "key", "status", "updated_at", "pk") if status == PlanStep.Status.AWAITING_APPROVAL)
    for _, _, agent_id, key in reversed(steps):  # the earliest last: it stands
        still[agent_id] = f"step {key} awaits approval"
    rest = [pk for pk, reason in still.items() if not reason]
    plans = (Plan.objects.filter(agent_id__in=rest).waiting()
             .order_by("-status", "-created_at", "-pk")  # "awaiting_approval" sorts before "needs_clarification"
             .only("agent_id", "status", "version", "clarification_question")) if rest else []
    for plan in plans:  # the first in that order last: it stands
        if plan.status == Plan.Status.AWAITING_APPROVAL:
            still[plan.agent_id] = f"plan v{plan.version} awaits approval"
        else:
            still[plan.agent_id] = f"plan v{plan.version} asks: {plan.clarification_question}"
    return still


def agents_waiting_refresh(agent_ids: Sequence[int]) -> None:
    """agent_waiting_set(reason="") for many agents whose rows said something waits (a runner's pass starting
    their plans): each row says what still waits (waiting_still_many), written only where it says otherwise, one
    UPDATE per reason. Per agent, the clear and the reads again were four statements of every planning in the
    scale bench's first minute, where most personas have a step in the inbox."""
    if not agent_ids:
        return
    by_reason: dict[str, list[int]] = {}
    for agent_id, reason in waiting_still_many(agent_ids).items():
        by_reason.setdefault(reason[:300], []).append(agent_id)
    for reason, ids in by_reason.items():
        Agent.objects.filter(pk__in=ids).exclude(waiting_reason=reason).update(waiting_reason=reason)


def agent_retry_earliest(*, agent_id: int) -> Subquery:
    """The earliest automatic retry of the agent's failed plans, as a subquery for an UPDATE of its row."""
    return Subquery(Plan.objects.filter(agent_id=agent_id, status=Plan.Status.FAILED, retry_at__isnull=False)
                    .order_by("retry_at").values("retry_at")[:1])


def agent_retry_sync(*, agent_id: int) -> None:
    """The agent row keeps the earliest automatic retry of its failed plans, so a cycle knows without a query."""
    Agent.objects.filter(pk=agent_id).update(plan_retry_at=agent_retry_earliest(agent_id=agent_id))


# --- an operator creates a tool agent and puts files into its workspace (the dashboard's New agent, the agent
# page's Upload files) ---

UPLOAD_MAX_FILES = 20  # files in one upload


@dataclass(frozen=True)
class Upload:
    """One file an operator puts into an agent's workspace: its name (no folder) and its bytes."""

    name: str
    data: bytes


def size_shown(size: int) -> str:
    """1536 -> "1.5 KB": sizes as people read them (1 KB = 1,024 bytes)."""
    value = float(size)
    for unit in ("bytes", "KB", "MB"):
        if value < 1024 or unit == "MB":
            return f"{int(value)} bytes" if unit == "bytes" else f"{value:.1f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")


def agent_name_clean(name: str) -> str:
    """An agent's name as stored (spaces collapsed); DecisionError when it is empty, unprintable or too long."""
    name = " ".join(name.split())
    if not name:
        raise DecisionError("Name the agent. Nothing was changed.")
    if problem := text_problem(name, max_length=100):
        raise DecisionError(f"The name {problem}. Nothing was changed.")
    return name


def agent_name_taken(name: str) -> DecisionError:
    """The refusal of a name another agent has (found before the insert, or by the unique constraint after)."""
    return DecisionError(f"An agent named {name} already exists; choose another name. Nothing was changed.")


@atomic_retried
def agent_create(*, user: User, name: str, backstory: str = "", tools: Sequence[str]) -> Agent:
    """Create a tool agent that may use the given built-in tools (agents/tools.py), running: it plans the goals
    it is given, in its own empty workspace. Recorded as an `Agent created` event naming the operator."""
    name = agent_name_clean(name)
    backstory = backstory.strip()
    if problem := text_problem(backstory, max_length=2000):
        raise DecisionError(f"The description {problem}. Nothing was changed.")
    chosen = sorted(set(tools))
    if not chosen:
        raise DecisionError("Choose at least one tool the agent may use. Nothing was changed.")
    if unknown := [tool for tool in chosen if tool not in TOOLS]:
        raise DecisionError(f"Unknown tools: {', '.join(unknown)}. Nothing was changed.")
    if Agent.objects.filter(name__iexact=name).exists():
        raise agent_name_taken(name)
    try:
        with transaction.atomic():  # two operators creating the same name at once: the second is told so
            agent = Agent.objects.create(name=name, backstory=backstory, kind=Agent.Kind.TOOL, tools=chosen)
    except IntegrityError:
        raise agent_name_taken(name) from None
    risky = [tool for tool in chosen if TOOLS[tool].risky]
    event_agent_record(agent=agent, kind=PlanEvent.Kind.AGENT_CREATED, actor=user,
                       reason=f"Tool agent {name} created with {len(chosen)} tools: {', '.join(chosen)}",
                       detail={"tools": chosen, "risky_tools": risky, "diff": {"created": ["", name]}})
    return agent


def workspace_upload(*, agent: Agent, user: User, uploads: Sequence[Upload], folder: str = "",
                     replace: bool = False) -> list[str]:
    """Put files into a tool agent's workspace, in `folder` (relative; "" is the workspace itself): every name,
    the folder and the total size checked first (WORKSPACE_UPLOAD_MAX_BYTES), a file of the same name kept unless
    `replace`, each path confined to the workspace through symbolic links too. Either every file is put in place
    and one `Files uploaded` event records them, or none is and the refusal says why. Returns their paths."""
    created: list[Path] = []  # files this upload made, removed again when it does not commit
    try:
        return workspace_upload_recorded(agent=agent, user=user, uploads=uploads, folder=folder, replace=replace,
                                         created=created)
    except BaseException:
        for path in created:
            path.unlink(missing_ok=True)
        raise


@atomic_retried
def workspace_upload_recorded(*, agent: Agent, user: User, uploads: Sequence[Upload], folder: str, replace: bool,
                              created: list[Path]) -> list[str]:
    for path in created:  # an attempt rolled back (a conflict retried): its files go with it
        path.unlink(missing_ok=True)
    created.clear()
    if agent.kind != Agent.Kind.TOOL:
        raise DecisionError(f"{agent.name} is not a tool agent: only tool agents work on files in a workspace. "
                            "Nothing was changed.")
    if not uploads:
        raise DecisionError("Choose at least one file to upload. Nothing was changed.")
    if len(uploads) > UPLOAD_MAX_FILES:
        raise DecisionError(f"{len(uploads)} files at once; upload at most {UPLOAD_MAX_FILES}. Nothing was changed.")
    problems = [problem for upload in uploads if (problem := upload_name_problem(upload.name))]
    folder = folder.strip().replace("\\", "/").rstrip("/")
    if folder and (problem := upload_folder_problem(folder)):
        problems.append(problem)
    names = [upload.name for upload in uploads]
    if doubled := sorted({n for n in names if names.count(n) > 1}):
        problems.append(f"{', '.join(doubled)} chosen twice")
    total = sum(len(upload.data) for upload in uploads)
    limit = int(settings.WORKSPACE_UPLOAD_MAX_BYTES)
    if total > limit:
        problems.append(f"the files hold {size_shown(total)}, more than the {size_shown(limit)} an upload may "
                        "hold (WORKSPACE_UPLOAD_MAX_BYTES)")
    if problems:
        raise DecisionError(f"Not uploaded: {'; '.join(problems)}. Nothing was changed.")
    agent = Agent.objects.select_for_update(no_key=True).get(pk=agent.pk)  # one upload into a workspace at a time
    staged: list[tuple[Path, Path, str, bool]] = []
    try:
        refused = []
        for upload in uploads:
            rel = f"{folder}/{upload.name}" if folder else upload.name
            try:
                existed = workspace_resolve(agent.workspace, rel).exists()
                temporary, target = workspace_upload_stage(agent.workspace, rel, upload.data, replace=replace)
            except ToolError as exc:
                refused.append(str(exc))
                continue
            staged.append((temporary, target, rel, existed))
        if refused:
            raise DecisionError(f"Not uploaded: {'; '.join(refused)}. Nothing was changed.")
        files = [{"path": rel, "bytes": len(upload.data), "replaced": existed}
                 for (_, _, rel, existed), upload in zip(staged, uploads, strict=True)]
        listed = ", ".join(f"{rel} ({size_shown(len(upload.data))}{', replaced' if existed else ''})"
                           for (_, _, rel, existed), upload in zip(staged, uploads, strict=True))
        event_agent_record(agent=agent, kind=PlanEvent.Kind.FILES_UPLOADED, actor=user,
                           reason=f"Uploaded {len(files)} file{'s' if len(files) > 1 else ''}: {listed}"[:4000],
                           detail={"files": files, "folder": folder})
        for temporary, target, _, existed in staged:
            os.replace(temporary, target)
            if not existed:
                created.append(target)
        staged = []
        return [str(f["path"]) for f in files]
    finally:
        for temporary, *_ in staged:  # refused or failed before they were put in place
            temporary.unlink(missing_ok=True)
