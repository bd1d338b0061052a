"""Logging in, to the console and to the admin, with django-axes refusing a username from
an address after too many failures (config/settings_console.py, "logins"), and a username
slowed, never locked, after many failures from any addresses.

Axes' backend refuses the login and flags the request (``axes_locked_out``); the forms
here then say why instead of "wrong password", and axes' middleware answers with
:func:`lockout_response`: the same page, with axes' status.

The pair's lockout lets a username be tried from many addresses at its pace each. So
:class:`LoginBackend` (axes' backend, and then) counts a username's failures from every
address within the window (axes' records of the pairs that failed within it): past
``CONSOLE_LOGIN_USERNAME_CEILING`` the username takes one try every window / ceiling
seconds, from anywhere; a try sooner is refused with 429 and ``Retry-After``, and not
counted, so the slowing ends by itself once the failures stop, and the real user, with
the right password, gets in at the next free try. Each refusal is counted on ``/metrics``
(``tasks_logins_slowed_total``), with the usernames slowed now
(``tasks_login_usernames_slowed``), for the TasksLoginUsernameSlowed alert.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any

from axes.backends import AxesStandaloneBackend
from axes.exceptions import AxesBackendPermissionDenied
from axes.models import AccessAttempt
from django.conf import settings
from django.contrib.admin.forms import AdminAuthenticationForm
from django.contrib.auth import views as auth_views
from django.contrib.auth.decorators import login_not_required
from django.contrib.auth.forms import AuthenticationForm
from django.core.exceptions import ValidationError
from django.db.models import Count, Max, Sum
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.template.response import TemplateResponse
from django.utils import timezone
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.metrics_core import Metric

from tasks_app.history import counting

# The counter of tries refused by the username's ceiling.
SLOWED = "login_slowed"


def lockout_message() -> str:
    minutes = max(math.ceil(settings.AXES_COOLOFF_TIME.total_seconds() / 60), 1)
    return (
        "Too many failed logins for this username from your address: it is locked for "
        f"{minutes} minute{'' if minutes == 1 else 's'} after the last one. "
        "An administrator can unlock it sooner."
    )


def slowed_message(wait: int) -> str:
    spacing = math.ceil(_window_seconds() / settings.CONSOLE_LOGIN_USERNAME_CEILING)
    return (
        "Too many failed logins for this username from many addresses: for now it takes "
        f"one try every {spacing} seconds. Try again in {wait} second{'' if wait == 1 else 's'}."
    )


def _locked_out_error(request: HttpRequest | None) -> ValidationError | None:
    if request is not None and (wait := getattr(request, "login_slowed_for", None)):
        return ValidationError(slowed_message(wait), code="slowed")
    if request is not None and getattr(request, "axes_locked_out", False):
        return ValidationError(lockout_message(), code="locked_out")
    return None


# --- a username's ceiling, from any addresses -----------------------------------------------


def _window_seconds() -> float:
    return float(settings.AXES_COOLOFF_TIME.total_seconds())


def _failing_within_window() -> Any:
    """Axes' records of the (username, address) pairs that failed within the window."""
    since = timezone.now() - settings.AXES_COOLOFF_TIME
    return AccessAttempt.objects.filter(attempt_time__gt=since)


def username_wait(username: str) -> int | None:
    """The seconds a try for ``username`` must wait, or None when it may be tried now: it
    failed ``CONSOLE_LOGIN_USERNAME_CEILING`` times within the window, from any addresses,
    and its last failure is more recent than one window / ceiling ago."""
    ceiling: int = settings.CONSOLE_LOGIN_USERNAME_CEILING
    seen = _failing_within_window().filter(username=username)
    found = seen.aggregate(failures=Sum("failures_since_start"), last=Max("attempt_time"))
    if (found["failures"] or 0) < ceiling:
        return None
    wait = _window_seconds() / ceiling - (timezone.now() - found["last"]).total_seconds()
    return math.ceil(wait) if wait > 0 else None


class LoginBackend(AxesStandaloneBackend):  # type: ignore[misc]  # axes has no types
    """Axes' backend (the pair's lockout), then the username's ceiling: a try too soon is
    refused as axes refuses one, so axes does not count it and its middleware answers
    with :func:`lockout_response`."""

    def authenticate(
        self,
        request: HttpRequest,
        username: str | None = None,
        password: str | None = None,
        **kwargs: Any,
    ) -> None:
        super().authenticate(request, username, password, **kwargs)
        if not getattr(settings, "AXES_ENABLED", True) or not username:
            return
        wait = username_wait(username)
        if wait is None:
            return
        request.axes_locked_out = True  # type: ignore[attr-defined]
        request.login_slowed_for = wait  # type: ignore[attr-defined]
        counting.add({SLOWED: 1})
        raise AxesBackendPermissionDenied(f"login for this username slowed: try in {wait} s")


def login_metrics() -> Iterator[Metric]:
    """The ceiling's figures on ``/metrics`` (``metrics.register_part``)."""
    ceiling = settings.CONSOLE_LOGIN_USERNAME_CEILING
    slowed = (
        _failing_within_window()
        .values("username")
        .annotate(failures=Sum("failures_since_start"))
        .filter(failures__gte=ceiling)
        .aggregate(n=Count("username"))
    )
    yield GaugeMetricFamily(
        "tasks_login_usernames_slowed",
        "Usernames past their ceiling of failed logins from any addresses, slowed now.",
        value=slowed["n"] or 0,
    )
    yield CounterMetricFamily(
        "tasks_logins_slowed",
        "Login tries refused because their username was past its ceiling.",
        value=counting.totals().get(SLOWED, 0),
    )


class LoginForm(AuthenticationForm):
    """Django's login form, saying so when the login was refused for a lockout."""

    def get_invalid_login_error(self) -> ValidationError:
        locked_out = _locked_out_error(self.request)
        return locked_out if locked_out is not None else super().get_invalid_login_error()


class AdminLoginForm(AdminAuthenticationForm):
    """The admin's login form, saying so when the login was refused for a lockout."""

    def get_invalid_login_error(self) -> ValidationError:
        locked_out = _locked_out_error(self.request)
        return locked_out if locked_out is not None else super().get_invalid_login_error()


login = login_not_required(
    auth_views.LoginView.as_view(authentication_form=LoginForm, redirect_authenticated_user=True)
)


def lockout_response(
    request: HttpRequest,
    original_response: HttpResponse | None = None,
    credentials: dict[str, Any] | None = None,
) -> HttpResponse:
    """What a login refused for a lockout answers (``AXES_LOCKOUT_CALLABLE``): the login
    page the view rendered, console's or admin's, whose form says why, with axes' status."""
    status: int = settings.AXES_HTTP_RESPONSE_CODE
    wait = getattr(request, "login_slowed_for", None)
    if isinstance(original_response, TemplateResponse):
        original_response.status_code = status
        response: HttpResponse = original_response
    else:
        # No page to keep (axes' asynchronous middleware passes none): the console's login.
        lockout = slowed_message(wait) if wait else lockout_message()
        context = {"form": LoginForm(request), "lockout": lockout}
        response = render(request, "registration/login.html", context, status=status)
    if wait:
        response["Retry-After"] = str(wait)
    return response
