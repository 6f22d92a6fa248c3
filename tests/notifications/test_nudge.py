"""The after-commit nudge on the scale-out stack: a job engine dispatch is asked for only when someone listens
(with nobody subscribed, every validated plan deferred a dispatch job that had nobody to tell)."""

from __future__ import annotations

from typing import Any
from unittest import mock

import pytest

from notifications import selectors
from notifications.models import Subscription
from runtime.notify import nudge
from tests.notifications.conftest import subscribed

pytestmark = pytest.mark.django_db


def test_a_nudge_defers_a_dispatch_only_when_someone_listens(settings: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    settings.SCALE_OUT = True
    monkeypatch.setattr(selectors, "_listening", (float("-inf"), False))
    with mock.patch("runtime.notify_tasks.dispatch_defer") as defer:
        nudge()
        assert defer.call_count == 0  # nobody subscribed: no job
        user = subscribed()
        monkeypatch.setattr(selectors, "_listening", (float("-inf"), False))  # as after LISTENING_READ_SECONDS
        nudge()
        assert defer.call_count == 1
        Subscription.objects.filter(user=user).update(active=False)  # a paused subscription listens to nothing
        monkeypatch.setattr(selectors, "_listening", (float("-inf"), False))
        nudge()
        assert defer.call_count == 1


def test_events_written_in_bulk_wake_the_dispatch_after_commit(settings: Any, monkeypatch: pytest.MonkeyPatch,
                                                               django_capture_on_commit_callbacks: Any) -> None:
    """First versions accepted in bulk send no post_save: the domain says so through a signal
    (agents/signals.py events_may_notify) and the notifications runtime, which the domain never imports, wakes."""
    from agents.signals import events_may_notify_on_commit

    settings.SCALE_OUT = True
    subscribed()
    monkeypatch.setattr(selectors, "_listening", (float("-inf"), False))
    with mock.patch("runtime.notify_tasks.dispatch_defer") as defer:
        with django_capture_on_commit_callbacks(execute=False) as callbacks:
            events_may_notify_on_commit()
        assert defer.call_count == 0  # nothing before the commit
        for callback in callbacks:
            callback()
        assert defer.call_count == 1
