from __future__ import annotations

from django.contrib import admin
from django.urls import include, path

admin.site.site_header = "Agent planner admin"
admin.site.site_title = "Agent planner"

urlpatterns = [
    path("admin/", admin.site.urls),
    path("accounts/", include("django.contrib.auth.urls")),
    path("", include("planning.urls")),
]
