"""A client-side bound on every statement: what a hung PostgreSQL server cannot enforce.

The server ends a statement after ``statement_timeout`` and a lock wait after
``lock_timeout`` (``config/settings_django.py``), but a server that hangs (stopped, its disk
stalled) enforces nothing, and the process waiting for its answer would wait for the
whole hang. So each process has a watchdog thread: a statement, commit or rollback still
unanswered ``TASKS_DB_STATEMENT_TIMEOUT_MS`` + ``TASKS_DB_CLIENT_GRACE_SECONDS`` after it
was sent has its connection's socket shut down. psycopg then raises ``OperationalError``
("server closed the connection"), Django drops the connection, and the caller gets an
error in seconds instead of hanging with the server. With the statement timeout off (0,
as the release step's migrations run) nothing is bounded.

The database backend ``tasks_app.db.pg_backend`` puts every statement, commit and rollback
under :func:`bounded`; raw psycopg cursors on Django's connection (``tasks_app.engine.fastpath``)
use it too.

A web request has a shorter deadline of its own, ``TASKS_WEB_STATEMENT_TIMEOUT_MS``
(:class:`WebDeadlineMiddleware`): a person waits for the page, and a thread held for the
whole statement timeout is one the other requests (and the probes) wait behind. While a
request is served, :func:`statement_timeout_ms` is that deadline, the backend gives the
server the same ``statement_timeout`` before the request's first statement, and the
client-side cut comes that much sooner too. A connection's health check (``SELECT 1``, as
``CONN_HEALTH_CHECKS`` asks at the first use in each request) is bounded by the connect
timeout: it answers as fast as a connect does, or the server is not answering.
"""

from __future__ import annotations

import contextlib
import contextvars
import itertools
import logging
import os
import socket
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from django.conf import settings
from django.db import DEFAULT_DB_ALIAS, connections
from django.http import HttpRequest, HttpResponse

logger = logging.getLogger(__name__)

# How often the watchdog looks: a hung statement is cut within this of its deadline.
CHECK_SECONDS = 0.5


# The statement timeout of the web request this thread (or task) serves; None outside one.
_web_request_ms: contextvars.ContextVar[int | None] = contextvars.ContextVar(
    "web_request_statement_timeout_ms", default=None
)


def statement_timeout_ms() -> int:
    """The statement timeout in force here: a web request's own, else every session's (0:
    none)."""
    web = _web_request_ms.get()
    return settings.TASKS_DB_STATEMENT_TIMEOUT_MS if web is None else web


def web_request_timeout_ms() -> int | None:
    """The statement timeout the request being served asked for; None outside a request
    (the session keeps the one it connected with)."""
    return _web_request_ms.get()


def limit_seconds() -> float | None:
    """How long a statement may go unanswered before its connection is cut; None: no
    bound (the statement timeout is off)."""
    timeout_ms = statement_timeout_ms()
    if not timeout_ms:
        return None
    return timeout_ms / 1000 + settings.TASKS_DB_CLIENT_GRACE_SECONDS


def health_check_seconds() -> float:
    """How long a connection's health check may go unanswered."""
    return float(settings.TASKS_DB_CONNECT_TIMEOUT_SECONDS)


@contextmanager
def serving_web_request() -> Iterator[None]:
    """The enclosed statements under the web requests' deadline
    (``TASKS_WEB_STATEMENT_TIMEOUT_MS``; 0: every session's)."""
    web_ms = settings.TASKS_WEB_STATEMENT_TIMEOUT_MS
    token = _web_request_ms.set(web_ms or None)
    try:
        yield
    finally:
        _web_request_ms.reset(token)


class WebDeadlineMiddleware:
    """Every request's statements under the web requests' deadline: a hung or locked
    database answers a page in seconds (``console.errors`` turns the failure into a 503)
    and frees its thread."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        with serving_web_request():
            return self.get_response(request)


class Watchdog:
    """Statements in flight in this process, each with its deadline and its socket."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._running: dict[int, tuple[float, int]] = {}
        self._ids = itertools.count()
        self._pid = 0
        self.cut = 0

    @contextmanager
    def watching(self, fd: int, seconds: float) -> Iterator[None]:
        key = next(self._ids)
        with self._lock:
            if self._pid != os.getpid():
                # First use in this process (or in a child forked from one that had it).
                self._pid = os.getpid()
                self._running.clear()
                threading.Thread(target=self._run, name="db-deadlines", daemon=True).start()
            self._running[key] = (time.monotonic() + seconds, fd)
        try:
            yield
        finally:
            with self._lock:
                self._running.pop(key, None)

    def _run(self) -> None:
        while True:
            time.sleep(CHECK_SECONDS)
            now = time.monotonic()
            with self._lock:
                # Cut under the lock: a statement that ended meanwhile has left the table,
                # so its socket (or one reusing its number) is never touched.
                for key, (deadline, fd) in list(self._running.items()):
                    if deadline <= now:
                        del self._running[key]
                        self._cut(fd)

    def _cut(self, fd: int) -> None:
        logger.error(
            "a database statement went unanswered past its deadline; cutting its connection"
        )
        self.cut += 1
        with contextlib.suppress(OSError):
            sock = socket.socket(fileno=os.dup(fd))
            try:
                sock.shutdown(socket.SHUT_RDWR)
            finally:
                sock.close()


watchdog = Watchdog()


@contextmanager
def bounded(raw_connection: Any, seconds: float | None = None) -> Iterator[None]:
    """Run the enclosed round trip on ``raw_connection`` (a psycopg connection) under the
    client-side deadline (or within ``seconds``)."""
    if seconds is None:
        seconds = limit_seconds()
    if seconds is None or raw_connection is None or raw_connection.closed:
        yield
        return
    with watchdog.watching(raw_connection.pgconn.socket, seconds):
        yield


@contextmanager
def within(seconds: float, using: str = DEFAULT_DB_ALIAS) -> Iterator[None]:
    """The enclosed statements on ``using``'s connection answered within ``seconds`` (a
    tighter bound than every statement's, for a probe), or the connection is cut. Opening
    the connection is bounded by the connect timeout."""
    connection = connections[using]
    if connection.vendor != "postgresql":
        yield
        return
    connection.ensure_connection()
    with watchdog.watching(connection.connection.pgconn.socket, seconds):
        yield


def bounded_execute(
    execute: Callable[..., Any], sql: str, params: Any, many: bool, context: dict[str, Any]
) -> Any:
    """Django's execute wrapper: each statement under the client-side deadline."""
    with bounded(context["connection"].connection):
        return execute(sql, params, many, context)
