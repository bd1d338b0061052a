"""``/healthz``, ``/readyz`` and ``/metrics``, answered ahead of every other middleware: no
login, no host check (probes and scrapers call by address), no HTTPS redirect (they call
inside the network). ``/metrics`` has its own guard: ``METRICS_TOKEN`` when one is set,
else ``METRICS_ALLOWED_NETWORKS``.

A probe's answer is for its prober: Django's ERROR line per 503 is dropped
(``tasks_app.observability.logs.DropProbeAnswers``), and the process logs a change of its readiness
once instead, naming the checks that failed."""

from __future__ import annotations

import ipaddress
import logging
import threading
from collections.abc import Callable
from typing import Any

from django.conf import settings
from django.http import HttpRequest, HttpResponse, JsonResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from tasks_app.addresses import client_address
from tasks_app.observability import health, metrics
from tasks_app.observability.bearer import bears
from tasks_app.observability.logs import PROBE_ANSWER

logger = logging.getLogger(__name__)

PROBES: dict[str, Callable[[], tuple[dict[str, Any], int]]] = {
    "/healthz": health.alive,
    "/readyz": health.ready,
}


def may_scrape(request: HttpRequest) -> bool:
    """With a token set, only the token opens the metrics, from any address: behind a proxy
    on the same machine every request comes from loopback, so no address can stand for
    it. Without one, the allowed networks do, checked against the client's address as
    ``tasks_app.addresses`` tells it (what a trusted proxy forwarded for, not
    the proxy's)."""
    if settings.METRICS_TOKEN:
        return bears(request, settings.METRICS_TOKEN)
    client = client_address(request)
    if client is None:
        return False
    address = ipaddress.ip_address(client)
    return any(address in network for network in settings.METRICS_ALLOWED_NETWORKS)


def serve_metrics(request: HttpRequest) -> HttpResponse:
    if not may_scrape(request):
        if settings.METRICS_TOKEN:
            refusal = HttpResponse(
                "metrics need the bearer token (METRICS_TOKEN)\n",
                status=401,
                content_type="text/plain",
            )
            refusal["WWW-Authenticate"] = 'Bearer realm="metrics"'
            return refusal
        return HttpResponse(
            "metrics answer only the allowed networks (METRICS_ALLOWED_NETWORKS)\n",
            status=403,
            content_type="text/plain",
        )
    return HttpResponse(
        generate_latest(metrics.registry),
        content_type=CONTENT_TYPE_LATEST,
        headers={"Cache-Control": "no-store"},
    )


class Readiness:
    """What this process last answered on ``/readyz``, to log a change once: a WARNING
    naming the failed checks when it stops being ready, an INFO line when it is again. The
    first answer is logged only when it is not ready."""

    def __init__(self) -> None:
        self._ready: bool | None = None
        self._lock = threading.Lock()

    def answered(self, body: dict[str, Any], status: int) -> None:
        ready = status == 200
        with self._lock:
            before, self._ready = self._ready, ready
        if before == ready:
            return
        if not ready:
            failed = ", ".join(
                f"{name} ({check['detail']})"
                for name, check in body.get("checks", {}).items()
                if not check["ok"]
            )
            logger.warning("not ready: %s", failed)
        elif before is not None:
            logger.info("ready again")


readiness = Readiness()


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
        request.META[PROBE_ANSWER] = path
        body, status = PROBES[path]()
        if path == "/readyz":
            readiness.answered(body, status)
        return JsonResponse(body, status=status, headers={"Cache-Control": "no-store"})
