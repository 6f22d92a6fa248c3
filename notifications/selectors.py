"""Reads for the dispatcher (what happened that someone should hear of, and who wants to) and the settings page."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from django.db.models import Prefetch, Q, QuerySet
from django.urls import reverse
from django.utils import timezone

from agents.models import Agent
from notifications.links import link_make
from notifications.models import Channel, Delivery, Notification, Subscription, Trigger
from planning.models import Plan, PlanEvent, PlanStep
from planning.operator_selectors import inbox_items

# The events that may notify someone, and what each is about.
EVENT_TRIGGERS: dict[str, str] = {
    PlanEvent.Kind.STEP_AWAITING: Trigger.WAITING,
    PlanEvent.Kind.VALIDATED: Trigger.WAITING,  # only while its plan awaits approval
    PlanEvent.Kind.CLARIFICATION_ASKED: Trigger.QUESTION,
    PlanEvent.Kind.PLAN_FAILED: Trigger.FAILED,
    PlanEvent.Kind.PLAN_UNVERIFIED: Trigger.FAILED,  # done, but its outcome was not found: the goal stays open
    PlanEvent.Kind.ESCALATED: Trigger.ESCALATED,
    PlanEvent.Kind.BUDGET_REACHED: Trigger.BUDGET,
}
RISK_FILTERED = (Trigger.WAITING, Trigger.URGENT, Trigger.ESCALATED)
# Events committed out of id order (a longer transaction took its id earlier) are still read this long after.
LOOKBACK_SECONDS = 60
BATCH_EVENTS = 500
TITLE_CHARS = 300


@dataclass
class Candidate:
    """Something to tell: the same for every operator who wants it."""

    key: str
    kind: str
    agent: Agent | None
    plan: Plan | None = None
    step: PlanStep | None = None
    event: PlanEvent | None = None
    risky: bool = False
    title: str = ""
    text: str = ""
    extra: dict[str, Any] = field(default_factory=dict)

    def payload(self) -> dict[str, Any]:
        plan, step, agent, event = self.plan, self.step, self.agent, self.event
        links: dict[str, str] = {}
        if step is not None:
            links["link"] = link_make(plan_id=step.plan_id, step_id=step.pk)
        elif plan is not None:
            links["link"] = link_make(plan_id=plan.pk)
        else:
            links["link"] = link_make(agent_id=agent.pk if agent else None)
        if "undo_link" in self.extra and step is not None:
            links["undo_link"] = link_make(plan_id=step.plan_id, step_id=step.pk, action="undo")
        elif self.kind in (Trigger.WAITING, Trigger.URGENT, Trigger.ESCALATED) and (step or plan):
            ids = {"plan_id": plan.pk if plan else None, "step_id": step.pk if step else None}
            links["approve_link"] = link_make(**ids, action="approve")
            links["decline_link"] = link_make(**ids, action="decline")
            if plan is not None:  # e-mail's links open a confirmation page, bound to the item as it is now
                from notifications.confirm import confirm_link_make

                links["confirm_approve_link"] = confirm_link_make(plan=plan, step=step, action="approve")
                links["confirm_decline_link"] = confirm_link_make(plan=plan, step=step, action="decline")
        return {
            "kind": self.kind,
            "title": self.title[:TITLE_CHARS],
            "text": self.text[:2000],
            "risky": self.risky,
            "agent": {"id": agent.pk, "name": agent.name} if agent else None,
            "plan": {"id": plan.pk, "version": plan.version, "goal": plan.goal_text, "status": plan.status}
            if plan else None,
            "step": {"id": step.pk, "key": step.key, "description": step.description, "tool": step.tool,
                     "risk": step.risk, "requires_permission": step.requires_permission} if step else None,
            "event": {"id": event.pk, "kind": event.kind, "reason": event_reason_shown(event)[:2000],
                      "at": event.created_at.isoformat()} if event else None,
            **links,
            "settings_link": link_settings(),
            "created_at": timezone.now().isoformat(),
            **{k: v for k, v in self.extra.items() if k != "undo_link"},
        }


# The planner's notes on how it read a model's answer: for the plan page's validator flags, not for a message to
# a person (a webhook's event.reason read "repaired: closed 1 bracket").
PLANNER_NOTES = ("repaired:", "parsed from", "structured output")


def event_reason_shown(event: PlanEvent) -> str:
    """An event's reason as a notification tells it: a validated plan's flags without the planner's notes."""
    if event.kind != PlanEvent.Kind.VALIDATED:
        return event.reason
    listed = event.detail.get("flags") if isinstance(event.detail, dict) else None
    flags = [str(f).strip() for f in listed] if isinstance(listed, list) else event.reason.split(";")
    flags = [f.strip() for f in flags if f.strip()]
    kept = [f for f in flags if not f.lower().startswith(PLANNER_NOTES)]
    return "; ".join(kept) or "The plan passed validation and awaits approval."


def link_settings() -> str:
    from django.conf import settings

    return settings.PLANNER_BASE_URL + reverse("notify-settings")


def events_to_read(*, after_id: int, now: datetime, wanted: set[str] | None = None) -> list[PlanEvent]:
    """New events that may notify someone (after the cursor), and the last minute's again (see LOOKBACK): only
    the kinds someone subscribed to, and a plan's VALIDATED only while that plan still awaits approval (a
    persona's plans start at once: reading all of them every second, with many agents, would be most of a
    runner's work)."""
    kinds = [k for k, trigger in EVENT_TRIGGERS.items() if wanted is None or trigger in wanted]
    relevant = PlanEvent.objects.filter(kind__in=kinds).exclude(
        Q(kind=PlanEvent.Kind.VALIDATED) & ~Q(plan__status=Plan.Status.AWAITING_APPROVAL)).select_related(
        "agent", "plan", "plan__agent", "step")
    new = list(relevant.filter(pk__gt=after_id).order_by("pk")[:BATCH_EVENTS])
    again = list(relevant.filter(pk__lte=after_id, created_at__gte=now - timedelta(seconds=LOOKBACK_SECONDS))
                 .order_by("-pk")[:BATCH_EVENTS])
    return again[::-1] + new


def plans_risky(plan_ids: set[int]) -> set[int]:
    """Which of these plans have a risky step (one query)."""
    return set(PlanStep.objects.filter(plan_id__in=plan_ids, risk=PlanStep.Risk.RISKY)
               .values_list("plan_id", flat=True).distinct())


def step_held(step: PlanStep | None, plan: Plan | None) -> bool:
    """A step a policy approved that waits for its undo window to pass before it starts."""
    return (step is not None and plan is not None and plan.status == Plan.Status.ACTIVE
            and step.status == PlanStep.Status.PENDING and step.start_after is not None
            and step.start_after > timezone.now())


def event_candidate(event: PlanEvent, risky_plans: set[int]) -> Candidate | None:
    """What an event tells, or None when it no longer matters (a wait already decided, e.g. by a policy)."""
    kind = EVENT_TRIGGERS[event.kind]
    plan, step = event.plan, event.step
    agent = event.agent or (plan.agent if plan else None)
    name = agent.name if agent else "An agent"
    goal = f"“{plan.goal_text}” (v{plan.version})" if plan else ""
    risky = bool(step and step.risk == PlanStep.Risk.RISKY) or bool(plan and not step and (
        plan.pk in risky_plans or plan.risks))
    c = Candidate(key=f"event:{event.pk}", kind=kind, agent=agent, plan=plan, step=step, event=event, risky=risky)
    if event.kind == PlanEvent.Kind.STEP_AWAITING and step_held(step, plan):
        # A policy approved it at once; it starts after the undo window (POLICY_UNDO_SECONDS): say so, with Undo.
        assert step is not None
        c.title = (f"{name}: step {step.key} approved by a policy, starts after "
                   f"{timezone.localtime(step.start_after):%H:%M:%S} unless you undo it")
        c.text = f"{step.description} (plan {goal}{', risky' if risky else ''})"
        c.extra["undo_link"] = True  # made in payload(), with the step
    elif event.kind == PlanEvent.Kind.STEP_AWAITING:
        if step is None or plan is None or step.status != PlanStep.Status.AWAITING_APPROVAL \
                or plan.status != Plan.Status.ACTIVE:
            return None
        c.title = f"{name}: step {step.key} waits for your approval"
        c.text = f"{step.description} (plan {goal}{', risky' if risky else ''}" \
                 f"{', needs permission' if step.requires_permission else ''})"
    elif event.kind == PlanEvent.Kind.VALIDATED:
        if plan is None or plan.status != Plan.Status.AWAITING_APPROVAL:
            return None
        c.step = None
        c.title = f"{name}: plan {goal} waits for your approval"
        c.text = plan.what or plan.goal_text
    elif event.kind == PlanEvent.Kind.CLARIFICATION_ASKED:
        if plan is None or plan.status != Plan.Status.CLARIFYING:
            return None
        c.title = f"{name} asks a question before planning {goal}"
        c.text = plan.clarification_question or event.reason
    elif event.kind == PlanEvent.Kind.PLAN_UNVERIFIED:
        c.title = f"{name}: plan {goal} is done, outcome not verified"
        c.text = event.reason or (plan.failure_reason if plan else "")
    elif event.kind == PlanEvent.Kind.PLAN_FAILED:
        c.title = f"{name}: plan {goal} failed"
        c.text = event.reason or (plan.failure_reason if plan else "")
    elif event.kind == PlanEvent.Kind.ESCALATED:
        what = f"step {step.key}" if step else f"plan {goal}" if plan else "an item"
        c.title = f"{name}: {what} was escalated to you"
        c.text = event.reason
    else:  # BUDGET_REACHED
        c.title = f"{name}: budget reached, the agent is paused"
        c.text = event.reason
    return c


def urgent_candidates(*, now: datetime) -> list[Candidate]:
    """Items that crossed their agent's waiting policy (item_urgent): each once per wait."""
    if not Agent.objects.filter(escalate_after_minutes__isnull=False).exists():
        return []
    out = []
    for item in inbox_items(now=now):
        if not item.urgent:
            continue
        minutes = item.waiting_seconds // 60
        what = f"step {item.step.key}" if item.step else f"plan “{item.plan.goal_text}” (v{item.plan.version})"
        out.append(Candidate(
            key=f"urgent:{item.key}:{int(item.waiting_since.timestamp())}", kind=Trigger.URGENT,
            agent=item.agent, plan=item.plan, step=item.step, risky=item.risky,
            title=f"Urgent: {item.agent.name}: {what} has waited {minutes} min for a person",
            text=item.question or (item.step.description if item.step else item.plan.goal_text),
        ))
    return out


@dataclass
class Recipient:
    user_id: int
    channels: list[Channel]


def subscriptions_active() -> list[Subscription]:
    """Every active subscription of an active user, with its agents and the user's active channels (3 queries)."""
    return list(
        Subscription.objects.filter(active=True, user__is_active=True)
        .prefetch_related(Prefetch("agents", queryset=Agent.objects.only("pk")),
                          Prefetch("user__notify_channels", queryset=Channel.objects.filter(active=True),
                                   to_attr="channels_active"))
        .select_related("user")
    )


LISTENING_READ_SECONDS = 1.0
_listening: tuple[float, bool] = (float("-inf"), False)


def anyone_listening() -> bool:
    """Whether any active operator has an active subscription: read at most once a LISTENING_READ_SECONDS in a
    process, for the after-commit nudge (a nudge is only a head start on the sweep, which reads it every time).
    The scale bench showed a dispatch job deferred after every validated plan, with nobody to tell."""
    global _listening
    now = time.monotonic()
    if now - _listening[0] >= LISTENING_READ_SECONDS:
        _listening = (now, Subscription.objects.filter(active=True, user__is_active=True).exists())
    return _listening[1]


def wanted_kinds(subscriptions: list[Subscription]) -> set[str]:
    return {k for s in subscriptions for k in s.kinds}


def subscription_matches(sub: Subscription, c: Candidate) -> bool:
    if c.kind not in sub.kinds:
        return False
    agent_ids = {a.pk for a in sub.agents.all()}
    if agent_ids and (c.agent is None or c.agent.pk not in agent_ids):
        return False
    # Minimum risk filters what waits for a decision; failures, questions and budgets always pass.
    return sub.min_risk == Subscription.MinRisk.SAFE or c.risky or c.kind not in RISK_FILTERED


def recipients(subscriptions: list[Subscription], c: Candidate) -> list[Recipient]:
    """The operators who want this, each once, with their active channels."""
    seen: dict[int, Recipient] = {}
    for sub in subscriptions:
        if sub.user_id not in seen and subscription_matches(sub, c):
            seen[sub.user_id] = Recipient(sub.user_id, list(sub.user.channels_active))  # type: ignore[attr-defined]
    return list(seen.values())


def deliveries_due(*, now: datetime, limit: int = 100) -> list[int]:
    """Deliveries to try now: pending and due, or claimed by a sender that never finished."""
    due = Q(status=Delivery.Status.PENDING, next_attempt_at__lte=now) | Q(
        status=Delivery.Status.SENDING, claimed_until__lt=now)
    return list(Delivery.objects.filter(due).order_by("next_attempt_at", "pk").values_list("pk", flat=True)[:limit])


# --- the settings page ---------------------------------------------------------------------------------------

def channels_of(user_id: int) -> QuerySet[Channel]:
    return Channel.objects.filter(user_id=user_id).order_by("kind", "pk")


def subscriptions_of(user_id: int) -> QuerySet[Subscription]:
    return Subscription.objects.filter(user_id=user_id).prefetch_related("agents").order_by("pk")


def notifications_recent(user_id: int, limit: int = 20) -> list[Notification]:
    return list(Notification.objects.filter(user_id=user_id).prefetch_related(
        Prefetch("deliveries", queryset=Delivery.objects.select_related("channel")))[:limit])
