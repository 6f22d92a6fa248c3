"""`{% budget_notice agent %}` on the agent page; `{% policy_decisions %}` in the inbox."""

from __future__ import annotations

from typing import Any

from django import template

from agents.models import Agent
from policies.selectors import budget_notice, decisions_recent

register = template.Library()


@register.inclusion_tag("policies/budget_notice.html")
def budget_notice_of(agent: Agent) -> dict[str, Any]:
    """Why the agent is paused, when its budget paused it (no query while it runs)."""
    return {"event": budget_notice(agent)}


@register.inclusion_tag("policies/decisions.html", takes_context=True)
def policy_decisions(context: template.Context, back: str = "inbox") -> dict[str, Any]:
    return {"decisions": decisions_recent(), "back": back, "can_undo": context.get("can_decide", False),
            "csrf_token": context.get("csrf_token")}
