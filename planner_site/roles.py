"""Roles: operators decide and edit, viewers only watch; superusers may do everything."""

from __future__ import annotations

from typing import Any

from django.contrib.auth.models import AnonymousUser, User
from django.http import HttpRequest

OPERATORS = "operators"
VIEWERS = "viewers"
DECIDE_PERMISSION = "planning.decide_plan"


def user_can_decide(user: User | AnonymousUser) -> bool:
    """Whether this user may approve, decline, edit, pause and give goals."""
    return bool(user.is_authenticated and user.has_perm(DECIDE_PERMISSION))


def roles_context(request: HttpRequest) -> dict[str, Any]:
    return {"can_decide": user_can_decide(request.user)}
