"""A health check for load balancers and orchestrators: the database answers, and how many runners live.

Anyone may ask, so the answer says nothing about the deployment: no host, port, database name or driver
message (those go to the server's log), only "ok" or "unreachable" and a count of live runners: on the
scale-out stack the job engine's workers whose heartbeat is younger than RUNNER_STALLED_SECONDS (a killed
one drops out within that, a stopped one at once); on the embedded stack, this process's own scheduler.
"""

from __future__ import annotations

import logging

from django.contrib.auth.decorators import login_not_required
from django.db import DatabaseError
from django.http import HttpRequest, JsonResponse
from django.views.decorators.http import require_GET

from runtime.selectors import runners_live

logger = logging.getLogger("planner.health")


@login_not_required
@require_GET
def healthz(request: HttpRequest) -> JsonResponse:
    try:
        runners = runners_live()
    except DatabaseError as exc:
        logger.warning("health check: the database did not answer: %s", exc)
        return JsonResponse({"status": "error", "database": "unreachable"}, status=503)
    return JsonResponse({"status": "ok", "database": "ok", "runners": runners})
