"""A small AG-UI agent for the tests (docs/agui-agents.md), served on loopback by http.server: its run is an SSE
stream built with ag-ui-protocol's EventEncoder. A goal's run lists and reads the notes, then ends with an interrupt
asking approval to write a summary; the resumed run writes where the answer says, or not at all when declined."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from ag_ui.core import (
    Interrupt,
    RunAgentInput,
    RunFinishedEvent,
    RunFinishedInterruptOutcome,
    RunStartedEvent,
    StateDeltaEvent,
    StateSnapshotEvent,
    StepFinishedEvent,
    StepStartedEvent,
    TextMessageContentEvent,
    TextMessageEndEvent,
    TextMessageStartEvent,
    ToolCallArgsEvent,
    ToolCallEndEvent,
    ToolCallResultEvent,
    ToolCallStartEvent,
)
from ag_ui.encoder import EventEncoder


class FileAgent:
    """An AG-UI agent: a goal's run lists and reads the notes, then asks before writing a summary; a resumed run
    writes where the answer says (or not at all, when declined)."""

    def __init__(self, expires_at: str | None = None, pause_seconds: float = 0.0) -> None:
        self.expires_at = expires_at or (datetime.now(UTC) + timedelta(hours=1)).isoformat()
        self.runs: list[dict[str, Any]] = []
        self.pause_seconds = pause_seconds  # a slow agent: this long before each event after the first
        self.events_sent = 0
        self.disconnected = threading.Event()  # the client closed the run's stream

    def events(self, body: RunAgentInput) -> list[Any]:
        t, r = body.thread_id, body.run_id
        if body.resume:
            entry = body.resume[0]
            payload = entry.payload or {}
            if not payload.get("approved"):
                return [RunStartedEvent(thread_id=t, run_id=r),
                        TextMessageStartEvent(message_id="m2", role="assistant"),
                        TextMessageContentEvent(message_id="m2", delta=f"Not writing: {payload.get('feedback')}"),
                        TextMessageEndEvent(message_id="m2"),
                        RunFinishedEvent(thread_id=t, run_id=r)]
            path = payload["arguments"]["path"]
            return [RunStartedEvent(thread_id=t, run_id=r),
                    ToolCallResultEvent(message_id="m3", tool_call_id="c3", content=f"wrote {path}"),
                    StateDeltaEvent(delta=[{"op": "add", "path": "/files/-", "value": path}]),
                    RunFinishedEvent(thread_id=t, run_id=r)]
        calls = [("c1", "list_files", {"path": "."}, "notes.txt"),
                 ("c2", "read_file", {"path": "notes.txt"}, "ship on friday")]
        out: list[Any] = [RunStartedEvent(thread_id=t, run_id=r), StateSnapshotEvent(snapshot={"files": []}),
                          StepStartedEvent(step_name="survey"),
                          TextMessageStartEvent(message_id="m1", role="assistant"),
                          TextMessageContentEvent(message_id="m1", delta="I will read the notes, "),
                          TextMessageContentEvent(message_id="m1", delta="then write a summary."),
                          TextMessageEndEvent(message_id="m1")]
        for call_id, tool, args, result in calls:
            text = json.dumps(args)
            out += [ToolCallStartEvent(tool_call_id=call_id, tool_call_name=tool),
                    ToolCallArgsEvent(tool_call_id=call_id, delta=text[:5]),
                    ToolCallArgsEvent(tool_call_id=call_id, delta=text[5:]),
                    ToolCallEndEvent(tool_call_id=call_id),
                    ToolCallResultEvent(message_id=f"r{call_id}", tool_call_id=call_id, content=result)]
        out += [StateDeltaEvent(delta=[{"op": "add", "path": "/files/-", "value": "notes.txt"}]),
                StepFinishedEvent(step_name="survey"),
                ToolCallStartEvent(tool_call_id="c3", tool_call_name="write_file"),
                ToolCallArgsEvent(tool_call_id="c3", delta=json.dumps({"path": "summary.txt", "content": "friday"})),
                ToolCallEndEvent(tool_call_id="c3"),
                RunFinishedEvent(thread_id=t, run_id=r, outcome=RunFinishedInterruptOutcome(interrupts=[
                    Interrupt(id="i-write", reason="tool_approval", message="May I write summary.txt?",
                              tool_call_id="c3", expires_at=self.expires_at)]))]
        return out


@contextmanager
def agui_agent_serving(agent: FileAgent) -> Iterator[str]:
    """The agent served on a free loopback port; yields its URL."""
    encoder = EventEncoder()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 (http.server's name)
            raw = self.rfile.read(int(self.headers["Content-Length"]))
            body = RunAgentInput.model_validate_json(raw)
            agent.runs.append(json.loads(raw))
            self.send_response(200)
            self.send_header("Content-Type", encoder.get_content_type())
            self.end_headers()
            for index, event in enumerate(agent.events(body)):
                if index and agent.pause_seconds:
                    time.sleep(agent.pause_seconds)
                try:
                    self.wfile.write(encoder.encode(event).encode())
                    self.wfile.flush()
                except (BrokenPipeError, ConnectionResetError):
                    agent.disconnected.set()
                    return
                agent.events_sent += 1

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/agent"
    finally:
        server.shutdown()
        server.server_close()
