"""The policies page: everyone signed in reads it, only operators edit (checked on the server), bad input is
refused with a reason and changes nothing, every change is recorded; the dry run; the admin."""

from __future__ import annotations

from typing import Any

import pytest
from django.test import Client

from planning.models import PlanEvent, PlanStep
from policies.models import Budget, Policy, PolicyChange, Rule
from tests.factories import AgentFactory, PlanFactory, PlanStepFactory, UserFactory

pytestmark = pytest.mark.django_db


def test_a_viewer_reads_the_page_but_cannot_change_anything(viewer_client: Client) -> None:
    policy = Policy.objects.create(name="Routine")
    page = viewer_client.get("/policies/")
    assert page.status_code == 200
    html = page.content.decode()
    assert "Routine" in html and "Create policy" not in html and "Set budget" not in html
    assert "Add rule" not in viewer_client.get(f"/policies/{policy.pk}/").content.decode()
    for path, data in [("/policies/new/", {"name": "Mine", "position": 1}),
                       (f"/policies/{policy.pk}/switch/", {"enabled": "on"}),
                       (f"/policies/{policy.pk}/rules/", {"new-action": "approve"}),
                       (f"/policies/{policy.pk}/delete/", {}),
                       ("/policies/budgets/", {"daily_limit": "1"})]:
        assert viewer_client.post(path, data).status_code == 403, path
    assert Policy.objects.get().enabled is False and not Rule.objects.exists() and not Budget.objects.exists()


def test_logged_out_users_are_sent_to_log_in(client: Client) -> None:
    response = client.get("/policies/")
    assert response.status_code == 302 and "/accounts/login/" in response["Location"]


def rule_post(**values: Any) -> dict[str, Any]:
    data = {"applies_to": "steps", "risk": "any", "requires_permission": "any", "action": "approve"}
    data.update(values)
    return {f"new-{k}": v for k, v in data.items()}


def test_an_operator_writes_a_policy_and_switches_it_on(operator_client: Client, operator: Any) -> None:
    response = operator_client.post("/policies/new/", {"name": "Routine reads", "description": "", "position": 1},
                                    follow=True)
    policy = Policy.objects.get(name="Routine reads")
    assert "It is off" in response.content.decode() and not policy.enabled
    refused = operator_client.post(f"/policies/{policy.pk}/switch/", {"enabled": "on"}, follow=True).content.decode()
    assert "has no rules yet" in refused and not Policy.objects.get().enabled
    operator_client.post(f"/policies/{policy.pk}/rules/", rule_post(tools="file.read, file.list", max_estimated_cycles=2))
    operator_client.post(f"/policies/{policy.pk}/rules/", rule_post(action="decline", reason="No writes at night",
                                                                    tools="file.write", active_from="22:00",
                                                                    active_until="06:00"))
    page = operator_client.get(f"/policies/{policy.pk}/").content.decode()
    assert "steps using file.read, file.list estimated at most 2 cycles → approve" in page
    assert "steps using file.write between 22:00 and 06:00 → decline: “No writes at night”" in page
    operator_client.post(f"/policies/{policy.pk}/switch/", {"enabled": "on"})
    assert Policy.objects.get().enabled
    changes = list(PolicyChange.objects.order_by("id").values_list("what", "actor_label"))
    assert changes[0] == ("policy 'Routine reads' created (off)", "olga")
    assert changes[-1] == ("policy 'Routine reads' switched on", "olga")
    assert len(changes) == 4


@pytest.mark.parametrize(("values", "message"), [
    ({"action": "decline"}, "A decline needs a reason"),
    ({"risk": "risky"}, "would never approve anything"),
    ({"action": "teleport"}, "Select a valid choice"),
    ({"tools": "file.read\x1b[31m"}, "This text"),
    ({"max_estimated_cycles": "0"}, "greater than or equal to 1"),
    ({"active_from": "25:00"}, "Enter a valid time"),
])
def test_a_bad_rule_is_refused_with_the_reason_and_nothing_is_saved(operator_client: Client, values: dict[str, Any],
                                                                    message: str) -> None:
    policy = Policy.objects.create(name="Routine")
    response = operator_client.post(f"/policies/{policy.pk}/rules/", rule_post(**values), follow=True)
    assert message in response.content.decode() and "Nothing was changed." in response.content.decode()
    assert not Rule.objects.exists() and not PolicyChange.objects.exists()


def test_budgets_are_set_and_refused_with_reasons(operator_client: Client) -> None:
    agent = AgentFactory(name="Spender")
    refused = operator_client.post("/policies/budgets/", {"agent": agent.pk}, follow=True).content.decode()
    assert "Set a daily limit, a plan limit or both." in refused and not Budget.objects.exists()
    assert operator_client.post("/policies/budgets/", {"agent": agent.pk, "daily_limit": "-1"}).status_code == 302
    assert not Budget.objects.exists()
    operator_client.post("/policies/budgets/", {"agent": agent.pk, "daily_limit": "2.5", "plan_limit": ""})
    page = operator_client.get("/policies/").content.decode()
    assert "$2.500000" in page and "Spender" in page and "Spent today" in page
    assert PolicyChange.objects.get().what == "budget of Spender set"


def test_the_dry_run_shows_what_a_policy_would_have_decided_on_people_s_decisions(operator_client: Client,
                                                                                  operator: Any) -> None:
    plan = PlanFactory(agent=AgentFactory(name="Reader", kind="tool"))
    decided = []
    for key, tool, kind in [("1", "file.read", PlanEvent.Kind.STEP_APPROVED),
                            ("2", "file.write", PlanEvent.Kind.STEP_DECLINED),
                            ("3", "file.read", PlanEvent.Kind.STEP_DECLINED),
                            ("4", "file.list", PlanEvent.Kind.STEP_APPROVED)]:
        step = PlanStepFactory(plan=plan, key=key, tool=tool, action_hint="", status=PlanStep.Status.PENDING)
        PlanEvent.objects.create(plan=plan, step=step, kind=PlanEvent.Kind.STEP_AWAITING, actor_label="runner")
        decided.append(PlanEvent.objects.create(plan=plan, step=step, kind=kind, actor=operator, actor_label="olga"))
    robot = UserFactory(username="policy-engine", is_active=False)
    step = PlanStepFactory(plan=plan, key="5", tool="file.read", action_hint="")
    PlanEvent.objects.create(plan=plan, step=step, kind=PlanEvent.Kind.STEP_AWAITING, actor_label="runner")
    PlanEvent.objects.create(plan=plan, step=step, kind=PlanEvent.Kind.STEP_APPROVED, actor=robot,
                             actor_label="policy: Other, rule 1", detail={"policy": 1})  # not a person's: left out
    policy = Policy.objects.create(name="Reads")
    Rule.objects.create(policy=policy, position=1, action="approve", tools="file.read")
    Rule.objects.create(policy=policy, position=2, action="escalate", tools="file.write")
    page = operator_client.get(f"/policies/{policy.pk}/dry-run/")
    html = page.content.decode()
    assert page.status_code == 200
    assert ("Of <b>4</b> decisions: would approve <b>2</b>, decline <b>0</b>, escalate <b>1</b>, leave <b>1</b> to a "
            "person.") in html
    assert "It agrees with the person on <b>1</b> and differs on <b>1</b>." in html
    assert html.count('class="tag bad">differs') == 1 and "step 3:" in html
    assert not Policy.objects.get().enabled and not PolicyChange.objects.exists()  # nothing changed


def test_the_admin_refuses_a_contradictory_rule_and_records_changes(admin_client: Client) -> None:
    form = {"name": "From admin", "description": "", "position": "1", "rules-TOTAL_FORMS": "1",
            "rules-INITIAL_FORMS": "0", "rules-MIN_NUM_FORMS": "0", "rules-MAX_NUM_FORMS": "1000",
            "rules-0-position": "1", "rules-0-applies_to": "steps", "rules-0-tools": "", "rules-0-risk": "any",
            "rules-0-requires_permission": "any", "rules-0-action": "decline", "rules-0-reason": ""}
    response = admin_client.post("/admin/policies/policy/add/", form)
    assert response.status_code == 200 and "A decline needs a reason" in response.content.decode()
    assert not Policy.objects.exists()
    form["rules-0-reason"] = "Not today"
    assert admin_client.post("/admin/policies/policy/add/", form).status_code == 302
    assert Policy.objects.get().enabled is False
    assert list(PolicyChange.objects.order_by("id").values_list("what", flat=True)) == [
        "policy 'From admin' added in admin (off)", "rule 1 added to 'From admin' in admin"]


def test_policies_deleted_with_the_admins_bulk_action_are_each_recorded(admin_client: Client) -> None:
    policies = [Policy.objects.create(name=f"Routine {n}") for n in range(2)]
    response = admin_client.post("/admin/policies/policy/", {
        "action": "delete_selected", "_selected_action": [p.pk for p in policies], "post": "yes"})
    assert response.status_code == 302 and not Policy.objects.exists()
    assert sorted(PolicyChange.objects.values_list("what", flat=True)) == [
        "policy 'Routine 0' deleted in admin", "policy 'Routine 1' deleted in admin"]


def test_the_dry_run_judges_a_plan_by_the_steps_it_had_to_do_even_once_they_are_done(operator_client: Client,
                                                                                      operator: Any) -> None:
    plan = PlanFactory(agent=AgentFactory(name="Reader", kind="tool"))
    PlanStepFactory(plan=plan, key="1", tool="file.read", action_hint="", status=PlanStep.Status.COMPLETED,
                    estimated_cycles=2)
    PlanStepFactory(plan=plan, key="2", tool="file.list", action_hint="", status=PlanStep.Status.COMPLETED)
    PlanEvent.objects.create(plan=plan, kind=PlanEvent.Kind.VALIDATED, actor_label="runner")
    PlanEvent.objects.create(plan=plan, kind=PlanEvent.Kind.PLAN_APPROVED, actor=operator, actor_label="olga")
    policy = Policy.objects.create(name="Reads")
    Rule.objects.create(policy=policy, position=1, action="approve", applies_to="plans", tools="file.read, file.list",
                        max_estimated_cycles=3)
    html = operator_client.get(f"/policies/{policy.pk}/dry-run/").content.decode()
    assert "file.read, file.list · 3 cycles" in html and "<b>approve</b> (rule 1)" in html
    assert "It agrees with the person on <b>1</b>" in html


def test_the_policies_page_costs_the_same_queries_for_one_budget_or_many(
        operator_client: Client, operator: Any, settings: Any, django_assert_max_num_queries: Any) -> None:
    from decimal import Decimal

    from policies import services
    from tests.factories import LLMCallFactory

    settings.LLM_PRICES = {"offline-rules": [1000.0, 1000.0]}

    def budgeted(name: str, words: int) -> None:
        agent = AgentFactory(name=name)
        LLMCallFactory(agent=agent, tokens_in=words, tokens_out=0)
        services.budget_save(user=operator, agent=agent, daily_limit=Decimal(1), plan_limit=None)

    budgeted("First", 100)
    operator_client.get("/policies/")
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    with CaptureQueriesContext(connection) as one:
        operator_client.get("/policies/")
    for n in range(5):
        budgeted(f"More {n}", 10)
    with django_assert_max_num_queries(len(one.captured_queries)):
        html = operator_client.get("/policies/").content.decode()
    assert "$0.100000" in html and html.count("$0.010000") == 5  # what each spent today
