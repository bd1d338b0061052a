"""Pages that show tasks, drafts and audit rows are never kept by a browser or a proxy."""

from __future__ import annotations

from django.http import HttpRequest
from django.http.response import HttpResponseBase
from django.utils.cache import patch_cache_control
from django.utils.deprecation import MiddlewareMixin


class NoStoreMiddleware(MiddlewareMixin):
    """Marks every answer a view made ``Cache-Control: no-store``, unless it set its own.

    It sits after WhiteNoise, which answers static files with their long caching before any view
    runs, and after ``tasks_app.observability.probes``, whose answers say no-store themselves. So
    what it sees is dynamic: the console's pages, their htmx regions, refusals and exports, the
    admin's and the login's (those two set never-cache already, and keep it).
    """

    def process_response(
        self, request: HttpRequest, response: HttpResponseBase
    ) -> HttpResponseBase:
        if not response.has_header("Cache-Control"):
            patch_cache_control(response, no_store=True)
        return response
