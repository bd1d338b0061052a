"""Stand-ins for the remote systems of the shipped workflows (``PUBLISH_URL`` for
publish_article, ``MAIL_URL`` for ticket_reply), so the demo completes without any outside
service.

:class:`FakeRemote` keeps, in memory, every request it received and every write it
applied. The publishing fake honours the ``Idempotency-Key`` header (a repeated key
returns the first answer and applies nothing); the mail fake does not (every request
sends a mail). The project serves both under ``/fake/`` (``tasks_app/demo/fake_urls.py``) when
``TASKS_FAKE_REMOTES`` is on, the default only in the embedded demo; production refuses
them. Served, they take writes only with ``FAKE_REMOTES_TOKEN`` as a bearer token (the
demo's workers send it as ``PUBLISH_TOKEN`` / ``MAIL_TOKEN``), and show what they applied
only to a logged-in user. The tests also serve them on loopback ports
(``tests/remotes.py``).

They live with the project's wiring, not in an app: they are part of the demo, not of
the approvals app whose workflows call them.
"""

from __future__ import annotations

import itertools
import json
import threading
from dataclasses import dataclass, field
from typing import Any

from django.conf import settings
from django.contrib.auth.decorators import login_not_required
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_http_methods

from tasks_app.observability.bearer import bears


@dataclass
class FakeRemote:
    name: str
    honours_idempotency_key: bool
    received: list[dict[str, Any]] = field(default_factory=list)
    applied: list[dict[str, Any]] = field(default_factory=list)
    _answers: dict[str, dict[str, Any]] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _ids: itertools.count[int] = field(default_factory=lambda: itertools.count(1))

    def handle(self, body: Any, key: str | None) -> tuple[int, dict[str, Any]]:
        """Apply one request; returns the status code and the JSON answer."""
        with self._lock:
            self.received.append({"key": key, "body": body})
            if not isinstance(body, dict):
                return 400, {"error": "the body must be a JSON object"}
            if self.honours_idempotency_key and key and key in self._answers:
                return 200, {**self._answers[key], "replayed": True}
            answer = {"id": f"{self.name}-{next(self._ids)}", "key": key}
            self.applied.append({"id": answer["id"], "key": key, "body": body})
            if self.honours_idempotency_key and key:
                self._answers[key] = answer
            return 201, answer

    def applied_with(self, key: str) -> list[dict[str, Any]]:
        with self._lock:
            return [write for write in self.applied if write["key"] == key]

    def reset(self) -> None:
        with self._lock:
            self.received.clear()
            self.applied.clear()
            self._answers.clear()


publishing = FakeRemote("publish", honours_idempotency_key=True)
mail = FakeRemote("mail", honours_idempotency_key=False)


def _serve(remote: FakeRemote, request: HttpRequest) -> HttpResponse:
    reading = request.method == "GET"
    if not (
        bears(request, settings.FAKE_REMOTES_TOKEN) or (reading and request.user.is_authenticated)
    ):
        refusal = JsonResponse(
            {
                "error": "log in to read what this fake applied"
                if reading
                else "a write needs the fake remotes' bearer token"
            },
            status=401,
        )
        refusal["WWW-Authenticate"] = 'Bearer realm="fake remotes"'
        return refusal
    if reading:
        # What the fake did, for a person checking the demo.
        return JsonResponse({"name": remote.name, "applied": remote.applied[-50:]})
    try:
        body = json.loads(request.body or b"null")
    except ValueError:
        return JsonResponse({"error": "the body must be JSON"}, status=400)
    status, answer = remote.handle(body, request.headers.get("Idempotency-Key"))
    return JsonResponse(answer, status=status)


# Workers call these with a token instead of a session, as they would a remote service
# (so no CSRF: a browser's session alone can only read).
@login_not_required
@csrf_exempt
@require_http_methods(["GET", "POST"])
def publish_endpoint(request: HttpRequest) -> HttpResponse:
    return _serve(publishing, request)


@login_not_required
@csrf_exempt
@require_http_methods(["GET", "POST"])
def mail_endpoint(request: HttpRequest) -> HttpResponse:
    return _serve(mail, request)
