"""``/healthz`` and ``/readyz``, answered ahead of every other middleware: no login, no
host check (a probe calls by address), no HTTPS redirect (it calls inside the network)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django.http import HttpRequest, HttpResponse, JsonResponse

from tasks_app import health

PROBES: dict[str, Callable[[], tuple[dict[str, Any], int]]] = {
    "/healthz": health.alive,
    "/readyz": health.ready,
}


class ProbeMiddleware:
    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        probe = PROBES.get(request.path_info)
        if probe is None:
            return self.get_response(request)
        if request.method not in ("GET", "HEAD"):
            return JsonResponse({"error": "GET only"}, status=405, headers={"Allow": "GET, HEAD"})
        body, status = probe()
        return JsonResponse(body, status=status, headers={"Cache-Control": "no-store"})
