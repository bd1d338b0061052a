"""The remote systems of the shipped workflows, served on loopback ports for the tests.

Each wraps the app's own fake (:class:`tasks_app.demo.fakes.FakeRemote`: the publishing one
honours ``Idempotency-Key``, the mail one does not) in a small HTTP server the tests start,
inspect and can tell to time out after accepting a request.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from tasks_app.demo.fakes import FakeRemote

# How long a held answer waits at most; far past any client timeout the tests use.
HOLD_SECONDS = 30.0


class LoopbackRemote:
    def __init__(self, name: str, *, honours_idempotency_key: bool) -> None:
        self.fake = FakeRemote(name, honours_idempotency_key=honours_idempotency_key)
        # The Authorization header of every request, in order (None when absent).
        self.authorizations: list[str | None] = []
        self._holds = 0
        # Answers the next requests get instead of the fake's: (status, applied first).
        self._refusals: list[tuple[int, bool]] = []
        self._lock = threading.Lock()
        self._release = threading.Event()
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_port}/"

    @property
    def applied(self) -> list[dict[str, Any]]:
        return list(self.fake.applied)

    @property
    def received(self) -> list[dict[str, Any]]:
        return list(self.fake.received)

    def time_out_after_accepting(self, requests: int = 1) -> None:
        """The next ``requests`` requests are applied, then answered only after the client
        gave up waiting."""
        with self._lock:
            self._holds += requests

    def answer_next(self, status: int, *, after_applying: bool) -> None:
        """The next request is answered ``status``: after the fake applied it (a load
        balancer's 503 once the remote acted), or without applying it, saying so
        (``{"applied": false}``, the remote's own load shedding)."""
        with self._lock:
            self._refusals.append((status, after_applying))

    def _take_refusal(self) -> tuple[int, bool] | None:
        with self._lock:
            return self._refusals.pop(0) if self._refusals else None

    def release(self) -> None:
        """Answer the held requests now (and any held later at once)."""
        self._release.set()

    def _take_hold(self) -> bool:
        with self._lock:
            if self._holds:
                self._holds -= 1
                return True
            return False

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        remote = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                try:
                    body = json.loads(self.rfile.read(length) or b"null")
                except ValueError:
                    body = None
                remote.authorizations.append(self.headers.get("Authorization"))
                refusal = remote._take_refusal()
                answer: dict[str, Any]
                if refusal is not None and not refusal[1]:
                    status, answer = refusal[0], {"applied": False}
                else:
                    status, answer = remote.fake.handle(body, self.headers.get("Idempotency-Key"))
                    if refusal is not None:
                        status, answer = refusal[0], {"error": "unavailable"}
                if remote._take_hold():
                    remote._release.wait(HOLD_SECONDS)
                payload = json.dumps(answer).encode()
                try:
                    self.send_response(status)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(payload)))
                    self.end_headers()
                    self.wfile.write(payload)
                except OSError:
                    pass  # the client gave up: that was the point

            def log_message(self, format: str, *args: Any) -> None:
                pass

        return Handler

    def start(self) -> LoopbackRemote:
        self.thread.start()
        return self

    def stop(self) -> None:
        self._release.set()
        self.server.shutdown()
        self.server.server_close()


@contextmanager
def loopback_remotes() -> Iterator[tuple[LoopbackRemote, LoopbackRemote]]:
    """The publishing and the mail remote, started; stopped on exit."""
    publishing = LoopbackRemote("publish", honours_idempotency_key=True).start()
    mail = LoopbackRemote("mail", honours_idempotency_key=False).start()
    try:
        yield publishing, mail
    finally:
        publishing.stop()
        mail.stop()
