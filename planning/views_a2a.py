"""Remote A2A agents' own endpoints (docs/a2a-agents.md): the webhook an agent POSTs its task's updates to (push
notifications), and the agent page's change of the credential sent to the agent.

The webhook has no login and no CSRF token: the agent is not a user of the dashboard. It is authenticated by the
secret token the dashboard gave the agent for that one task (the X-A2A-Notification-Token header), compared in
constant time before the body is read; a request without it changes nothing."""

from __future__ import annotations

from django.contrib import messages
from django.contrib.auth.decorators import login_not_required, permission_required
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import get_object_or_404, redirect
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_POST

from agents.models import Agent
from planning.forms import A2ACredentialForm
from planning.services import a2a as a2a_services
from planning.services.errors import DecisionError
from planning.views import form_errors, operator

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


@require_POST
@permission_required("agents.change_agent", raise_exception=True)
def agent_a2a_credential(request: HttpRequest, pk: int) -> HttpResponse:
    """Replace or remove the credential sent to a remote A2A agent; the outcome shown on its page."""
    agent = get_object_or_404(Agent, pk=pk, kind=Agent.Kind.A2A)
    form = A2ACredentialForm(request.POST)
    if not form.is_valid():
        messages.error(request, form_errors(form))
        return redirect(agent)
    try:
        a2a_services.agent_a2a_credential_set(user=operator(request), agent=agent,
                                              credential=form.cleaned_data["credential"],
                                              remove=form.cleaned_data["action"] == "remove")
    except DecisionError as exc:
        messages.error(request, str(exc))
    else:
        messages.success(request, "Credential removed: requests to the agent now go without one."
                         if form.cleaned_data["action"] == "remove" else
                         "Credential replaced: the agent's next request carries the new one.")
    return redirect(agent)
