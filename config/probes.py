"""``/healthz``, ``/readyz`` and ``/metrics``, answered ahead of every other middleware: no
login, no host check (probes and scrapers call by address), no HTTPS redirect (they call
inside the network). ``/metrics`` has its own guard: ``METRICS_TOKEN`` or
``METRICS_ALLOWED_NETWORKS``."""

from __future__ import annotations

import ipaddress
from collections.abc import Callable
from typing import Any

from django.conf import settings
from django.http import HttpRequest, HttpResponse, JsonResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from tasks_app import health, metrics

from .bearer import bears

PROBES: dict[str, Callable[[], tuple[dict[str, Any], int]]] = {
    "/healthz": health.alive,
    "/readyz": health.ready,
}


def may_scrape(request: HttpRequest) -> bool:
    if bears(request, settings.METRICS_TOKEN):
        return True
    try:
        address = ipaddress.ip_address(request.META.get("REMOTE_ADDR", ""))
    except ValueError:
        return False
    return any(address in network for network in settings.METRICS_ALLOWED_NETWORKS)


def serve_metrics(request: HttpRequest) -> HttpResponse:
    if not may_scrape(request):
        refusal = HttpResponse(
            "metrics need the bearer token (METRICS_TOKEN) or an allowed network\n",
            status=401 if settings.METRICS_TOKEN else 403,
            content_type="text/plain",
        )
        if settings.METRICS_TOKEN:
            refusal["WWW-Authenticate"] = 'Bearer realm="metrics"'
        return refusal
    return HttpResponse(
        generate_latest(metrics.registry),
        content_type=CONTENT_TYPE_LATEST,
        headers={"Cache-Control": "no-store"},
    )


class ProbeMiddleware:
    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        path = request.path_info
        if path not in PROBES and path != "/metrics":
            return self.get_response(request)
        if request.method not in ("GET", "HEAD"):
            return JsonResponse({"error": "GET only"}, status=405, headers={"Allow": "GET, HEAD"})
        if path == "/metrics":
            return serve_metrics(request)
        probe = PROBES[path]
        body, status = probe()
        return JsonResponse(body, status=status, headers={"Cache-Control": "no-store"})
