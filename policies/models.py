"""Approval policies (named, ordered rules that decide routine approvals), budgets (a cost limit per agent per
day and per plan) and the record of every change made to them.

Safe by default: a policy decides nothing until an operator switches it on, and a rule never approves a risky
step or a step that requires permission unless it says so in its own fields (`approve_risky`,
`approve_permission`)."""

from __future__ import annotations

from django.conf import settings
from django.core.validators import MinValueValidator
from django.db import models
from django.db.models import Q


class Policy(models.Model):
    """A named list of rules, tried in order; the first rule that matches decides. Policies are tried in their
    own order (`position`), and only those switched on."""

    name = models.CharField(max_length=100, unique=True)
    description = models.CharField(max_length=500, blank=True)
    enabled = models.BooleanField(default=False, help_text="Off until an operator switches it on")
    position = models.PositiveIntegerField(default=1, help_text="Policies are tried in this order, lowest first")
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["position", "name"]
        verbose_name_plural = "policies"

    def __str__(self) -> str:
        return self.name


class Rule(models.Model):
    """When an item that waits for a person matches every condition set here, the policy decides it."""

    class Action(models.TextChoices):
        APPROVE = "approve", "Approve"
        DECLINE = "decline", "Decline with the reason as feedback"
        ESCALATE = "escalate", "Escalate (urgent, notify)"

    class Applies(models.TextChoices):
        STEPS = "steps", "Steps"
        PLANS = "plans", "Plans awaiting approval"
        BOTH = "both", "Steps and plans"

    class Risk(models.TextChoices):
        ANY = "any", "Any risk"
        SAFE = "safe", "Safe only"
        RISKY = "risky", "Risky only"

    class Permission(models.TextChoices):
        ANY = "any", "Either"
        YES = "yes", "Requires permission"
        NO = "no", "Does not require permission"

    policy = models.ForeignKey(Policy, on_delete=models.CASCADE, related_name="rules")
    position = models.PositiveIntegerField(help_text="Rules are tried in this order, lowest first")
    applies_to = models.CharField(max_length=8, choices=Applies, default=Applies.STEPS)
    agent = models.ForeignKey("agents.Agent", null=True, blank=True, on_delete=models.CASCADE,
                              related_name="policy_rules", help_text="Empty: any agent")
    tools = models.CharField(max_length=500, blank=True,
                             help_text="Tool or persona action names, comma-separated; empty: any. A plan matches "
                                       "when every step uses one of them")
    risk = models.CharField(max_length=8, choices=Risk, default=Risk.ANY)
    requires_permission = models.CharField(max_length=8, choices=Permission, default=Permission.ANY)
    max_estimated_cycles = models.PositiveIntegerField(
        null=True, blank=True, validators=[MinValueValidator(1)],
        help_text="The estimated cost at most, in cycles (a plan: its steps' sum); empty: any")
    active_from = models.TimeField(null=True, blank=True, help_text="Time of day (server time) from which it applies")
    active_until = models.TimeField(null=True, blank=True,
                                    help_text="Time of day until which it applies (may wrap past midnight)")
    action = models.CharField(max_length=8, choices=Action)
    reason = models.CharField(max_length=500, blank=True,
                              help_text="Said with the decision; a decline's feedback, which the agent replans with")
    approve_risky = models.BooleanField(
        default=False, help_text="Without it this rule never approves a risky step or plan")
    approve_permission = models.BooleanField(
        default=False, help_text="Without it this rule never approves a step that requires permission")

    class Meta:
        ordering = ["policy", "position"]
        constraints = [
            models.UniqueConstraint(fields=["policy", "position"], name="rule_position_unique_in_policy",
                                    violation_error_message="Another rule of this policy has this position."),
            models.CheckConstraint(condition=~Q(action="decline") | ~Q(reason=""), name="rule_decline_has_reason",
                                   violation_error_message="A decline needs a reason: the agent replans with it as "
                                                           "feedback."),
        ]

    def __str__(self) -> str:
        return f"{self.policy.name}, rule {self.position}"

    @property
    def tool_names(self) -> list[str]:
        return [t.strip() for t in self.tools.split(",") if t.strip()]


class Budget(models.Model):
    """A cost limit in USD, from LLM_PRICES and the tokens of the recorded model calls: per agent per day (server
    time) and per plan version. Reaching either pauses the agent. A budget without an agent is every agent's
    that has none of its own."""

    agent = models.OneToOneField("agents.Agent", null=True, blank=True, on_delete=models.CASCADE,
                                 related_name="budget", help_text="Empty: every agent without a budget of its own")
    daily_limit = models.DecimalField(max_digits=12, decimal_places=6, null=True, blank=True,
                                      validators=[MinValueValidator(0)], help_text="USD per agent per day; empty: none")
    plan_limit = models.DecimalField(max_digits=12, decimal_places=6, null=True, blank=True,
                                     validators=[MinValueValidator(0)], help_text="USD per plan version; empty: none")
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["agent"], condition=Q(agent__isnull=True), name="budget_one_default"),
        ]

    def __str__(self) -> str:
        return f"budget of {self.agent}" if self.agent_id else "budget of every agent"


class PolicyChange(models.Model):
    """Who changed a policy, a rule or a budget, when, and the diff: the policies' own audit rows."""

    policy = models.ForeignKey(Policy, null=True, blank=True, on_delete=models.SET_NULL, related_name="changes")
    actor = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL,
                              related_name="policy_changes")
    actor_label = models.CharField(max_length=150)
    what = models.CharField(max_length=500)
    diff = models.JSONField(default=dict, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-created_at", "-id"]

    def __str__(self) -> str:
        return f"{self.what} by {self.actor_label}"
