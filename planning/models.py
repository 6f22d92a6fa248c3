"""Plans, their steps, and the events that are at once audit log, timeline and replay."""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from typing import Any

from django.conf import settings
from django.core.validators import MaxValueValidator, MinValueValidator
from django.db import models
from django.db.models import Q
from django.urls import reverse

from planner_site import tracing
from planning.engine.schedule import steps_runnable
from planning.engine.shown import input_preview, steps_fingerprint
from planning.engine.validate import StepSpec


class PlanQuerySet(models.QuerySet["Plan"]):
    """The filters written again and again over plans."""

    def open(self) -> PlanQuerySet:
        """Plans still in play: drafting, planning, asking, awaiting approval or active."""
        return self.filter(status__in=Plan.OPEN_STATUSES)

    def held(self) -> PlanQuerySet:
        """Plans that hold their goal: open, failed (a failed planning retries), or done but not verified (the
        operator decides what next)."""
        return self.filter(status__in=[*Plan.OPEN_STATUSES, Plan.Status.FAILED, Plan.Status.UNVERIFIED])

    def waiting(self) -> PlanQuerySet:
        """Plans that wait for a person: a question of the planner, or a plan awaiting approval that was not sent
        back for a new version (declined with feedback, it waits for its agent)."""
        return self.filter(models.Q(status__in=[Plan.Status.CLARIFYING, Plan.Status.UNVERIFIED])
                           | models.Q(status=Plan.Status.AWAITING_APPROVAL, replan_reason=""))


class Plan(models.Model):
    """One version of an agent's plan for a goal; a replan makes version n+1 linked to version n."""

    class Status(models.TextChoices):
        DRAFT = "draft", "Draft"
        VALIDATING = "validating", "Validating"
        CLARIFYING = "needs_clarification", "Needs clarification"
        REJECTED = "rejected", "Rejected"
        AWAITING_APPROVAL = "awaiting_approval", "Awaiting approval"
        ACTIVE = "active", "Active"
        COMPLETED = "completed", "Completed"
        FAILED = "failed", "Failed"
        CANCELLED = "cancelled", "Cancelled"
        REPLANNED = "replanned", "Replanned"
        CLARIFICATION_ASKED = "clarification_asked", "Clarification asked"
        CLARIFIED = "clarified", "Clarification answered"
        STEP_ROLLED_BACK = "step_rolled_back", "Step rolled back"
        # Every step ran, but the outcome the goal asks for was not found (planning/engine/goal_check.py
        # outcome_check): the goal stays open and the operator is asked what next.
        UNVERIFIED = "unverified", "Done, not verified"
        # A person took a "Done, not verified" plan as done (plan_accept_done): closed by their decision, and
        # never shown as verified.
        ACCEPTED = "accepted", "Accepted as done, not verified"

    class ApprovalMode(models.TextChoices):
        PENDING = "pending", "Not yet chosen"
        ALL = "all", "All steps"
        STEP = "step", "Step by step"

    OPEN_STATUSES = (Status.DRAFT, Status.VALIDATING, Status.CLARIFYING, Status.AWAITING_APPROVAL, Status.ACTIVE)

    # plan_agent_status_idx (agent, status) serves every lookup by agent.
    agent = models.ForeignKey("agents.Agent", on_delete=models.CASCADE, related_name="plans", db_index=False)
    goal = models.ForeignKey("goals.Goal", null=True, blank=True, on_delete=models.SET_NULL, related_name="plans")
    goal_text = models.CharField(max_length=500, help_text="The goal in the words the plan was made for")
    version = models.PositiveIntegerField(default=1)
    previous = models.OneToOneField("self", null=True, blank=True, on_delete=models.SET_NULL, related_name="next_version")
    status = models.CharField(max_length=24, choices=Status, default=Status.DRAFT)
    who = models.CharField(max_length=300, blank=True)
    what = models.CharField(max_length=500, blank=True)
    when = models.CharField(max_length=300, blank=True)
    where = models.CharField(max_length=300, blank=True)
    why = models.CharField(max_length=500, blank=True)
    thinking_summary = models.TextField(blank=True)
    confidence = models.FloatField(default=0.5, validators=[MinValueValidator(0.0), MaxValueValidator(1.0)])
    risks = models.JSONField(default=list, blank=True)
    approval_mode = models.CharField(max_length=8, choices=ApprovalMode, default=ApprovalMode.PENDING)
    times_replanned = models.PositiveIntegerField(default=0)
    model = models.CharField(max_length=200, blank=True, help_text="The model whose plan was accepted")
    edited_by = models.CharField(max_length=150, blank=True,
                                 help_text="The operator who wrote this version in the plan editor; empty when planned")
    retry_hints = models.JSONField(default=list, blank=True)
    failure_reason = models.TextField(blank=True)
    replan_reason = models.TextField(blank=True, help_text="Set when a replan is due; the runner replans next cycle")
    clarification_question = models.TextField(blank=True, help_text="What the planner asks the operator (seed 003)")
    clarification_answer = models.TextField(blank=True, help_text="The operator's answer; planning resumes with it")
    planning_retry = models.PositiveIntegerField(default=0, help_text="Automatic retries of planning before this version")
    retry_at = models.DateTimeField(null=True, blank=True, help_text="When a failed planning is tried again")
    # The W3C trace of the plan's lineage (docs/tracing.md): set when the lineage starts, kept by versions n+1.
    trace_id = models.CharField(max_length=32, blank=True, default=tracing.lineage_trace_id,
                                help_text="The lineage's W3C trace id")
    trace_root_id = models.CharField(max_length=16, blank=True, default=tracing.span_id_new,
                                     help_text="The span id of the lineage's root span")
    trace_parent_id = models.CharField(max_length=16, blank=True, default=tracing.lineage_parent_id,
                                       help_text="The caller's span the root span is a child of (its traceparent)")
    trace_exported_through = models.PositiveBigIntegerField(
        default=0, help_text="On a lineage's first version: the last event whose closed spans were exported")
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    objects = PlanQuerySet.as_manager()

    class Meta:
        ordering = ["-created_at"]
        indexes = [
            models.Index(fields=["agent", "status"], name="plan_agent_status_idx"),  # an agent's open plan
            models.Index(fields=["agent", "-created_at"], name="plan_agent_latest_idx"),  # the dashboard's latest plan
            # The dashboard's failing agents: those with a failed plan at all (selectors.failing_agent_ids).
            models.Index(fields=["agent"], condition=models.Q(status="failed"), name="plan_failed_idx"),
        ]
        permissions = [("decide_plan", "Can approve, decline and edit plans and steps")]

    def __str__(self) -> str:
        return f"{self.goal_text} (v{self.version})"

    def get_absolute_url(self) -> str:
        return reverse("plan-detail", args=[self.pk])

    @property
    def is_open(self) -> bool:
        return self.status in self.OPEN_STATUSES

    def trace_ids(self) -> dict[str, str]:
        """The lineage's trace, as its next version keeps it (docs/tracing.md)."""
        return {"trace_id": self.trace_id, "trace_root_id": self.trace_root_id, "trace_parent_id": self.trace_parent_id}

    @property
    def planned_by(self) -> str:
        """Who made this version, as the operator is told: the person who wrote it in the plan editor, the model
        whose plan was accepted, or "rules" (the one-step shortcut, a question asked before any model: no model)."""
        return self.edited_by or self.model or "rules"


class PlanStep(models.Model):
    """One step: a persona action hint or a tool call, with dependencies on other steps of its plan."""

    class Status(models.TextChoices):
        PENDING = "pending", "Pending"
        AWAITING_APPROVAL = "awaiting_approval", "Awaiting approval"
        RUNNING = "running", "Running"
        COMPLETED = "completed", "Completed"
        FAILED = "failed", "Failed"
        SKIPPED = "skipped", "Skipped"
        DECLINED = "declined", "Declined"
        ROLLED_BACK = "rolled_back", "Rolled back"
        CANCELLED = "cancelled", "Cancelled"  # it was running when its plan was closed

    DONE_STATUSES = (Status.COMPLETED, Status.SKIPPED)  # settled: a dependency met, kept by a replan

    class Risk(models.TextChoices):
        SAFE = "safe", "Safe"
        RISKY = "risky", "Risky"

    # step_position_unique_in_plan (plan, position) serves every lookup by plan.
    plan = models.ForeignKey(Plan, on_delete=models.CASCADE, related_name="steps", db_index=False)
    key = models.CharField(max_length=32, help_text="The step id the planner gave it")
    position = models.PositiveIntegerField()
    description = models.CharField(max_length=500)
    action_hint = models.CharField(max_length=200, blank=True)
    tool = models.CharField(max_length=64, blank=True)
    tool_input = models.JSONField(default=dict, blank=True)
    expected_outcome = models.CharField(max_length=500, blank=True)
    estimated_cycles = models.PositiveIntegerField(default=1)
    actual_cycles = models.PositiveIntegerField(default=0)
    depends_on = models.JSONField(default=list, blank=True, help_text="Keys of steps of this plan that must complete first")
    requires_permission = models.BooleanField(default=False)
    risk = models.CharField(max_length=8, choices=Risk, default=Risk.SAFE)
    status = models.CharField(max_length=24, choices=Status, default=Status.PENDING)
    retries = models.PositiveIntegerField(default=0)
    max_retries = models.PositiveIntegerField(default=2)
    overrides = models.PositiveIntegerField(default=0, help_text="Consecutive cycles an urgent need overrode this step")
    result = models.TextField(blank=True)
    error = models.TextField(blank=True)
    failure_reason = models.TextField(blank=True)
    carried_over = models.BooleanField(default=False, help_text="Completed in an earlier version and kept")
    tools_needed = models.JSONField(default=list, blank=True, help_text="The tools this step needs (seed 004)")
    loop = models.JSONField(
        default=dict, blank=True,
        help_text='Seed 002 loops: {"for_each": key, "items_from": {tool, input}} or {"repeat": n}',
    )
    precheck = models.TextField(blank=True, help_text="What the step will touch, checked before it runs")
    elapsed_ms = models.PositiveIntegerField(null=True, blank=True, help_text="How long the step took")
    approved_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="approved_steps"
    )
    start_after = models.DateTimeField(
        null=True, blank=True,
        help_text="A policy approved this step: it starts no earlier than this, so its approval can be undone")
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["plan", "position"]
        constraints = [
            models.UniqueConstraint(fields=["plan", "key"], name="step_key_unique_in_plan"),
            models.UniqueConstraint(fields=["plan", "position"], name="step_position_unique_in_plan"),
        ]
        indexes = [
            models.Index(fields=["status"], name="step_status_idx"),  # the runner looks for runnable steps
            # The dashboard's failing agents: those with a failed or retried step at all (selectors.failing_agent_ids).
            models.Index(fields=["plan"], condition=models.Q(status="failed") | models.Q(retries__gt=0),
                         name="step_troubled_idx"),
        ]

    def __str__(self) -> str:
        return f"{self.plan} step {self.key}"

    def needs_approval(self, plan: Plan) -> bool:
        """Seed 002/003: a step flagged requires-permission always waits for an operator, and in step-by-step
        mode every step does, until one approves it. One rule for built-in and external agents."""
        return self.approved_by_id is None and (self.requires_permission or plan.approval_mode == Plan.ApprovalMode.STEP)

    @property
    def is_done(self) -> bool:
        return self.status in self.DONE_STATUSES

    @property
    def input_display(self) -> str:
        """The tool input as the JSON the planner wrote."""
        return json.dumps(self.tool_input, ensure_ascii=False)

    @property
    def input_preview(self) -> str:
        """The tool input as an operator reads it before approving: paths whole, written content previewed."""
        return input_preview(self.tool_input if isinstance(self.tool_input, dict) else {})

    def shown_values(self) -> dict[str, Any]:
        """What the operator approves of this step (planning/engine/shown.py FINGERPRINT_FIELDS)."""
        return {"key": self.key, "description": self.description, "tool": self.tool, "input": self.tool_input,
                "action_hint": self.action_hint, "requires_permission": self.requires_permission,
                "depends_on": self.depends_on, "loop": self.loop}

    def spec(self) -> StepSpec:
        """The step as the product's one step type: what it does, without its row state."""
        return StepSpec.from_step(self)

    def diff_values(self) -> dict[str, Any]:
        """The step as plain values for a diff (stored in events, shown on the compare page): its spec and,
        alongside it, its status."""
        return self.spec().as_dict() | {"status": self.status}


def steps_shown_fingerprint(steps: Iterable[PlanStep]) -> str:
    """The fingerprint of steps as an approve form shows them, in plan order (planning/engine/shown.py)."""
    return steps_fingerprint(s.shown_values() for s in sorted(steps, key=lambda s: s.position))


def step_current(steps: Sequence[PlanStep]) -> PlanStep | None:
    """The step a plan is on, one rule for the runner, the dashboard and the plan page: the step waiting for an
    operator, else the running one, else the next pending step whose dependencies are done (none when every
    pending step is blocked). `steps` in plan order."""
    for status in (PlanStep.Status.AWAITING_APPROVAL, PlanStep.Status.RUNNING):
        for step in steps:
            if step.status == status:
                return step
    keys = steps_runnable([(s.key, s.status, s.depends_on) for s in steps], limit=1)
    return next((s for s in steps if s.key in keys), None)


class PlanEvent(models.Model):
    """Who did what, when, why, and the diff: the audit log, the timeline on the page, the replay of a run."""

    class Kind(models.TextChoices):
        CREATED = "created", "Plan created"
        ATTEMPT_REJECTED = "attempt_rejected", "Attempt rejected"
        VALIDATED = "validated", "Plan validated"
        PLAN_APPROVED = "plan_approved", "Plan approved"
        PLAN_CANCELLED = "plan_cancelled", "Plan cancelled"
        STEP_STARTED = "step_started", "Step started"
        STEP_COMPLETED = "step_completed", "Step completed"
        STEP_FAILED = "step_failed", "Step failed"
        STEP_RETRIED = "step_retried", "Step retried"
        STEP_AWAITING = "step_awaiting", "Step awaits approval"
        STEP_APPROVED = "step_approved", "Step approved"
        STEP_DECLINED = "step_declined", "Step declined"
        STEP_OVERRIDDEN = "step_overridden", "Step overridden"
        STEP_EDITED = "step_edited", "Step edited"
        REPLANNED = "replanned", "Replanned"
        CLARIFICATION_ASKED = "clarification_asked", "Clarification asked"
        CLARIFIED = "clarified", "Clarification answered"
        STEP_ROLLED_BACK = "step_rolled_back", "Step rolled back"
        PLAN_COMPLETED = "plan_completed", "Plan completed"
        PLAN_UNVERIFIED = "plan_unverified", "Done, not verified"
        PLAN_ACCEPTED = "plan_accepted", "Accepted as done, not verified"
        PLAN_FAILED = "plan_failed", "Plan failed"
        PLAN_RETRIED = "plan_retried", "Planning retried"
        ADMIN_EDIT = "admin_edit", "Edited in admin"
        AGENT_PAUSED = "agent_paused", "Agent paused"
        AGENT_RESUMED = "agent_resumed", "Agent resumed"
        AGENT_STOPPED = "agent_stopped", "Agent stopped"
        STEP_SKIPPED = "step_skipped", "Step skipped"
        STEP_CANCELLED = "step_cancelled", "Step cancelled"
        REPLAN_REQUESTED = "replan_requested", "Replan requested"
        PLAN_EDITED = "plan_edited", "Plan edited"
        GOAL_GIVEN = "goal_given", "Goal given"
        GOAL_COMPLETED = "goal_completed", "Goal completed"
        GOAL_ABANDONED = "goal_abandoned", "Goal abandoned"
        ESCALATED = "escalated", "Escalated"
        BUDGET_REACHED = "budget_reached", "Budget reached"
        DECISION_UNDONE = "decision_undone", "Automatic decision undone"
        GOALS_GENERATED = "goals_generated", "Goals generated"
        MILESTONE_CHECKED = "milestone_checked", "Milestone checked"
        TOOLS_DECLARED = "tools_declared", "Tools declared"
        ADMIN_DELETE = "admin_delete", "Deleted in admin"
        TOKEN_REVOKED = "token_revoked", "API token revoked"
        AGENT_CREATED = "agent_created", "Agent created"
        FILES_UPLOADED = "files_uploaded", "Files uploaded"
        TOKEN_ISSUED = "token_issued", "API token issued"
        ROLES_CHANGED = "roles_changed", "Roles changed"
        TASK_STATE = "task_state", "Remote task state changed"
        AGENT_REPORTED = "agent_reported", "Reported by the agent"
        CREDENTIAL_CHANGED = "credential_changed", "Credential changed"

    # A goal given to an agent, or an admin change to an agent without an open plan, has no plan.
    # planevent_timeline_idx (plan, created_at) and planevent_agent_idx (agent, created_at) serve every lookup by
    # plan and by agent.
    plan = models.ForeignKey(Plan, null=True, blank=True, on_delete=models.CASCADE, related_name="events",
                             db_index=False)
    agent = models.ForeignKey("agents.Agent", null=True, blank=True, on_delete=models.CASCADE, related_name="events",
                              db_index=False)
    step = models.ForeignKey(PlanStep, null=True, blank=True, on_delete=models.SET_NULL, related_name="events")
    kind = models.CharField(max_length=24, choices=Kind)
    actor = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="plan_events")
    actor_label = models.CharField(max_length=150, help_text="The operator's username, or 'runner <id>'")
    reason = models.TextField(blank=True)
    detail = models.JSONField(default=dict, blank=True)
    created_at = models.DateTimeField(auto_now_add=True, db_index=False)

    class Meta:
        ordering = ["-created_at", "-id"]
        indexes = [
            models.Index(fields=["plan", "-created_at"], name="planevent_timeline_idx"),  # a plan's timeline
            models.Index(fields=["-created_at", "-id"], name="planevent_audit_idx"),  # the audit log, newest first
            models.Index(fields=["agent", "-created_at"], name="planevent_agent_idx"),  # the audit log of one agent
        ]

    def __str__(self) -> str:
        return f"{self.get_kind_display()} by {self.actor_label}"

    def save(self, *args: Any, **kwargs: Any) -> None:
        if self.agent_id is None and self.plan is not None:  # every event names its agent, for the audit filters
            self.agent_id = self.plan.agent_id
        super().save(*args, **kwargs)


def steps_done(statuses: Iterable[str], *, plan_status: str) -> int:
    """The "N/M steps done" count every page and push shows: completed steps, and steps an operator skipped
    (settled, the plan goes on without them), but not the steps a cancelled plan skipped."""
    counted = {PlanStep.Status.COMPLETED} if plan_status == Plan.Status.CANCELLED else {
        PlanStep.Status.COMPLETED, PlanStep.Status.SKIPPED}
    return sum(1 for status in statuses if status in counted)


def steps_done_q() -> Q:
    """steps_done as a Count filter over a plan's steps."""
    return Q(steps__status=PlanStep.Status.COMPLETED) | (
        Q(steps__status=PlanStep.Status.SKIPPED) & ~Q(status=Plan.Status.CANCELLED))


class A2ATask(models.Model):
    """The A2A task a remote A2A agent works on for one plan (docs/a2a-agents.md): what the runner last read of
    it, so that each new state, message and artifact is recorded once; for an agent that pushes its updates, the
    hash of the token its notifications carry."""

    plan = models.OneToOneField(Plan, on_delete=models.CASCADE, related_name="a2a_task")
    task_id = models.CharField(max_length=200)
    context_id = models.CharField(max_length=200, blank=True)
    state = models.CharField(max_length=24, blank=True,
                             help_text="The task's state as last read; \"answered\": the operator's answer sent")
    messages_seen = models.PositiveIntegerField(default=0)
    message_ids_seen = models.JSONField(default=list, blank=True,
                                        help_text="The ids of the task's messages recorded (its agent's as steps)")
    artifacts_seen = models.JSONField(default=list, blank=True, help_text="The ids of the artifacts recorded")
    snapshot = models.JSONField(default=dict, blank=True,
                                help_text="The task as last read or pushed, in A2A's JSON: what a pushed update applies to")
    push_token_hash = models.CharField(
        max_length=64, blank=True,
        help_text="The agent POSTs this task's updates to the dashboard: SHA-256 of the secret token they carry")
    updated_at = models.DateTimeField(auto_now=True)

    def __str__(self) -> str:
        return f"A2A task {self.task_id} ({self.state})"
