"""Calls to the remote systems the shipped workflows write to (publishing, mail).

What a failure means for the side-effects ledger:
- nothing was sent (connection refused, connect timeout), or the remote answered 429 or
  503 and said in its answer that it did nothing (a JSON body with ``"applied": false``):
  :class:`EffectNotApplied`, so a retry may call again even without idempotency keys;
- a 429 or 503 that says no such thing proves nothing: a load balancer or the remote may
  have acted before answering it. For a remote that honours keys it is
  :class:`RetryableError` (the next call carries the same key); for one that does not,
  ``OutcomeUnknown``, for a person to resolve;
- any other 4xx: :class:`RemoteRefused`, permanent, and the write did not happen;
- a timeout waiting for the answer, after the request went out: ``TimeoutError`` (the
  ledger decides: same key again if the remote honours it, else ``OutcomeUnknown``);
- another 5xx: :class:`RetryableError` for a remote that honours keys, else
  ``OutcomeUnknown`` (it may have acted before failing).
"""

from __future__ import annotations

import json
import urllib.error
import urllib.parse
import urllib.request
from typing import Any

from django.conf import settings

from tasks_app.exceptions import EffectNotApplied, OutcomeUnknown, RemoteRefused, RetryableError


def post_json(
    url: str, body: dict[str, Any], *, idempotency_key: str, honours_key: bool, token: str = ""
) -> dict[str, Any]:
    """POST ``body`` as JSON with an ``Idempotency-Key`` header (and ``token`` as a bearer
    token when given); return the JSON answer."""
    if urllib.parse.urlsplit(url).scheme not in ("http", "https"):
        raise RemoteRefused(f"{url!r} is not an http(s) URL")
    headers = {
        "Content-Type": "application/json",
        "Accept": "application/json",
        "Idempotency-Key": idempotency_key,
    }
    if token:
        headers["Authorization"] = f"Bearer {token}"
    # The scheme is checked above: urllib's file: and custom handlers are never reached.
    request = urllib.request.Request(  # noqa: S310
        url,
        data=json.dumps(body, ensure_ascii=False).encode(),
        method="POST",
        headers=headers,
    )
    try:
        with urllib.request.urlopen(  # noqa: S310
            request, timeout=settings.REMOTE_TIMEOUT_SECONDS
        ) as answer:
            data = json.loads(answer.read() or b"{}")
    except urllib.error.HTTPError as exc:
        detail = exc.read()[:500].decode("utf-8", errors="replace")
        if exc.code in (429, 503) and _says_not_applied(detail):
            raise EffectNotApplied(f"{url} answered {exc.code}: {detail}") from exc
        if 400 <= exc.code < 500 and exc.code != 429:
            raise RemoteRefused(f"{url} refused the request ({exc.code}): {detail}") from exc
        if honours_key:
            raise RetryableError(f"{url} failed ({exc.code}): {detail}") from exc
        raise OutcomeUnknown(f"{url} failed ({exc.code}) and may have acted: {detail}") from exc
    except urllib.error.URLError as exc:
        # Raised while connecting or sending: the remote never got the request.
        raise EffectNotApplied(f"{url} unreachable: {exc.reason}") from exc
    if not isinstance(data, dict):
        raise RetryableError(f"{url} answered with something other than a JSON object")
    return data


def _says_not_applied(detail: str) -> bool:
    """Whether an error answer's JSON body says the remote did nothing."""
    try:
        body = json.loads(detail)
    except ValueError:
        return False
    return isinstance(body, dict) and body.get("applied") is False
