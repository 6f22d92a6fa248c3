"""Goals by horizon (seed 001). Their curves of progress and confidence are drawn from the experiences
(`Experience.goals_after`, agents/selectors.py), so no samples are stored apart."""

from __future__ import annotations

from django.core.validators import MaxValueValidator, MinValueValidator
from django.db import models
from django.urls import reverse

UNIT = [MinValueValidator(0.0), MaxValueValidator(1.0)]


class GoalQuerySet(models.QuerySet["Goal"]):
    def active(self) -> GoalQuerySet:
        """Goals still pursued (neither completed nor abandoned)."""
        return self.filter(status=Goal.Status.ACTIVE)


class Goal(models.Model):
    """Something an agent wants, born of needs and lessons; its confidence decays unless pursued."""

    class Horizon(models.TextChoices):
        SHORT = "short_term", "Short term"
        MID = "mid_term", "Mid term"
        LONG = "long_term", "Long term"

    class Status(models.TextChoices):
        ACTIVE = "active", "Active"
        COMPLETED = "completed", "Completed"
        ABANDONED = "abandoned", "Abandoned"
        # Closed by a person who accepted a plan whose outcome was not verified (planning plan_accept_done).
        ACCEPTED = "accepted", "Accepted as done, not verified"

    # goal_agent_status_idx (agent, status) serves every lookup by agent.
    agent = models.ForeignKey("agents.Agent", on_delete=models.CASCADE, related_name="goals", db_index=False)
    description = models.CharField(max_length=500)
    horizon = models.CharField(max_length=16, choices=Horizon, default=Horizon.SHORT)
    source_needs = models.JSONField(default=list, blank=True)
    source_lessons = models.JSONField(default=list, blank=True)
    recommended_actions = models.JSONField(default=list, blank=True)
    progress = models.FloatField(default=0.0, validators=UNIT)
    confidence = models.FloatField(default=1.0, validators=UNIT)
    status = models.CharField(max_length=16, choices=Status, default=Status.ACTIVE)
    created_at = models.DateTimeField(auto_now_add=True)
    last_progressed = models.DateTimeField(null=True, blank=True)
    times_advanced = models.PositiveIntegerField(default=0)
    times_regressed = models.PositiveIntegerField(default=0)
    reasoning = models.TextField(blank=True, help_text="Why the model proposed this goal")
    milestone_explanation = models.TextField(blank=True, help_text="The last milestone check's verdict, explained")
    milestone_checked_at = models.DateTimeField(null=True, blank=True)

    objects = GoalQuerySet.as_manager()

    class Meta:
        # Seed 000's priority, short-term first: the horizon values sort short_term > mid_term > long_term.
        ordering = ["agent", "-horizon", "-confidence"]
        constraints = [
            models.CheckConstraint(condition=models.Q(progress__gte=0.0, progress__lte=1.0), name="goal_progress_unit"),
            models.CheckConstraint(condition=models.Q(confidence__gte=0.0, confidence__lte=1.0), name="goal_confidence_unit"),
        ]
        indexes = [models.Index(fields=["agent", "status"], name="goal_agent_status_idx")]  # active goals of an agent

    def __str__(self) -> str:
        return self.description

    def get_absolute_url(self) -> str:
        return reverse("agent-detail", args=[self.agent_id]) + f"#goal-{self.pk}"

