from __future__ import annotations

from django.conf import settings
from django.contrib import admin
from django.urls import include, path
from django.views.generic import RedirectView

urlpatterns = [
    # Until the dashboard exists the admin is the console.
    path("", RedirectView.as_view(pattern_name="admin:index", permanent=False)),
    path("admin/", admin.site.urls),
]

if settings.TASKS_FAKE_REMOTES:
    # Stand-ins for the publishing and mail services, so the demo workflows complete.
    urlpatterns.append(path("fake/", include("approvals.urls")))
