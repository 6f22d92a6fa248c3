"""A real webhook receiver (http.server in a thread on a free port) that checks signatures the way the README
tells receivers to, and answers each request with the next status of its script (then 200)."""

from __future__ import annotations

import hashlib
import hmac
import json
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from notifications.models import Channel, Subscription, Trigger
from tests.factories import UserFactory


@dataclass
class Received:
    body: bytes
    headers: dict[str, str]
    at: float  # time.monotonic() when it arrived

    def json(self) -> Any:
        return json.loads(self.body)


@dataclass
class Receiver:
    url: str
    script: list[int] = field(default_factory=list)  # statuses to answer, in order; then 200
    secret: str = ""
    received: list[Received] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)
    arrived: threading.Condition = field(default_factory=threading.Condition)

    def signature_valid(self, r: Received) -> bool:
        expected = "sha256=" + hmac.new(self.secret.encode(), r.body, hashlib.sha256).hexdigest()
        return hmac.compare_digest(expected, r.headers.get("x-planner-signature", ""))

    def wait_for(self, count: int, *, deadline: float = 30.0) -> list[Received]:
        """Wait (at most `deadline` seconds, not a timing assertion) until `count` requests arrived."""
        end = time.monotonic() + deadline
        with self.arrived:
            while len(self.received) < count and time.monotonic() < end:
                self.arrived.wait(timeout=max(0.0, end - time.monotonic()))
            return list(self.received)


PUBLIC_ADDRESS = "93.184.215.14"  # a public address the tests' example names resolve to (nothing is sent there)


@pytest.fixture(autouse=True)
def example_names_resolve(monkeypatch: pytest.MonkeyPatch) -> None:
    """Names under example.com and Slack's webhook host resolve to a public address without asking a DNS server
    (the tests run offline); every other name goes to the system resolver (localhost: loopback)."""
    from planner_site import outbound

    real = outbound.resolve

    def resolve(host: str, port: int) -> list[str]:
        if host == "example.com" or host.endswith((".example.com", ".slack.com")):
            return [PUBLIC_ADDRESS]
        return real(host, port)

    monkeypatch.setattr(outbound, "resolve", resolve)


@pytest.fixture
def receiver(settings: Any) -> Iterator[Receiver]:
    """The receiver listens on loopback, which the outbound guard refuses unless the deployer allows it: these
    tests allow it as a deployer would (OUTBOUND_ALLOWED_NETWORKS); tests/notifications/test_outbound.py proves
    the default refuses it."""
    settings.OUTBOUND_ALLOWED_NETWORKS = ["127.0.0.0/8"]
    state = Receiver(url="")

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
            with state.lock:
                status = state.script.pop(0) if state.script else 200
            self.send_response(status)
            self.send_header("Content-Type", "text/plain")
            self.end_headers()
            self.wfile.write(b"ok" if status < 400 else b"receiver broke")
            with state.arrived:
                state.received.append(Received(body, {k.lower(): v for k, v in self.headers.items()}, time.monotonic()))
                state.arrived.notify_all()

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    state.url = f"http://127.0.0.1:{server.server_address[1]}/hook"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield state
    server.shutdown()
    server.server_close()


def subscribed(receiver: Receiver | None = None, *, email: str = "", kinds: list[str] | None = None,
               min_risk: str = Subscription.MinRisk.SAFE, agents: list[Any] | None = None,
               username: str = "nadia") -> Any:
    """An operator subscribed to `kinds` (all of them by default), with a webhook to `receiver` and/or e-mail."""
    user = UserFactory(username=username, role="operators")
    if receiver is not None:
        channel = Channel.objects.create(user=user, kind=Channel.Kind.WEBHOOK, target=receiver.url, secret="s3cret-" + username)
        receiver.secret = channel.secret
    if email:
        Channel.objects.create(user=user, kind=Channel.Kind.EMAIL, target=email)
    sub = Subscription.objects.create(user=user, kinds=kinds or list(Trigger.values), min_risk=min_risk)
    if agents:
        sub.agents.set(agents)
    return user
