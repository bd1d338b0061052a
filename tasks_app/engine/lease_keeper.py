"""The lease keeper: one background thread per process that renews the leases of the steps
it holds while their handlers run, and tells a handler when its task was cancelled or its
lease was lost."""

from __future__ import annotations

import logging
import os
import random
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass

from django.db import InterfaceError, OperationalError, connections

from tasks_app.db.idle_connections import idle_seconds
from tasks_app.db.lock_conflicts import is_lock_conflict
from tasks_app.engine import leases
from tasks_app.engine.workflows import StepContext

# The keeper's lines keep the name the worker's log has always given them (the runner's),
# so filters and alerts on it still match.
logger = logging.getLogger("tasks_app.engine.runner")


@dataclass
class _Watched:
    claim: leases.Claim
    renewed_at: float
    ctx: StepContext | None = None
    deadline: float | None = None


class LeaseKeeper:
    """Renews the leases of the claims this process holds, from one background thread
    with its own database connection.

    Each lease is renewed once a third of it has passed. The keeper tells a handler
    (through its context) when its task was cancelled or its lease was lost, and stops
    renewing a step once its timeout has passed, so a hung handler's lease runs out and
    the sweeper hands the step to another attempt. The thread is started on first use in
    each process (Celery's prefork children included) and lives as long as the process.

    The thread keeps its database connection while it has leases to renew, so a renewal
    needs no new connection slot (with the server's slots exhausted, claims and
    completions go on over kept connections, and so must renewals), and closes it after
    ``CONN_MAX_AGE`` with nothing to renew. A renewal that fails is tried again with a
    growing, jittered delay, well inside the lease; a streak of failures is logged once
    when it starts and once when renewals work again.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        # Held while a renewal is in flight (re-entrant: a renewal may forget its claim).
        self._renewing = threading.RLock()
        self._watched: dict[int, _Watched] = {}
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None
        self._pid = 0
        self._failing: _Streak | None = None
        self._give_back: threading.Event | None = None

    def watch(self, claims: Sequence[leases.Claim]) -> None:
        now = time.monotonic()
        with self._lock:
            for claim in claims:
                self._watched[claim.step_id] = _Watched(claim, renewed_at=now)
            if self._thread is None or self._pid != os.getpid() or not self._thread.is_alive():
                self._pid = os.getpid()
                self._thread = threading.Thread(target=self._run, name="lease-keeper", daemon=True)
                self._thread.start()
        # The thread looks again at least every MAX_WAIT_SECONDS: woken only when one of
        # these leases is due sooner (leases of a few seconds), not once per batch.
        if min((claim.lease_seconds for claim in claims), default=0) / 3 < MAX_WAIT_SECONDS:
            self._wake.set()

    def started(self, claim: leases.Claim, ctx: StepContext, timeout: float | None) -> None:
        with self._lock:
            watched = self._watched.get(claim.step_id)
            if watched is not None:
                watched.ctx = ctx
                watched.deadline = time.monotonic() + timeout if timeout else None

    def forget(self, claim: leases.Claim) -> None:
        """Stop renewing; waits for a renewal in flight, so none lands after the caller
        goes on to record the step's outcome (it would be refused as a stale write)."""
        with self._renewing, self._lock:
            self._watched.pop(claim.step_id, None)

    def _run(self) -> None:
        idle_since: float | None = None
        while True:
            with self._lock:
                watched = list(self._watched.values())
            now = time.monotonic()
            wait = MAX_WAIT_SECONDS
            for item in watched:
                if now >= self._next_beat(item):
                    with self._renewing:
                        if item.claim.step_id in self._watched:
                            self._beat(item)
                wait = min(wait, max(self._next_beat(item) - time.monotonic(), 0.01))
            if watched:
                idle_since = None
            elif self._give_back is not None:
                connections.close_all()
                self._give_back.set()
                self._give_back = idle_since = None
            elif idle_since is None:
                idle_since = now
            elif now - idle_since >= idle_seconds():
                # Nothing to renew for a while: give the connection slot back.
                connections.close_all()
                idle_since = None
            self._wake.wait(wait)
            self._wake.clear()

    def give_back_connection(self, timeout: float = 10) -> None:
        """Have the thread close its database connection as soon as it has nothing to
        renew, and wait for that (a process shutting down, a test run dropping its
        database)."""
        thread = self._thread
        if thread is None or not thread.is_alive() or self._pid != os.getpid():
            return
        released = threading.Event()
        self._give_back = released
        self._wake.set()
        released.wait(timeout)

    def _next_beat(self, item: _Watched) -> float:
        due = item.renewed_at + item.claim.lease_seconds / 3
        return max(due, self._failing.retry_at) if self._failing else due

    def _beat(self, item: _Watched) -> None:
        if item.deadline is not None and time.monotonic() > item.deadline:
            logger.warning("step %s passed its timeout; lease left to expire", item.claim.step_id)
            self.forget(item.claim)
            return
        try:
            beat = leases.heartbeat(item.claim)
        except Exception as exc:
            self._failed(item, exc)
            return
        if self._failing:
            logger.warning(
                "lease renewals work again after %d failure(s) over %.1f s",
                self._failing.count,
                time.monotonic() - self._failing.since,
            )
            self._failing = None
        item.renewed_at = time.monotonic()
        if item.ctx is not None and beat.cancel_requested:
            item.ctx._cancelled.set()
        if not beat.alive:
            if item.ctx is not None:
                item.ctx._lease_lost.set()
            self.forget(item.claim)

    def _failed(self, item: _Watched, exc: Exception) -> None:
        """One failed renewal: the first of a streak is logged (one line, no traceback);
        the next try waits a growing, jittered delay, at most a sixth of the lease."""
        now = time.monotonic()
        if self._failing is None:
            self._failing = _Streak(since=now)
            detail = str(exc).strip().splitlines()
            logger.warning(
                "lease renewal failed for step %s (%s: %s); trying again with backoff, "
                "a lease runs out %d s after its last renewal",
                item.claim.step_id,
                type(exc).__name__,
                detail[0] if detail else "",
                item.claim.lease_seconds,
            )
        streak = self._failing
        streak.count += 1
        ceiling = min(RENEWAL_RETRY_MAX_SECONDS, item.claim.lease_seconds / 6)
        delay = min(ceiling, RENEWAL_RETRY_BASE_SECONDS * 2 ** min(streak.count, 16))
        streak.retry_at = now + delay / 2 + random.uniform(0, delay / 2)
        # A broken connection is replaced at the next try; one that only lost a lock wait
        # is kept (reconnecting would need a free slot).
        if isinstance(exc, InterfaceError) or (
            isinstance(exc, OperationalError) and not is_lock_conflict(exc)
        ):
            connections["default"].close()


# The longest the thread waits before it looks at its leases again.
MAX_WAIT_SECONDS = 1.0
# A failed renewal is tried again after a delay that doubles from the first figure up to
# the second (or a sixth of the lease, if shorter), half of it random.
RENEWAL_RETRY_BASE_SECONDS = 0.05
RENEWAL_RETRY_MAX_SECONDS = 2.0


@dataclass
class _Streak:
    """Renewals failing one after another since ``since``."""

    since: float
    count: int = 0
    retry_at: float = 0.0


lease_keeper = LeaseKeeper()
