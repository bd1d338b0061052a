"""``/api/v1/``: the API answers its calls by token, not by a session, so Django's
``LoginRequiredMiddleware`` leaves its views alone (the docs page excepted: it is for a
signed-in person)."""

from __future__ import annotations

from django.urls import URLPattern, URLResolver

from api.main import api

app_urls, _app, _namespace = api.urls
# The namespace ninja reverses its own views in (NinjaAPI(urls_namespace=...)).
app_name = "api"


def _open(patterns: list[URLPattern | URLResolver]) -> list[URLPattern | URLResolver]:
    for pattern in patterns:
        if isinstance(pattern, URLResolver):
            _open(pattern.url_patterns)
        elif pattern.name != "openapi-view":
            pattern.callback.login_required = False  # type: ignore[attr-defined]
    return patterns


urlpatterns = _open(list(app_urls))
