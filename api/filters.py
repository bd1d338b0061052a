"""The API's filters are the console's: the query string goes through the same form
(``console.task_filters``, ``console.forms``), so a filter's rule has one home. A field
the form refuses is an ``InvalidInput`` naming it."""

from __future__ import annotations

from typing import Any

from django.forms import Form
from django.http import HttpRequest

from tasks_app.exceptions import InvalidInput


def read[F: Form](request: HttpRequest, form_class: type[F]) -> F:
    """``form_class`` bound to the call's query string, valid, or the first field it
    refuses as an :class:`InvalidInput`."""
    return checked(form_class(request.GET))


def checked[F: Form](form: F, prefix: str = "") -> F:
    """``form``, valid, or the first field it refuses as an :class:`InvalidInput` (named
    ``<prefix>.<field>`` for a form read from part of a JSON body)."""
    if not form.is_valid():
        field, messages = next(iter(form.errors.items()))
        message = str(messages[0])
        name = "query" if field == "__all__" else field
        if message.startswith(f"{name}:"):
            message = message.removeprefix(f"{name}:").strip()
        name = f"{prefix}.{name}" if prefix else name
        raise InvalidInput(name, "invalid", f"{name}: {message}")
    return form


def known(request: HttpRequest, allowed: set[str]) -> None:
    """Refuse a query parameter the call does not read: a typo would otherwise widen the
    list silently."""
    for name in request.GET:
        if name not in allowed:
            raise InvalidInput(name, "unexpected", f"{name}: not a filter of this list")


def cursor(form: Any) -> int | None:
    value = form.cleaned_data.get("after")
    return int(value) if value else None
