"""Statements compiled once give what the ORM gives: the dashboard's counts, the inbox count, converted rows."""

from __future__ import annotations

from typing import Any

import pytest
from django.db.models import Count, Q

from agents.models import Agent
from planner_site.statements import Statement
from planning.models import Plan, PlanStep
from planning.selectors import dashboard_counts, failing_q
from planning.steer_selectors import inbox_count
from tests.factories import AgentFactory, PlanFactory, PlanStepFactory

pytestmark = pytest.mark.django_db


def agents_of_every_kind() -> None:
    AgentFactory(status="running")
    AgentFactory(status="paused", waiting_reason="step 2 awaits approval")
    PlanFactory(agent=AgentFactory(), status=Plan.Status.FAILED)
    PlanStepFactory(plan=PlanFactory(agent=AgentFactory()), retries=1)
    PlanStepFactory(plan=PlanFactory(agent=AgentFactory()), status=PlanStep.Status.FAILED)
    recovered = AgentFactory()  # an old failure does not count once a newer plan exists
    PlanFactory(agent=recovered, status=Plan.Status.FAILED)
    PlanStepFactory(plan=PlanFactory(agent=recovered, status=Plan.Status.ACTIVE), status=PlanStep.Status.AWAITING_APPROVAL)
    PlanFactory(agent=AgentFactory(), status=Plan.Status.AWAITING_APPROVAL)


def test_dashboard_counts_match_the_orm_aggregate_as_agents_change() -> None:
    def orm() -> dict[str, int]:
        return Agent.objects.aggregate(
            agents=Count("pk"), running=Count("pk", filter=Q(status=Agent.Status.RUNNING)),
            paused=Count("pk", filter=Q(status=Agent.Status.PAUSED)), waiting=Count("pk", filter=~Q(waiting_reason="")),
            failing=Count("pk", filter=failing_q()))

    assert dashboard_counts() == orm() == {"agents": 0, "running": 0, "paused": 0, "waiting": 0, "failing": 0}
    agents_of_every_kind()
    assert dashboard_counts() == orm()
    assert dashboard_counts()["failing"] == 3 and dashboard_counts()["waiting"] == 1
    Agent.objects.filter(status="paused").update(status="running")  # the kept statement reads the new rows
    assert dashboard_counts() == orm() and dashboard_counts()["paused"] == 0


def test_inbox_count_counts_plans_and_steps_awaiting_a_person() -> None:
    assert inbox_count() == 0
    agents_of_every_kind()
    assert inbox_count() == 2


def test_statement_rows_are_converted_like_the_orm_values() -> None:
    step = PlanStepFactory(depends_on=["a", "b"], tool_input={"path": "x.txt"})
    query = PlanStep.objects.filter(plan=step.plan).values_list("pk", "depends_on", "tool_input", "updated_at", "status")
    assert Statement(query).rows() == list(query) == [
        (step.pk, ["a", "b"], {"path": "x.txt"}, step.updated_at, step.status)]


def test_a_kept_statement_refuses_parameters_it_was_not_compiled_with() -> None:
    from planner_site.statements import statement_kept

    with pytest.raises(ValueError, match="takes"):
        statement_kept("test_refuses", lambda: Agent.objects.filter(pk__in=[1, 2]).values_list("pk"), params=[2, 1])
    with pytest.raises(ValueError, match="2 parameters, not 1"):
        Statement(Agent.objects.filter(pk__in=[1, 2]).values_list("pk")).rows([1])


def test_dashboard_rows_follow_the_ids_asked_for_whatever_their_number() -> None:
    from planning.selectors import dashboard_rows
    from tests.factories import NeedFactory

    first, second, third = AgentFactory(name="a"), AgentFactory(name="b"), AgentFactory(name="c")
    PlanFactory(agent=first, status=Plan.Status.FAILED)  # older: the latest plan is the one below
    latest = PlanFactory(agent=first)
    PlanStepFactory(plan=latest, key="1", position=1, status=PlanStep.Status.COMPLETED)
    running = PlanStepFactory(plan=latest, key="2", position=2, status=PlanStep.Status.RUNNING)
    NeedFactory(agent=second, name="money", satisfaction=0.2)
    NeedFactory(agent=second, name="hunger", satisfaction=0.9)
    for ids in ([first.pk], [third.pk, second.pk, first.pk], [second.pk, 999_999, second.pk]):
        rows = dashboard_rows(agent_ids=ids)
        assert [r.agent.pk for r in rows] == [pk for pk in dict.fromkeys(ids) if pk != 999_999]
    rows = {r.agent.pk: r for r in dashboard_rows(agent_ids=[first.pk, second.pk, third.pk])}
    assert rows[first.pk].plan == latest and rows[first.pk].step == running
    assert (rows[first.pk].done, rows[first.pk].total, rows[first.pk].percent) == (1, 2, 50)
    assert [(n.name, n.satisfaction) for n in rows[second.pk].needs] == [("hunger", 0.9), ("money", 0.2)]
    assert rows[third.pk].plan is None and rows[third.pk].step is None and rows[third.pk].needs == []


def test_user_can_decide_answers_as_has_perm_does(operator: Any, viewer: Any) -> None:
    from django.contrib.auth.models import AnonymousUser, Permission

    from planner_site.roles import DECIDE_PERMISSION, user_can_decide
    from tests.factories import UserFactory

    direct = UserFactory(username="dana")
    direct.user_permissions.add(Permission.objects.get(codename=DECIDE_PERMISSION.split(".")[1]))
    root = UserFactory(username="root", is_superuser=True)
    gone = UserFactory(username="gone", role="operators", is_active=False)
    for user in (operator, viewer, direct, root, gone, UserFactory(username="nobody")):
        fresh = type(user).objects.get(pk=user.pk)  # no permission cache from an earlier answer
        assert user_can_decide(user) == fresh.has_perm(DECIDE_PERMISSION), user.username
    assert [user_can_decide(u) for u in (operator, viewer, direct, root, gone)] == [True, False, True, True, False]
    assert user_can_decide(AnonymousUser()) is False


def test_the_planners_lock_reads_the_plan_its_agent_and_previous_version_as_the_orm_does() -> None:
    from django.db import transaction

    from planning.plan_services import PlanNoLongerValidating, plan_locked_validating

    first = PlanFactory(status=Plan.Status.REPLANNED, risks=["spends money"])
    second = PlanFactory(agent=first.agent, previous=first, version=2, status=Plan.Status.VALIDATING,
                         who="Ada", confidence=0.25)
    lone = PlanFactory(status=Plan.Status.VALIDATING)
    for plan in (second, lone):
        with transaction.atomic():
            locked = plan_locked_validating(plan)
            orm = Plan.objects.select_related("agent", "previous").get(pk=plan.pk)
        fields = [f.attname for f in Plan._meta.concrete_fields]
        assert [getattr(locked, f) for f in fields] == [getattr(orm, f) for f in fields]
        assert [getattr(locked.agent, f.attname) for f in Agent._meta.concrete_fields] == [
            getattr(orm.agent, f.attname) for f in Agent._meta.concrete_fields]
        assert (locked.previous and locked.previous.risks, locked.previous_id) == (
            orm.previous and orm.previous.risks, orm.previous_id)
    Plan.objects.filter(pk=lone.pk).update(status=Plan.Status.FAILED)  # ended meanwhile (interrupted)
    with transaction.atomic(), pytest.raises(PlanNoLongerValidating):
        plan_locked_validating(lone)
