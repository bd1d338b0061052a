from __future__ import annotations

from django.conf import settings
from django.contrib import admin
from django.urls import URLPattern, URLResolver, include, path

from console import views as console_views

handler400 = "console.errors.bad_request"
handler403 = "console.errors.permission_denied"
handler404 = "console.errors.page_not_found"
handler500 = "console.errors.server_error"

urlpatterns: list[URLPattern | URLResolver] = [
    path("admin/", admin.site.urls),
    path("accounts/login/", console_views.login, name="login"),
    path("accounts/", include("django.contrib.auth.urls")),
    path("", include("console.urls")),
]

if settings.TASKS_FAKE_REMOTES:
    # Stand-ins for the publishing and mail services, so the demo completes (never in
    # production: the settings refuse to start with them on).
    urlpatterns.append(path("fake/", include("config.fake_urls")))
