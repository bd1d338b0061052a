"""Waiting on rows another transaction holds: how long the sweeper may wait, and what a
transaction does when the database ends it for a deadlock or a lock timeout.

Every transition locks its task row, then its step rows (``transitions.lock_task``); the
batch paths lock tasks in id order. The sweeper never waits on a row: it skips rows
others hold (``SKIP LOCKED``, ``transitions.try_lock_task``) and comes back to them at
the next sweep, and whatever it cannot skip runs under ``TASKS_SWEEPER_LOCK_TIMEOUT_MS``.
A worker's completion that still loses a deadlock is tried again
(:func:`retry_lock_conflicts`), so a batch of finished steps is not abandoned to expire.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import psycopg
from django.db import DatabaseError, connection

logger = logging.getLogger(__name__)

LOCK_CONFLICTS = (psycopg.errors.DeadlockDetected, psycopg.errors.LockNotAvailable)


def is_lock_conflict(exc: BaseException) -> bool:
    """Whether the database ended a transaction for a deadlock or a lock timeout (Django
    wraps psycopg's error; its cause says which)."""
    return isinstance(exc, LOCK_CONFLICTS) or isinstance(exc.__cause__, LOCK_CONFLICTS)


def retry_lock_conflicts[T](work: Callable[[], T], *, what: str, attempts: int = 3) -> T:
    """Run ``work``, one transaction of its own, again when the database ends it for a
    deadlock or a lock timeout: up to ``attempts`` times, a short random wait between.

    Inside a caller's transaction nothing is retried (that transaction is already lost):
    the error goes to the caller.
    """
    for attempt in range(1, attempts + 1):
        try:
            return work()
        except DatabaseError as exc:
            if attempt == attempts or connection.in_atomic_block or not is_lock_conflict(exc):
                raise
            logger.warning(
                "%s lost a lock conflict (%s); trying again (%d of %d)",
                what,
                type(exc.__cause__ or exc).__name__,
                attempt + 1,
                attempts,
            )
            time.sleep(random.uniform(0, 0.05 * 2**attempt))
    raise AssertionError("unreachable")  # pragma: no cover


@contextmanager
def lock_wait(milliseconds: int) -> Iterator[None]:
    """Wait at most ``milliseconds`` for any row lock on this connection's statements
    (PostgreSQL's ``lock_timeout``), restoring the connection's own setting after; a
    statement that waits longer fails with ``LockNotAvailable``."""
    if connection.vendor != "postgresql":
        yield
        return
    with connection.cursor() as cursor:
        cursor.execute("SELECT current_setting('lock_timeout')")
        row = cursor.fetchone()
        cursor.execute("SELECT set_config('lock_timeout', %s, false)", [f"{milliseconds}ms"])
    try:
        yield
    finally:
        if row is not None and connection.is_usable():
            with connection.cursor() as cursor:
                cursor.execute("SELECT set_config('lock_timeout', %s, false)", [row[0]])
