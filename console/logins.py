"""Logging in, to the console and to the admin, with django-axes refusing a username from
an address after too many failures (config/settings_console.py, "logins").

Axes' backend refuses the login and flags the request (``axes_locked_out``); the forms
here then say why instead of "wrong password", and axes' middleware answers with
:func:`lockout_response`: the same page, with axes' status.
"""

from __future__ import annotations

import math
from typing import Any

from django.conf import settings
from django.contrib.admin.forms import AdminAuthenticationForm
from django.contrib.auth import views as auth_views
from django.contrib.auth.decorators import login_not_required
from django.contrib.auth.forms import AuthenticationForm
from django.core.exceptions import ValidationError
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.template.response import TemplateResponse


def lockout_message() -> str:
    minutes = max(math.ceil(settings.AXES_COOLOFF_TIME.total_seconds() / 60), 1)
    return (
        "Too many failed logins for this username from your address: it is locked for "
        f"{minutes} minute{'' if minutes == 1 else 's'} after the last one. "
        "An administrator can unlock it sooner."
    )


def _locked_out_error(request: HttpRequest | None) -> ValidationError | None:
    if request is not None and getattr(request, "axes_locked_out", False):
        return ValidationError(lockout_message(), code="locked_out")
    return None


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
    if isinstance(original_response, TemplateResponse):
        original_response.status_code = status
        return original_response
    # No page to keep (axes' asynchronous middleware passes none): the console's login.
    context = {"form": LoginForm(request), "lockout": lockout_message()}
    return render(request, "registration/login.html", context, status=status)
