"""Why a service refused: each error's message says what is wrong and that nothing was changed."""

from __future__ import annotations

from django.utils import timezone

from planning.models import Plan, PlanEvent, PlanStep

# What a decision did, as a refusal tells who decided first (not "someone else may have decided it").
DECIDED: dict[str, str] = {
    PlanEvent.Kind.STEP_APPROVED: "approved", PlanEvent.Kind.STEP_DECLINED: "declined",
    PlanEvent.Kind.STEP_SKIPPED: "skipped", PlanEvent.Kind.PLAN_APPROVED: "approved",
    PlanEvent.Kind.PLAN_CANCELLED: "cancelled", PlanEvent.Kind.REPLAN_REQUESTED: "sent back",
}


def decided_by(events: list[PlanEvent]) -> str:
    """", olga declined it at 05:40:12 with the feedback “Too pricey”" from the latest decision, or ""."""
    if not events:
        return ""
    event = events[0]
    who = event.actor_label or (event.actor.get_username() if event.actor_id and event.actor else "") or "someone"
    said = " ".join(event.reason.split())
    feedback = (f" with the feedback “{said[:300]}”" if said and event.kind in (
        PlanEvent.Kind.STEP_DECLINED, PlanEvent.Kind.REPLAN_REQUESTED, PlanEvent.Kind.PLAN_CANCELLED) else "")
    return f": {who} {DECIDED[event.kind]} it at {timezone.localtime(event.created_at):%H:%M:%S}{feedback}"


class DecisionError(Exception):
    """An operator decision that cannot apply as asked; the message says why, and nothing changed."""


class StepNotAwaitingApproval(DecisionError):
    def __init__(self, step: PlanStep) -> None:
        events = list(PlanEvent.objects.filter(step_id=step.pk, kind__in=[
            PlanEvent.Kind.STEP_APPROVED, PlanEvent.Kind.STEP_DECLINED, PlanEvent.Kind.STEP_SKIPPED])
            .select_related("actor").order_by("-created_at", "-id")[:1])
        first = decided_by(events)
        super().__init__(
            f"Step {step.key} is no longer awaiting approval (it is {step.get_status_display().lower()}){first}. "
            "Nothing was changed." if first else
            f"Step {step.key} is no longer awaiting approval (it is {step.get_status_display().lower()}). "
            "Nothing was changed."
        )


class PlanNotAwaitingApproval(DecisionError):
    def __init__(self, plan: Plan) -> None:
        events = list(PlanEvent.objects.filter(plan_id=plan.pk, step__isnull=True, kind__in=[
            PlanEvent.Kind.PLAN_APPROVED, PlanEvent.Kind.PLAN_CANCELLED, PlanEvent.Kind.REPLAN_REQUESTED])
            .select_related("actor").order_by("-created_at", "-id")[:1])
        super().__init__(
            f"Plan v{plan.version} is no longer awaiting approval (it is {plan.get_status_display().lower()})"
            f"{decided_by(events)}. Nothing was changed."
        )


class StaleVersion(DecisionError):
    """The operator decided or edited what they saw, but the plan has moved on to a newer version."""

    def __init__(self, seen: int, current: Plan) -> None:
        self.current = current
        super().__init__(
            f"You were looking at version {seen}, but the plan is now version {current.version} "
            f"({current.get_status_display().lower()}). Nothing was changed; look at version {current.version} and "
            "decide again."
        )


class PlanEditInvalid(DecisionError):
    """The edited plan did not pass the planner's validator; `problems` says what, step by step."""

    def __init__(self, problems: list[str]) -> None:
        self.problems = problems
        super().__init__("The edited plan is not valid: " + "; ".join(problems) + ". Nothing was saved.")


class PlanAlreadyReplanned(Exception):
    """Another runner or operator already made the next version of this plan."""


class GoalAlreadyPlanned(Exception):
    """A plan already holds this goal: another planner (a runner's start pass, another cycle) began it first."""


class PlanNoLongerValidating(Exception):
    """The plan left "validating" while the planner worked (failed as interrupted, or cancelled)."""
