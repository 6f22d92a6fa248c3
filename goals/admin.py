from __future__ import annotations

from typing import Any

from django.contrib import admin

from goals.models import Goal
from planner_site.admin_audit import AuditedAdmin


@admin.register(Goal)
class GoalAdmin(AuditedAdmin):
    list_display = ["description", "agent", "horizon", "status", "progress", "confidence", "times_advanced", "times_regressed"]
    list_filter = ["horizon", "status", "agent"]
    search_fields = ["description"]
    list_select_related = ["agent"]
    # The runner's bookkeeping: shown, never saved back from a form loaded earlier.
    readonly_fields = ["progress", "confidence", "times_advanced", "times_regressed", "last_progressed",
                       "milestone_explanation", "milestone_checked_at", "created_at"]

    def audit_agent_id(self, obj: Any) -> int:
        return obj.agent_id

