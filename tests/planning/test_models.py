"""The plan's own summary (seed 004's progress and to_summary): the "N/M steps done" every page shows."""

from __future__ import annotations

from planning.models import Plan, PlanStep, steps_done

S = PlanStep.Status


def test_steps_done_counts_completed_and_operator_skipped_steps() -> None:
    statuses = [S.COMPLETED, S.SKIPPED, S.FAILED, S.PENDING, S.RUNNING, S.DECLINED]
    assert steps_done(statuses, plan_status=Plan.Status.ACTIVE) == 2


def test_steps_done_of_a_cancelled_plan_leaves_out_the_steps_the_cancel_skipped() -> None:
    assert steps_done([S.COMPLETED, S.SKIPPED, S.SKIPPED], plan_status=Plan.Status.CANCELLED) == 1
