"""Every refusal and failure the API answers, as JSON in one shape (``Problem``): the
status, a code, what happened, and for bad input the field and the rule it broke.

The errors carry their own status (``http_status``) as in the console; a refusal says
nothing of the object it refused, and a refused write logs one ``action_refused`` line
(``console.errors.log_refusal``).
"""

from __future__ import annotations

import math
from typing import Any

from django.core.exceptions import ObjectDoesNotExist, PermissionDenied
from django.http import Http404, HttpRequest, HttpResponse
from ninja import NinjaAPI, Schema
from ninja.errors import AuthenticationError, HttpError, Throttled, ValidationError

from console.errors import DATABASE_UNAVAILABLE, RETRY_AFTER_SECONDS, log_refusal
from tasks_app.exceptions import IdempotencyConflict, InvalidInput, InvalidTransition


class Problem(Schema):
    status: int
    # invalid_input, not_authenticated, not_permitted, not_found, conflict, not_possible,
    # too_many_requests, unavailable.
    error: str
    detail: str
    field: str | None = None
    rule: str | None = None


def problems(*statuses: int) -> dict[int, type[Problem]]:
    """The refusals an operation documents, beside those every call may meet (401, 403,
    429, 503) and bad input (400)."""
    return {status: Problem for status in sorted({400, 401, 403, 429, 503, *statuses})}


def problem(
    api: NinjaAPI, request: HttpRequest, status: int, error: str, detail: str, **extra: Any
) -> HttpResponse:
    body = Problem(status=status, error=error, detail=detail, **extra)
    return api.create_response(request, body.model_dump(), status=status)


def install(api: NinjaAPI) -> None:
    """Register the handlers of every error the API answers with."""

    def invalid_input(request: HttpRequest, exc: Any) -> HttpResponse:
        return problem(api, request, 400, "invalid_input", str(exc), field=exc.field, rule=exc.rule)

    def invalid_request(request: HttpRequest, exc: Any) -> HttpResponse:
        # What the schema refused before any service read it: the first error, by its field
        # (``body.payload`` is named ``payload``; a query parameter by its name).
        first = exc.errors[0] if exc.errors else {}
        location = [str(part) for part in first.get("loc", ()) if part not in ("body", "query")]
        field = ".".join(location) or "body"
        rule = str(first.get("type", "invalid"))
        message = str(first.get("msg", "is not valid"))
        return problem(
            api, request, 400, "invalid_input", f"{field}: {message}", field=field, rule=rule
        )

    def unreadable(request: HttpRequest, exc: Any) -> HttpResponse:
        # ninja's own refusal of a body it cannot parse (400), with the parser's reason.
        why = f" ({exc.__cause__})" if exc.__cause__ is not None else ""
        if exc.status_code != 400:
            return problem(api, request, exc.status_code, "not_possible", str(exc))
        return problem(
            api,
            request,
            400,
            "invalid_input",
            f"body: must be a JSON object{why}",
            field="body",
            rule="json",
        )

    def not_permitted(request: HttpRequest, exc: Any) -> HttpResponse:
        detail = str(exc) or "this token may not do this"
        log_refusal(request, detail, by_method=True)
        return problem(api, request, 403, "not_permitted", f"Not permitted: {detail}.")

    def not_found(request: HttpRequest, exc: Any) -> HttpResponse:
        return problem(api, request, 404, "not_found", "There is nothing at this address.")

    def not_possible(request: HttpRequest, exc: Any) -> HttpResponse:
        return problem(api, request, exc.http_status, "not_possible", str(exc))

    def conflict(request: HttpRequest, exc: Any) -> HttpResponse:
        return problem(
            api,
            request,
            exc.http_status,
            "conflict",
            str(exc),
            field="idempotency_key",
            rule="conflict",
        )

    def not_authenticated(request: HttpRequest, exc: Any) -> HttpResponse:
        response = problem(
            api,
            request,
            401,
            "not_authenticated",
            "A live token is needed: Authorization: Bearer tc_… (make one on the Tokens page).",
        )
        response["WWW-Authenticate"] = "Bearer"
        return response

    def throttled(request: HttpRequest, exc: Any) -> HttpResponse:
        wait = math.ceil(exc.wait or 1)
        return problem(
            api,
            request,
            429,
            "too_many_requests",
            "This token made more calls than API_REQUESTS_PER_MINUTE allows; "
            f"try again in {wait} s.",
        )

    def unavailable(request: HttpRequest, exc: Any) -> HttpResponse:
        response = problem(
            api, request, 503, "unavailable", "The database is not answering; try again shortly."
        )
        response["Retry-After"] = str(RETRY_AFTER_SECONDS)
        return response

    api.add_exception_handler(InvalidInput, invalid_input)
    api.add_exception_handler(ValidationError, invalid_request)
    api.add_exception_handler(HttpError, unreadable)
    api.add_exception_handler(PermissionDenied, not_permitted)
    api.add_exception_handler(Http404, not_found)
    api.add_exception_handler(ObjectDoesNotExist, not_found)
    api.add_exception_handler(InvalidTransition, not_possible)
    api.add_exception_handler(IdempotencyConflict, conflict)
    api.add_exception_handler(AuthenticationError, not_authenticated)
    api.add_exception_handler(Throttled, throttled)
    for failure in DATABASE_UNAVAILABLE:
        api.add_exception_handler(failure, unavailable)
