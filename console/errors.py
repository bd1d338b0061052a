"""What a refused or failed request renders: the project's error pages (``handler400``,
``handler403``, ``handler404``, ``handler500``), and the one log line of a refused write.

A request the database failed (it did not answer in time, or its connection was cut)
answers 503 with a page built without the database (``database_unavailable``).

A refusal shows only its reason, never the object it refused: a full page with the
console's layout for a plain request, and for an htmx request a notice that htmx puts in
the page's message region (``#messages``, on every page) and scrolls into view, so the
form the person used stays as it was and no bare fragment replaces the document.
"""

from __future__ import annotations

import logging
import sys
from dataclasses import dataclass
from typing import Any

from django.core.exceptions import PermissionDenied
from django.db import InterfaceError, OperationalError
from django.http import Http404, HttpRequest, HttpResponse
from django.template.loader import render_to_string
from django.utils.html import format_html
from django_htmx.http import retarget

from tasks_app.exceptions import InvalidInput, InvalidTransition, NotPermitted
from tasks_app.observability import oplog

# What a service refuses with, for a person to read: each carries its ``http_status``.
REFUSED = (NotPermitted, InvalidInput, InvalidTransition)

TITLES = {
    400: "Bad request",
    403: "Not permitted",
    404: "Not found",
    409: "Not possible now",
    500: "Something went wrong",
}


def error_response(request: HttpRequest, status: int, message: str) -> HttpResponse:
    """The error page, or for htmx its notice in the page's message region."""
    context = {"status": status, "title": TITLES.get(status, "Error"), "message": message}
    if getattr(request, "htmx", False):
        html = render_to_string("console/_refusal.html", context, request=request)
        response = retarget(HttpResponse(html, status=status), "#messages")
        # Scrolled into view: the form the person used may be far below the region.
        # (django-htmx's ``reswap`` takes no swap modifiers.)
        response["HX-Reswap"] = "innerHTML show:top"
        return response
    html = render_to_string("console/error.html", context, request=request)
    return HttpResponse(html, status=status)


@dataclass(frozen=True)
class Refusal:
    """How a page answers a service's refusal: the status, and the notice to show ("" when
    the form shows the error on the field it names)."""

    status: int
    message: str


def refusal(
    request: HttpRequest, exc: NotPermitted | InvalidInput | InvalidTransition, form: Any = None
) -> Refusal:
    """The answer to ``exc``: its own status; a permission refusal logged and said so; bad
    input put on the field of ``form`` it names (or on the form as a whole)."""
    if isinstance(exc, InvalidInput) and form is not None:
        form.add_error(form_field(form, exc), str(exc))
        return Refusal(exc.http_status, "")
    if isinstance(exc, NotPermitted):
        log_refusal(request, str(exc))
        return Refusal(exc.http_status, f"Not permitted: {exc}")
    return Refusal(exc.http_status, str(exc))


def form_field(form: Any, exc: InvalidInput) -> str | None:
    """The form field an input error belongs to: the field it names, the input it is in
    (``payload`` for ``payload.title``), or the field after the input's name (``title``
    for ``draft.title`` on a form of the draft's fields); None for the form as a whole."""
    for name in (exc.field, exc.top_field, exc.field.split(".", 1)[-1]):
        if name in form.fields:
            return name
    return None


def log_refusal(
    request: HttpRequest, reason: str, *, status: int = 403, by_method: bool = False
) -> None:
    """One warning line per refused write: who tried what, on which object, and why. With
    ``by_method`` the action names the method too (``api:task_list POST``: the API serves
    several operations at one URL)."""
    if request.method in ("GET", "HEAD", "OPTIONS"):
        return
    user = getattr(request, "user", None)
    match = getattr(request, "resolver_match", None)
    action = match.view_name if match is not None else ""
    if by_method:
        action = f"{action} {request.method}"
    fields: dict[str, Any] = {
        "user": user.get_username() if user is not None and user.is_authenticated else "",
        "action": action,
        "object": request.path,
        "status": status,
        "reason": reason,
    }
    oplog.write(logging.WARNING, "action_refused", fields)


class RefusalMiddleware:
    """Answers a view's refusal (``PermissionDenied``, ``Http404``) with the console's
    error page or notice, the same with ``DEBUG`` on or off (Django's debug pages would
    otherwise take over in development)."""

    def __init__(self, get_response: Any) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        response: HttpResponse = self.get_response(request)
        return response

    def process_exception(self, request: HttpRequest, exception: Exception) -> HttpResponse | None:
        if isinstance(exception, PermissionDenied):
            return permission_denied(request, exception)
        if isinstance(exception, Http404):
            return page_not_found(request, exception)
        return None


def bad_request(request: HttpRequest, exception: Exception | None = None) -> HttpResponse:
    return error_response(request, 400, "The request could not be read.")


def permission_denied(request: HttpRequest, exception: Exception | None = None) -> HttpResponse:
    detail = str(exception or "") or "your account may not do this"
    log_refusal(request, detail)
    # The notice's title already says "Not permitted"; the message says why.
    return error_response(request, 403, f"{detail[:1].upper()}{detail[1:]}.")


def page_not_found(request: HttpRequest, exception: Exception | None = None) -> HttpResponse:
    return error_response(request, 404, "There is nothing at this address.")


# What the database failures a request can meet have in common: the server did not answer
# in time (the web deadline, a lock wait, a connect timeout, a connection cut).
DATABASE_UNAVAILABLE = (OperationalError, InterfaceError)
RETRY_AFTER_SECONDS = 5


def server_error(request: HttpRequest) -> HttpResponse:
    """A 503 that touches nothing when the database is what failed (the request's session,
    user and the context processors would each wait on it again); else the console's 500
    page, or the plain one when even that cannot be rendered."""
    failure = sys.exc_info()[1]
    if isinstance(failure, DATABASE_UNAVAILABLE):
        return database_unavailable(request)
    try:
        return error_response(
            request, 500, "The console could not answer; the error is in the server's log."
        )
    except Exception:  # the page itself failed: the plain one needs nothing
        return plain_error(request, 500, TITLES[500], "The error is in the server's log.")


def database_unavailable(request: HttpRequest) -> HttpResponse:
    response = plain_error(
        request,
        503,
        "The database is not answering",
        "The console could not read or write its records in time. Try again in a moment.",
    )
    response["Retry-After"] = str(RETRY_AFTER_SECONDS)
    return response


def plain_error(request: HttpRequest, status: int, title: str, message: str) -> HttpResponse:
    """An error page built from nothing but its words: no template, no session, no user, no
    query; for htmx the notice alone, in the page's message region."""
    if request.headers.get("HX-Request") == "true":
        notice = format_html(
            '<p class="notice error" role="alert"><strong>{}.</strong> {}</p>', title, message
        )
        response = retarget(HttpResponse(notice, status=status), "#messages")
        response["HX-Reswap"] = "innerHTML show:top"
        return response
    page = format_html(
        '<!doctype html><html lang="en"><head><meta charset="utf-8"><title>{}</title></head>'
        "<body><h1>{}</h1><p>{}</p></body></html>",
        title,
        title,
        message,
    )
    return HttpResponse(page, status=status)
