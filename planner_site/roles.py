"""Roles: operators decide and edit, viewers only watch; superusers may do everything."""

from __future__ import annotations

from typing import Any

from django.contrib.auth.models import AnonymousUser, User
from django.http import HttpRequest

OPERATORS = "operators"
VIEWERS = "viewers"
DECIDE_PERMISSION = "planning.decide_plan"


def user_can_decide(user: User | AnonymousUser) -> bool:
    """Whether this user may approve, decline, edit, pause and give goals: the permission the views'
    `@permission_required` check, as Django's model backend answers it (cached on the user per request)."""
    return user.is_active and user.has_perm(DECIDE_PERMISSION)


def roles_context(request: HttpRequest) -> dict[str, Any]:
    return {"can_decide": user_can_decide(request.user)}


ROLE_APPS = ["agents", "goals", "planning", "policies"]


def roles_assign(*, group_model: Any, permission_model: Any) -> None:
    """Create (or repair) the two groups with their permissions; used by the data migration and by tests
    whose database was flushed. Operators may view, add and change everything of the apps (and decide);
    viewers may only view."""
    operators, _ = group_model.objects.get_or_create(name=OPERATORS)
    viewers, _ = group_model.objects.get_or_create(name=VIEWERS)
    in_apps = permission_model.objects.filter(content_type__app_label__in=ROLE_APPS)
    viewers.permissions.set(in_apps.filter(codename__startswith="view_"))
    operators.permissions.set(in_apps.exclude(codename__startswith="delete_"))
