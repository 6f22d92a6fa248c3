"""From events to what reaches an operator: the dispatcher makes one notification per subscribed operator and a
delivery per channel; webhooks arrive signed, a failure is retried later, and nothing is sent twice after a
success; e-mail goes through Django's mail; Slack gets Approve and Decline buttons."""

from __future__ import annotations

import json
import threading
from datetime import timedelta
from typing import Any

import pytest
from django.core import mail
from django.db import close_old_connections
from django.utils import timezone

from notifications.models import Delivery, DeliveryAttempt, Notification, Subscription, Trigger
from notifications.senders import slack_body
from notifications.services import deliveries_send_due, delivery_attempt, notifications_dispatch
from planning import services as planning_services
from planning.models import Plan, PlanEvent, PlanStep
from tests.factories import AgentFactory, PlanEventFactory, PlanFactory, PlanStepFactory
from tests.notifications.conftest import Receiver, subscribed

pytestmark = pytest.mark.django_db


def step_waiting(*, risk: str = PlanStep.Risk.SAFE, agent: Any = None, **plan: Any) -> PlanStep:
    plan_row = PlanFactory(agent=agent or AgentFactory(kind="tool", name="Ada"), approval_mode=Plan.ApprovalMode.STEP, **plan)
    step = PlanStepFactory(plan=plan_row, key="s1", description="Delete the old logs", risk=risk,
                           status=PlanStep.Status.AWAITING_APPROVAL)
    PlanEventFactory(plan=plan_row, step=step, kind=PlanEvent.Kind.STEP_AWAITING)
    return step


def test_a_waiting_step_reaches_the_webhook_signed_with_a_link(receiver: Receiver) -> None:
    user = subscribed(receiver)
    step = step_waiting()
    assert len(notifications_dispatch()) == 1
    assert deliveries_send_due() == 1
    [got] = receiver.wait_for(1)
    assert receiver.signature_valid(got)
    body = got.json()
    assert body["kind"] == Trigger.WAITING
    assert body["step"]["key"] == "s1" and body["agent"]["name"] == "Ada"
    assert "waits for your approval" in body["title"]
    assert body["link"].startswith("http://127.0.0.1:8000/notifications/link/")
    assert body["approve_link"] != body["decline_link"]
    assert got.headers["x-planner-timestamp"] == str(body["sent_at"])
    assert got.headers["x-planner-delivery"] == str(body["delivery"])
    notification = Notification.objects.get(user=user)
    assert notification.step == step
    delivery = notification.deliveries.get()
    assert delivery.status == Delivery.Status.DELIVERED
    assert list(delivery.attempt_rows.values_list("status_code", "response_excerpt")) == [(200, "ok")]


def test_a_tampered_body_fails_the_signature_check(receiver: Receiver) -> None:
    subscribed(receiver)
    step_waiting()
    notifications_dispatch()
    deliveries_send_due()
    [got] = receiver.wait_for(1)
    got.body = got.body.replace(b"Delete", b"Keep")
    assert not receiver.signature_valid(got)


def test_a_500_is_retried_later_and_nothing_is_sent_again_after_success(receiver: Receiver) -> None:
    subscribed(receiver)
    receiver.script = [500]
    step_waiting()
    [delivery_id] = notifications_dispatch()
    assert deliveries_send_due() == 0
    delivery = Delivery.objects.get(pk=delivery_id)
    assert delivery.status == Delivery.Status.PENDING and delivery.attempts == 1
    assert delivery.next_attempt_at > timezone.now()  # backed off: not due again at once
    assert "HTTP 500" in delivery.last_error
    assert deliveries_send_due() == 0  # not due yet
    assert deliveries_send_due(now=delivery.next_attempt_at) == 1
    first, second = receiver.wait_for(2)
    assert first.headers["x-planner-delivery"] == second.headers["x-planner-delivery"]
    assert [first.json()["attempt"], second.json()["attempt"]] == [1, 2]
    assert list(DeliveryAttempt.objects.filter(delivery_id=delivery_id).values_list("number", "status_code")) == [
        (1, 500), (2, 200)]
    # Delivered: a late job, a second worker or another sweep sends nothing more.
    assert delivery_attempt(delivery_id=delivery_id).status == "skipped"
    assert deliveries_send_due(now=timezone.now() + timedelta(days=1)) == 0
    notifications_dispatch()
    assert len(receiver.received) == 2
    assert Notification.objects.count() == 1


def test_attempts_run_out_and_the_delivery_is_given_up(receiver: Receiver, settings: Any) -> None:
    settings.NOTIFY_MAX_ATTEMPTS = 2
    subscribed(receiver)
    receiver.script = [503, 503, 503]
    step_waiting()
    [delivery_id] = notifications_dispatch()
    deliveries_send_due()
    deliveries_send_due(now=timezone.now() + timedelta(hours=1))
    delivery = Delivery.objects.get(pk=delivery_id)
    assert (delivery.status, delivery.attempts) == (Delivery.Status.FAILED, 2)
    assert deliveries_send_due(now=timezone.now() + timedelta(days=1)) == 0
    assert len(receiver.received) == 2


@pytest.mark.django_db(transaction=True)
def test_two_senders_at_once_send_once(receiver: Receiver) -> None:
    subscribed(receiver)
    step_waiting()
    [delivery_id] = notifications_dispatch()
    outcomes: list[str] = []

    def send() -> None:
        try:
            outcomes.append(delivery_attempt(delivery_id=delivery_id).status)
        finally:
            close_old_connections()

    threads = [threading.Thread(target=send) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(outcomes) == ["delivered", "skipped", "skipped", "skipped"]
    assert len(receiver.received) == 1


def test_email_goes_through_djangos_mail_with_the_link() -> None:
    subscribed(email="nadia@example.com")
    step_waiting()
    notifications_dispatch()
    assert deliveries_send_due() == 1
    [message] = mail.outbox
    assert message.to == ["nadia@example.com"]
    assert "Ada: step s1 waits for your approval" in message.subject
    assert "/notifications/link/" in message.body and "Approve: " in message.body


def test_slack_payload_has_approve_and_decline_buttons() -> None:
    subscribed(email="n@example.com")
    step_waiting()
    notifications_dispatch()
    payload = Notification.objects.get().payload
    body = slack_body(payload)
    assert body["text"] == payload["title"]
    [actions] = [b for b in body["blocks"] if b["type"] == "actions"]
    buttons = {b["text"]["text"]: b["url"] for b in actions["elements"]}
    assert buttons["Approve"] == payload["approve_link"] and buttons["Decline"] == payload["decline_link"]
    json.dumps(body)  # a JSON body as Slack takes it


def test_slack_text_cannot_inject_mentions_or_links() -> None:
    body = slack_body({"title": "<!channel> <https://evil|click>", "text": "a & b", "link": "http://x/"})
    assert body["blocks"][0]["text"]["text"] == "&lt;!channel&gt; &lt;https://evil|click&gt;"


def test_a_step_decided_before_the_dispatch_notifies_nobody(receiver: Receiver, operator: Any) -> None:
    subscribed(receiver)
    step = step_waiting()
    planning_services.step_approve(step=step, user=operator)  # e.g. a policy decided it at once
    assert notifications_dispatch() == []
    assert Notification.objects.count() == 0


def test_a_plan_awaiting_approval_a_failure_and_a_question_notify(receiver: Receiver) -> None:
    subscribed(receiver)
    awaiting = PlanFactory(status=Plan.Status.AWAITING_APPROVAL, goal_text="Tidy the disk")
    PlanEventFactory(plan=awaiting, kind=PlanEvent.Kind.VALIDATED)
    failed = PlanFactory(status=Plan.Status.FAILED)
    PlanEventFactory(plan=failed, kind=PlanEvent.Kind.PLAN_FAILED, reason="the model never answered")
    asking = PlanFactory(status=Plan.Status.CLARIFYING, clarification_question="Which folder?")
    PlanEventFactory(plan=asking, kind=PlanEvent.Kind.CLARIFICATION_ASKED)
    validated_then_active = PlanFactory(status=Plan.Status.ACTIVE)  # approved at once: waits no more
    PlanEventFactory(plan=validated_then_active, kind=PlanEvent.Kind.VALIDATED)
    notifications_dispatch()
    kinds = dict(Notification.objects.values_list("plan_id", "kind"))
    assert kinds == {awaiting.pk: Trigger.WAITING, failed.pk: Trigger.FAILED, asking.pk: Trigger.QUESTION}
    texts = {n.kind: n.payload["text"] for n in Notification.objects.all()}
    assert texts[Trigger.FAILED] == "the model never answered" and texts[Trigger.QUESTION] == "Which folder?"


def test_escalations_and_budgets_recorded_by_policies_notify(receiver: Receiver) -> None:
    subscribed(receiver)
    step = step_waiting(risk=PlanStep.Risk.RISKY)
    PlanEventFactory(plan=step.plan, step=step, kind=PlanEvent.Kind.ESCALATED, actor_label="policy night-watch",
                     reason="rule 2: risky tool at night")
    PlanEventFactory(plan=None, agent=step.plan.agent, kind=PlanEvent.Kind.BUDGET_REACHED,
                     actor_label="policy budget", reason="$5.00 a day reached")
    notifications_dispatch()
    titles = dict(Notification.objects.values_list("kind", "title"))
    assert titles[Trigger.ESCALATED] == "Ada: step s1 was escalated to you"
    assert titles[Trigger.BUDGET] == "Ada: budget reached, the agent is paused"


def test_subscriptions_filter_by_agent_kind_and_risk() -> None:
    ada, bob = AgentFactory(kind="tool", name="Ada"), AgentFactory(kind="tool", name="Bob")
    only_bob = subscribed(email="b@example.com", agents=[bob], username="only-bob")
    only_risky = subscribed(email="r@example.com", min_risk=Subscription.MinRisk.RISKY, username="only-risky")
    only_failures = subscribed(email="f@example.com", kinds=[Trigger.FAILED], username="only-failures")
    step_waiting(agent=ada)
    risky = step_waiting(agent=bob, risk=PlanStep.Risk.RISKY)
    notifications_dispatch()
    got = set(Notification.objects.values_list("user__username", "step_id"))
    assert got == {(only_bob.username, risky.pk), (only_risky.username, risky.pk)}
    assert not Notification.objects.filter(user=only_failures).exists()


def test_an_item_that_crosses_its_waiting_policy_notifies_once_as_urgent(receiver: Receiver) -> None:
    subscribed(receiver, kinds=[Trigger.URGENT])
    agent = AgentFactory(kind="tool", name="Ada", escalate_after_minutes=5)
    step = step_waiting(agent=agent)
    assert notifications_dispatch() == []  # it waits, but not for long yet
    later = timezone.now() + timedelta(minutes=6)
    assert len(notifications_dispatch(now=later)) == 1
    assert notifications_dispatch(now=later + timedelta(minutes=1)) == []  # once per wait
    notification = Notification.objects.get()
    assert (notification.kind, notification.step) == (Trigger.URGENT, step)
    assert notification.title.startswith("Urgent: Ada: step s1 has waited")


def test_nobody_subscribed_nothing_made_and_history_is_not_sent(receiver: Receiver) -> None:
    step_waiting()
    assert notifications_dispatch() == []
    subscribed(receiver)
    old = timezone.now() + timedelta(minutes=5)  # the event is now older than the look-back
    assert notifications_dispatch(now=old) == []
    assert Notification.objects.count() == 0


def test_a_channel_turned_off_before_sending_sends_nothing(receiver: Receiver) -> None:
    user = subscribed(receiver)
    step_waiting()
    [delivery_id] = notifications_dispatch()
    user.notify_channels.update(active=False)
    assert deliveries_send_due() == 0
    delivery = Delivery.objects.get(pk=delivery_id)
    assert (delivery.status, delivery.last_error) == (Delivery.Status.FAILED, "Not sent: the channel was turned off.")
    assert receiver.received == []


def test_a_burst_of_events_is_read_in_batches_none_skipped(receiver: Receiver, monkeypatch: Any) -> None:
    from notifications import selectors

    monkeypatch.setattr(selectors, "BATCH_EVENTS", 2)
    subscribed(receiver)
    notifications_dispatch()  # the cursor starts here
    steps = [step_waiting(agent=AgentFactory(kind="tool")) for _ in range(5)]
    made = [len(notifications_dispatch()) for _ in range(4)]
    assert made == [2, 2, 1, 0]
    assert set(Notification.objects.values_list("step_id", flat=True)) == {s.pk for s in steps}


def test_a_slack_channel_gets_the_message_with_buttons(receiver: Receiver, settings: Any) -> None:
    from notifications.models import Channel

    settings.SLACK_WEBHOOK_HOSTS = ["127.0.0.1"]  # Slack's own host stands in for the local receiver
    user = subscribed()
    Channel.objects.create(user=user, kind=Channel.Kind.SLACK, target=receiver.url)
    step_waiting()
    notifications_dispatch()
    assert deliveries_send_due() == 1
    [got] = receiver.wait_for(1)
    body = got.json()
    assert body["text"] == "Ada: step s1 waits for your approval"
    [actions] = [b for b in body["blocks"] if b["type"] == "actions"]
    assert [b["text"]["text"] for b in actions["elements"]] == ["Approve", "Decline", "Open"]
    assert all("/notifications/link/" in b["url"] for b in actions["elements"])


def test_with_nobody_subscribed_the_dispatch_reads_no_events_and_moves_past_them(django_assert_max_num_queries: Any) -> None:
    """A thousand agents write hundreds of events a second; when nobody listens, the dispatch (every second on
    every runner) must not read them (tests/bench/scale.py measured it as most of a runner's CPU)."""
    plan = PlanFactory()
    notifications_dispatch()  # the cursor exists from the first dispatch on
    PlanEvent.objects.bulk_create([PlanEvent(plan=plan, agent=plan.agent, kind=PlanEvent.Kind.STEP_AWAITING)
                                   for _ in range(200)])
    with django_assert_max_num_queries(4):
        assert notifications_dispatch() == []
    newest = PlanEvent.objects.order_by("-pk").values_list("pk", flat=True).first()
    from notifications.models import DispatchCursor
    assert DispatchCursor.objects.get(pk=1).last_event_id == newest


def test_a_persona_plan_that_started_at_once_is_not_read_as_waiting(receiver: Receiver) -> None:
    subscribed(receiver)
    plan = PlanFactory(status=Plan.Status.ACTIVE)
    PlanEventFactory(plan=plan, kind=PlanEvent.Kind.VALIDATED)
    assert notifications_dispatch() == []
