from __future__ import annotations

from django.contrib import admin
from django.urls import include, path

from planner_site.health import healthz
from planning.api import api_urls

admin.site.site_header = "Agent planner admin"
admin.site.site_title = "Agent planner"

urlpatterns = [
    path("admin/", admin.site.urls),
    path("accounts/", include("planner_site.accounts")),
    path("healthz", healthz, name="healthz"),
    path("notifications/", include("notifications.urls")),
    path("", include("planning.urls")),
    path("policies/", include("policies.urls")),
    path("api/", api_urls()),
]
