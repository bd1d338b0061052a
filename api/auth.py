"""How a program is known: a bearer token (``tasks_app.operations.tokens``), each use
recorded, its calls counted per minute (``API_REQUESTS_PER_MINUTE``).

A call with a live token acts as the token's actor (``tokens.acting_user``: its user, cut
to the token's group), which is also ``request.user`` for the refusal log line. Anything
else answers 401 without saying whether a token of that prefix exists.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from django.conf import settings
from django.http import HttpRequest
from ninja.security import HttpBearer
from ninja.throttling import BaseThrottle

from console.throttle import minute_wait
from tasks_app.addresses import client_address
from tasks_app.models import ApiToken
from tasks_app.operations import tokens

logger = logging.getLogger(__name__)


class TokenAuth(HttpBearer):
    openapi_description = "A token made on the console's Tokens page: `Authorization: Bearer tc_…`"

    def authenticate(self, request: HttpRequest, token: str) -> ApiToken | None:
        found = tokens.find(token)
        if found is None:
            return None
        tokens.record_use(found, client_address(request))
        request.user = tokens.acting_user(found)  # type: ignore[assignment]
        return found


class TokenThrottle(BaseThrottle):
    """At most ``API_REQUESTS_PER_MINUTE`` calls a clock minute per token, counted
    atomically in the cache so every web process shares the count; with the cache
    unreachable, calls go on uncounted and a warning says so."""

    def __init__(self) -> None:
        # One throttle serves every request: the wait of this thread's last refusal.
        self._local = threading.local()

    def allow_request(self, request: HttpRequest) -> bool:
        limit: int = settings.API_REQUESTS_PER_MINUTE
        token: Any = getattr(request, "auth", None)
        if not limit or not isinstance(token, ApiToken):
            return True
        try:
            wait = minute_wait(f"api:calls:{token.pk}", limit)
        except Exception:
            logger.warning(
                "the API's rate limit is off: the cache cannot be reached", exc_info=True
            )
            return True
        self._local.wait = wait
        return wait is None

    def wait(self) -> float | None:
        wait: int | None = getattr(self._local, "wait", None)
        return wait
