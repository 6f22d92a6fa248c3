"""Sharing a model server fairly: how many calls go to one model at once, in what order, and for how long a call
may wait for its turn.

- **A limit per model**, respected by every process: `concurrency` in the model's LLM_MODEL_SETTINGS, else
  LLM_LOCAL_CONCURRENCY (1) for a server on this machine (a loopback OPENAI_BASE_URL: llama.cpp, Ollama answer one
  request at a time) and LLM_CONCURRENCY_PER_MODEL for any other. Within a process, calls beyond it wait on the
  event loop (holding neither a thread's database connection nor a socket); across event loops and processes, a
  call to a model allowed at most SHARED_LIMIT_MAX calls at once also holds one of its leases in the cache
  (settings.CACHES: Redis in scale-out, shared by every process) while it runs.
- **Operators first**: a call for work an operator waits on (a tool agent's plan, a replan after a decline, the plan
  after an answered question: `calls_for(operator=True)`) goes before any background call (personas) waiting for
  the same model, here and, through the cache, in the other processes.
- **Background calls wait no longer than their cycle** (`calls_for(wait_limit=...)`, a persona's cycle interval):
  past it the call fails with `ModelBusy`, and the persona's rules decide instead, as for any model error (the
  call log says so).
- **Cancelled plans abort their calls**: `plan_calls_abort(plan_id)` (planning's cancel) marks the plan in the
  cache; a call of that plan, waiting or in flight, stops within LLM_ABORT_POLL_SECONDS.
- **A stopping runner aborts its calls**: `model_calls_stop(loop)` (the runner's stop, SIGTERM) stops every call
  made on the runner's event loop, waiting or in flight, at once with CallAborted, and no new one starts there: the
  cycles under way end within the grace instead of waiting for a busy model.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import ipaddress
import itertools
import secrets
import time
import weakref
from collections.abc import Awaitable, Callable, Iterator
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from django.conf import settings
from django.core.cache import cache

from agents.llm.structured import model_settings

OPERATOR, BACKGROUND = 0, 1  # priorities: lower goes first
LEASE_POLL_SECONDS = 0.05
OPERATOR_MARK_SECONDS = 2.0  # an operator's call waiting for a lease says so in the cache for this long


class ModelBusy(Exception):
    """A background call waited longer than it may for its model (its cycle): the rules decide instead."""


class CallAborted(Exception):
    """The plan the call was for was cancelled: the call stopped, waiting or in flight."""


@dataclass(frozen=True)
class CallClass:
    """Who waits for the calls made in a block: an operator (first in line) or nobody in particular (background),
    and how long such a call may wait for its turn (None: as long as its deadline allows)."""

    operator: bool = False
    wait_limit: float | None = None


_call_class: ContextVar[CallClass | None] = ContextVar("llm_call_class", default=None)
_BACKGROUND = CallClass()


@contextlib.contextmanager
def calls_for(*, operator: bool = False, wait_limit: float | None = None) -> Iterator[None]:
    """The model calls made inside the block are an operator's (`operator=True`) or background ones that may wait
    at most `wait_limit` seconds for their turn. Threads and event-loop tasks started inside inherit it."""
    token = _call_class.set(CallClass(operator=operator, wait_limit=wait_limit))
    try:
        yield
    finally:
        _call_class.reset(token)


def call_class() -> CallClass:
    return _call_class.get() or _BACKGROUND


def loopback(base_url: str) -> bool:
    """Whether the model server runs on this machine."""
    host = (urlsplit(base_url).hostname or "").lower()
    if host in ("localhost", "localhost.localdomain"):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def model_concurrency(model: str) -> int:
    """How many calls to `model` may run at once, in all processes together (see the module's docstring)."""
    own = model_settings(model).get("concurrency")
    if own:
        return max(1, int(own))
    bound = max(1, int(settings.LLM_CONCURRENCY_PER_MODEL))
    local = int(getattr(settings, "LLM_LOCAL_CONCURRENCY", 1))
    if local > 0 and loopback(getattr(settings, "OPENAI_BASE_URL", "")):
        return min(bound, local)
    return bound


SHARED_LIMIT_MAX = 16  # a model allowed more calls at once than this (a hosted API) is bounded per process only


def shared_slots(capacity: int) -> bool:
    """Whether a call also takes a lease in the cache: for a model allowed few calls at once (a local server), so
    that every event loop of this process and every process sharing the cache (Redis in scale-out) keep to the
    limit together (LLM_SHARED_SLOTS: "auto", "on", "off")."""
    wanted = str(getattr(settings, "LLM_SHARED_SLOTS", "auto")).lower()
    if wanted in ("on", "off"):
        return wanted == "on"
    backend = str(settings.CACHES.get("default", {}).get("BACKEND", ""))
    return capacity <= SHARED_LIMIT_MAX and not backend.endswith("DummyCache")


class ModelGate:
    """One model's calls in one process: at most `capacity` at once, operators' before the others; a background
    call holding a slot gives it up to an operator's call that would wait (`give_way`)."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.in_use = 0
        self.waiting: list[tuple[int, int, asyncio.Future[None]]] = []
        self._order = itertools.count()
        self.background: set[asyncio.Task[Any]] = set()  # the background calls holding a slot

    def operators_waiting(self) -> bool:
        return any(priority == OPERATOR and not future.done() for priority, _n, future in self.waiting)

    def give_way(self) -> None:
        """An operator's call waits: one background call holding a slot stops (ModelBusy, its rules decide), and
        its slot goes to the first in line, the operator's."""
        for task in self.background:
            if task not in _gave_way and not task.done():
                _gave_way.add(task)
                task.cancel()
                return

    async def acquire(self, priority: int, wait_limit: float | None) -> None:
        if self.in_use < self.capacity and not any(not f.done() for _p, _n, f in self.waiting):
            self.in_use += 1
            return
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        heapq.heappush(self.waiting, (priority, next(self._order), future))
        if priority == OPERATOR and self.capacity <= SHARED_LIMIT_MAX:
            self.give_way()
        try:
            async with asyncio.timeout(wait_limit):
                await future
        except BaseException:
            if future.done() and not future.cancelled():
                self.release()  # handed the slot just as the wait ended: pass it on
            else:
                future.cancel()
            raise

    def release(self) -> None:
        while self.waiting:
            _priority, _n, future = heapq.heappop(self.waiting)
            if not future.done():
                future.set_result(None)  # the slot goes to the first in line, still counted in use
                return
        self.in_use = max(0, self.in_use - 1)


# Event loop -> model -> its gate (a gate's futures belong to the loop they are awaited on).
_gates: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[str, ModelGate]] = weakref.WeakKeyDictionary()


def model_gate(model: str) -> ModelGate:
    """The gate of `model`'s calls on the running loop (its capacity follows the settings)."""
    per_model = _gates.setdefault(asyncio.get_running_loop(), {})
    gate = per_model.get(model)
    capacity = model_concurrency(model)
    if gate is None:
        gate = per_model[model] = ModelGate(capacity)
    gate.capacity = capacity
    return gate


def _server_key(model: str) -> str:
    return f"{getattr(settings, 'OPENAI_BASE_URL', '')}|{model.strip().lower()}".replace(" ", "_")[:200]


def lease_seconds() -> float:
    """How long a lease lasts if its process dies holding it: a call's longest life (every try), plus a margin."""
    return float(settings.LLM_TIMEOUT_SECONDS) * (int(settings.LLM_MAX_RETRIES) + 1) + 10


async def lease_take(model: str, capacity: int, *, operator: bool, until: float | None,
                     aborted: Callable[[], bool]) -> str:
    """One of the model's `capacity` leases in the shared cache; the key taken. Background calls leave free
    leases to an operator's call that waits for one in any process. Raises ModelBusy at `until`."""
    token = secrets.token_hex(8)
    base = f"llm-lease:{_server_key(model)}"
    while True:
        operator_waits = (not operator) and bool(cache.get(f"{base}:operator"))
        if not operator_waits:
            for slot in range(capacity):
                key = f"{base}:{slot}"
                if cache.add(key, token, timeout=lease_seconds()):
                    return key
        if operator:
            cache.set(f"{base}:operator", 1, timeout=OPERATOR_MARK_SECONDS)
        if until is not None and time.monotonic() >= until:
            raise ModelBusy(f"waited more than the {settings_wait(until):g} s this call may wait for {model}")
        if aborted():
            raise CallAborted("the plan was cancelled while its call waited for the model")
        await asyncio.sleep(LEASE_POLL_SECONDS)


def settings_wait(until: float) -> float:
    return max(0.0, round(until - time.monotonic(), 1))


def lease_give_back(key: str) -> None:
    with contextlib.suppress(Exception):
        cache.delete(key)


def plan_calls_abort(plan_id: int) -> None:
    """Stop the model calls of a cancelled plan, in every process (they look within LLM_ABORT_POLL_SECONDS)."""
    with contextlib.suppress(Exception):
        cache.set(f"llm-abort:{plan_id}", 1, timeout=max(600.0, lease_seconds()))


def plan_calls_aborted(plan_id: int | None) -> bool:
    if plan_id is None:
        return False
    try:
        return bool(cache.get(f"llm-abort:{plan_id}"))
    except Exception:
        return False


# The runner's loops that are stopping (no model call starts there), and each loop's calls under way.
_stopped_loops: weakref.WeakSet[asyncio.AbstractEventLoop] = weakref.WeakSet()
_loop_calls: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, set[asyncio.Task[Any]]] = (
    weakref.WeakKeyDictionary())
_stop_cancelled: weakref.WeakSet[asyncio.Task[Any]] = weakref.WeakSet()  # cancelled by model_calls_stop
_gave_way: weakref.WeakSet[asyncio.Task[Any]] = weakref.WeakSet()  # background calls an operator's call stopped
GAVE_WAY = ("{model} was needed for an operator's call ({capacity} at a time): this background call gave way and the "
            "rules decide instead")
STOPPED = "the runner is stopping: the model call was stopped"


def model_calls_stop(loop: asyncio.AbstractEventLoop) -> None:
    """The runner on `loop` stops: its model calls, waiting for their turn or in flight, end now with CallAborted
    (their requests closed, their slots freed) and none starts there any more. Safe from any thread."""
    def stop() -> None:
        _stopped_loops.add(loop)
        for task in list(_loop_calls.get(loop, ())):
            if not task.done():
                _stop_cancelled.add(task)
                task.cancel()

    if loop.is_closed():
        return
    try:
        running = asyncio.get_running_loop()
    except RuntimeError:
        running = None
    if running is loop:
        stop()
    else:
        with contextlib.suppress(RuntimeError):  # the loop closed meanwhile: nothing left to stop
            loop.call_soon_threadsafe(stop)


def model_calls_resume(loop: asyncio.AbstractEventLoop) -> None:
    """A runner starts on `loop`: model calls may start there again (after a stop, in the same process)."""
    _stopped_loops.discard(loop)


async def model_call_bounded[T](call: Callable[..., Awaitable[T]], /, *, model: str, priority: int = BACKGROUND,
                                wait_limit: float | None = None, plan_id: int | None = None, **kwargs: Any) -> T:
    """`await call(model=model, **kwargs)` in its turn (see the module's docstring): ModelBusy when a wait limit
    passes first, CallAborted when the plan `plan_id` is cancelled meanwhile or the runner stops."""
    loop = asyncio.get_running_loop()
    if loop in _stopped_loops:
        raise CallAborted(STOPPED)
    task = asyncio.current_task()
    if task is None:  # not in a task (never the case under asyncio.run or async_to_sync): nothing to register
        return await _model_call_bounded(call, model=model, priority=priority, wait_limit=wait_limit,
                                         plan_id=plan_id, **kwargs)
    calls = _loop_calls.setdefault(loop, set())
    calls.add(task)
    try:
        return await _model_call_bounded(call, model=model, priority=priority, wait_limit=wait_limit,
                                         plan_id=plan_id, **kwargs)
    except asyncio.CancelledError:
        if task in _stop_cancelled:
            task.uncancel()
            raise CallAborted(STOPPED) from None
        if task in _gave_way:
            task.uncancel()
            raise ModelBusy(GAVE_WAY.format(model=model, capacity=model_gate(model).capacity)) from None
        raise
    finally:
        calls.discard(task)
        _stop_cancelled.discard(task)
        _gave_way.discard(task)


async def _model_call_bounded[T](call: Callable[..., Awaitable[T]], /, *, model: str, priority: int,
                                 wait_limit: float | None, plan_id: int | None, **kwargs: Any) -> T:
    gate = model_gate(model)
    started = time.monotonic()
    until = None if wait_limit is None else started + wait_limit
    if plan_calls_aborted(plan_id):
        raise CallAborted("the plan was cancelled before its call was made")
    try:
        await gate.acquire(priority, wait_limit)
    except TimeoutError:
        raise ModelBusy(f"{model} was busy with other calls for more than the {seconds(wait_limit)} s this call may "
                        f"wait ({gate.capacity} at a time, operators' first)" + busy_then(priority)) from None
    lease = ""
    try:
        if shared_slots(gate.capacity):
            try:
                lease = await lease_take(model, gate.capacity, operator=priority == OPERATOR, until=until,
                                         aborted=lambda: plan_calls_aborted(plan_id))
            except ModelBusy:
                raise ModelBusy(f"{model} was busy in other processes for more than the {seconds(wait_limit)} s this "
                                "call may wait" + busy_then(priority)) from None
        holder = asyncio.current_task() if priority == BACKGROUND else None
        if holder is not None:
            gate.background.add(holder)  # gives way to an operator's call in this process (ModelGate.give_way)
        try:
            if plan_id is None and not (lease and holder is not None):
                return await call(model=model, **kwargs)
            operator_mark = f"llm-lease:{_server_key(model)}:operator" if lease and holder is not None else ""
            return await call_watched(call(model=model, **kwargs), plan_id, operator_mark)
        finally:
            if holder is not None:
                gate.background.discard(holder)
    finally:
        if lease:
            lease_give_back(lease)
        gate.release()


def seconds(value: float | None) -> str:
    return "?" if value is None else f"{value:.1f}".removesuffix(".0")


def busy_then(priority: int) -> str:
    """What follows a call that waited too long: a persona's rules decide; an operator's plan is retried."""
    return ": the rules decide instead" if priority == BACKGROUND else " (the time left of its plan's deadline)"


async def call_watched[T](work: Awaitable[T], plan_id: int | None, operator_mark: str = "") -> T:
    """`await work`, stopped (its request closed) once the plan `plan_id` is cancelled (CallAborted), or, given the
    cache key `operator_mark`, once an operator's call in another process waits for the model (ModelBusy: this
    background call gives way)."""
    task = asyncio.ensure_future(work)
    poll = float(getattr(settings, "LLM_ABORT_POLL_SECONDS", 0.5))
    try:
        while True:
            done, _pending = await asyncio.wait({task}, timeout=poll)
            if done:
                return task.result()
            stop: Exception | None = None
            if plan_calls_aborted(plan_id):
                stop = CallAborted("the plan was cancelled while its model call ran: the call was stopped")
            elif operator_mark and operator_marked(operator_mark):
                stop = ModelBusy("the model was needed for an operator's call in another process: this background "
                                 "call gave way and the rules decide instead")
            if stop is not None:
                task.cancel()
                with contextlib.suppress(BaseException):
                    await task
                raise stop
    finally:
        if not task.done():
            task.cancel()


def operator_marked(key: str) -> bool:
    try:
        return bool(cache.get(key))
    except Exception:
        return False
