"""Operator decisions racing each other over real HTTP requests in parallel threads: a step decision
against a plan cancel never ends in a 500 (no deadlock), and each decision applies once or is refused
with a clear message. The deadlock it guards against needs PostgreSQL's row locks; on SQLite writes
are serialized and the test checks the outcome only."""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable
from functools import partial
from typing import Any

import pytest
from django.db import connection
from django.test import Client
from django.urls import reverse

from planning.models import Plan, PlanEvent, PlanStep
from tests.factories import AgentFactory, PlanFactory, PlanStepFactory, UserFactory

pytestmark = pytest.mark.django_db(transaction=True)

ROUNDS = 20


def parallel(*calls: Callable[[], int]) -> list[int]:
    """Run the calls at once (a barrier releases them together); their HTTP status codes."""
    barrier = threading.Barrier(len(calls))
    results: list[int] = [0] * len(calls)

    def run(i: int, call: Callable[[], int]) -> None:
        try:
            barrier.wait()
            results[i] = call()
        finally:
            connection.close()

    threads = [threading.Thread(target=run, args=(i, c)) for i, c in enumerate(calls)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    return results


def logged_in(user: Any) -> Client:
    client = Client(raise_request_exception=False)  # a server error is a 500, as a browser sees it
    client.force_login(user)
    return client


def post(client: Client, url: str, data: dict[str, str]) -> int:
    return client.post(url, data).status_code


def racing_plan() -> tuple[Plan, list[PlanStep]]:
    plan = PlanFactory(agent=AgentFactory(kind="tool"), status=Plan.Status.ACTIVE, approval_mode="step")
    steps = [PlanStepFactory(plan=plan, key=str(i), position=i, status=PlanStep.Status.AWAITING_APPROVAL,
                             requires_permission=True) for i in range(1, 4)]
    return plan, steps


@pytest.mark.parametrize("decision", ["step-approve", "step-decline", "step-skip"])
def test_step_decision_racing_plan_cancel_never_500(decision: str) -> None:
    operators = [UserFactory(role="operators") for _ in range(2)]
    deciding, cancelling = logged_in(operators[0]), logged_in(operators[1])
    statuses: Counter[int] = Counter()
    for _ in range(ROUNDS):
        plan, steps = racing_plan()
        data = {"feedback": "not now"} if decision == "step-decline" else {}
        codes = parallel(
            *[partial(post, deciding, reverse(decision, args=[s.pk]), data) for s in steps],
            partial(post, cancelling, reverse("plan-cancel", args=[plan.pk]), {"reason": "stop"}),
        )
        statuses.update(codes)
        assert 500 not in codes, codes  # a deadlock between the two transactions reached the operator
        plan.refresh_from_db()
        cancelled = PlanEvent.objects.filter(plan=plan, kind=PlanEvent.Kind.PLAN_CANCELLED).count()
        if plan.status == Plan.Status.COMPLETED:  # every step skipped before the cancel: nothing left to cancel
            assert decision == "step-skip" and codes[-1] == 409 and cancelled == 0
        else:
            assert plan.status == Plan.Status.CANCELLED and codes[-1] in (200, 302) and cancelled == 1
        for step, code in zip(steps, codes[:-1], strict=True):
            step.refresh_from_db()
            # A decision either applied (and is recorded once) or was refused, leaving the cancel's skip.
            decided = PlanEvent.objects.filter(step=step).exclude(kind=PlanEvent.Kind.PLAN_CANCELLED).count()
            assert (code in (200, 302)) == (decided == 1), (code, decided, step.status)
            assert step.status in (PlanStep.Status.SKIPPED, PlanStep.Status.DECLINED)
    assert statuses[500] == 0, statuses
    assert set(statuses) <= {200, 302, 409}, statuses


# --- opposite plan decisions: "Approve all" by one operator, "Cancel plan" by another ---------------------------


def awaiting_plan() -> Plan:
    plan = PlanFactory(agent=AgentFactory(kind="tool"), status=Plan.Status.AWAITING_APPROVAL,
                       approval_mode=Plan.ApprovalMode.PENDING)
    PlanStepFactory(plan=plan, key="1", position=1, requires_permission=True)
    return plan


def approve_all(client: Client, plan: Plan, where: str) -> Any:
    return client.post(reverse(f"{where}plan-approve", args=[plan.pk]),
                       {"mode": "all", "version": plan.version})


def cancel_as_seen(client: Client, plan: Plan, where: str) -> Any:
    """Cancel plan, pressed on the page that showed the plan awaiting approval."""
    return client.post(reverse(f"{where}plan-cancel", args=[plan.pk]),
                       {"version": plan.version, "seen_status": Plan.Status.AWAITING_APPROVAL})


@pytest.mark.parametrize("where", ["", "inbox-"])
def test_approve_all_racing_cancel_plan_exactly_one_wins(where: str) -> None:
    approving, cancelling = (logged_in(UserFactory(role="operators")) for _ in range(2))
    for _ in range(ROUNDS):
        plan = awaiting_plan()
        codes = parallel(lambda: approve_all(approving, plan, where).status_code,  # noqa: B023
                         lambda: cancel_as_seen(cancelling, plan, where).status_code)  # noqa: B023
        assert sorted(code == 409 for code in codes) == [False, True], codes  # one applied, the other refused
        plan.refresh_from_db()
        approved = PlanEvent.objects.filter(plan=plan, kind=PlanEvent.Kind.PLAN_APPROVED).count()
        cancelled = PlanEvent.objects.filter(plan=plan, kind=PlanEvent.Kind.PLAN_CANCELLED).count()
        if codes[0] != 409:
            assert (plan.status, approved, cancelled) == (Plan.Status.ACTIVE, 1, 0)
        else:
            assert (plan.status, approved, cancelled) == (Plan.Status.CANCELLED, 0, 1)


@pytest.mark.parametrize("where", ["", "inbox-"])
@pytest.mark.parametrize("first", ["approve", "cancel"])
def test_approve_all_and_cancel_plan_the_second_is_told_nothing_was_changed(first: str, where: str) -> None:
    approving, cancelling = (logged_in(UserFactory(role="operators")) for _ in range(2))
    plan = awaiting_plan()
    page = cancelling.get(reverse("inbox" if where else "plan-detail", args=[] if where else [plan.pk]))
    assert 'name="seen_status" value="awaiting_approval"' in page.content.decode()  # the cancel form says what it saw
    decisions = [lambda: approve_all(approving, plan, where), lambda: cancel_as_seen(cancelling, plan, where)]
    if first == "cancel":
        decisions.reverse()
    assert decisions[0]().status_code in (200, 302)
    refused = decisions[1]()
    assert refused.status_code == 409
    text = refused.content.decode()
    assert "no longer awaiting approval" in text and "Nothing was changed." in text
    plan.refresh_from_db()
    assert plan.status == (Plan.Status.ACTIVE if first == "approve" else Plan.Status.CANCELLED)
    assert PlanEvent.objects.filter(plan=plan, kind__in=[PlanEvent.Kind.PLAN_APPROVED,
                                                         PlanEvent.Kind.PLAN_CANCELLED]).count() == 1
