"""A health check for load balancers and orchestrators: the database answers, and which runners hold leases."""

from __future__ import annotations

from django.contrib.auth.decorators import login_not_required
from django.db import DatabaseError
from django.http import HttpRequest, JsonResponse
from django.utils import timezone
from django.views.decorators.http import require_GET

from agents.models import Agent


@login_not_required
@require_GET
def healthz(request: HttpRequest) -> JsonResponse:
    try:
        runners = sorted(set(
            Agent.objects.filter(lease_expires_at__gt=timezone.now()).exclude(lease_owner="")
            .values_list("lease_owner", flat=True)
        ))
    except DatabaseError as exc:
        return JsonResponse({"status": "error", "database": str(exc)[:200]}, status=503)
    # A count only: nothing about agents, plans or hosts reaches an unauthenticated caller.
    return JsonResponse({"status": "ok", "database": "ok", "runners": len(runners)})
