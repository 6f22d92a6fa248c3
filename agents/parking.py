"""Cycles that wait for a model without holding a thread.

The runner drives many agents at once, and most of a planning cycle is a wait for a model's answer. A cycle
is plain synchronous Django code (services, transactions, the planner), so the runner runs each one in a
greenlet on one of a few worker threads (RUNNER_THREADS). When the cycle asks a model, `loop_await` hands
the request to the runner's event loop and parks the greenlet: the thread goes on with other cycles (new
ones, or ones whose answers came back) while the HTTP request is awaited on the loop. The answer resumes
the greenlet on the thread it started on (a greenlet never moves between threads).

A hundred agents waiting for their models therefore hold a hundred parked greenlets (a few KB each), no
thread and no database connection (agents/connections.py gives it back before the wait). A cycle never
parks inside a transaction: the greenlets of one thread share its database connection, so a wait inside
`atomic()` blocks the thread instead (no model call happens there; the planner's writes are services of
their own).

This is SQLAlchemy's asyncio bridge turned around: `greenlet` is the same well-kept library it uses.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
import queue
import threading
from collections.abc import Callable, Coroutine
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

from asgiref.sync import async_to_sync
from django.db import connection
from greenlet import greenlet

logger = logging.getLogger("planner.runner")


@dataclass
class _Start:
    fn: Callable[..., Any]
    args: tuple[Any, ...]
    done: asyncio.Future[Any]
    context: contextvars.Context


@dataclass
class _Resume:
    cycle: greenlet
    answer: Future[Any]


class _Thread(threading.local):
    """What a worker thread knows about itself: its hub greenlet, its queue, the pool it belongs to."""

    hub: greenlet | None = None
    inbox: queue.SimpleQueue[_Start | _Resume | None] | None = None
    pool: CyclePool | None = None


_here = _Thread()


class CyclePool:
    """A few threads that run many cycles, each in a greenlet that parks while it awaits the loop."""

    def __init__(self, *, threads: int, loop: asyncio.AbstractEventLoop, name: str = "runner-cycle") -> None:
        self.loop = loop
        self.inboxes: list[queue.SimpleQueue[_Start | _Resume | None]] = [queue.SimpleQueue() for _ in range(threads)]
        self.live = [0] * threads  # cycles started on each thread and not yet ended (parked ones included)
        self.threads = [threading.Thread(target=self._serve, args=(index,), name=f"{name}-{index}", daemon=True)
                        for index in range(threads)]
        for thread in self.threads:
            thread.start()

    def submit(self, fn: Callable[..., Any], /, *args: Any) -> asyncio.Future[Any]:
        """Run `fn(*args)` as a cycle; call on the loop. The future has its result or its exception."""
        done: asyncio.Future[Any] = self.loop.create_future()
        index = min(range(len(self.live)), key=self.live.__getitem__)  # the thread with the fewest cycles
        self.live[index] += 1
        done.add_done_callback(lambda _f: self._ended(index))
        self.inboxes[index].put(_Start(fn, args, done, contextvars.copy_context()))
        return done

    def _ended(self, index: int) -> None:
        self.live[index] -= 1

    def shutdown(self) -> None:
        """Let the threads end once their queues are empty; parked cycles are dropped with them."""
        for inbox in self.inboxes:
            inbox.put(None)

    def _serve(self, index: int) -> None:
        inbox = self.inboxes[index]
        _here.hub, _here.inbox, _here.pool = greenlet.getcurrent(), inbox, self
        while (item := inbox.get()) is not None:
            try:
                if isinstance(item, _Resume):
                    item.cycle.switch(item.answer)
                    continue
                cycle = greenlet(self._cycle)
                cycle.gr_context = item.context
                cycle.switch(item)
            except Exception:  # never: _cycle settles every outcome; the thread must go on regardless
                logger.exception("cycle thread %s", threading.current_thread().name)

    def _cycle(self, start: _Start) -> None:
        try:
            result = start.fn(*start.args)
        except BaseException as exc:  # handed to the awaiting task, which decides what it means
            self._settle(start.done, exc=exc)
        else:
            self._settle(start.done, result=result)

    def _settle(self, done: asyncio.Future[Any], *, result: Any = None, exc: BaseException | None = None) -> None:
        def settle() -> None:
            if done.cancelled():
                return
            if exc is not None:
                done.set_exception(exc)
            else:
                done.set_result(result)

        try:
            self.loop.call_soon_threadsafe(settle)
        except RuntimeError:  # the loop closed meanwhile: nobody waits for this cycle any more
            logger.debug("a cycle ended after its runner's loop closed")

    def _park(self, coroutine: Coroutine[Any, Any, Any]) -> Any:
        cycle, hub, inbox = greenlet.getcurrent(), _here.hub, _here.inbox
        assert hub is not None and inbox is not None
        answer = asyncio.run_coroutine_threadsafe(coroutine, self.loop)
        answer.add_done_callback(lambda f: inbox.put(_Resume(cycle, f)))
        resumed: Future[Any] = hub.switch()  # the thread goes on with other cycles; the answer comes back here
        return resumed.result()


def loop_await[T](call: Callable[..., Coroutine[Any, Any, T]], /, **kwargs: Any) -> T:
    """`await call(**kwargs)` from sync code: in a runner's cycle, on the runner's loop with the cycle parked
    (its thread free meanwhile); anywhere else (a web request, the shell, a test), as `async_to_sync` does."""
    pool = _here.pool
    if pool is not None and greenlet.getcurrent() is not _here.hub and not connection.in_atomic_block \
            and not pool.loop.is_closed():
        return pool._park(call(**kwargs))  # noqa: SLF001  # the pool's own protocol, kept in this module
    return async_to_sync(call)(**kwargs)
