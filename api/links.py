"""Where an answer links: the API's own operations (``api_url``) beside the console's pages
(``schemas.console_url``), both under ``CONSOLE_BASE_URL``. By convention a schema's ``url``
is the console's page and its ``api_url`` the API's address of the same thing."""

from __future__ import annotations

from typing import Any
from urllib.parse import urlencode

from django.conf import settings
from django.urls import reverse


def api_url(name: str, *args: Any, query: dict[str, Any] | None = None) -> str:
    """The address of the API's operation ``name`` (its view's name)."""
    return with_query(
        settings.CONSOLE_BASE_URL.rstrip("/") + reverse(f"api:{name}", args=args), query
    )


def with_query(url: str, query: dict[str, Any] | None) -> str:
    """``url`` with ``query`` as its query string, its empty values left out."""
    given = {key: value for key, value in (query or {}).items() if value not in ("", None)}
    return f"{url}?{urlencode(given)}" if given else url
