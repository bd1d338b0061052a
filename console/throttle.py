"""Each person's reads of the console, limited: at most ``CONSOLE_READS_PER_MINUTE`` pages
(and htmx regions, and the admin's pages) a minute per user, so that nobody, with a
session or a stolen one, can read the console as fast as a script can ask.

Counted in Django's cache (Redis in production, so every web process shares the count):
one counter per user and clock minute, added to atomically (``add`` then ``incr``), gone
two minutes later. A read over the limit answers 429 with ``Retry-After`` (the seconds to
the next minute) and a small page built without the database; an htmx request gets the
notice in the page's message region. Only logged-in users' reads (GET and HEAD) count:
the login is limited by axes, writes by the services' own rules, and the probes and the
metrics (``/healthz``, ``/readyz``, ``/metrics``) are answered before this middleware runs
and are never counted. When the cache cannot be reached, reads go on uncounted (the
console reads the database, which is up) and a warning says so once.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable

from django.conf import settings
from django.core.cache import cache
from django.http import HttpRequest, HttpResponse
from django.template.loader import render_to_string
from django_htmx.http import retarget

logger = logging.getLogger(__name__)

WINDOW_SECONDS = 60
READS = frozenset({"GET", "HEAD"})
# Answered before this middleware (tasks_app.observability.probes); named here as well, so
# that moving the middleware could not start counting a prober.
NEVER_COUNTED = frozenset({"/healthz", "/readyz", "/metrics"})
TITLE = "Too many requests"

# The clock the window is read from; a test moves it instead of waiting.
clock: Callable[[], float] = time.time


class ReadLimitMiddleware:
    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response
        self.cache_down = False

    def __call__(self, request: HttpRequest) -> HttpResponse:
        retry_after = self.refused_for(request)
        if retry_after is not None:
            return too_many_reads(request, retry_after)
        return self.get_response(request)

    def refused_for(self, request: HttpRequest) -> int | None:
        """The seconds ``request`` must wait, or None when it may be answered now."""
        limit: int = settings.CONSOLE_READS_PER_MINUTE
        user = getattr(request, "user", None)
        if (
            not limit
            or request.method not in READS
            or request.path in NEVER_COUNTED
            or user is None
            or not user.is_authenticated
        ):
            return None
        try:
            wait = minute_wait(f"console:reads:{user.pk}", limit)
        except Exception:
            if not self.cache_down:
                logger.warning("the read limit is off: the cache cannot be reached", exc_info=True)
            self.cache_down = True
            return None
        self.cache_down = False
        return wait


def minute_wait(scope: str, limit: int) -> int | None:
    """Count one more use of ``scope`` in this clock minute: None while the count is at most
    ``limit``, else the seconds to the next minute. Raises what the cache raises."""
    now = clock()
    window = int(now // WINDOW_SECONDS)
    key = f"{scope}:{window}"
    cache.add(key, 0, timeout=2 * WINDOW_SECONDS)
    if cache.incr(key) <= limit:
        return None
    return max(math.ceil((window + 1) * WINDOW_SECONDS - now), 1)


def too_many_reads(request: HttpRequest, retry_after: int) -> HttpResponse:
    """429 with ``Retry-After``: a small page, or for htmx the notice in ``#messages``;
    rendered without the request (no context processor reads the database)."""
    limit = settings.CONSOLE_READS_PER_MINUTE
    context = {
        "status": 429,
        "title": TITLE,
        "message": (
            f"You read more than {limit} pages a minute (CONSOLE_READS_PER_MINUTE). "
            f"Try again in {retry_after} second{'' if retry_after == 1 else 's'}."
        ),
    }
    if getattr(request, "htmx", False):
        html = render_to_string("console/_refusal.html", context)
        response = retarget(HttpResponse(html, status=429), "#messages")
        response["HX-Reswap"] = "innerHTML show:top"
    else:
        response = HttpResponse(render_to_string("console/too_many_requests.html", context))
        response.status_code = 429
    response["Retry-After"] = str(retry_after)
    return response
