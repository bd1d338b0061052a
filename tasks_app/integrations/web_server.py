"""gunicorn's threaded worker with a lane of its own for ``/healthz`` (the Procfile's
``--worker-class``).

gunicorn's ``gthread`` worker accepts every connection in its main loop and queues it for
its pool of ``--threads`` threads. While every thread waits (on a hung database, up to the
web deadline, ``tasks_app.db.deadlines``), a liveness probe waits in that queue behind the
others, and a prober that gives up after a second or two restarts a healthy process. So
this worker reads the start of each request before queueing it, without taking it off the
socket (``MSG_PEEK``): a ``GET`` or ``HEAD`` of ``/healthz`` goes to a pool of its own
(``PROBE_THREADS``), every other request to the usual one. The probe is still answered by
Django (``tasks_app.observability.probes``, ahead of every middleware that could wait), so
it says that the process answers requests, not only that its main loop runs.

A new connection whose request has not arrived yet waits in the main loop's selector (as a
kept-alive connection does) for at most ``--timeout`` seconds (an hour when that is 0),
instead of in a thread.
"""

from __future__ import annotations

import collections
import contextlib
import errno
import selectors
import socket
import time
from concurrent import futures
from functools import partial
from typing import Any

from gunicorn.workers.gthread import TConn, ThreadWorker  # type: ignore[import-untyped]

# Threads kept for the liveness probe: it needs no database, so one answers many.
PROBE_THREADS = 2
# How much of a request is read to route it: enough for the longest probe line start.
PEEK_BYTES = 16
PROBE_LINES = (b"GET /healthz", b"HEAD /healthz")
NO_TIMEOUT_SECONDS = 3600.0


def is_probe(start: bytes) -> bool:
    """Whether the request that starts with ``start`` asks for ``/healthz``."""
    for line in PROBE_LINES:
        if start.startswith(line):
            rest = start[len(line) : len(line) + 1]
            return rest in (b" ", b"?")
    return False


class ProbesFirstThreadWorker(ThreadWorker):  # type: ignore[misc]  # gunicorn has no types
    """See the module."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.probe_pool: futures.ThreadPoolExecutor | None = None
        # New connections whose request has not arrived, oldest first: (deadline, conn).
        self.arriving: collections.deque[tuple[float, TConn]] = collections.deque()

    def init_process(self) -> None:
        self.probe_pool = futures.ThreadPoolExecutor(
            max_workers=PROBE_THREADS, thread_name_prefix="probes"
        )
        super().init_process()

    def accept(self, listener: socket.socket) -> None:
        try:
            client, address = listener.accept()
        except OSError as exc:
            if exc.errno not in (errno.EAGAIN, errno.ECONNABORTED, errno.EWOULDBLOCK):
                raise
            return
        self.nr_conns += 1
        conn = TConn(self.cfg, client, address, listener.getsockname())
        self.route(conn)

    def on_client_socket_readable(self, conn: TConn, client: Any) -> None:
        """A kept-alive connection's next request arrived: routed as a new one is."""
        self.poller.unregister(client)
        self.keepalived_conns.remove(conn)
        self.route(conn)

    def route(self, conn: TConn) -> None:
        """Queue ``conn`` for the probes' pool or the usual one by its request's start, or
        wait for the request to arrive."""
        try:
            start = conn.sock.recv(PEEK_BYTES, socket.MSG_PEEK | socket.MSG_DONTWAIT)
        except (BlockingIOError, InterruptedError):
            conn.sock.setblocking(False)
            self.arriving.append((time.monotonic() + self.arrival_seconds(), conn))
            self.poller.register(conn.sock, selectors.EVENT_READ, partial(self.arrived, conn))
            return
        except OSError:
            start = b""  # the usual pool reads the error and closes the connection
        pool = self.probe_pool if is_probe(start) and self.probe_pool is not None else self.tpool
        job = pool.submit(self.handle, conn)
        job.add_done_callback(lambda done: self.method_queue.defer(self.finish_request, conn, done))

    def arrival_seconds(self) -> float:
        """How long a new connection may wait for its request: ``--timeout``, or an hour
        when it is 0 (gunicorn's "no timeout")."""
        return float(self.cfg.timeout) if self.cfg.timeout > 0 else NO_TIMEOUT_SECONDS

    def arrived(self, conn: TConn, client: Any) -> None:
        self.poller.unregister(client)
        self.arriving = collections.deque(item for item in self.arriving if item[1] is not conn)
        self.route(conn)

    def murder_keepalived(self) -> None:
        """Close kept-alive connections past their keep-alive, and new ones whose request
        did not arrive within ``--timeout``."""
        super().murder_keepalived()
        now = time.monotonic()
        while self.arriving and self.arriving[0][0] <= now:
            _, conn = self.arriving.popleft()
            with contextlib.suppress(OSError, KeyError, ValueError):
                self.poller.unregister(conn.sock)
            self.nr_conns -= 1
            conn.close()

    def handle_quit(self, sig: Any, frame: Any) -> None:
        if self.probe_pool is not None:
            self.probe_pool.shutdown(wait=False)
        super().handle_quit(sig, frame)
