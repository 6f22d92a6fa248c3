"""The settings page (each operator sees and edits only their own channels and subscriptions; bad input is
refused and changes nothing) and the signed deep links (to the item after login; expired or altered: said so)."""

from __future__ import annotations

import time
from typing import Any
from unittest import mock

import pytest
from django.test import Client

from notifications.links import link_make
from notifications.models import Channel, Subscription, Trigger
from tests.factories import AgentFactory, PlanFactory, PlanStepFactory, UserFactory

pytestmark = pytest.mark.django_db


def path_of(url: str) -> str:
    return url.removeprefix("http://127.0.0.1:8000")


def test_settings_page_needs_login() -> None:
    response = Client().get("/notifications/settings/")
    assert response.status_code == 302 and "/accounts/login/" in response.url


def test_an_operator_adds_a_webhook_and_sees_its_secret(operator_client: Client, operator: Any) -> None:
    response = operator_client.post("/notifications/channels/", {"kind": "webhook", "target": "https://hooks.example.com/a"},
                                    follow=True)
    channel = Channel.objects.get(user=operator)
    assert len(channel.secret) >= 40
    page = response.content.decode()
    assert "Added Webhook (signed JSON) https://hooks.example.com/a." in page and channel.secret in page


def test_bad_channel_input_is_refused_and_changes_nothing(operator_client: Client) -> None:
    for kind, target in (("webhook", "ftp://x.example.com/"), ("email", "not-an-address"), ("slack", "javascript:alert(1)"),
                         ("pager", "https://x.example.com/")):
        response = operator_client.post("/notifications/channels/", {"kind": kind, "target": target},
                                        HTTP_HX_REQUEST="true")
        assert response.status_code == 400
        assert "Nothing was changed." in response.content.decode()
    assert Channel.objects.count() == 0


def test_an_operator_cannot_see_or_change_anothers_channels(operator_client: Client) -> None:
    other = UserFactory(username="zoe", role="operators")
    theirs = Channel.objects.create(user=other, kind="webhook", target="https://zoe.example.com/h", secret="zoes-secret")
    page = operator_client.get("/notifications/settings/").content.decode()
    assert "zoe.example.com" not in page and "zoes-secret" not in page
    for action in ("off", "remove", "rotate"):
        response = operator_client.post(f"/notifications/channels/{theirs.pk}/{action}/", HTTP_HX_REQUEST="true")
        assert response.status_code == 404
    theirs.refresh_from_db()
    assert (theirs.active, theirs.secret) == (True, "zoes-secret")


def test_a_subscription_is_saved_with_its_agents_kinds_and_risk(operator_client: Client, operator: Any) -> None:
    ada = AgentFactory(kind="tool", name="Ada")
    response = operator_client.post("/notifications/subscriptions/", {
        "new-kinds": [Trigger.WAITING, Trigger.URGENT], "new-agents": [ada.pk], "new-min_risk": "risky"},
        HTTP_HX_REQUEST="true")
    assert response.status_code == 200 and "Subscribed." in response.content.decode()
    sub = Subscription.objects.get(user=operator)
    assert (sub.kinds, sub.min_risk, list(sub.agents.all())) == ([Trigger.WAITING, Trigger.URGENT], "risky", [ada])
    response = operator_client.post(f"/notifications/subscriptions/{sub.pk}/", {
        f"s{sub.pk}-kinds": [Trigger.FAILED], f"s{sub.pk}-min_risk": "safe"}, HTTP_HX_REQUEST="true")
    sub.refresh_from_db()
    assert (sub.kinds, sub.min_risk, sub.agents.count()) == ([Trigger.FAILED], "safe", 0)


def test_a_subscription_without_kinds_or_of_another_is_refused(operator_client: Client) -> None:
    response = operator_client.post("/notifications/subscriptions/", {"new-min_risk": "safe"}, HTTP_HX_REQUEST="true")
    assert response.status_code == 400
    assert "Choose at least one kind of notification. Nothing was changed." in response.content.decode()
    theirs = Subscription.objects.create(user=UserFactory(username="zoe"), kinds=[Trigger.FAILED])
    response = operator_client.post(f"/notifications/subscriptions/{theirs.pk}/remove/", HTTP_HX_REQUEST="true")
    assert response.status_code == 404
    assert Subscription.objects.filter(pk=theirs.pk).exists()


def test_a_link_leads_to_the_step_after_login(operator: Any) -> None:
    step = PlanStepFactory(plan=PlanFactory(), key="s7")
    url = path_of(link_make(plan_id=step.plan_id, step_id=step.pk, action="approve"))
    anonymous = Client().get(url)
    assert anonymous.status_code == 302 and anonymous.url.startswith("/accounts/login/")
    client = Client()
    client.force_login(operator)
    response = client.get(url)
    assert response.status_code == 302 and response.url == f"/plans/{step.plan_id}/#step-s7"
    page = client.get(response.url).content.decode()
    assert "Approve step s7 with its button below." in page


def test_an_expired_link_says_so(operator_client: Client, settings: Any) -> None:
    step = PlanStepFactory(plan=PlanFactory())
    made = time.time() - settings.NOTIFY_LINK_MAX_AGE_SECONDS - 60
    with mock.patch("django.core.signing.time.time", return_value=made):
        url = path_of(link_make(plan_id=step.plan_id, step_id=step.pk))
    response = operator_client.get(url)
    assert response.status_code == 410
    assert "This link has expired" in response.content.decode()


def test_an_altered_link_says_so(operator_client: Client) -> None:
    step = PlanStepFactory(plan=PlanFactory())
    url = path_of(link_make(plan_id=step.plan_id, step_id=step.pk))
    token = url.rstrip("/").rsplit("/", 1)[1]
    forged = url.replace(token, token[:-3] + ("aaa" if not token.endswith("aaa") else "bbb"))
    response = operator_client.get(forged)
    assert response.status_code == 400
    assert "This link is not valid" in response.content.decode()


def test_the_admin_shows_every_attempt_with_the_receivers_answer(admin_client: Client) -> None:
    from django.utils import timezone

    from notifications.models import Delivery, DeliveryAttempt, Notification

    user = UserFactory(username="nadia")
    channel = Channel.objects.create(user=user, kind="webhook", target="https://hooks.example.com/n", secret="x")
    notification = Notification.objects.create(user=user, key="event:1", kind=Trigger.WAITING, title="Ada: step s1 waits")
    delivery = Delivery.objects.create(notification=notification, channel=channel, status="delivered", attempts=2,
                                       next_attempt_at=timezone.now())
    DeliveryAttempt.objects.create(delivery=delivery, number=1, status_code=500, response_excerpt="receiver <b>broke</b>")
    DeliveryAttempt.objects.create(delivery=delivery, number=2, ok=True, status_code=200, response_excerpt="ok")
    page = admin_client.get(f"/admin/notifications/delivery/{delivery.pk}/change/").content.decode()
    assert "receiver &lt;b&gt;broke&lt;/b&gt;" in page and "500" in page
    listing = admin_client.get("/admin/notifications/notification/").content.decode()
    assert "Ada: step s1 waits" in listing


def test_settings_changes_are_recorded_without_secrets(operator_client: Client, operator: Any) -> None:
    from notifications.models import SettingsChange

    operator_client.post("/notifications/channels/", {"kind": "webhook", "target": "https://hooks.example.com/a"})
    channel = Channel.objects.get(user=operator)
    operator_client.post(f"/notifications/channels/{channel.pk}/rotate/")
    operator_client.post(f"/notifications/channels/{channel.pk}/off/")
    operator_client.post(f"/notifications/channels/{channel.pk}/remove/")
    changes = list(SettingsChange.objects.order_by("pk").values_list("user_label", "action"))
    assert changes == [("olga", "channel_added"), ("olga", "channel_secret_renewed"), ("olga", "channel_turned_off"),
                       ("olga", "channel_removed")]
    assert channel.secret not in str(list(SettingsChange.objects.values_list("detail", flat=True)))


def test_an_admins_change_of_someones_channel_is_recorded(admin_client: Client) -> None:
    from notifications.models import SettingsChange

    owner = UserFactory(username="nadia")
    channel = Channel.objects.create(user=owner, kind="email", target="n@example.com")
    response = admin_client.post(f"/admin/notifications/channel/{channel.pk}/change/", {
        "user": owner.pk, "kind": "email", "target": "nadia@example.com", "secret": "", "active": "on"})
    assert response.status_code == 302
    change = SettingsChange.objects.get()
    assert (change.action, change.detail["owner"], change.detail["fields"]) == (
        "admin_channel_changed", owner.pk, ["target"])
