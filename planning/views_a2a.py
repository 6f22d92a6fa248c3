"""The webhook a remote A2A agent POSTs its task's updates to (push notifications, docs/a2a-agents.md).

The webhook has no login and no CSRF token: the agent is not a user of the dashboard. It is authenticated by the
secret token the dashboard gave the agent for that one task (the X-A2A-Notification-Token header), compared in
constant time before the body is read; a request without it changes nothing."""

from __future__ import annotations

from django.contrib.auth.decorators import login_not_required
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_POST

from planning.services import a2a as a2a_services

PUSH_MAX_BYTES = 1024 * 1024  # one task update; a task's whole history fits many times


@csrf_exempt
@login_not_required
@require_POST
def a2a_push(request: HttpRequest, pk: int) -> HttpResponse:
    """A remote A2A agent's push notification for the task `pk`: recorded as a read of the task would be."""
    if len(request.body) > PUSH_MAX_BYTES:  # Django refuses a body over DATA_UPLOAD_MAX_MEMORY_SIZE before
        return JsonResponse({"error": "The notification is too large. Nothing was changed."}, status=413)
    try:
        outcome = a2a_services.task_push_record(
            task_pk=pk, token=request.headers.get("X-A2A-Notification-Token", ""), body=request.body)
    except a2a_services.PushRefused as exc:
        return JsonResponse({"error": str(exc)}, status=exc.status)
    return JsonResponse({"recorded": outcome.recorded, "state": outcome.state})
