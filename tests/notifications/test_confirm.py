"""E-mail that confirms: the Approve and Decline links of an e-mail open a confirmation page with the exact steps
and one button; a GET decides nothing; the link decides once, only for the item as it was when sent, until it
expires; declining asks for feedback; the server checks the role of whoever signs in."""

from __future__ import annotations

import re
from typing import Any

import pytest
from django.core import mail
from django.test import Client

from notifications.services import deliveries_send_due, notifications_dispatch
from planning import services as planning_services
from planning.models import Plan, PlanEvent, PlanStep
from tests.factories import AgentFactory, PlanEventFactory, PlanFactory, PlanStepFactory, UserFactory
from tests.notifications.conftest import subscribed

pytestmark = pytest.mark.django_db


def step_waiting() -> PlanStep:
    plan = PlanFactory(agent=AgentFactory(kind="tool", name="Ada"), approval_mode=Plan.ApprovalMode.STEP,
                       goal_text="Tidy the log bucket")
    step = PlanStepFactory(plan=plan, key="s1", description="Delete the old logs", risk=PlanStep.Risk.RISKY,
                           tool="shell", tool_input={"command": "rm -rf /var/log/old"},
                           status=PlanStep.Status.AWAITING_APPROVAL)
    PlanEventFactory(plan=plan, step=step, kind=PlanEvent.Kind.STEP_AWAITING)
    return step


def mailed_links() -> dict[str, str]:
    """Dispatch and send; the e-mail's Approve and Decline links (paths)."""
    notifications_dispatch()
    deliveries_send_due()
    [message] = mail.outbox
    links = dict(re.findall(r"^(Approve|Decline): http://127\.0\.0\.1:8000(\S+)$", message.body, re.M))
    assert set(links) == {"Approve", "Decline"}
    return links


def signed_in(user: Any) -> Client:
    client = Client()
    client.force_login(user)
    return client


def test_the_approve_link_shows_the_exact_step_and_decides_only_on_the_button() -> None:
    user = subscribed(email="nadia@example.com")
    step = step_waiting()
    links = mailed_links()
    assert links["Approve"].startswith("/notifications/confirm/")
    client = signed_in(user)
    page = client.get(links["Approve"])
    html = page.content.decode()
    assert page.status_code == 200
    assert "Approve" in html and "step s1" in html and "rm -rf /var/log/old" in html and "shell" in html
    assert 'name="viewport"' in html  # phone-sized
    step.refresh_from_db()
    assert step.status == PlanStep.Status.AWAITING_APPROVAL  # opening the link (a prefetch, a scanner) decides nothing
    done = client.post(links["Approve"])
    assert done.status_code == 200 and "Approved step s1." in done.content.decode()
    step.refresh_from_db()
    assert step.status == PlanStep.Status.PENDING and step.approved_by == user
    assert PlanEvent.objects.get(kind=PlanEvent.Kind.STEP_APPROVED).detail["via"] == "email"


def test_a_link_decides_once() -> None:
    user = subscribed(email="nadia@example.com")
    step_waiting()
    links = mailed_links()
    client = signed_in(user)
    client.post(links["Approve"])
    again = client.post(links["Approve"])
    assert again.status_code == 409
    assert "Nothing was changed." in again.content.decode()
    assert PlanEvent.objects.filter(kind=PlanEvent.Kind.STEP_APPROVED).count() == 1


def test_a_changed_plan_is_refused() -> None:
    user = subscribed(email="nadia@example.com")
    step = step_waiting()
    links = mailed_links()
    PlanStep.objects.filter(pk=step.pk).update(tool_input={"command": "rm -rf /"})  # edited after the e-mail
    client = signed_in(user)
    page = client.get(links["Approve"])
    assert "The plan changed since this e-mail was sent. Nothing was changed." in page.content.decode()
    assert "<button class=\"primary\">Approve</button>" not in page.content.decode()
    refused = client.post(links["Approve"])
    assert refused.status_code == 409
    assert "The plan changed since this e-mail was sent. Nothing was changed." in refused.content.decode()
    step.refresh_from_db()
    assert step.status == PlanStep.Status.AWAITING_APPROVAL


def test_decline_asks_for_feedback_there_and_it_reaches_the_replan() -> None:
    user = subscribed(email="nadia@example.com")
    step = step_waiting()
    links = mailed_links()
    client = signed_in(user)
    page = client.get(links["Decline"]).content.decode()
    assert "<textarea" in page and "Why decline?" in page
    empty = client.post(links["Decline"], {"feedback": "   "})
    assert empty.status_code == 400 and "Feedback is required" in empty.content.decode()
    step.refresh_from_db()
    assert step.status == PlanStep.Status.AWAITING_APPROVAL
    client.post(links["Decline"], {"feedback": "keep them, archive to cold storage"})
    step.refresh_from_db()
    assert step.status == PlanStep.Status.DECLINED
    assert "archive to cold storage" in step.plan.replan_reason


def test_a_viewer_signs_in_and_is_refused() -> None:
    subscribed(email="nadia@example.com")
    step_waiting()
    links = mailed_links()
    viewer = UserFactory(username="vera", role="viewers")
    client = signed_in(viewer)
    refused = client.post(links["Approve"])
    assert refused.status_code == 403 and "may only view" in refused.content.decode()
    assert not PlanEvent.objects.filter(kind=PlanEvent.Kind.STEP_APPROVED).exists()


def test_signed_out_the_link_asks_to_sign_in_first() -> None:
    subscribed(email="nadia@example.com")
    step = step_waiting()
    links = mailed_links()
    response = Client().post(links["Approve"])
    assert response.status_code == 302 and "/accounts/login/" in response["Location"]
    step.refresh_from_db()
    assert step.status == PlanStep.Status.AWAITING_APPROVAL


def test_decided_elsewhere_the_page_says_who(operator: Any) -> None:
    user = subscribed(email="nadia@example.com")
    step = step_waiting()
    links = mailed_links()
    planning_services.step_approve(step=step, user=operator)
    page = signed_in(user).get(links["Decline"]).content.decode()
    assert f"Already decided: Approved by {operator.get_username()} at" in page


def test_an_expired_or_altered_link_is_refused(settings: Any) -> None:
    user = subscribed(email="nadia@example.com")
    step_waiting()
    links = mailed_links()
    client = signed_in(user)
    assert client.get(links["Approve"][:-6] + "xxxxx/").status_code == 400
    settings.NOTIFY_LINK_MAX_AGE_SECONDS = -1
    assert client.post(links["Approve"]).status_code == 410
    assert not PlanEvent.objects.filter(kind=PlanEvent.Kind.STEP_APPROVED).exists()


def test_a_plan_awaiting_approval_is_approved_from_its_email() -> None:
    user = subscribed(email="nadia@example.com")
    plan = PlanFactory(agent=AgentFactory(kind="tool", name="Bo"), status=Plan.Status.AWAITING_APPROVAL,
                       goal_text="Ship the report")
    PlanStepFactory(plan=plan, key="fetch", tool="http_get", tool_input={"url": "https://example.com/data"})
    PlanEventFactory(plan=plan, kind=PlanEvent.Kind.VALIDATED)
    links = mailed_links()
    client = signed_in(user)
    assert "https://example.com/data" in client.get(links["Approve"]).content.decode()
    client.post(links["Approve"])
    plan.refresh_from_db()
    assert plan.status == Plan.Status.ACTIVE
