"""Remote AG-UI agents (docs/agui-agents.md): where the agent answers, the thread its runs belong to, its shared
state, and each interrupt that waits for an operator's decision (answered exactly once, with `resume[]`)."""

from __future__ import annotations

from django.conf import settings
from django.db import models


class AguiAgent(models.Model):
    """An agent of kind "agui": the dashboard POSTs RunAgentInput to `url` and reads the run's event stream."""

    agent = models.OneToOneField("agents.Agent", on_delete=models.CASCADE, related_name="agui")
    url = models.URLField(max_length=500, help_text="Where the agent takes runs (HTTP POST, SSE answer)")
    thread_id = models.CharField(max_length=100, blank=True, help_text="The thread of the current goal's runs")
    plan = models.ForeignKey("planning.Plan", null=True, blank=True, on_delete=models.SET_NULL, related_name="+",
                             help_text="The plan the current thread's events build")
    state = models.JSONField(default=dict, blank=True, help_text="The agent's state: snapshots and JSON Patch deltas")
    calls = models.JSONField(default=dict, blank=True, help_text="Tool call id -> the step it became")
    pending_run = models.JSONField(default=dict, blank=True,
                                   help_text="The run to start (RunAgentInput) at the agent's next cycle; {}: none")
    run_reading = models.CharField(max_length=100, blank=True,
                                   help_text="The run a cycle is reading; left set only by a cycle that died")

    def __str__(self) -> str:
        return f"{self.agent} at {self.url}"


class AguiInterrupt(models.Model):
    """One interrupt of a run that ended with the "interrupt" outcome: a step awaiting approval; the operator's
    decision resumes the thread with one `resume[]` entry, once."""

    remote = models.ForeignKey(AguiAgent, on_delete=models.CASCADE, related_name="interrupts")
    step = models.OneToOneField("planning.PlanStep", on_delete=models.CASCADE, related_name="agui_interrupt")
    run_id = models.CharField(max_length=100, help_text="The run that ended with this interrupt")
    interrupt_id = models.CharField(max_length=200)
    reason = models.CharField(max_length=200, blank=True)
    message = models.TextField(blank=True)
    expires_at = models.DateTimeField(null=True, blank=True)
    decided_at = models.DateTimeField(null=True, blank=True)
    decided_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL,
                                   related_name="+")
    resume = models.JSONField(default=dict, blank=True, help_text="The resume entry sent to the agent")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["remote", "interrupt_id"], name="agui_interrupt_unique")]

    def __str__(self) -> str:
        return f"{self.remote.agent} interrupt {self.interrupt_id}"
