"""The project's URLs: the console, the admin, login and logout, and the demo's fake
remotes."""

from __future__ import annotations

from django.conf import settings
from django.contrib import admin
from django.contrib.auth import views as auth_views
from django.urls import URLPattern, URLResolver, include, path

from console import logins

# The admin's login says so when axes refused it for a lockout, as the console's does.
admin.site.login_form = logins.AdminLoginForm

handler400 = "console.errors.bad_request"
handler403 = "console.errors.permission_denied"
handler404 = "console.errors.page_not_found"
handler500 = "console.errors.server_error"

urlpatterns: list[URLPattern | URLResolver] = [
    path("admin/", admin.site.urls),
    # Of django.contrib.auth's views only login and logout: a password is reset by an admin
    # or a command, never by mail (README, Logins: how a password is reset).
    path("accounts/login/", logins.login, name="login"),
    path("accounts/logout/", auth_views.LogoutView.as_view(), name="logout"),
    path("api/v1/", include("api.urls")),
    path("", include("console.urls")),
]

if settings.TASKS_FAKE_REMOTES:
    # Stand-ins for the publishing and mail services, so the demo completes (never in
    # production: the settings refuse to start with them on).
    urlpatterns.append(path("fake/", include("tasks_app.demo.fake_urls")))
