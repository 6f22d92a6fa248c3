"""Why a service refused: each error's message says what is wrong and that nothing was changed."""

from __future__ import annotations

from planning.models import Plan, PlanEvent, PlanStep

STEP_DECISIONS: dict[str, str] = {PlanEvent.Kind.STEP_APPROVED: "approved", PlanEvent.Kind.STEP_DECLINED: "declined",
                  PlanEvent.Kind.STEP_SKIPPED: "skipped"}


PLAN_DECISIONS: dict[str, str] = {PlanEvent.Kind.PLAN_APPROVED: "approved", PlanEvent.Kind.PLAN_CANCELLED: "cancelled",
                                  PlanEvent.Kind.REPLAN_REQUESTED: "sent back", PlanEvent.Kind.PLAN_EDITED: "edited"}


def plan_decided_by(plan: Plan) -> str:
    """Who last decided a plan that no longer waits, and when ("approved by nadia at 07:02:11 UTC"), or ""."""
    if plan.pk is None:
        return ""
    event = PlanEvent.objects.filter(plan_id=plan.pk, step__isnull=True, kind__in=list(PLAN_DECISIONS)).order_by(
        "-pk").first()
    if event is None:
        return ""
    return f"{PLAN_DECISIONS[event.kind]} by {event.actor_label} at {event.created_at:%H:%M:%S} UTC"


def step_decided_by(step: PlanStep) -> str:
    """Who decided a step that no longer waits, and when ("approved by nadia at 07:02 UTC"), or "" if unknown."""
    if step.pk is None:
        return ""
    event = PlanEvent.objects.filter(step_id=step.pk, kind__in=list(STEP_DECISIONS)).order_by("-pk").first()
    if event is None:
        return ""
    return f"{STEP_DECISIONS[event.kind]} by {event.actor_label} at {event.created_at:%H:%M:%S} UTC"


class DecisionError(Exception):
    """An operator decision that cannot apply as asked; the message says why, and nothing changed."""


class StepNotAwaitingApproval(DecisionError):
    def __init__(self, step: PlanStep) -> None:
        decided = step_decided_by(step)
        super().__init__(
            f"Step {step.key} is no longer awaiting approval (it is {step.get_status_display().lower()}"
            + (f": {decided}). Nothing was changed." if decided
               else "); someone else may have decided it already. Nothing was changed.")
        )


class PlanNotAwaitingApproval(DecisionError):
    def __init__(self, plan: Plan) -> None:
        decided = plan_decided_by(plan)
        super().__init__(
            f"Plan v{plan.version} is no longer awaiting approval (it is {plan.get_status_display().lower()}"
            f"{': ' + decided if decided else ''}). Nothing was changed."
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
