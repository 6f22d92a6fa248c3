"""Who is told what, and how: operators' channels and subscriptions, the notifications made for them from the
plans' events, and every delivery attempt with the receiver's answer."""

from __future__ import annotations

from django.conf import settings
from django.core.exceptions import ValidationError
from django.core.validators import validate_email
from django.db import models

from planner_site import outbound


class Trigger(models.TextChoices):
    """What a notification is about (a subscription names the ones it wants)."""

    WAITING = "waiting", "Waits for a person"
    URGENT = "urgent", "Became urgent"
    QUESTION = "question", "Planner asks a question"
    FAILED = "failed", "Plan failed"
    ESCALATED = "escalated", "Escalated by a policy"
    BUDGET = "budget", "Budget reached"


class Channel(models.Model):
    """One way to reach an operator: a signed JSON webhook, an e-mail address, or a Slack incoming webhook."""

    class Kind(models.TextChoices):
        WEBHOOK = "webhook", "Webhook (signed JSON)"
        EMAIL = "email", "E-mail"
        SLACK = "slack", "Slack incoming webhook"
        SLACK_APP = "slackapp", "Slack app (buttons that decide)"

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="notify_channels")
    kind = models.CharField(max_length=8, choices=Kind)
    target = models.CharField(max_length=500, help_text="The webhook URL, or the e-mail address")
    secret = models.CharField(max_length=128, blank=True, help_text="Signs webhook bodies (HMAC-SHA256)")
    bot_token = models.CharField(max_length=255, blank=True, help_text="A Slack app's bot token (xoxb-…); never shown back")
    signing_secret = models.CharField(max_length=128, blank=True,
                                      help_text="A Slack app's signing secret (verifies its clicks); never shown back")
    active = models.BooleanField(default=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["user", "kind", "pk"]
        constraints = [models.UniqueConstraint(fields=["user", "kind", "target"], name="notify_channel_unique")]

    def __str__(self) -> str:
        return f"{self.get_kind_display()} {self.target}"

    def clean(self) -> None:
        """The admin's check too: a URL the outbound guard refuses is never stored."""
        if problem := channel_target_problem(self.kind, self.target):
            raise ValidationError({"target": problem})


def channel_target_problem(kind: str, target: str) -> str | None:
    """Why `target` cannot be a channel of `kind`, in words for the person who typed it, or None. A URL goes
    through the outbound guard (resolved now; checked again at every send); a Slack URL must be on one of
    SLACK_WEBHOOK_HOSTS."""
    if kind == Channel.Kind.EMAIL:
        try:
            validate_email(target)
        except ValidationError:
            return "Enter a valid e-mail address."
        return None
    if kind not in Channel.Kind.values:
        return "Unknown kind of channel."
    hosts = settings.SLACK_WEBHOOK_HOSTS if kind == Channel.Kind.SLACK else None
    if problem := outbound.url_problem(target, hosts=hosts):
        return f"The URL {problem}."
    return None


class Subscription(models.Model):
    """What an operator wants to hear about: which agents (none chosen: all), which triggers, from which risk."""

    class MinRisk(models.TextChoices):
        SAFE = "safe", "Any risk"
        RISKY = "risky", "Risky only"

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="notify_subscriptions")
    agents = models.ManyToManyField("agents.Agent", blank=True, related_name="notify_subscriptions",
                                    help_text="None chosen: every agent")
    kinds = models.JSONField(default=list, help_text="The triggers wanted (notifications.models.Trigger)")
    min_risk = models.CharField(max_length=8, choices=MinRisk, default=MinRisk.SAFE,
                                help_text="Risky only: of the items that wait for a decision, only risky steps and plans with one")
    remind_after_minutes = models.PositiveIntegerField(
        null=True, blank=True, help_text="An item still waiting this long after it was sent is sent again (once)")
    escalate_after_minutes = models.PositiveIntegerField(
        null=True, blank=True, help_text="An item still waiting this long goes to the escalation subscription")
    escalate_to = models.ForeignKey("self", null=True, blank=True, on_delete=models.SET_NULL, related_name="+",
                                    help_text="Another operator's subscription (or a team account's) to escalate to")
    active = models.BooleanField(default=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["user", "pk"]

    def __str__(self) -> str:
        return f"{self.user} subscription {self.pk}"


class Notification(models.Model):
    """One thing one operator is told, made once (its key) from an event or an urgency crossing; the payload
    is frozen when it is made, so every channel and every retry says the same."""

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="notifications")
    key = models.CharField(max_length=120, help_text="What it is about: event:<id> or urgent:<item>:<since>")
    kind = models.CharField(max_length=12, choices=Trigger)
    agent = models.ForeignKey("agents.Agent", null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    plan = models.ForeignKey("planning.Plan", null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    step = models.ForeignKey("planning.PlanStep", null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    event = models.ForeignKey("planning.PlanEvent", null=True, blank=True, on_delete=models.SET_NULL,
                              related_name="+")
    title = models.CharField(max_length=300)
    payload = models.JSONField(default=dict)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-created_at", "-id"]
        constraints = [models.UniqueConstraint(fields=["user", "key"], name="notification_once_per_user")]
        indexes = [models.Index(fields=["key"], name="notification_key_idx")]  # the sweep: which keys are done

    def __str__(self) -> str:
        return f"{self.title} → {self.user}"


class Delivery(models.Model):
    """A notification on one channel. pending → sending (claimed by one worker) → delivered | pending again
    (a retry, later) | failed (attempts exhausted). Once delivered it is never sent again."""

    class Status(models.TextChoices):
        PENDING = "pending", "Pending"
        SENDING = "sending", "Sending"
        DELIVERED = "delivered", "Delivered"
        FAILED = "failed", "Failed"

    notification = models.ForeignKey(Notification, on_delete=models.CASCADE, related_name="deliveries")
    channel = models.ForeignKey(Channel, on_delete=models.CASCADE, related_name="deliveries")
    status = models.CharField(max_length=10, choices=Status, default=Status.PENDING)
    attempts = models.PositiveIntegerField(default=0)
    next_attempt_at = models.DateTimeField(help_text="When it is due (a retry waits longer each time)")
    claimed_until = models.DateTimeField(null=True, blank=True, help_text="A sending worker's claim lasts until")
    delivered_at = models.DateTimeField(null=True, blank=True)
    last_error = models.TextField(blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-created_at", "-id"]
        verbose_name_plural = "deliveries"
        constraints = [models.UniqueConstraint(fields=["notification", "channel"], name="delivery_once_per_channel")]
        indexes = [models.Index(fields=["status", "next_attempt_at"], name="delivery_due_idx")]  # deliveries due

    def __str__(self) -> str:
        return f"{self.notification.title} via {self.channel}"


class DeliveryAttempt(models.Model):
    """One try to deliver, with what the receiver answered (kept for the admin)."""

    delivery = models.ForeignKey(Delivery, on_delete=models.CASCADE, related_name="attempt_rows")
    number = models.PositiveIntegerField()
    ok = models.BooleanField(default=False)
    status_code = models.PositiveIntegerField(null=True, blank=True)
    response_excerpt = models.TextField(blank=True)
    error = models.TextField(blank=True)
    duration_ms = models.PositiveIntegerField(default=0)
    runner = models.CharField(max_length=150, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["delivery", "number"]
        constraints = [models.UniqueConstraint(fields=["delivery", "number"], name="attempt_number_unique")]

    def __str__(self) -> str:
        return f"attempt {self.number} of delivery {self.delivery_id}: {self.status_code or self.error[:40]}"


class DispatchCursor(models.Model):
    """The last event the dispatcher read (one row)."""

    last_event_id = models.BigIntegerField(default=0)
    updated_at = models.DateTimeField(auto_now=True)

    def __str__(self) -> str:
        return f"events read up to {self.last_event_id}"


class SettingsChange(models.Model):
    """The audit of operators' notification settings: who added, changed or removed which channel or
    subscription, and how (a secret is never recorded)."""

    user = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, on_delete=models.SET_NULL, related_name="+")
    user_label = models.CharField(max_length=150)
    action = models.CharField(max_length=40, help_text="e.g. channel_added, subscription_saved")
    detail = models.JSONField(default=dict, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-created_at", "-id"]

    def __str__(self) -> str:
        return f"{self.user_label}: {self.action}"


class SlackMessage(models.Model):
    """A message a Slack app channel posted about an item waiting for a person (a step, a plan, a question):
    where it is (Slack's channel and ts), so a click finds its item and a decision made anywhere updates it.
    `outcome` says who decided and when, once decided; `refresh_due` asks the notifier to update it in Slack."""

    channel = models.ForeignKey(Channel, on_delete=models.CASCADE, related_name="slack_messages")
    delivery = models.OneToOneField(Delivery, null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    plan = models.ForeignKey("planning.Plan", on_delete=models.CASCADE, related_name="+")
    step = models.ForeignKey("planning.PlanStep", null=True, blank=True, on_delete=models.CASCADE, related_name="+")
    kind = models.CharField(max_length=12, help_text="step, plan or question")
    slack_channel = models.CharField(max_length=40)
    ts = models.CharField(max_length=40)
    outcome = models.CharField(max_length=500, blank=True)
    escalated = models.CharField(max_length=300, blank=True, help_text="To whom and when it was escalated")
    refresh_due = models.BooleanField(default=False)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["-created_at", "-id"]
        indexes = [models.Index(fields=["refresh_due"], name="slack_message_refresh_idx")]

    def __str__(self) -> str:
        return f"Slack message {self.slack_channel}/{self.ts}"


class SlackAccount(models.Model):
    """A Slack user connected to a product account (once, with a code from the settings page): their clicks
    decide as that account, with its role."""

    team_id = models.CharField(max_length=40)
    slack_user_id = models.CharField(max_length=40)
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="slack_accounts")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["user", "pk"]
        constraints = [models.UniqueConstraint(fields=["team_id", "slack_user_id"], name="slack_account_once")]

    def __str__(self) -> str:
        return f"Slack {self.team_id}/{self.slack_user_id} → {self.user}"


class SlackConnectCode(models.Model):
    """A one-time code an operator makes in the settings page and types in Slack to connect their Slack user
    (only its SHA-256 is kept); it expires after SLACK_CONNECT_CODE_MAX_AGE_SECONDS."""

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="+")
    code_hash = models.CharField(max_length=64, unique=True)
    expires_at = models.DateTimeField()
    used_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    def __str__(self) -> str:
        return f"Slack connect code of {self.user}"


class ConfirmLinkUse(models.Model):
    """An e-mail's Approve or Decline link, used: its nonce (a link decides once)."""

    nonce = models.CharField(max_length=64, unique=True)
    user = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, on_delete=models.SET_NULL, related_name="+")
    action = models.CharField(max_length=10)
    used_at = models.DateTimeField(auto_now_add=True)

    def __str__(self) -> str:
        return f"link {self.nonce[:8]}… used to {self.action}"
