"""Reads about the runtime itself: who drives the agents now."""

from __future__ import annotations

from datetime import timedelta

from django.conf import settings
from django.utils import timezone


def runners_live() -> int:
    """Scale-out: the job engine's workers heard from within RUNNER_STALLED_SECONDS. Embedded: 1 while this
    process's scheduler runs (the only runner there can be), else 0."""
    if settings.SCALE_OUT:
        from procrastinate.contrib.django.models import ProcrastinateWorker

        since = timezone.now() - timedelta(seconds=settings.RUNNER_STALLED_SECONDS)
        workers = ProcrastinateWorker.objects  # type: ignore[misc]  # the engine's read-only manager, typed loosely
        return int(workers.filter(last_heartbeat__gte=since).count())
    from runtime import embedded

    return int(embedded.current is not None)
