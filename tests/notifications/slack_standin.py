"""A local stand-in of Slack's Web API (no machine here reaches Slack): an HTTP server on a free port recording
chat.postMessage, chat.update, chat.postEphemeral and views.open, answering as Slack documents
({"ok": true, "channel": ..., "ts": ...}); and requests signed exactly as Slack signs them
(v0:timestamp:body, HMAC-SHA256 with the app's signing secret)."""

from __future__ import annotations

import hashlib
import hmac
import itertools
import json
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qsl, urlencode

import pytest
from django.test import Client, override_settings


@dataclass
class Call:
    method: str
    args: dict[str, Any]
    token: str
    ts: str = ""  # the message's ts (posted or updated)


@dataclass
class SlackStandin:
    base_url: str = ""
    calls: list[Call] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)
    fail_next: list[str] = field(default_factory=list)  # Slack error codes to answer, in order

    def of(self, method: str) -> list[Call]:
        with self.lock:
            return [c for c in self.calls if c.method == method]

    def value(self, ts: str, action: str) -> str:
        """The value of the button `action` of message `ts` as it shows now (what Slack sends with a click)."""
        with self.lock:
            drawn = [c for c in self.calls if c.method in ("chat.postMessage", "chat.update") and c.ts == ts]
        for block in drawn[-1].args.get("blocks", []) if drawn else []:
            for element in block.get("elements", []) if block.get("type") == "actions" else []:
                if element.get("action_id") == action:
                    return str(element.get("value", ""))
        return ""


@pytest.fixture
def slack() -> Iterator[SlackStandin]:
    state, server = standin_start()
    with override_settings(SLACK_API_BASE_URL=state.base_url):
        yield state
    server.shutdown()
    server.server_close()


def standin_start() -> tuple[SlackStandin, ThreadingHTTPServer]:
    """The stand-in, serving in a thread on a free port (the bench uses it too)."""
    state = SlackStandin()
    numbers = itertools.count(1)

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            raw = self.rfile.read(int(self.headers.get("Content-Length", "0")))
            method = self.path.rstrip("/").rsplit("/", 1)[-1]
            if "json" in (self.headers.get("Content-Type") or ""):
                args = json.loads(raw or b"{}")
            else:
                args = dict(parse_qsl(raw.decode()))
                for key in ("blocks", "view"):
                    if isinstance(args.get(key), str):
                        args[key] = json.loads(args[key])
            token = (self.headers.get("Authorization") or "").removeprefix("Bearer ")
            call = Call(method, args, token)
            with state.lock:
                state.calls.append(call)
                error = state.fail_next.pop(0) if state.fail_next else ""
            if error:
                answer: dict[str, Any] = {"ok": False, "error": error}
            elif method in ("chat.postMessage", "chat.update"):
                answer = {"ok": True, "channel": args.get("channel"),
                          "ts": args.get("ts") or f"1765090000.{next(numbers):06d}",
                          "message": {"text": args.get("text", "")}}
                call.ts = answer["ts"]
            elif method == "chat.postEphemeral":
                answer = {"ok": True, "message_ts": f"1765090000.{next(numbers):06d}"}
            elif method == "views.open":
                answer = {"ok": True, "view": {"id": f"V{next(numbers)}", **args.get("view", {})}}
            else:
                answer = {"ok": False, "error": "unknown_method"}
            body = json.dumps(answer).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json; charset=utf-8")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    state.base_url = f"http://127.0.0.1:{server.server_address[1]}/api/"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    return state, server


def slack_post(client: Client, payload: dict[str, Any], *, secret: str, timestamp: int | None = None,
               signature: str | None = None) -> Any:
    """POST an interaction as Slack does: form-encoded `payload=<json>`, signed over v0:<timestamp>:<body>."""
    body = urlencode({"payload": json.dumps(payload)})
    ts = str(int(time.time()) if timestamp is None else timestamp)
    sig = signature or "v0=" + hmac.new(secret.encode(), f"v0:{ts}:{body}".encode(), hashlib.sha256).hexdigest()
    return client.post("/notifications/slack/interactions/", data=body,
                       content_type="application/x-www-form-urlencoded",
                       HTTP_X_SLACK_SIGNATURE=sig, HTTP_X_SLACK_REQUEST_TIMESTAMP=ts)


def click(action: str, *, channel: str, ts: str, user: str = "U1", team: str = "T1", value: str = "") -> dict[str, Any]:
    """A click on a button of message `ts` (`value`: the button's, as Slack sends it)."""
    return {"type": "block_actions", "user": {"id": user, "team_id": team}, "team": {"id": team},
            "trigger_id": "13345224609.738474920.8088930838d88f008e0", "api_app_id": "A1",
            "container": {"type": "message", "channel_id": channel, "message_ts": ts},
            "channel": {"id": channel}, "message": {"ts": ts},
            "actions": [{"action_id": action, "block_id": "decide", "type": "button", "value": value}]}


def submit(view: dict[str, Any], text: str, *, user: str = "U1", team: str = "T1") -> dict[str, Any]:
    """A modal submitted: the view the app opened, with the text typed in its one input."""
    return {"type": "view_submission", "user": {"id": user, "team_id": team}, "team": {"id": team},
            "view": {**view, "state": {"values": {"text": {"text": {"type": "plain_text_input", "value": text}}}}}}
