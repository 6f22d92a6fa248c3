"""Roles: operators decide and edit, viewers only watch; superusers may do everything."""

from __future__ import annotations

from typing import Any

from django.contrib.auth.models import AnonymousUser, Permission, User
from django.db.models import Q, QuerySet
from django.http import HttpRequest

from planner_site.statements import statement_kept

OPERATORS = "operators"
VIEWERS = "viewers"
DECIDE_PERMISSION = "planning.decide_plan"


def decide_grants(user_id: int) -> QuerySet[Permission, tuple[int]]:
    """The decide permission if this user holds it, directly or through a group: one row at most."""
    app_label, codename = DECIDE_PERMISSION.split(".")
    return (Permission.objects.filter(content_type__app_label=app_label).filter(codename=codename)
            .filter(Q(user=user_id) | Q(group__user=user_id)).order_by().values_list("pk")[:1])


def user_can_decide(user: User | AnonymousUser) -> bool:
    """Whether this user may approve, decline, edit, pause and give goals: `has_perm` as the model backend
    answers it, in one statement compiled once (every page asks, for its header)."""
    if not user.is_authenticated or not user.is_active:
        return False
    if user.is_superuser:
        return True
    app_label, codename = DECIDE_PERMISSION.split(".")
    grants = statement_kept("decide_grants", lambda: decide_grants(0), params=[app_label, codename, 0, 0])
    return bool(grants.rows([app_label, codename, user.pk, user.pk]))


def roles_context(request: HttpRequest) -> dict[str, Any]:
    return {"can_decide": user_can_decide(request.user)}


ROLE_APPS = ["agents", "goals", "planning"]


def roles_assign(*, group_model: Any, permission_model: Any) -> None:
    """Create (or repair) the two groups with their permissions; used by the data migration and by tests
    whose database was flushed. Operators may view, add and change everything of the apps (and decide);
    viewers may only view."""
    operators, _ = group_model.objects.get_or_create(name=OPERATORS)
    viewers, _ = group_model.objects.get_or_create(name=VIEWERS)
    in_apps = permission_model.objects.filter(content_type__app_label__in=ROLE_APPS)
    viewers.permissions.set(in_apps.filter(codename__startswith="view_"))
    operators.permissions.set(in_apps.exclude(codename__startswith="delete_"))
