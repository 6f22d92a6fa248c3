"""Notifications on the embedded runtime: the scheduler of `serve`/`runagents` (runtime/embedded.py) runs
`notifier_forever` beside its cycles. Every NOTIFY_SWEEP_SECONDS, or at once when an event that may notify
someone commits in this process (`nudge`), it dispatches new events and sends what is due, in a thread of its
own (a slow webhook never holds up the agents' cycles or the database thread)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from concurrent.futures import ThreadPoolExecutor

from asgiref.sync import sync_to_async
from django.conf import settings

from agents.connections import CONNECTION_ERRORS, connection_release, error_brief

logger = logging.getLogger("planner.notifications")

_wake: asyncio.Event | None = None
_loop: asyncio.AbstractEventLoop | None = None


def nudge(*, always: bool = False) -> None:
    """After a commit of an event that may notify someone: dispatch now rather than on the next sweep. With
    nobody subscribed there is nothing to dispatch: no job to run, no round to wake (the sweep moves on).
    `always`: there is something to do anyway (a Slack message to update)."""
    from notifications.selectors import anyone_listening

    if not always and not anyone_listening():
        return
    if settings.SCALE_OUT:
        from runtime.notify_tasks import dispatch_defer

        dispatch_defer()
        return
    loop, wake = _loop, _wake
    if loop is not None and wake is not None:
        with contextlib.suppress(RuntimeError):  # the loop closed meanwhile
            loop.call_soon_threadsafe(wake.set)


def notify_warm() -> None:
    """Load once, before the first notification, what the first one would otherwise wait for: the URL
    configuration its links are made from (a runner process never served a page), and the e-mail package."""
    from django.core.mail import EmailMessage
    from django.urls import reverse

    reverse("notify-settings")
    EmailMessage(subject="warm", body="warm", to=["nobody@example.com"]).message()  # built, never sent


def notify_round(runner: str) -> int:
    from notifications.reminders import reminders_dispatch
    from notifications.services import deliveries_send_due, notifications_dispatch
    from notifications.slack_app import messages_refresh

    try:
        notifications_dispatch()
        reminders_dispatch()
        sent = deliveries_send_due(runner=runner)
        messages_refresh()
        return sent
    finally:
        connection_release()


async def notifier_forever(stopping: asyncio.Event, *, runner: str) -> None:
    """Dispatch and deliver until `stopping` is set."""
    global _wake, _loop
    _wake, _loop = asyncio.Event(), asyncio.get_running_loop()
    thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="notifier")
    try:
        await sync_to_async(notify_warm, thread_sensitive=False, executor=thread)()
        while not stopping.is_set():
            _wake.clear()
            try:
                await sync_to_async(notify_round, thread_sensitive=False, executor=thread)(runner)
            except CONNECTION_ERRORS as exc:
                logger.warning("%s: notifications wait for the database (%s)", runner, error_brief(exc))
            except Exception:
                logger.exception("%s: a notifications round failed", runner)
            waits = [asyncio.ensure_future(_wake.wait()), asyncio.ensure_future(stopping.wait())]
            await asyncio.wait(waits, timeout=settings.NOTIFY_SWEEP_SECONDS, return_when=asyncio.FIRST_COMPLETED)
            for waiting in waits:
                waiting.cancel()
    finally:
        _wake = _loop = None
        # A round under way finishes (its connection given back) before the scheduler reports it stopped.
        await asyncio.get_running_loop().run_in_executor(None, thread.shutdown)
