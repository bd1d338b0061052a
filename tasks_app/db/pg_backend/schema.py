"""The schema editor of ``tasks_app.db.pg_backend``: a migration's DDL waits only briefly for
a table's lock, and a statement that waited too long outside a transaction is tried again.

A DDL statement that needs a table's lock (ALTER TABLE, CREATE TRIGGER, DROP CONSTRAINT)
first waits for the transactions using the table, and while it waits every statement of
every other session on that table queues behind it: on a busy table, a DDL statement that
waits ten seconds stops every worker for ten seconds. So for the length of a migration the
editor sets ``lock_timeout`` to ``TASKS_MIGRATION_LOCK_TIMEOUT_MS`` (2 s), shorter than
the workers' own (``TASKS_DB_LOCK_TIMEOUT_MS``), so that a worker queued behind a DDL
statement never fails for it. A statement whose wait runs out:

- outside a transaction (a migration with ``atomic = False``, as every migration of the
  big tables is) changed nothing, and is tried again after a pause, up to
  ``TASKS_MIGRATION_LOCK_ATTEMPTS`` (10) times; the others' statements run in between;
- inside one (an atomic migration) has ended it: the migration is rolled back whole.

The last failure raises :class:`LockNotAcquired`, naming the statement and the sessions
that held locks on its tables. The concurrent builds of ``tasks_app.db.online_migrations``
make nobody wait behind them; they run under the session's own lock timeout and retry
themselves (a failed build leaves an invalid index to drop first).
"""

from __future__ import annotations

import itertools
import logging
import re
import time
from collections.abc import Callable
from typing import Any

from django.conf import settings
from django.db import DatabaseError, OperationalError
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.backends.postgresql import schema

from tasks_app.db.lock_conflicts import is_lock_conflict

logger = logging.getLogger(__name__)

# A concurrent build that timed out leaves an invalid index; its operation drops that
# before trying again, so the editor leaves these statements to it.
BUILDS_CONCURRENTLY = re.compile(r"^\s*CREATE\s+(UNIQUE\s+)?INDEX\s+CONCURRENTLY\b", re.I)
QUOTED_NAME = re.compile(r'"((?:[^"]|"")+)"')


class LockNotAcquired(OperationalError):
    """A migration's statement could not take its lock within the allowed waits."""


def lock_timeout_ms() -> int:
    """How long one DDL statement of a migration waits for a lock."""
    return int(getattr(settings, "TASKS_MIGRATION_LOCK_TIMEOUT_MS", 2_000))


def lock_attempts() -> int:
    """How many times a statement outside a transaction waits for its lock."""
    return max(1, int(getattr(settings, "TASKS_MIGRATION_LOCK_ATTEMPTS", 10)))


def pause_seconds(attempt: int) -> float:
    """Between two waits the statement steps aside, longer each time (0.5 s, 1 s, … 5 s),
    so the work queued behind it runs."""
    return min(0.5 * attempt, 5.0)


def retry_lock_waits[T](
    connection: BaseDatabaseWrapper,
    statement: str,
    run: Callable[[], T],
    *,
    before_each: Callable[[], None] | None = None,
) -> T:
    """Run ``run`` (one statement, ``statement``) until it gets its lock: again after a
    lock timeout or a deadlock while outside a transaction, up to :func:`lock_attempts`
    times; ``before_each`` runs before every attempt. Raises :class:`LockNotAcquired`."""
    attempts = lock_attempts()
    for attempt in itertools.count(1):
        if before_each is not None:
            before_each()
        try:
            return run()
        except DatabaseError as exc:
            if not is_lock_conflict(exc):
                raise
            if connection.in_atomic_block:
                raise LockNotAcquired(
                    f"waited too long for a lock, inside the migration's transaction, which "
                    f"is rolled back: {_short(statement)} (run the migration again; a "
                    f"migration of a busy table is best made atomic = False, so its "
                    f"statements are tried again one by one)"
                ) from exc
            if attempt >= attempts:
                raise LockNotAcquired(
                    f"waited for a lock {attempt} times and gave up: {_short(statement)}; "
                    f"{holders(connection, statement)}"
                ) from exc
            logger.warning(
                "migration: %s waiting for a lock (%s); trying again in %.1f s (%d of %d)",
                _short(statement, 80),
                type(exc.__cause__ or exc).__name__,
                pause_seconds(attempt),
                attempt + 1,
                attempts,
            )
            time.sleep(pause_seconds(attempt))
    raise AssertionError("unreachable")  # pragma: no cover


def holders(connection: BaseDatabaseWrapper, statement: str) -> str:
    """The sessions holding locks on the tables (or the tables of the indexes) that
    ``statement`` names, as a sentence for an error."""
    names = [name.replace('""', '"') for name in QUOTED_NAME.findall(statement)]
    names += re.findall(r"\b(?:ON|TABLE)\s+([a-z_][a-z0-9_]*)\b", statement, re.I)
    with connection.cursor() as cursor:
        cursor.execute(
            """
            WITH named AS (
                SELECT to_regclass(quote_ident(name)) AS oid FROM unnest(%s::text[]) AS name
            ), tables AS (
                SELECT oid FROM named WHERE oid IS NOT NULL
                UNION SELECT indrelid FROM pg_index WHERE indexrelid IN (SELECT oid FROM named)
            )
            SELECT DISTINCT a.pid, a.application_name, a.state,
                   round(extract(epoch FROM now() - coalesce(a.xact_start, a.query_start))),
                   left(a.query, 120)
            FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid
            WHERE l.granted AND l.relation IN (SELECT oid FROM tables)
              AND a.pid <> pg_backend_pid()
            ORDER BY 1
            """,
            [names],
        )
        rows = cursor.fetchall()
    if not rows:
        return "no session holds a lock on its tables now"
    return "sessions holding locks on its tables: " + "; ".join(
        f"pid {pid} ({app or 'no application_name'}, {state}, transaction open {age} s): {query}"
        for pid, app, state, age, query in rows
    )


def _short(statement: str, limit: int = 200) -> str:
    flat = " ".join(statement.split())
    return flat if len(flat) <= limit else flat[: limit - 1] + "…"


class DatabaseSchemaEditor(schema.DatabaseSchemaEditor):
    """Django's PostgreSQL schema editor under a short lock timeout (see the module)."""

    ddl_lock_timeout_ms: int | None = None

    def __enter__(self) -> DatabaseSchemaEditor:
        super().__enter__()
        self.ddl_lock_timeout_ms = lock_timeout_ms()
        self.execute(self.sql_lock_wait())
        return self

    def __exit__(self, exc_type: Any, exc_value: Any, traceback: Any) -> None:
        try:
            super().__exit__(exc_type, exc_value, traceback)
        finally:
            self._reset_lock_wait(failing=exc_type is not None)

    def _reset_lock_wait(self, *, failing: bool) -> None:
        """Back to the session's own lock timeout (the one it connected with); when the
        migration failed, what it raised matters more than a reset that cannot run."""
        if self.collect_sql:
            self.collected_sql.append("RESET lock_timeout;")
            return
        try:
            with self.connection.cursor() as cursor:
                cursor.execute("RESET lock_timeout")
        except DatabaseError:
            if not failing:
                raise

    def sql_lock_wait(self) -> str:
        """The statement giving the migration's DDL its short lock timeout."""
        return f"SET lock_timeout = '{self.ddl_lock_timeout_ms or lock_timeout_ms()}ms'"

    def execute(self, sql: Any, params: Any = ()) -> None:
        statement = str(sql)
        if self.collect_sql or BUILDS_CONCURRENTLY.match(statement):
            super().execute(sql, params)
            return
        base_execute = super().execute
        retry_lock_waits(self.connection, statement, lambda: base_execute(sql, params))
