"""Policies deciding in real cycles with the offline model: approvals, declines the agent replans with,
escalations, safe defaults, undo, and the record of every automatic decision."""

from __future__ import annotations

import json
from typing import Any

import pytest
from django.test import Client

from agents.models import Agent, Experience, LLMCall
from planning import services as planning
from planning.live.renderers import PlanLivePage
from planning.models import Plan, PlanEvent, PlanStep
from planning.operator_selectors import inbox_items
from policies import services
from policies.models import Policy
from runtime.cycle import agent_cycle
from tests.agents.test_cycle import cycles_until, hungry_persona
from tests.factories import AgentFactory, GoalFactory, PlanFactory, PlanStepFactory

pytestmark = pytest.mark.django_db


def policy_with(user: Any, *rules: dict[str, Any], name: str = "Routine", on: bool = True) -> Policy:
    policy = services.policy_save(user=user, policy=None, name=name)
    for values in rules:
        services.rule_save(user=user, policy=policy, rule=None, values=values)
    if on:
        services.policy_switch(user=user, policy=policy, enabled=True)
    return policy


def waiting_step(agent: Agent) -> PlanStep | None:
    return PlanStep.objects.filter(plan__agent=agent, status=PlanStep.Status.AWAITING_APPROVAL).first()


def until_buy_food_asked(agent: Agent) -> PlanStep:
    """Cycles until the persona's "buy food" step has asked for approval (and been decided, or not)."""
    cycles_until(agent, lambda: PlanEvent.objects.filter(plan__agent=agent, kind=PlanEvent.Kind.STEP_AWAITING).exists())
    return PlanStep.objects.get(plan__agent=agent, action_hint="buy food", plan__status=Plan.Status.ACTIVE)


def test_a_new_policy_is_off_and_decides_nothing(operator: Any) -> None:
    policy = policy_with(operator, {"action": "approve", "approve_risky": True, "approve_permission": True}, on=False)
    assert not Policy.objects.get(pk=policy.pk).enabled
    agent = hungry_persona()
    step = until_buy_food_asked(agent)
    assert step.status == PlanStep.Status.AWAITING_APPROVAL  # a person decides, as without any policy
    assert not PlanEvent.objects.filter(detail__has_key="policy").exists()


def test_a_rule_that_names_permission_steps_approves_one_and_the_person_acts_on_it(operator: Any) -> None:
    policy = policy_with(operator, {"action": "approve", "tools": "buy food", "approve_risky": True,
                                    "approve_permission": True})
    agent = hungry_persona()
    step = until_buy_food_asked(agent)
    assert step.status == PlanStep.Status.PENDING and step.approved_by is not None  # approved in the same cycle
    approval = PlanEvent.objects.get(step=step, kind=PlanEvent.Kind.STEP_APPROVED)
    assert approval.actor_label == "policy: Routine, rule 1"
    assert approval.detail["policy"] == policy.pk and approval.detail["rule"] == 1
    assert not inbox_items()  # nothing waits for a person
    cycles_until(agent, lambda: Experience.objects.filter(agent=agent, action="buy food").exists())


def test_without_the_named_flags_a_permission_step_waits_for_a_person(operator: Any) -> None:
    policy_with(operator, {"action": "approve", "tools": "buy food", "approve_risky": True})  # permission not named
    agent = hungry_persona()
    step = until_buy_food_asked(agent)
    assert step.status == PlanStep.Status.AWAITING_APPROVAL
    assert [i.step.pk for i in inbox_items() if i.step] == [step.pk]


def test_a_decline_by_policy_is_feedback_the_agent_replans_with(operator: Any) -> None:
    policy_with(operator, {"action": "decline", "tools": "buy food", "reason": "Cook at home instead of buying food"})
    agent = hungry_persona()
    step = until_buy_food_asked(agent)
    assert step.status == PlanStep.Status.DECLINED
    decline = PlanEvent.objects.get(step=step, kind=PlanEvent.Kind.STEP_DECLINED)
    assert decline.actor_label == "policy: Routine, rule 1" and decline.reason == "Cook at home instead of buying food"
    v1 = step.plan
    agent_cycle(agent_id=agent.pk, runner="runner-test")
    v1.refresh_from_db()
    assert v1.status == Plan.Status.REPLANNED
    v2 = Plan.objects.get(previous=v1)
    replan_call = LLMCall.objects.filter(plan=v2, purpose="replan").first()
    assert replan_call is not None and "Cook at home instead of buying food" in json.dumps(replan_call.prompt)


def test_an_escalation_puts_the_step_on_top_of_the_inbox_as_urgent(operator: Any) -> None:
    older = PlanStepFactory(plan=PlanFactory(), status=PlanStep.Status.AWAITING_APPROVAL, requires_permission=True)
    PlanEvent.objects.create(plan=older.plan, step=older, kind=PlanEvent.Kind.STEP_AWAITING, actor_label="runner")
    policy_with(operator, {"action": "escalate", "requires_permission": "yes", "reason": "money: look now"})
    agent = hungry_persona()
    step = until_buy_food_asked(agent)
    assert step.status == PlanStep.Status.AWAITING_APPROVAL
    escalation = PlanEvent.objects.get(step=step, kind=PlanEvent.Kind.ESCALATED)
    assert escalation.actor_label == "policy: Routine, rule 1" and escalation.reason == "money: look now"
    items = inbox_items()
    assert [(i.step.pk, i.urgent) for i in items if i.step] == [(step.pk, True), (older.pk, False)]


def test_a_tool_plan_is_approved_by_policy_its_permission_step_by_another_rule(operator: Any, settings: Any) -> None:
    settings.POLICY_UNDO_SECONDS = 0  # no undo window here (tests/policies/test_operator_binds.py has it)
    policy_with(operator,
                {"action": "approve", "applies_to": "plans", "tools": "file.read, file.convert", "approve_risky": True},
                {"action": "approve", "tools": "file.convert", "approve_risky": True, "approve_permission": True,
                 "max_estimated_cycles": 2})
    agent = AgentFactory(name="Archivist", kind=Agent.Kind.TOOL)
    agent.workspace.mkdir(parents=True)
    (agent.workspace / "data.csv").write_text("name,city\nAda,London\n")
    GoalFactory(agent=agent, description="Convert data.csv to JSON", source_needs=[])
    agent_cycle(agent_id=agent.pk, runner="runner-test")
    plan = Plan.objects.get(agent=agent)
    assert plan.status == Plan.Status.ACTIVE and plan.approval_mode == Plan.ApprovalMode.ALL
    approved = plan.events.get(kind=PlanEvent.Kind.PLAN_APPROVED)
    assert approved.actor_label == "policy: Routine, rule 1"
    # The plan's approval left the step that requires permission to be decided on its own.
    assert list(plan.steps.filter(requires_permission=True, approved_by__isnull=False)) == []
    cycles_until(agent, lambda: Plan.objects.get(pk=plan.pk).status == Plan.Status.COMPLETED, limit=10)
    convert = plan.steps.get(tool="file.convert")
    assert convert.events.filter(kind=PlanEvent.Kind.STEP_APPROVED).get().actor_label == "policy: Routine, rule 2"
    assert list(agent.workspace.glob("*.json"))


def test_an_operator_undoes_an_automatic_approval_and_the_step_waits_again(operator: Any, operator_client: Client) -> None:
    policy_with(operator, {"action": "approve", "tools": "buy food", "approve_risky": True, "approve_permission": True})
    agent = hungry_persona()
    step = until_buy_food_asked(agent)
    approval = PlanEvent.objects.get(step=step, kind=PlanEvent.Kind.STEP_APPROVED)
    Agent.objects.filter(pk=agent.pk).update(status=Agent.Status.PAUSED)  # the step has not started yet
    page = operator_client.get("/policies/")
    assert f'action="/policies/decisions/{approval.pk}/undo/"' in page.content.decode()
    response = operator_client.post(f"/policies/decisions/{approval.pk}/undo/", {"next": "inbox"}, follow=True)
    assert "Approval undone: step" in response.content.decode()
    step.refresh_from_db()
    assert step.status == PlanStep.Status.AWAITING_APPROVAL and step.approved_by is None
    undone = PlanEvent.objects.get(step=step, kind=PlanEvent.Kind.DECISION_UNDONE)
    assert undone.actor == operator and "policy: Routine, rule 1" in undone.reason
    assert [i.step.pk for i in inbox_items() if i.step] == [step.pk]  # and no policy took it again
    with pytest.raises(planning.DecisionError, match="already undone"):
        services.decision_undo(event_id=approval.pk, user=operator)


def test_an_approval_of_a_step_that_started_cannot_be_undone(operator: Any) -> None:
    policy_with(operator, {"action": "approve", "tools": "buy food", "approve_risky": True, "approve_permission": True})
    agent = hungry_persona()
    step = until_buy_food_asked(agent)
    approval = PlanEvent.objects.get(step=step, kind=PlanEvent.Kind.STEP_APPROVED)
    cycles_until(agent, lambda: PlanStep.objects.get(pk=step.pk).actual_cycles > 0)
    with pytest.raises(planning.DecisionError, match="only a policy's approval of a step that has not started"):
        services.decision_undo(event_id=approval.pk, user=operator)
    person = PlanEvent.objects.create(plan=step.plan, step=step, kind=PlanEvent.Kind.STEP_APPROVED, actor=operator,
                                      actor_label=operator.username)
    with pytest.raises(planning.DecisionError, match="Only a policy's approval"):
        services.decision_undo(event_id=person.pk, user=operator)


def test_automatic_decisions_show_on_the_timeline_the_inbox_history_and_the_audit_log(
        operator: Any, viewer_client: Client) -> None:
    policy_with(operator, {"action": "approve", "tools": "buy food", "approve_risky": True, "approve_permission": True})
    agent = hungry_persona()
    step = until_buy_food_asked(agent)
    label = "policy: Routine, rule 1"
    plan_page = viewer_client.get(f"/plans/{step.plan_id}/").content.decode()
    assert f"by {label}" in plan_page
    inbox = viewer_client.get("/inbox/").content.decode()
    assert "Decided by policies" in inbox and label in inbox and "Undo" not in inbox  # a viewer cannot undo
    audit = viewer_client.get("/audit/", {"operator": label}).content.decode()
    assert label in audit and "Step approved" in audit


def test_an_external_agent_is_told_to_run_a_step_a_policy_approved(operator: Any) -> None:
    from planning.services.reported import plan_next

    agent = AgentFactory(name="Notes", kind=Agent.Kind.EXTERNAL)
    # A declared tool is matched only by a rule scoped to its agent, and its items count as risky
    # (tests/policies/test_tool_scope.py).
    policy_with(operator, {"action": "approve", "tools": "search", "agent": agent, "approve_permission": True,
                           "approve_risky": True})
    plan = PlanFactory(agent=agent, status=Plan.Status.ACTIVE, approval_mode=Plan.ApprovalMode.ALL)
    step = PlanStepFactory(plan=plan, key="1", tool="search", action_hint="", requires_permission=True)
    answer = plan_next(agent=agent, plan_id=plan.pk)
    assert answer["action"] == "run" and answer["step"]["id"] == step.pk


def test_an_api_agent_submitting_a_routine_plan_is_told_it_is_active(operator: Any) -> None:
    from planning.services.reported import agent_tools_declare, plan_submit

    agent = AgentFactory(name="Notes", kind=Agent.Kind.EXTERNAL)
    policy_with(operator, {"action": "approve", "applies_to": "plans", "tools": "search", "agent": agent,
                           "approve_risky": True})  # scoped to the agent, its declared risk not believed
    agent_tools_declare(agent=agent, tools=[{"name": "search", "risk": "safe"}])
    agent.refresh_from_db()
    plan = plan_submit(agent=agent, data={"goal": "Find the Q3 report", "steps": [
        {"id": "1", "tool": "search", "intent": "Search the wiki", "input": {"q": "Q3"}, "requiresPermission": False}]})
    assert plan.status == Plan.Status.ACTIVE
    assert Plan.objects.get(pk=plan.pk).status == Plan.Status.ACTIVE
    assert plan.events.get(kind=PlanEvent.Kind.PLAN_APPROVED).actor_label == "policy: Routine, rule 1"


def test_a_policy_that_cannot_decide_leaves_the_step_to_a_person_and_the_cycle_goes_on(
        operator: Any, caplog: pytest.LogCaptureFixture) -> None:
    from tests.factories import UserFactory

    UserFactory(username=services.POLICY_USERNAME)  # a person's account took the policies' name: refuse to act as it
    policy_with(operator, {"action": "approve", "tools": "buy food", "approve_risky": True, "approve_permission": True})
    agent = hungry_persona()
    step = until_buy_food_asked(agent)
    assert step.status == PlanStep.Status.AWAITING_APPROVAL and step.approved_by is None
    assert not PlanEvent.objects.filter(step=step, kind=PlanEvent.Kind.STEP_APPROVED).exists()
    assert "it waits for a person" in caplog.text
    agent_cycle(agent_id=agent.pk, runner="runner-test")  # the person lives on
    assert Agent.objects.get(pk=agent.pk).cycle_count >= 2


def test_a_live_push_of_the_row_a_policy_approved_offers_operators_its_undo(operator: Any) -> None:
    """An operator watching the plan when a policy approves a step gets the row with Undo approval, as a reload
    would show it; a viewer's push has no such form."""
    policy_with(operator, {"action": "approve", "tools": "buy food", "approve_risky": True, "approve_permission": True})
    agent = hungry_persona()
    cycles_until(agent, lambda: PlanStep.objects.filter(plan__agent=agent, action_hint="buy food").exists())
    plan_id = PlanStep.objects.get(plan__agent=agent, action_hint="buy food").plan_id
    live = PlanLivePage(f"plan-{plan_id}", plan_id)
    live.baseline()  # the page as it was opened, before the step asked
    step = until_buy_food_asked(agent)
    assert step.plan_id == plan_id and step.approved_by is not None and not step.actual_cycles
    approval = PlanEvent.objects.get(step=step, kind=PlanEvent.Kind.STEP_APPROVED)
    pushed = live.render_changes({plan_id}, {"operator", "viewer"})
    assert f'id="step-{step.key}"' in pushed["operator"] and f'id="step-{step.key}"' in pushed["viewer"]
    assert f'name="event" value="{approval.pk}"' in pushed["operator"]
    assert "Approved by a policy, not started yet." in pushed["operator"]
    assert "undo-policy-approval" not in pushed["viewer"]


def test_the_plan_page_undoes_a_policys_approval_on_the_step_row(operator: Any, operator_client: Client,
                                                                  viewer_client: Client) -> None:
    """The step's own row offers Undo approval (operators only, CSRF, the same service as the inbox); a refused
    undo (a viewer, no CSRF token, an event that is not this step's approval) changes nothing."""
    policy_with(operator, {"action": "approve", "tools": "buy food", "approve_risky": True, "approve_permission": True})
    agent = hungry_persona()
    step = until_buy_food_asked(agent)
    Agent.objects.filter(pk=agent.pk).update(status=Agent.Status.PAUSED)  # the step has not started yet
    approval = PlanEvent.objects.get(step=step, kind=PlanEvent.Kind.STEP_APPROVED)
    url = f"/steps/{step.pk}/undo-policy-approval/"
    page = operator_client.get(f"/plans/{step.plan_id}/").content.decode()
    assert f'hx-post="{url}"' in page and f'name="event" value="{approval.pk}"' in page
    assert url not in viewer_client.get(f"/plans/{step.plan_id}/").content.decode()

    assert viewer_client.post(url, {"event": approval.pk}).status_code == 403
    guarded = Client(enforce_csrf_checks=True)
    guarded.force_login(operator)
    assert guarded.post(url, {"event": approval.pk}).status_code == 403
    other = PlanEvent.objects.filter(step=step).exclude(kind=PlanEvent.Kind.STEP_APPROVED).first()
    for bad in ["", "x", "²", str(other.pk if other else 0), "9" * 30]:
        refused = operator_client.post(url, {"event": bad}, HTTP_HX_REQUEST="true")
        assert refused.status_code == 400 and "Nothing was changed" in refused.content.decode(), bad
    step.refresh_from_db()
    assert step.status == PlanStep.Status.PENDING and not step.events.filter(kind=PlanEvent.Kind.DECISION_UNDONE)

    done = operator_client.post(url, {"event": approval.pk}, HTTP_HX_REQUEST="true")
    body = done.content.decode()
    assert done.status_code == 200 and f"Approval undone: step {step.key}" in body
    assert url not in body and f'hx-post="/steps/{step.pk}/approve/"' in body  # the row now asks a person
    step.refresh_from_db()
    assert step.status == PlanStep.Status.AWAITING_APPROVAL and step.approved_by is None
    assert PlanEvent.objects.get(step=step, kind=PlanEvent.Kind.DECISION_UNDONE).actor == operator
    again = operator_client.post(url, {"event": approval.pk}, HTTP_HX_REQUEST="true")
    assert again.status_code == 409 and "already undone" in again.content.decode()

    # Approved again by a person: nothing to undo on the row.
    planning.step_approve(step=step, user=operator)
    assert url not in operator_client.get(f"/plans/{step.plan_id}/").content.decode()


def test_plans_accepted_together_are_each_decided_by_the_rule_that_matches_it(operator: Any, settings: Any) -> None:
    from runtime.cycle import tools_start

    settings.POLICY_UNDO_SECONDS = 0
    policy_with(operator, {"action": "approve", "applies_to": "plans", "tools": "file.list, file.read"})
    agents = []
    for name, goal in (("Reader", "what's in notes.txt?"), ("Writer", "write a two-line summary of notes.txt to sum.md"),
                       ("Lister", "Show me which files are in the workspace")):
        agent = AgentFactory(name=name, kind=Agent.Kind.TOOL)
        agent.workspace.mkdir(parents=True)
        (agent.workspace / "notes.txt").write_text("milk\neggs\n")
        GoalFactory(agent=agent, description=goal, source_needs=[])
        agents.append(agent)
    tools_start([a.pk for a in agents], runner="runner-test")  # one start pass: the three plans accepted together
    reader, writer, lister = (Plan.objects.get(agent=a) for a in agents)
    for plan in (reader, lister):  # they only list and read: the rule approves each
        assert plan.status == Plan.Status.ACTIVE
        assert plan.events.get(kind=PlanEvent.Kind.PLAN_APPROVED).actor_label == "policy: Routine, rule 1"
    assert writer.status == Plan.Status.AWAITING_APPROVAL  # it writes a report: no rule names that tool
    assert not writer.events.filter(kind=PlanEvent.Kind.PLAN_APPROVED).exists()
    assert set(writer.steps.values_list("tool", flat=True)) - {"file.list", "file.read"}
