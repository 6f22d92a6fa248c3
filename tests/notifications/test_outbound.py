"""Nothing inside the deployment is reachable through a notification channel: every address a person types is
checked when the channel is saved, when it is tested and at every send, and the request goes to the address
checked. Real receivers listen on loopback; the allow-list (OUTBOUND_ALLOWED_NETWORKS) lets a deployer reach
one on purpose, and without it each form of an inside address is refused with nothing stored or sent."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from django.core.cache import cache
from django.test import Client

from notifications.models import Channel, Delivery, DeliveryAttempt, Subscription, Trigger
from notifications.services import deliveries_send_due, delivery_attempt, notifications_dispatch
from planner_site import outbound
from planning.models import Plan, PlanEvent, PlanStep
from tests.factories import AgentFactory, PlanEventFactory, PlanFactory, PlanStepFactory, UserFactory
from tests.notifications.conftest import Receiver, subscribed

pytestmark = pytest.mark.django_db

SECRET_BODY = '{"internal_db_password": "S3cr3t-do-not-show"}'


@pytest.fixture(autouse=True)
def fresh_counts() -> Iterator[None]:
    cache.clear()  # the per-minute counts of earlier tests (a port may be reused)
    yield
    cache.clear()


def step_waiting() -> PlanStep:
    plan = PlanFactory(agent=AgentFactory(kind="tool", name="Ada"), approval_mode=Plan.ApprovalMode.STEP)
    step = PlanStepFactory(plan=plan, key="s1", description="Delete the old logs",
                           status=PlanStep.Status.AWAITING_APPROVAL)
    PlanEventFactory(plan=plan, step=step, kind=PlanEvent.Kind.STEP_AWAITING)
    return step


def add_channel(client: Client, kind: str, target: str) -> Any:
    return client.post("/notifications/channels/", {"kind": kind, "target": target}, HTTP_HX_REQUEST="true")


def port_of(receiver: Receiver) -> int:
    return int(receiver.url.rsplit(":", 1)[1].split("/")[0])


def inside_forms(port: int) -> dict[str, str]:
    return {
        "loopback v4": f"http://127.0.0.1:{port}/hook",
        "loopback v4, short form": f"http://127.1:{port}/hook",
        "loopback v6": f"http://[::1]:{port}/hook",
        "localhost": f"http://localhost:{port}/hook",
        "localhost with a dot": f"http://localhost.:{port}/hook",
        "unspecified v4": f"http://0.0.0.0:{port}/hook",
        "unspecified v6": f"http://[::]:{port}/hook",
        "IPv4 mapped in IPv6": f"http://[::ffff:127.0.0.1]:{port}/hook",
        "cloud metadata": "http://169.254.169.254/latest/meta-data/",
        "cloud metadata v6": "http://[fd00:ec2::254]/latest/meta-data/",
        "private 10/8": "http://10.0.0.7/hook",
        "private 192.168/16": "https://192.168.1.1/hook",
        "private 172.16/12": "http://172.16.0.1/hook",
        "shared 100.64/10": "http://100.100.100.200/hook",
        "unique-local": "http://[fd12:3456::1]/hook",
        "link-local v6": "http://[fe80::1]/hook",
        "multicast v4": "http://224.0.0.1/hook",
        "multicast v6": "http://[ff02::1]/hook",
        "decimal loopback": f"http://2130706433:{port}/hook",
    }


# --- at save time ---------------------------------------------------------------------------------------------


def test_by_default_every_inside_address_is_refused_and_nothing_is_stored(operator_client: Client,
                                                                          receiver: Receiver, settings: Any) -> None:
    settings.OUTBOUND_ALLOWED_NETWORKS = []  # the default: nothing inside is allowed
    for name, url in inside_forms(port_of(receiver)).items():
        for kind in ("webhook", "slack"):
            response = add_channel(operator_client, kind, url)
            page = response.content.decode()
            assert response.status_code == 400, (name, kind, response.status_code)
            assert "Nothing was changed." in page, (name, kind)
    assert not Channel.objects.exists()
    assert receiver.received == []


def test_a_name_that_resolves_to_loopback_is_refused(operator_client: Client, monkeypatch: pytest.MonkeyPatch,
                                                     receiver: Receiver, settings: Any) -> None:
    settings.OUTBOUND_ALLOWED_NETWORKS = []
    monkeypatch.setattr(outbound, "resolve", lambda host, port: ["127.0.0.1"])
    response = add_channel(operator_client, "webhook", f"http://inside.attacker.test:{port_of(receiver)}/hook")
    assert response.status_code == 400
    assert "points at an address inside this network" in response.content.decode()
    # One public and one inside answer: refused too (the connection could go to either).
    monkeypatch.setattr(outbound, "resolve", lambda host, port: ["93.184.215.14", "::1"])
    assert add_channel(operator_client, "webhook", "http://mixed.attacker.test/hook").status_code == 400
    assert not Channel.objects.exists()


def test_user_info_in_a_url_is_refused(operator_client: Client) -> None:
    for url in ("https://user:password@hooks.example.com/a", "https://user@hooks.example.com/a",
                "https://hooks.example.com@127.0.0.1/a"):
        response = add_channel(operator_client, "webhook", url)
        assert response.status_code == 400, url
    assert not Channel.objects.exists()


def test_slack_channels_accept_only_slacks_webhook_host(operator_client: Client, settings: Any) -> None:
    for url in ("http://hooks.example.com/services/T/B/x", "https://hooks.slack.com.example.com/services/x",
                "https://slack.com/services/x"):
        response = add_channel(operator_client, "slack", url)
        assert response.status_code == 400, url
        assert "must be on hooks.slack.com" in response.content.decode()
    assert add_channel(operator_client, "slack", "https://hooks.slack.com/services/T0/B0/abc").status_code == 200
    settings.SLACK_WEBHOOK_HOSTS = ["hooks.slack.com", "hooks.grid.example.com"]  # an Enterprise Grid's own
    assert add_channel(operator_client, "slack", "https://hooks.grid.example.com/services/x").status_code == 200
    assert Channel.objects.count() == 2


def test_a_user_has_at_most_the_capped_number_of_channels(operator_client: Client, operator: Any,
                                                          settings: Any) -> None:
    settings.NOTIFY_MAX_CHANNELS_PER_USER = 5
    for n in range(5):
        assert add_channel(operator_client, "webhook", f"https://hooks.example.com/{n}").status_code == 200
    response = add_channel(operator_client, "webhook", "https://hooks.example.com/6")
    assert response.status_code == 409
    assert "5 channels, the most allowed" in response.content.decode()
    assert Channel.objects.filter(user=operator).count() == 5


def test_the_admin_refuses_an_inside_address_too(admin_client: Client, settings: Any) -> None:
    settings.OUTBOUND_ALLOWED_NETWORKS = []
    owner = UserFactory(username="nadia", role="operators")
    response = admin_client.post("/admin/notifications/channel/add/", {
        "user": owner.pk, "kind": "webhook", "target": "http://127.0.0.1:9/hook", "secret": "x", "active": "on"})
    assert response.status_code == 200  # the form again, with the reason
    assert "points at an address inside this network" in response.content.decode()
    assert not Channel.objects.exists()


# --- at send time ---------------------------------------------------------------------------------------------


def test_the_allow_list_lets_a_deployer_reach_an_internal_receiver(receiver: Receiver, settings: Any) -> None:
    for allowed in (["127.0.0.1/32"], ["localhost"], ["10.0.0.0/8", "127.0.0.0/8"]):
        cache.clear()
        settings.OUTBOUND_ALLOWED_NETWORKS = allowed
        url = receiver.url.replace("127.0.0.1", "localhost") if allowed == ["localhost"] else receiver.url
        assert outbound.url_problem(url) is None, allowed
        answer = outbound.post(url, b"{}", {})
        assert answer.ok and answer.status_code == 200, allowed
    assert len(receiver.wait_for(3)) == 3


def test_a_channel_stored_before_is_refused_at_every_send(receiver: Receiver, settings: Any) -> None:
    user = subscribed(receiver)  # stored straight in the table (as before this check, or by a migration)
    step_waiting()
    settings.OUTBOUND_ALLOWED_NETWORKS = []
    [delivery_id] = notifications_dispatch()
    assert deliveries_send_due() == 0
    delivery = Delivery.objects.get(pk=delivery_id)
    assert delivery.status == Delivery.Status.PENDING and delivery.last_error.startswith("refused")
    assert receiver.received == []
    assert Channel.objects.get(user=user).active  # still listed: its owner sees why it fails


def test_a_dns_answer_that_changes_after_the_check_is_refused_at_send(receiver: Receiver, settings: Any,
                                                                      monkeypatch: pytest.MonkeyPatch,
                                                                      operator_client: Client) -> None:
    settings.OUTBOUND_ALLOWED_NETWORKS = []
    answers = {"rebind.example.com": ["93.184.215.14"]}
    monkeypatch.setattr(outbound, "resolve", lambda host, port: answers[host])
    url = f"http://rebind.example.com:{port_of(receiver)}/hook"
    assert add_channel(operator_client, "webhook", url).status_code == 200  # public when saved
    answers["rebind.example.com"] = ["127.0.0.1"]  # rebound inside afterwards
    answer = outbound.post(url, b"{}", {})
    assert (answer.ok, answer.error_class) == (False, outbound.REFUSED)
    assert receiver.received == []


def test_the_request_goes_to_the_address_checked_without_resolving_again(receiver: Receiver, settings: Any,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    # The check's answer is loopback (allowed here), every later answer an address that must not be used: the
    # request still reaches the receiver, so it went to the address checked, with the name as its Host.
    settings.OUTBOUND_ALLOWED_NETWORKS = ["127.0.0.1/32"]
    calls: list[str] = []

    def resolve(host: str, port: int) -> list[str]:
        calls.append(host)
        return ["127.0.0.1"] if len(calls) == 1 else ["10.9.9.9"]

    monkeypatch.setattr(outbound, "resolve", resolve)
    real_getaddrinfo = socket.getaddrinfo

    def getaddrinfo(host: Any, *args: Any, **kwargs: Any) -> Any:
        if str(host) != "127.0.0.1":  # a connection to the pinned address looks its numeric form up only
            pytest.fail(f"a second resolution of {host}")
        return real_getaddrinfo(host, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)
    port = port_of(receiver)
    answer = outbound.post(f"http://hook.internal.test:{port}/hook", b'{"a": 1}', {"X-Test": "1"})
    assert answer.ok, answer
    assert calls == ["hook.internal.test"]
    [got] = receiver.wait_for(1)
    assert got.headers["host"] == f"hook.internal.test:{port}" and got.headers["x-test"] == "1"


def test_the_owner_sees_a_status_never_the_receivers_body(receiver: Receiver, operator_client: Client,
                                                          operator: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    channel = Channel.objects.create(user=operator, kind="webhook", target=receiver.url, secret="s")
    Subscription.objects.create(user=operator, kinds=list(Trigger.values))
    step_waiting()
    monkeypatch.setattr(outbound, "EXCERPT_CHARS", 200)
    original_post = outbound.post

    def leaky_receiver(url: str, body: bytes, headers: dict[str, str], **kw: Any) -> outbound.Answer:
        answer = original_post(url, body, headers, **kw)
        return outbound.Answer(ok=False, status_code=500, error_class=outbound.HTTP_STATUS,
                               excerpt=SECRET_BODY, duration_ms=answer.duration_ms)

    monkeypatch.setattr(outbound, "post", leaky_receiver)
    [delivery_id] = notifications_dispatch()
    delivery_attempt(delivery_id=delivery_id)
    delivery = Delivery.objects.get(pk=delivery_id)
    assert delivery.last_error == "HTTP 500: the receiver answered with an error"
    page = operator_client.get("/notifications/settings/").content.decode()
    assert "S3cr3t" not in page and "HTTP 500" in page
    test = operator_client.post(f"/notifications/channels/{channel.pk}/test/", HTTP_HX_REQUEST="true")
    assert "S3cr3t" not in test.content.decode() and "Test not delivered: HTTP 500" in test.content.decode()
    # The administrators' record keeps a short excerpt.
    assert DeliveryAttempt.objects.get(delivery=delivery).response_excerpt == SECRET_BODY


def test_a_real_500_body_is_kept_short_for_admins_only(receiver: Receiver) -> None:
    answer = outbound.post(receiver.url, b"{}", {})
    assert answer.ok
    receiver.script = [500]
    answer = outbound.post(receiver.url, b"{}", {})
    assert (answer.ok, answer.status_code, answer.summary) == (False, 500, "HTTP 500: the receiver answered with an error")
    assert answer.excerpt == "receiver broke" and "receiver broke" not in answer.summary


def silent_server(mode: str) -> tuple[int, socket.socket]:
    """A TCP port that accepts and then closes ("close") or answers bytes that are not HTTP ("garbage")."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()

    def serve() -> None:
        while True:
            try:
                conn, _ = server.accept()
            except OSError:
                return
            conn.recv(65536)
            if mode == "garbage":
                conn.sendall(b"SSH-2.0-OpenSSH_9.6\r\n\x00\xff\xfe")
            conn.close()

    threading.Thread(target=serve, daemon=True).start()
    return server.getsockname()[1], server


def test_failures_do_not_tell_open_closed_and_non_http_ports_apart(settings: Any) -> None:
    settings.OUTBOUND_ALLOWED_NETWORKS = ["127.0.0.0/8"]
    settings.NOTIFY_TIMEOUT_SECONDS = 2
    closed = socket.socket()
    closed.bind(("127.0.0.1", 0))
    closed_port = closed.getsockname()[1]
    closed.close()  # nothing listens there
    garbage_port, garbage = silent_server("garbage")
    close_port, closer = silent_server("close")
    try:
        summaries = {outbound.post(f"http://127.0.0.1:{port}/", b"{}", {}).summary
                     for port in (closed_port, garbage_port, close_port)}
    finally:
        garbage.close()
        closer.close()
    assert summaries == {"unreachable: no HTTP answer from the receiver"}


def test_attempts_per_minute_per_destination_are_capped_and_not_lost(receiver: Receiver, settings: Any,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    settings.OUTBOUND_MAX_PER_MINUTE = 2
    monkeypatch.setattr(outbound, "minute_now", lambda: 1_000)  # one minute, whatever the clock says meanwhile
    for _ in range(2):
        assert outbound.post(receiver.url, b"{}", {}).ok
    subscribed(receiver)
    step_waiting()
    [delivery_id] = notifications_dispatch()
    assert deliveries_send_due() == 0
    delivery = Delivery.objects.get(pk=delivery_id)
    assert delivery.status == Delivery.Status.PENDING and delivery.attempts == 0  # held back, not spent
    assert delivery.last_error.startswith("rate_limited")
    assert len(receiver.wait_for(2)) == 2
    monkeypatch.setattr(outbound, "minute_now", lambda: 1_001)  # the next minute
    assert deliveries_send_due(now=delivery.next_attempt_at) == 1
    assert len(receiver.wait_for(3)) == 3


# --- send a test, and who may ---------------------------------------------------------------------------------


def test_send_a_test_goes_through_the_same_guard(receiver: Receiver, operator_client: Client, operator: Any,
                                                 settings: Any) -> None:
    channel = Channel.objects.create(user=operator, kind="webhook", target=receiver.url, secret="s")
    settings.OUTBOUND_ALLOWED_NETWORKS = []
    response = operator_client.post(f"/notifications/channels/{channel.pk}/test/", HTTP_HX_REQUEST="true")
    assert "Test not delivered: refused" in response.content.decode()
    assert receiver.received == []
    settings.OUTBOUND_ALLOWED_NETWORKS = ["127.0.0.1/32"]
    response = operator_client.post(f"/notifications/channels/{channel.pk}/test/", HTTP_HX_REQUEST="true")
    assert "Test sent (HTTP 200)." in response.content.decode()
    [got] = receiver.wait_for(1)
    receiver.secret = "s"
    assert receiver.signature_valid(got) and got.json()["kind"] == "test"


def test_a_viewer_cannot_add_or_change_a_webhook_but_may_use_their_own_email(viewer_client: Client, viewer: Any,
                                                                             receiver: Receiver) -> None:
    viewer.email = "victor@example.com"
    viewer.save()
    for kind, target in (("webhook", "https://hooks.example.com/v"), ("slack", "https://hooks.slack.com/services/x"),
                         ("email", "someone-else@example.com")):
        response = add_channel(viewer_client, kind, target)
        assert response.status_code == 403, (kind, response.status_code)
        assert "Nothing was changed." in response.content.decode()
    assert not Channel.objects.exists()
    assert add_channel(viewer_client, "email", "victor@example.com").status_code == 200
    hook = Channel.objects.create(user=viewer, kind="webhook", target=receiver.url, secret="s", active=False)
    for action in ("on", "rotate", "test"):
        response = viewer_client.post(f"/notifications/channels/{hook.pk}/{action}/", HTTP_HX_REQUEST="true")
        assert response.status_code == 403, action
    hook.refresh_from_db()
    assert (hook.active, hook.secret) == (False, "s") and receiver.received == []
    # Turning off or removing one's own channel only stops sending: allowed.
    assert viewer_client.post(f"/notifications/channels/{hook.pk}/remove/", HTTP_HX_REQUEST="true").status_code == 200
    assert list(Channel.objects.values_list("kind", flat=True)) == ["email"]


def test_the_default_settings_allow_nothing_inside_and_only_slacks_host() -> None:
    import os
    import subprocess
    import sys
    from pathlib import Path

    env = {k: v for k, v in os.environ.items()
           if k not in ("OUTBOUND_ALLOWED_NETWORKS", "SLACK_WEBHOOK_HOSTS", "NOTIFY_MAX_CHANNELS_PER_USER")}
    code = ("import planner_site.settings as s; "
            "print(s.OUTBOUND_ALLOWED_NETWORKS, s.SLACK_WEBHOOK_HOSTS, s.NOTIFY_MAX_CHANNELS_PER_USER)")
    out = subprocess.run([sys.executable, "-c", code], cwd=Path(__file__).resolve().parents[2], env=env,
                         capture_output=True, text=True, timeout=60, check=True).stdout.strip()
    assert out == "[] ['hooks.slack.com'] 5"


def test_https_goes_to_the_checked_address_with_the_name_as_host_and_tls_server_name(
        monkeypatch: pytest.MonkeyPatch) -> None:
    import httpx

    seen: dict[str, Any] = {}

    class Recording:
        def stream(self, method: str, url: str, **kwargs: Any) -> Any:
            seen.update(method=method, url=url, **kwargs)
            raise httpx.ConnectError("no network in tests")

    monkeypatch.setattr(outbound, "http_client", lambda: Recording())
    answer = outbound.post("https://hooks.example.com/services/x?y=1", b"{}", {})
    assert answer.error_class == outbound.UNREACHABLE
    assert seen["url"] == "https://93.184.215.14:443/services/x?y=1"
    assert seen["headers"]["Host"] == "hooks.example.com"
    assert seen["extensions"] == {"sni_hostname": "hooks.example.com"}  # the certificate is checked for the name
