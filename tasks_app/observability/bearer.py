"""The one check of a bearer token, for the endpoints a machine calls with one (the
metrics, the demo's fake remotes)."""

from __future__ import annotations

from django.http import HttpRequest
from django.utils.crypto import constant_time_compare


def bears(request: HttpRequest, token: str) -> bool:
    """Whether ``request`` carries ``Authorization: Bearer <token>``; never for no token."""
    given = request.headers.get("Authorization", "")
    return bool(token) and constant_time_compare(given, f"Bearer {token}")
