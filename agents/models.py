"""Agents, their needs, experiences, lessons, and the record of every LLM call."""

from __future__ import annotations

import hashlib
import secrets
from datetime import datetime
from pathlib import Path

from django.conf import settings
from django.core.exceptions import ValidationError
from django.core.validators import MaxValueValidator, MinValueValidator
from django.db import models
from django.urls import reverse
from django.utils import timezone

from agents.tools import TOOLS

UNIT = [MinValueValidator(0.0), MaxValueValidator(1.0)]


def tools_known(value: object) -> None:
    """A tool agent's tools: names of the built-in registry (agents/tools.py)."""
    if not isinstance(value, list) or not all(isinstance(name, str) for name in value):
        raise ValidationError("Give the tools as a list of names.")
    unknown = sorted(set(value) - set(TOOLS))
    if unknown:
        raise ValidationError(f"Unknown tools: {', '.join(unknown)}. The tools are: {', '.join(sorted(TOOLS))}.")


class Agent(models.Model):
    """An agent the runner drives in cycles: a simulated person (persona) or a tool user (tool); or an
    external agent (external) that runs elsewhere and plans, asks and reports through the HTTP API; or a remote A2A
    agent (a2a) the runner sends goals and answers to as A2A messages, following its tasks (docs/a2a-agents.md)."""

    class Kind(models.TextChoices):
        PERSONA = "persona", "Persona"
        TOOL = "tool", "Tool"
        EXTERNAL = "external", "External (API)"
        A2A = "a2a", "Remote A2A agent"
        AGUI = "agui", "Remote (AG-UI)"

    class ApprovalPolicy(models.TextChoices):
        PLAN = "plan", "An operator approves each plan"
        PERMISSION = "permission", "Plans start at once; steps that require permission wait"

    class Status(models.TextChoices):
        RUNNING = "running", "Running"
        PAUSED = "paused", "Paused"
        STOPPED = "stopped", "Stopped"

    name = models.CharField(max_length=100, unique=True)
    backstory = models.TextField(blank=True)
    kind = models.CharField(max_length=16, choices=Kind, default=Kind.PERSONA)
    status = models.CharField(max_length=16, choices=Status, default=Status.RUNNING)
    personality = models.JSONField(default=dict, blank=True, help_text="Trait name -> 0..1")
    emotions = models.JSONField(default=dict, blank=True, help_text="Emotion name -> intensity 0..1")
    cycle_interval = models.FloatField(default=2.0, validators=[MinValueValidator(0.0)], help_text="Seconds between cycles")
    cycle_count = models.PositiveIntegerField(default=0)
    planner_models = models.CharField(
        max_length=500, blank=True,
        help_text="This agent's planning model chain, strongest first, comma-separated; empty: PLANNER_MODELS",
    )
    rules_planner = models.BooleanField(
        default=True, help_text="Tool agents: the rules planner may turn a simple goal into one step without a model "
        "call (PLAN_ONE_STEP_SHORTCUT says which goals); off: the model plans every goal",
    )
    plan_retry_limit = models.PositiveSmallIntegerField(
        default=3, help_text="How often failed planning is retried automatically; 0: wait for an operator",
    )
    plan_retry_backoff = models.PositiveIntegerField(
        default=30, help_text="Seconds before the first automatic retry; doubled for each further one",
    )
    plan_retry_at = models.DateTimeField(null=True, blank=True, help_text="The next automatic planning retry")
    declared_tools = models.JSONField(
        default=list, blank=True,
        help_text="External agents: the tools the agent declared over the API (name, description, input_schema, risk)",
    )
    tools = models.JSONField(
        default=list, blank=True, validators=[tools_known],
        help_text="Tool agents: the built-in tools (agents/tools.py) its plans may call; empty: every one",
    )
    a2a_card = models.JSONField(default=dict, blank=True,
                                help_text="Remote A2A agents: the agent card as read when the agent was added")
    a2a_url = models.URLField(max_length=500, blank=True, help_text="Remote A2A agents: the agent card's address")
    a2a_credential = models.CharField(
        max_length=2000, blank=True, editable=False,
        help_text="Remote A2A agents whose card asks for one: the credential its operator gave (never shown; sent "
                  "only to the agent card's origin)")
    approval_policy = models.CharField(
        max_length=16, choices=ApprovalPolicy, default=ApprovalPolicy.PLAN,
        help_text="External agents: whether a submitted plan waits for an operator's approval",
    )
    next_cycle_at = models.DateTimeField(null=True, blank=True)
    waiting_reason = models.CharField(max_length=300, blank=True, help_text="Why the agent waits for an operator")
    escalate_after_minutes = models.PositiveIntegerField(
        null=True, blank=True,
        help_text="Waiting policy: after this many minutes a pending approval is marked urgent and goes to the top "
                  "of the inbox; empty: it keeps waiting. Never approved or declined by itself.",
    )
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["name"]
        indexes = [
            # The embedded scheduler's look for due agents: running ones by the time they fall due.
            models.Index(fields=["status", "next_cycle_at"], name="agent_due_idx"),
        ]

    def __str__(self) -> str:
        return self.name

    def get_absolute_url(self) -> str:
        return reverse("agent-detail", args=[self.pk])

    @property
    def workspace(self) -> Path:
        """The only folder this agent's tools may touch."""
        return Path(settings.AGENT_WORKSPACES) / str(self.pk)


class Need(models.Model):
    """A need (hunger, energy, money, social...) whose satisfaction decays every hour."""

    # need_name_unique_per_agent (agent, name) serves every lookup by agent: no index of its own to keep up.
    agent = models.ForeignKey(Agent, on_delete=models.CASCADE, related_name="needs", db_index=False)
    name = models.CharField(max_length=50)
    satisfaction = models.FloatField(default=1.0, validators=UNIT)
    decay_per_hour = models.FloatField(default=0.05, validators=[MinValueValidator(0.0)])
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["agent", "name"]
        constraints = [
            models.UniqueConstraint(fields=["agent", "name"], name="need_name_unique_per_agent"),
            models.CheckConstraint(condition=models.Q(satisfaction__gte=0.0, satisfaction__lte=1.0), name="need_satisfaction_unit"),
        ]

    def __str__(self) -> str:
        return f"{self.agent} {self.name} {self.satisfaction:.0%}"


class Experience(models.Model):
    """What happened in one cycle: the action, its effect on needs, and how it relates to the plan."""

    # experience_cycle_unique_per_agent (agent, cycle) serves every lookup by agent.
    agent = models.ForeignKey(Agent, on_delete=models.CASCADE, related_name="experiences", db_index=False)
    cycle = models.PositiveIntegerField()
    action = models.CharField(max_length=200)
    need_deltas = models.JSONField(default=dict, blank=True)
    step = models.ForeignKey("planning.PlanStep", null=True, blank=True, on_delete=models.SET_NULL, related_name="experiences")
    followed_plan = models.BooleanField(default=False)
    override_reason = models.CharField(max_length=300, blank=True)
    outcome = models.TextField(blank=True)
    hours = models.FloatField(default=1.0, validators=[MinValueValidator(0.0)], help_text="Simulated hours the action took")
    needs_after = models.JSONField(default=dict, blank=True, help_text="Need name -> satisfaction after this cycle")
    goals_after = models.JSONField(default=dict, blank=True, help_text="Goal id -> [progress, confidence] after this cycle")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["agent", "-cycle"]
        constraints = [models.UniqueConstraint(fields=["agent", "cycle"], name="experience_cycle_unique_per_agent")]

    def __str__(self) -> str:
        return f"{self.agent} cycle {self.cycle}: {self.action}"


class Lesson(models.Model):
    """Something the agent learned, fed into goal generation and action decisions."""

    agent = models.ForeignKey(Agent, on_delete=models.CASCADE, related_name="lessons")
    description = models.CharField(max_length=300)
    source_experience = models.ForeignKey(Experience, null=True, blank=True, on_delete=models.SET_NULL)
    weight = models.FloatField(default=0.5, validators=UNIT)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["agent", "-created_at"]

    def __str__(self) -> str:
        return self.description


class LLMCall(models.Model):
    """One call to a model, for any purpose, with its full prompt and response."""

    class Purpose(models.TextChoices):
        RESTATE = "restate", "Restate goal"
        PLAN = "plan", "Plan"
        REPLAN = "replan", "Replan"
        REFLECT = "reflect", "Reflect on failure"
        GOALS = "goals", "Generate goals"
        MILESTONE = "milestone", "Milestone check"
        DECIDE = "decide", "Decide action"

    agent = models.ForeignKey(Agent, null=True, blank=True, on_delete=models.SET_NULL, related_name="llm_calls")
    # llmcall_plan_idx (plan, created_at) serves every lookup by plan.
    plan = models.ForeignKey("planning.Plan", null=True, blank=True, on_delete=models.SET_NULL, related_name="llm_calls",
                             db_index=False)
    purpose = models.CharField(max_length=16, choices=Purpose)
    provider = models.CharField(max_length=50, blank=True)
    model = models.CharField(max_length=200)
    prompt = models.JSONField(default=list, help_text="The chat messages sent")
    response = models.TextField(blank=True)
    tokens_in = models.PositiveIntegerField(default=0)
    tokens_out = models.PositiveIntegerField(default=0)
    latency_ms = models.PositiveIntegerField(default=0)
    cost = models.DecimalField(max_digits=12, decimal_places=6, null=True, blank=True)
    error = models.TextField(blank=True)
    finish_reason = models.CharField(max_length=20, blank=True,
                                     help_text='Why the model stopped: "stop", or "length" when the answer was cut off')
    response_format = models.CharField(max_length=20, blank=True,
                                       help_text="The structured-output format the server took (blank: none)")
    body_pruned = models.BooleanField(default=False, help_text="Prompt and response removed by retention")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-created_at"]
        verbose_name = "LLM call"
        indexes = [
            models.Index(fields=["plan", "created_at"], name="llmcall_plan_idx"),  # the plan page lists its calls
            # Retention clears the bodies of calls past RETAIN_LLM_BODIES_HOURS: only rows still holding one.
            models.Index(fields=["created_at"], condition=models.Q(body_pruned=False), name="llmcall_body_kept_idx"),
        ]

    def __str__(self) -> str:
        return f"{self.purpose} via {self.model}"

    @property
    def truncated(self) -> bool:
        return self.finish_reason == "length"


def token_hash(raw: str) -> str:
    """Tokens carry 256 random bits, so one fast hash suffices: a leaked table reveals no usable token."""
    return hashlib.sha256(raw.encode()).hexdigest()


class AgentTokenQuerySet(models.QuerySet["AgentToken"]):
    def active(self) -> AgentTokenQuerySet:
        """Not revoked and not expired (now, by the database's clock of this request)."""
        return self.filter(revoked_at__isnull=True).filter(
            models.Q(expires_at__isnull=True) | models.Q(expires_at__gt=timezone.now()))

    def lookup(self, raw: str) -> AgentToken | None:
        """The active token whose raw value this is, with its agent; None for unknown, revoked or expired ones."""
        raw = raw.strip()
        if not raw or len(raw) > 200:
            return None
        return self.active().select_related("agent").filter(key_hash=token_hash(raw)).first()


class AgentToken(models.Model):
    """A bearer token with which an external agent uses the API; stored hashed, acts only on its own agent."""

    PREFIX = "apt_"

    agent = models.ForeignKey(Agent, on_delete=models.CASCADE, related_name="tokens")
    label = models.CharField(max_length=100, blank=True, help_text="Where this token is used, for the operators")
    key_hash = models.CharField(max_length=64, unique=True, editable=False)
    hint = models.CharField(max_length=16, editable=False, help_text="The token's first characters, to recognise it")
    created_at = models.DateTimeField(auto_now_add=True)
    last_used_at = models.DateTimeField(null=True, blank=True, editable=False)
    revoked_at = models.DateTimeField(null=True, blank=True, help_text="Set to revoke: the token stops working at once")
    expires_at = models.DateTimeField(null=True, blank=True,
                                      help_text="The token stops working then, its open sockets and long polls within "
                                                "seconds (empty: until revoked)")

    objects = AgentTokenQuerySet.as_manager()

    class Meta:
        ordering = ["agent", "-created_at"]
        verbose_name = "API token"

    def __str__(self) -> str:
        state = "revoked" if self.revoked_at else ("expired" if not self.is_active else "active")
        return f"{self.agent} token {self.hint}… ({state})"

    @classmethod
    def issue(cls, *, agent: Agent, label: str = "", expires_at: datetime | None = None) -> tuple[AgentToken, str]:
        """A new token for `agent`: the row and the raw token, which is shown once and never stored."""
        raw = cls.PREFIX + secrets.token_urlsafe(32)
        token = cls.objects.create(agent=agent, label=label[:100], key_hash=token_hash(raw), hint=raw[:12],
                                   expires_at=expires_at)
        return token, raw

    @property
    def is_active(self) -> bool:
        return self.revoked_at is None and (self.expires_at is None or self.expires_at > timezone.now())


class ApiRequest(models.Model):
    """A client's request id, remembered with the answer it got, so a retried call is never applied twice."""

    agent = models.ForeignKey(Agent, on_delete=models.CASCADE, related_name="api_requests")
    request_id = models.CharField(max_length=100)
    operation = models.CharField(max_length=100, help_text="What the request did, e.g. 'step 12 result'")
    response = models.JSONField(default=dict)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-created_at"]
        constraints = [
            # Two racing retries of one call: the second insert fails, its transaction rolls back.
            models.UniqueConstraint(fields=["agent", "request_id"], name="api_request_unique_per_agent"),
        ]

    def __str__(self) -> str:
        return f"{self.agent} {self.request_id}: {self.operation}"


# Remote AG-UI agents' rows (docs/agui-agents.md), registered with this app.
from agents import agui_models  # noqa: E402, F401
