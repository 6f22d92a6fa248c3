"""A local OpenAI-compatible server for tests: scripted answers per model, over real HTTP.

Tests drive the real `openai` client against it, so retries, timeouts and body parsing are the SDK's own.
Each model name has a queue of scripted replies (`answer`, `error`, `hang`, `malformed`, `empty_choices`...),
taken one per request; a request for a model with nothing left in its queue gets a 404 `model_not_found`,
which the SDK does not retry. Every request is recorded (model, messages) for tests to assert on.

    with LLMTestServer() as server:
        server.script("m1", error(429), answer("hi"))
        ...  # settings.OPENAI_BASE_URL = server.base_url
        assert [r.model for r in server.requests] == ["m1", "m1"]
"""

from __future__ import annotations

import json
import threading
import time
from collections import defaultdict, deque
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Any


@dataclass(frozen=True)
class Reply:
    """One scripted reply: the status, headers and body to send, after `delay` seconds."""

    status: int = 200
    body: bytes = b""
    content_type: str = "application/json"
    headers: tuple[tuple[str, str], ...] = ()
    delay: float = 0.0


@dataclass(frozen=True)
class ReceivedRequest:
    """What the server was asked: the model, the chat messages, the JSON body, the headers (lower-cased)."""

    model: str
    messages: list[dict[str, Any]]
    body: dict[str, Any]
    headers: dict[str, str]
    received_at: float = field(default_factory=time.monotonic)


def _completion(model: str, choices: list[dict[str, Any]], usage: dict[str, int] | None) -> bytes:
    body: dict[str, Any] = {
        "id": "chatcmpl-test",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": choices,
    }
    if usage is not None:
        body["usage"] = usage
    return json.dumps(body).encode()


def answer(
    text: str | None, *, tokens_in: int = 10, tokens_out: int = 5, usage: bool = True, delay: float = 0.0,
    finish_reason: str = "stop",
) -> Reply:
    """A normal chat completion (`text=None` sends a null content), with usage unless `usage=False`;
    `finish_reason="length"` is an answer cut off at max_tokens."""
    choice = {"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": finish_reason}
    counts = (
        {"prompt_tokens": tokens_in, "completion_tokens": tokens_out, "total_tokens": tokens_in + tokens_out}
        if usage
        else None
    )
    # The model name is filled in when sent (see Handler), so one Reply can serve any model.
    return Reply(body=_completion("{model}", [choice], counts), delay=delay)


def error(status: int, *, message: str = "scripted error", retry_after_ms: int | None = 20) -> Reply:
    """An OpenAI-style error; its `retry-after-ms` keeps the SDK's backoff short (None: the SDK's own)."""
    body = json.dumps({"error": {"message": message, "type": "server_error", "code": str(status)}}).encode()
    headers = (("retry-after-ms", str(retry_after_ms)),) if retry_after_ms is not None else ()
    return Reply(status=status, body=body, headers=headers)


def hang(seconds: float = 5.0) -> Reply:
    """Say nothing for `seconds` (past the client's timeout), then answer; released early by `close()`."""
    return Reply(body=_completion("{model}", [], None), delay=seconds)


def malformed() -> Reply:
    """A 200 whose JSON body is cut off."""
    return Reply(body=b'{"id": "chatcmpl-test", "object": "chat.completion", "choices": [{"index": 0, "mess')


def empty_choices() -> Reply:
    """A well-formed completion with no choices at all."""
    usage = {"prompt_tokens": 3, "completion_tokens": 0, "total_tokens": 3}
    return Reply(body=_completion("{model}", [], usage))


def raw(body: bytes, *, status: int = 200, content_type: str = "application/json") -> Reply:
    """Any body at all, e.g. an HTML error page or JSON that is not a completion."""
    return Reply(status=status, body=body, content_type=content_type)


def format_refused(field: str = "response_format", *, status: int = 400) -> Reply:
    """What a server without structured output says to a request carrying one (llama-cpp-python answers
    422 to a `json_schema` type, others 400)."""
    message = f"Invalid value for '{field}': this server does not support it"
    body = json.dumps({"error": {"message": message, "type": "invalid_request_error", "param": field}}).encode()
    return Reply(status=status, body=body)


# What llama-cpp-python 0.3.36's server answers to `response_format: {"type": "json_schema", ...}`: an HTTP 500
# whose body is pydantic's validation error (its route handler wraps every exception as a 500).
LLAMA_CPP_JSON_SCHEMA_ERROR = (  # as its server sent it here (the traceback's file lines after it left out)
    "1 validation error: {'type': 'literal_error', 'loc': ('body', 'response_format', 'type'), "
    "'msg': \"Input should be 'text' or 'json_object'\", 'input': 'json_schema', "
    "'ctx': {'expected': \"'text' or 'json_object'\"}}"
)


def json_schema_500() -> Reply:
    """llama-cpp-python's refusal of the `json_schema` format: a 500 with a validation error as its message."""
    body = {"error": {"message": LLAMA_CPP_JSON_SCHEMA_ERROR, "type": "internal_server_error", "param": None,
                      "code": None}}
    return Reply(status=500, body=json.dumps(body).encode())


STREAM_PIECES = 20  # a streamed answer is sent in about this many pieces


class _Handler(BaseHTTPRequestHandler):
    # HTTP/1.1 keeps connections open, as real servers do, so the SDK's connection pool is exercised.
    protocol_version = "HTTP/1.1"
    # Headers and body go out in two writes: with Nagle's algorithm on, the body waits for the client's
    # delayed ACK of the headers (~40 ms a call). Real model servers (uvicorn, llama.cpp) set TCP_NODELAY.
    disable_nagle_algorithm = True
    server: _Server

    def do_GET(self) -> None:
        if self.path.rstrip("/") != "/v1/models" or self.server.llm.models is None:
            self._send(Reply(status=404, body=b'{"error": {"message": "unknown path"}}'))
            return
        self.server.llm.listed += 1
        data = [{"id": name, "object": "model", "owned_by": "me", "permissions": []}
                for name in self.server.llm.models]
        self._send(Reply(body=json.dumps({"object": "list", "data": data}).encode()))

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        raw_body = self.rfile.read(length)
        if self.path.rstrip("/") != "/v1/chat/completions":
            self._send(Reply(status=404, body=b'{"error": {"message": "unknown path"}}'))
            return
        body = json.loads(raw_body or b"{}")
        model = str(body.get("model", ""))
        headers = {name.lower(): value for name, value in self.headers.items()}
        reply = self.server.llm.take(model, body, headers)
        if self.server.llm.slots:
            self.server.llm.slots.acquire()  # a one-at-a-time server: the others queue, as llama.cpp's do
        try:
            with self.server.llm.in_flight():
                if body.get("stream") and reply.status == 200:
                    self._stream(reply, model=model)  # computed while sent: a client that hangs up stops it
                    return
                if reply.delay:
                    self.server.llm.released.wait(reply.delay)
        finally:
            if self.server.llm.slots:
                self.server.llm.slots.release()
        self._send(reply, model=model)

    def _stream(self, reply: Reply, *, model: str) -> None:
        """The answer as server-sent events, a piece at a time over its delay, as llama-cpp-python streams: when the
        client hangs up, the rest is not computed (the server's `streams_cut` counts it)."""
        completion = json.loads(reply.body.replace(b'"{model}"', json.dumps(model).encode()))
        choice = completion["choices"][0]
        text = str(choice["message"]["content"] or "")
        size = max(1, len(text) // STREAM_PIECES)
        pieces = [text[i:i + size] for i in range(0, len(text), size)]
        self.close_connection = True
        try:
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Connection", "close")
            self.end_headers()
            for piece in [*pieces, None]:
                if reply.delay:
                    self.server.llm.released.wait(reply.delay / (len(pieces) + 1))  # close() sends the rest at once
                delta = {"content": piece} if piece is not None else {}
                chunk = {"id": "chatcmpl-test", "object": "chat.completion.chunk", "created": completion["created"],
                         "model": model, "choices": [{"index": 0, "delta": delta,
                                                      "finish_reason": None if piece is not None else choice["finish_reason"]}]}
                self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
                self.wfile.flush()
            self.wfile.write(b"data: [DONE]\n\n")
            self.wfile.flush()
        except (BrokenPipeError, ConnectionResetError):
            with self.server.llm._lock:
                self.server.llm.streams_cut += 1


    def _send(self, reply: Reply, *, model: str = "") -> None:
        payload = reply.body.replace(b'"{model}"', json.dumps(model).encode())
        try:
            self.send_response(reply.status)
            self.send_header("Content-Type", reply.content_type)
            self.send_header("Content-Length", str(len(payload)))
            for name, value in reply.headers:
                self.send_header(name, value)
            self.end_headers()
            self.wfile.write(payload)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the client gave up waiting (a scripted hang): nothing left to tell it

    def log_message(self, format: str, *args: Any) -> None:
        pass  # keep test output clean


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    # socketserver's default backlog of 5 drops connects beyond it when many clients call at once; the
    # client's TCP retry then adds a second to those calls, which a real model server would not.
    request_queue_size = 256
    llm: LLMTestServer


class LLMTestServer:
    """The server on 127.0.0.1 (a free port) in a background thread; `base_url` is its `/v1` root."""

    def __init__(self, *, models: list[str] | None = None, refuse_json_schema: bool = False,
                 slots: int = 0) -> None:
        """`models`: what `GET /v1/models` lists (None: a 404, as some servers answer); `refuse_json_schema`:
        answer every `json_schema` request as llama-cpp-python does (`json_schema_500`, no script taken);
        `slots`: answer that many requests at a time, the rest wait (0: no bound)."""
        self.models = models
        self.listed = 0  # how many times /v1/models was asked
        self.refuse_json_schema = refuse_json_schema
        self.slots = threading.BoundedSemaphore(slots) if slots else None
        self._lock = threading.Lock()
        self._scripts: dict[str, deque[Reply]] = defaultdict(deque)
        self._in_flight = 0
        self.max_in_flight = 0
        self.streams_cut = 0  # streamed answers whose client hung up before the end (their rest never computed)
        self.requests: list[ReceivedRequest] = []
        # Set by close(): scripted hangs end at once, so shutting down never waits for them.
        self.released = threading.Event()
        self._httpd = _Server(("127.0.0.1", 0), _Handler)
        self._httpd.llm = self
        host, port = self._httpd.server_address[:2]
        self.base_url = f"http://{host!s}:{port}/v1"
        # A short poll lets close() return at once instead of after serve_forever's default half second.
        self._thread = threading.Thread(
            target=self._httpd.serve_forever, kwargs={"poll_interval": 0.05}, name="llm-test-server",
            daemon=True,
        )

    def start(self) -> LLMTestServer:
        self._thread.start()
        return self

    def close(self) -> None:
        self.released.set()
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(timeout=5)

    def __enter__(self) -> LLMTestServer:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def script(self, model: str, *replies: Reply) -> None:
        """Queue replies for `model`, answered in order, one per request."""
        with self._lock:
            self._scripts[model].extend(replies)

    def requests_for(self, model: str) -> list[ReceivedRequest]:
        with self._lock:
            return [r for r in self.requests if r.model == model]

    def pending(self, model: str) -> int:
        """How many scripted replies for `model` are still unused."""
        with self._lock:
            return len(self._scripts[model])

    def take(self, model: str, body: dict[str, Any], headers: dict[str, str]) -> Reply:
        with self._lock:
            messages = list(body.get("messages", []))
            self.requests.append(ReceivedRequest(model=model, messages=messages, body=body, headers=headers))
            if self.refuse_json_schema and (body.get("response_format") or {}).get("type") == "json_schema":
                return json_schema_500()
            queue = self._scripts.get(model)
            if queue:
                return queue.popleft()
        message = f"no scripted reply left for model {model!r}"
        not_found = {"message": message, "type": "invalid_request_error", "code": "model_not_found"}
        return Reply(status=404, body=json.dumps({"error": not_found}).encode())

    @contextmanager
    def in_flight(self) -> Iterator[None]:
        """Count requests being answered at once, so tests can see that calls overlap."""
        with self._lock:
            self._in_flight += 1
            self.max_in_flight = max(self.max_in_flight, self._in_flight)
        try:
            yield
        finally:
            with self._lock:
                self._in_flight -= 1


def _serve_in_child(conn: Any) -> None:
    """The child process of `LLMServerProcess`: one server, scripted and asked over the pipe."""
    with LLMTestServer() as server:
        conn.send(server.base_url)
        while (message := conn.recv()) is not None:
            op, args = message
            if op == "script":
                server.script(*args)
                conn.send(None)
            elif op == "max_in_flight":
                conn.send(server.max_in_flight)


class LLMServerProcess:
    """The same server in a process of its own, as a real model server is: its threads (one per request)
    then take no CPU from the process under test. Scripted the same way; `max_in_flight` is asked for."""

    def __init__(self) -> None:
        import multiprocessing

        context = multiprocessing.get_context("spawn")  # a fresh interpreter: no threads or Django state forked
        self._conn, child = context.Pipe()
        self._process = context.Process(target=_serve_in_child, args=(child,), name="llm-test-server", daemon=True)

    def __enter__(self) -> LLMServerProcess:
        self._process.start()
        self.base_url: str = self._conn.recv()
        return self

    def __exit__(self, *exc: object) -> None:
        self._conn.send(None)
        self._process.join(timeout=10)
        if self._process.is_alive():
            self._process.kill()

    def script(self, model: str, *replies: Reply) -> None:
        self._conn.send(("script", (model, *replies)))
        self._conn.recv()

    @property
    def pid(self) -> int:
        """The server process's id (its CPU is read from /proc by the runner's bench); started in __enter__."""
        assert self._process.pid is not None, "the server is not started"
        return self._process.pid

    @property
    def max_in_flight(self) -> int:
        self._conn.send(("max_in_flight", ()))
        return int(self._conn.recv())


# --- tool calls (the OpenAI Agents SDK and other tool-using clients) ---------------------------------------


def tool_call(name: str, arguments: dict[str, Any], *, call_id: str = "call_1", text: str | None = None,
              tokens_in: int = 10, tokens_out: int = 5) -> Reply:
    """A chat completion in which the model calls one tool (`finish_reason: tool_calls`)."""
    message = {"role": "assistant", "content": text, "tool_calls": [{
        "id": call_id, "type": "function", "function": {"name": name, "arguments": json.dumps(arguments)}}]}
    choice = {"index": 0, "message": message, "finish_reason": "tool_calls"}
    usage = {"prompt_tokens": tokens_in, "completion_tokens": tokens_out, "total_tokens": tokens_in + tokens_out}
    return Reply(body=_completion("{model}", [choice], usage))


def tool_results(request: ReceivedRequest) -> dict[str, str]:
    """The tool results a request carried back to the model, by call id (its `role: tool` messages)."""
    return {str(m.get("tool_call_id")): str(m.get("content")) for m in request.messages if m.get("role") == "tool"}
