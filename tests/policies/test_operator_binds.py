"""Issue 50, "the operator's choice binds policies": after Step by step no policy decides a step of that plan; a
policy's approval of a step that writes or is risky waits POLICY_UNDO_SECONDS before the step starts, with an Undo
that works meanwhile (inbox, plan page, notification); a policy switched off binds every process at once."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from agents.models import Agent
from notifications.selectors import event_candidate
from planning import services as planning
from planning.models import Plan, PlanEvent, PlanStep
from policies import services
from policies.models import Policy, PolicyChange
from runtime.cycle import agent_cycle
from tests.factories import AgentFactory, PlanFactory, PlanStepFactory
from tests.policies.test_decisions import policy_with

pytestmark = pytest.mark.django_db

@pytest.fixture(autouse=True)
def version_file_removed() -> Iterator[None]:
    """The policies' version file beside the test database goes with it."""
    yield
    path = services.version_file()
    if path is not None:
        path.unlink(missing_ok=True)


APPROVE_EVERYTHING = {"action": "approve", "applies_to": "steps", "approve_risky": True, "approve_permission": True}


def writing_plan(mode: str, *, status: str = Plan.Status.ACTIVE) -> tuple[Agent, Plan, PlanStep]:
    agent = AgentFactory(name="Reporter", kind=Agent.Kind.TOOL)
    agent.workspace.mkdir(parents=True, exist_ok=True)
    plan = PlanFactory(agent=agent, status=status, approval_mode=mode, goal_text="Write out.txt")
    step = PlanStepFactory(plan=plan, key="1", position=1, description="Write out.txt", tool="file.write",
                           tool_input={"path": "out.txt", "content": "hello\n"}, action_hint="",
                           requires_permission=True, risk=PlanStep.Risk.RISKY)
    return agent, plan, step


def test_after_step_by_step_no_policy_decides_a_step_of_that_plan(operator: Any) -> None:
    policy_with(operator, APPROVE_EVERYTHING)
    agent, plan, step = writing_plan(Plan.ApprovalMode.PENDING, status=Plan.Status.AWAITING_APPROVAL)
    PlanStepFactory(plan=plan, key="2", position=2, description="Read it back", tool="file.read",
                    tool_input={"path": "out.txt"}, action_hint="", depends_on=["1"])
    planning.plan_approve(plan=plan, user=operator, mode=Plan.ApprovalMode.STEP)
    agent_cycle(agent_id=agent.pk, runner="runner-test")
    step.refresh_from_db()
    assert step.status == PlanStep.Status.AWAITING_APPROVAL and step.approved_by is None
    assert not PlanEvent.objects.filter(plan=plan, detail__has_key="policy").exists()
    assert not (agent.workspace / "out.txt").exists()
    # The operator approves step 1; step 2 (a read, which any policy would approve) waits for them too.
    planning.step_approve(step=step, user=operator)
    agent_cycle(agent_id=agent.pk, runner="runner-test")
    agent_cycle(agent_id=agent.pk, runner="runner-test")
    second = plan.steps.get(key="2")
    assert second.status == PlanStep.Status.AWAITING_APPROVAL
    assert not PlanEvent.objects.filter(plan=plan, detail__has_key="policy").exists()


def test_a_policys_approval_of_a_writing_step_waits_the_undo_window_and_undo_works_meanwhile(
        operator: Any, operator_client: Client, settings: Any) -> None:
    settings.POLICY_UNDO_SECONDS = 10
    policy_with(operator, APPROVE_EVERYTHING)
    agent, plan, step = writing_plan(Plan.ApprovalMode.ALL)
    agent_cycle(agent_id=agent.pk, runner="runner-test")
    step.refresh_from_db()
    approval = PlanEvent.objects.get(step=step, kind=PlanEvent.Kind.STEP_APPROVED)
    assert "policy" in approval.detail
    assert step.status == PlanStep.Status.PENDING and step.start_after is not None
    assert timedelta(seconds=8) < step.start_after - timezone.now() <= timedelta(seconds=10)
    agent_cycle(agent_id=agent.pk, runner="runner-test")  # within the window: the step does not start
    assert not (agent.workspace / "out.txt").exists()

    # The plan page says when it starts and offers Undo; the inbox's "Decided by policies" offers it too.
    page = operator_client.get(plan.get_absolute_url()).content.decode()
    assert "Approved by a policy: starts after" in page and "unless you undo the approval" in page
    assert "Undo approval" in page and f'name="event" value="{approval.pk}"' in page
    inbox = operator_client.get(reverse("inbox")).content.decode()
    assert reverse("decision-undo", args=[approval.pk]) in inbox
    # The notification of the waiting step says a policy approved it and links to Undo.
    awaiting = PlanEvent.objects.get(step=step, kind=PlanEvent.Kind.STEP_AWAITING)
    candidate = event_candidate(awaiting, set())
    assert candidate is not None and "approved by a policy" in candidate.title
    payload = candidate.payload()
    assert "undo_link" in payload and "approve_link" not in payload

    # Undo from the plan page, within the window.
    response = operator_client.post(reverse("step-policy-undo", args=[step.pk]), {"event": approval.pk},
                                    HTTP_HX_REQUEST="true")
    assert response.status_code == 200
    step.refresh_from_db()
    assert step.status == PlanStep.Status.AWAITING_APPROVAL and step.start_after is None
    agent_cycle(agent_id=agent.pk, runner="runner-test")
    assert not (agent.workspace / "out.txt").exists()


def test_a_held_step_starts_once_its_window_has_passed(operator: Any, settings: Any) -> None:
    settings.POLICY_UNDO_SECONDS = 10
    policy_with(operator, APPROVE_EVERYTHING)
    agent, plan, step = writing_plan(Plan.ApprovalMode.ALL)
    agent_cycle(agent_id=agent.pk, runner="runner-test")
    PlanStep.objects.filter(pk=step.pk).update(start_after=timezone.now() - timedelta(seconds=1))
    agent_cycle(agent_id=agent.pk, runner="runner-test")
    assert (agent.workspace / "out.txt").read_text() == "hello\n"


def test_a_policy_change_here_is_read_again_here_and_bumps_the_shared_version(
        operator: Any, django_capture_on_commit_callbacks: Any) -> None:
    policy = policy_with(operator, APPROVE_EVERYTHING)
    before = services.policies_version()
    assert services.rules_enabled()
    with django_capture_on_commit_callbacks(execute=True):
        services.policy_switch(user=operator, policy=policy, enabled=False)
    assert services.rules_enabled() == []
    assert services.policies_version() != before  # every other process reads the policies again


def test_a_read_a_policy_approves_starts_at_once(operator: Any, settings: Any) -> None:
    settings.POLICY_UNDO_SECONDS = 10
    policy_with(operator, APPROVE_EVERYTHING)
    agent, plan, step = writing_plan(Plan.ApprovalMode.ALL)
    (agent.workspace / "in.txt").write_text("x\n")
    PlanStep.objects.filter(pk=step.pk).update(tool="file.read", tool_input={"path": "in.txt"}, risk="safe")
    agent_cycle(agent_id=agent.pk, runner="runner-test")  # asks; the policy approves
    agent_cycle(agent_id=agent.pk, runner="runner-test")  # runs, no window
    step.refresh_from_db()
    assert step.start_after is None and step.status == PlanStep.Status.COMPLETED


def test_a_policy_switched_off_in_another_process_binds_here_at_once(operator: Any) -> None:
    policy = policy_with(operator, APPROVE_EVERYTHING)
    assert services.rules_enabled()  # this process keeps the policies' state now
    # Another process (the web's) switches it off: its rows change and it bumps the shared version (its
    # policies_version_bump: Redis on the scale-out stack, the file beside SQLite on the embedded one); nothing
    # in this process is told.
    Policy.objects.filter(pk=policy.pk).update(enabled=False)
    PolicyChange.objects.create(policy=policy, actor=operator, actor_label="olga", what="policy switched off")
    shared, path = services.shared_cache(), services.version_file()
    if shared is not None:
        shared.set(services.POLICY_VERSION_KEY, "written by another process", timeout=None)
    else:
        assert path is not None
        path.write_text("written by another process")
    assert services.rules_enabled() == []
    agent, plan, step = writing_plan(Plan.ApprovalMode.ALL)
    agent_cycle(agent_id=agent.pk, runner="runner-test")
    step.refresh_from_db()
    assert step.status == PlanStep.Status.AWAITING_APPROVAL
