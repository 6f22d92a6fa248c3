"""Issue 50: a plan "Done, not verified" has a way out besides asking the agent again. An operator may accept it
as done (with an optional note): the plan and its goal close as that person's decision, never as "Completed" or
verified; a viewer cannot; the audit log names the person."""

from __future__ import annotations

import re
from typing import Any

import pytest
from django.test import Client
from django.urls import reverse

from goals.models import Goal
from planning import services
from planning.models import Plan, PlanEvent
from tests.planning.test_plans_reach_goals import run_approved, unverifiable

pytestmark = pytest.mark.django_db


def unverified_plan(operator: Any) -> tuple[Plan, Goal]:
    agent, plan, goal = unverifiable("Summarize notes.txt into summary.md", [
        {"description": "Read notes", "tool": "file.read", "tool_input": {"path": "notes.txt"}}])
    plan = run_approved(agent, plan, operator)
    assert plan.status == Plan.Status.UNVERIFIED
    return plan, goal


def test_accept_as_done_from_the_inbox_closes_the_goal_as_the_persons_decision(
        operator: Any, operator_client: Client) -> None:
    plan, goal = unverified_plan(operator)
    inbox = operator_client.get(reverse("inbox")).content.decode()
    url = reverse("inbox-plan-accept-done", args=[plan.pk])
    assert url in inbox and "Accept as done" in inbox and "Answer and plan again" in inbox  # replan kept

    response = operator_client.post(url, {"version": plan.version, "note": "the summary is in the chat, fine"})
    assert response.status_code == 200
    assert "Accepted" in response.content.decode() and "not verified" in response.content.decode()
    plan.refresh_from_db()
    goal.refresh_from_db()
    assert plan.status == Plan.Status.ACCEPTED and plan.get_status_display() == "Accepted as done, not verified"
    assert goal.status == Goal.Status.ACCEPTED and goal.get_status_display() == "Accepted as done, not verified"
    assert goal.milestone_explanation.startswith("Accepted as done by olga, not verified")
    assert "summary.md was not written" in goal.milestone_explanation and "the summary is in the chat" in \
        goal.milestone_explanation
    event = plan.events.get(kind=PlanEvent.Kind.PLAN_ACCEPTED)
    assert event.actor == operator and event.actor_label == "olga"
    assert event.detail["verified"] is False and event.detail["note"] == "the summary is in the chat, fine"
    # Never "Completed", never "verified".
    assert not plan.events.filter(kind=PlanEvent.Kind.PLAN_COMPLETED).exists()
    page = operator_client.get(plan.get_absolute_url()).content.decode()
    badge = re.search(r'id="plan-status">([^<]*)<', page)
    assert badge and badge.group(1) == "Accepted as done by olga, not verified"  # the plan's own status
    assert "Accept as done" not in page  # decided: no button any more
    agent_page = operator_client.get(plan.agent.get_absolute_url()).content.decode()
    assert "Accepted as done by olga, not verified" in agent_page
    assert "Accepted as done, not verified" in operator_client.get(reverse("audit")).content.decode()
    # The item left the inbox.
    assert reverse("inbox-plan-accept-done", args=[plan.pk]) not in operator_client.get(reverse("inbox")).content.decode()


def test_accept_as_done_from_the_plan_page_note_optional(operator: Any, operator_client: Client) -> None:
    plan, goal = unverified_plan(operator)
    page = operator_client.get(plan.get_absolute_url()).content.decode()
    assert reverse("plan-accept-done", args=[plan.pk]) in page and "Accept as done" in page
    response = operator_client.post(reverse("plan-accept-done", args=[plan.pk]), {"note": ""}, HTTP_HX_REQUEST="true")
    assert response.status_code == 200
    plan.refresh_from_db()
    assert plan.status == Plan.Status.ACCEPTED
    assert plan.events.get(kind=PlanEvent.Kind.PLAN_ACCEPTED).detail["note"] == ""


def test_a_viewer_cannot_accept_and_nothing_changes(operator: Any, viewer_client: Client) -> None:
    plan, goal = unverified_plan(operator)
    for url in (reverse("plan-accept-done", args=[plan.pk]), reverse("inbox-plan-accept-done", args=[plan.pk])):
        assert viewer_client.post(url, {"note": "ok"}).status_code == 403
    plan.refresh_from_db()
    goal.refresh_from_db()
    assert plan.status == Plan.Status.UNVERIFIED and goal.status == Goal.Status.ACTIVE
    assert not plan.events.filter(kind=PlanEvent.Kind.PLAN_ACCEPTED).exists()
    assert "Accept as done" not in viewer_client.get(plan.get_absolute_url()).content.decode()


def test_only_a_done_not_verified_plan_can_be_accepted_and_twice_is_refused(operator: Any,
                                                                            operator_client: Client) -> None:
    plan, _ = unverified_plan(operator)
    services.plan_accept_done(plan=plan, user=operator)
    response = operator_client.post(reverse("inbox-plan-accept-done", args=[plan.pk]), {"version": plan.version})
    assert response.status_code == 409 and "Nothing was changed" in response.content.decode()
    assert plan.events.filter(kind=PlanEvent.Kind.PLAN_ACCEPTED).count() == 1
    awaiting = Plan.objects.create(agent=plan.agent, goal_text="copy data.csv to b.csv",
                                   status=Plan.Status.AWAITING_APPROVAL)
    with pytest.raises(services.DecisionError, match="Nothing was changed"):
        services.plan_accept_done(plan=awaiting, user=operator)
    awaiting.refresh_from_db()
    assert awaiting.status == Plan.Status.AWAITING_APPROVAL


def test_the_live_plan_header_names_who_accepted_it(operator: Any) -> None:
    from planning.live.renderers import PlanLivePage

    plan, _ = unverified_plan(operator)
    page = PlanLivePage(f"plan-{plan.pk}", plan.pk)
    page.baseline()
    services.plan_accept_done(plan=plan, user=operator, note="good enough")
    out = page.render_changes({plan.pk}, {"operator", "viewer"})
    for audience in ("operator", "viewer"):
        badge = re.search(r'id="plan-status">([^<]*)<', out[audience])
        assert badge and badge.group(1) == "Accepted as done by olga, not verified"
    assert "Accept as done</button>" not in out["operator"]
