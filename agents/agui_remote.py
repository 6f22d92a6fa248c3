"""The AG-UI protocol client (docs/agui-agents.md): a run is an HTTP POST of RunAgentInput to the agent's URL,
answered by a stream of server-sent events, each parsed into the `ag-ui-protocol` package's event types.

The request goes through the outbound guard (planner_site/outbound.py): the URL is checked and resolved once, and
the request goes to the address checked. Pure helpers (the SSE reader, the JSON Patch applied to the state, the
resume entry) take values and return values."""

from __future__ import annotations

import asyncio
import contextlib
import copy
import json
import queue
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

import httpx
import jsonpatch
from ag_ui.core import Event, Message, ResumeEntry, RunAgentInput, UserMessage
from django.conf import settings
from pydantic import TypeAdapter, ValidationError

from planner_site.outbound import OutboundRefused, destination_check

EVENT = TypeAdapter(Event)
PROTOCOL_VERSION = "1.0"


class AguiError(Exception):
    """The run could not be started or read; the message says why, for the operator."""


class RunStopped(Exception):  # noqa: N818 (not an error: the caller asked for it)
    """The caller stopped reading the run (its plan was cancelled): the stream was closed."""


def sse_batches(chunks: Iterable[Sequence[str]]) -> Iterator[list[str]]:
    """The data of the server-sent events each chunk of lines completes, one list per chunk that completes any:
    `data:` lines joined, an event ended by a blank line (an event a chunk leaves open goes on in the next);
    comments and other fields ignored."""
    data: list[str] = []
    for chunk in chunks:
        done: list[str] = []
        for line in chunk:
            line = line.rstrip("\r\n")
            if not line:
                if data:
                    done.append("\n".join(data))
                data = []
            elif line.startswith("data:"):
                value = line[5:]
                data.append(value[1:] if value.startswith(" ") else value)
        if done:
            yield done
    if data:
        yield ["\n".join(data)]


def sse_data(lines: Iterable[str]) -> Iterator[str]:
    """The data of each server-sent event, as the lines come (sse_batches, a line at a time)."""
    for done in sse_batches([line] for line in lines):
        yield from done


def event_parse(data: str) -> Any:
    """One AG-UI event (a server-sent event's data) as the package's pydantic model; AguiError when it is not."""
    try:
        return EVENT.validate_json(data)
    except ValidationError as exc:
        raise AguiError(f"the agent sent an event that is not AG-UI: {data[:200]}") from exc


def events_parse(lines: Iterable[str]) -> Iterator[Any]:
    """The AG-UI events of an SSE stream, as the package's pydantic models; AguiError on one that is not."""
    for data in sse_data(lines):
        yield event_parse(data)


def batch_parse(datas: Sequence[str]) -> tuple[list[Any], AguiError | None]:
    """The events of a batch up to the first that is not AG-UI, and the error that one raised (None when all are)."""
    events: list[Any] = []
    for data in datas:
        try:
            events.append(event_parse(data))
        except AguiError as exc:
            return events, exc
    return events, None


def state_patched(state: Any, patch: list[Any]) -> Any:
    """The state after an RFC 6902 JSON Patch (a STATE_DELTA); the state given is left as it was. AguiError when
    the patch does not apply."""
    try:
        return jsonpatch.apply_patch(copy.deepcopy(state), patch)
    except (jsonpatch.JsonPatchException, jsonpatch.JsonPointerException, TypeError, KeyError) as exc:
        raise AguiError(f"the agent's state change does not apply: {exc}") from exc


def arguments_parse(text: str) -> dict[str, Any]:
    """A tool call's argument text as an object: {} when empty, {"arguments": text} when not a JSON object."""
    if not text.strip():
        return {}
    try:
        value = json.loads(text)
    except ValueError:
        return {"arguments": text}
    return value if isinstance(value, dict) else {"arguments": value}


def run_input(*, thread_id: str, goal: str = "", state: Any = None,
              resume: list[ResumeEntry] | None = None) -> RunAgentInput:
    """A new run of the thread: the goal as the user's message for the first run, `resume[]` for the next."""
    messages: list[Message] = [UserMessage(id=uuid.uuid4().hex, role="user", content=goal)] if goal else []
    return RunAgentInput(thread_id=thread_id, run_id=uuid.uuid4().hex, protocol_version=PROTOCOL_VERSION,
                         state=state if state is not None else {}, messages=messages, tools=[], context=[],
                         resume=resume)


def resume_entry(*, interrupt_id: str, approved: bool, arguments: dict[str, Any] | None = None,
                 feedback: str = "") -> ResumeEntry:
    """The answer to one interrupt: approved (with the arguments as the operator left them) or declined with
    the operator's feedback; both are answers ("resolved")."""
    payload: dict[str, Any] = {"approved": approved}
    if approved:
        payload["arguments"] = arguments or {}
    else:
        payload["feedback"] = feedback
    return ResumeEntry(interrupt_id=interrupt_id, status="resolved", payload=payload)


def run_stream(url: str, body: RunAgentInput, *, stopped: Callable[[], bool] = lambda: False,
               check_seconds: float = 0.5) -> Iterator[list[Any]]:
    """POST the run to the agent (through the outbound guard) and yield its events as they arrive: each time, the
    events that had arrived (at least one), in order, so that a caller writes what came together at once.

    The stream is read on an event loop of its own in a thread of its own, so that the caller can stop reading at
    any moment, an event arriving or not: `stopped` is asked every `check_seconds` while no event comes (and the
    caller may leave the loop after any batch); either way the request is cancelled and its connection closed,
    which is how an AG-UI client stops a run (the protocol has no cancel message). RunStopped when `stopped`."""
    try:
        destination = destination_check(url)
    except OutboundRefused as exc:
        raise AguiError(f"The agent's address {exc}.") from exc
    extensions = {"sni_hostname": destination.host} if destination.scheme == "https" else {}
    timeout = httpx.Timeout(settings.AGUI_READ_TIMEOUT_SECONDS, connect=settings.AGUI_CONNECT_TIMEOUT_SECONDS)
    lines: queue.Queue[str | AguiError | None] = queue.Queue()

    async def read() -> None:
        try:
            async with httpx.AsyncClient(timeout=timeout, follow_redirects=False, trust_env=False) as client, \
                    client.stream("POST", destination.pinned_url, content=body.model_dump_json(by_alias=True),
                                  extensions=extensions,
                                  headers={"Content-Type": "application/json", "Accept": "text/event-stream",
                                           "Host": destination.host_header}) as response:
                if not response.is_success:
                    raise AguiError(f"The agent answered HTTP {response.status_code}.")
                async for line in response.aiter_lines():
                    lines.put(line)
        except httpx.HTTPError as exc:
            lines.put(AguiError(f"No answer from the agent ({type(exc).__name__})."))
        except AguiError as exc:
            lines.put(exc)
        finally:
            lines.put(None)

    loop = asyncio.new_event_loop()
    task = loop.create_task(read())

    def main() -> None:
        try:
            loop.run_until_complete(task)
        except BaseException:  # noqa: BLE001, S110 (cancelled by the caller: the stream is closed, nothing to say)
            pass
        finally:
            loop.close()

    reader = threading.Thread(target=main, name="agui-run", daemon=True)
    reader.start()
    started = time.monotonic()

    def received() -> Iterator[list[str]]:
        """The lines as they arrive: each time, all that had arrived (the one reader here takes them)."""
        while True:
            try:
                item = lines.get(timeout=check_seconds)
            except queue.Empty:
                if stopped():
                    raise RunStopped() from None
                if time.monotonic() - started > settings.AGUI_RUN_MAX_SECONDS:
                    raise AguiError(f"The run took longer than {settings.AGUI_RUN_MAX_SECONDS} s; "
                                    "stopped reading.") from None
                continue
            chunk: list[str] = []
            while isinstance(item, str):
                chunk.append(item)
                if lines.empty():
                    break
                item = lines.get_nowait()
            yield chunk
            if item is None:
                return
            if isinstance(item, AguiError):
                raise item

    try:
        for datas in sse_batches(received()):
            events, problem = batch_parse(datas)
            if events:
                yield events
            if problem is not None:
                raise problem
            if time.monotonic() - started > settings.AGUI_RUN_MAX_SECONDS:
                raise AguiError(f"The run took longer than {settings.AGUI_RUN_MAX_SECONDS} s; stopped reading.")
    finally:
        if reader.is_alive():
            with contextlib.suppress(RuntimeError):  # the loop ended meanwhile: nothing left to cancel
                loop.call_soon_threadsafe(task.cancel)
        reader.join(5)
