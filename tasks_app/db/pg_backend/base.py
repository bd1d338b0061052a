"""Django's PostgreSQL backend with every statement, commit and rollback bounded on the
client side (``tasks_app.db.deadlines``), so a hung server cannot hold a process forever, and
a migration's DDL waiting only briefly for a table's lock (``schema``).

Inside a web request the server is given the request's shorter ``statement_timeout`` before
the request's first statement (once per connection while it stays the same: a thread of a
web process serves nothing else), and outside one the session's own again (``RESET``, back
to the value it connected with). A rollback may have undone the ``SET``, so after one the
next statement sets (or resets) it again.

The connection's health check is bounded too: without it, ``CONN_HEALTH_CHECKS`` would wait
for a hung server with no bound at all (Django runs it on the driver's connection, under no
execute wrapper); a check left unanswered fails the request instead of connecting again to
the same hung server."""

from __future__ import annotations

import time
from typing import Any

from django.db import OperationalError
from django.db.backends.postgresql import base
from psycopg.pq import TransactionStatus

from tasks_app.db import deadlines
from tasks_app.db.deadlines import bounded, bounded_execute
from tasks_app.db.pg_backend.schema import DatabaseSchemaEditor

# The connection's statement timeout is the one it connected with.
AS_CONNECTED: int | None = None
# A rollback may or may not have undone a SET: the next statement sets or resets it again.
UNKNOWN = -1


class DatabaseWrapper(base.DatabaseWrapper):
    SchemaEditorClass = DatabaseSchemaEditor

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.statement_timeout_ms: int | None = AS_CONNECTED
        # Whether this connection was ever given a request's timeout: only then can a
        # rollback leave it unknown (the workers' connections never are).
        self.timeout_was_set = False
        self.execute_wrappers.append(self._follow_statement_timeout)
        self.execute_wrappers.append(bounded_execute)

    def get_new_connection(self, conn_params: dict[str, Any]) -> Any:
        self.statement_timeout_ms = AS_CONNECTED
        self.timeout_was_set = False
        return super().get_new_connection(conn_params)

    def _follow_statement_timeout(
        self, execute: Any, sql: str, params: Any, many: bool, context: dict[str, Any]
    ) -> Any:
        """Django's execute wrapper: the server's statement timeout is the request's
        before the statement runs."""
        wanted = deadlines.web_request_timeout_ms()
        failed = self.connection.info.transaction_status == TransactionStatus.INERROR
        # In a failed transaction only a rollback runs; the next statement sets it.
        if wanted != self.statement_timeout_ms and not failed:
            statement = (
                "RESET statement_timeout"
                if wanted is None
                else f"SET statement_timeout = {int(wanted)}"
            )
            with (
                self.wrap_database_errors,
                bounded(self.connection),
                self.connection.cursor() as cursor,
            ):
                cursor.execute(statement)
            self.statement_timeout_ms = wanted
            self.timeout_was_set = True
        return execute(sql, params, many, context)

    def is_usable(self) -> bool:
        with bounded(self.connection, deadlines.health_check_seconds()):
            return bool(super().is_usable())

    def close_if_health_check_failed(self) -> None:
        """Django's check before a request's first use of a kept connection: one the
        server dropped is closed, and the request connects anew. One the server left
        unanswered (it hangs) fails the request at once: connecting anew would only wait
        for the same server again, for the connect timeout."""
        # Django's own attributes, the first not in its stubs.
        enabled = self.health_check_enabled  # type: ignore[attr-defined]
        if self.connection is None or not enabled or self.health_check_done:  # type: ignore[has-type]
            return
        started = time.monotonic()
        if not self.is_usable():
            self.close()
            if time.monotonic() - started >= deadlines.health_check_seconds():
                raise OperationalError(
                    "the database did not answer a kept connection's health check in time"
                )
        self.health_check_done = True

    def _commit(self) -> None:
        with bounded(self.connection):
            super()._commit()  # type: ignore[misc]  # Django's own, not in its stubs

    def _rollback(self) -> None:
        self._forget_statement_timeout()
        with bounded(self.connection):
            super()._rollback()  # type: ignore[misc]  # Django's own, not in its stubs

    def _savepoint_rollback(self, sid: str) -> None:
        # After it: its own statement runs in a failed transaction, where a SET would fail.
        super()._savepoint_rollback(sid)  # type: ignore[misc]  # Django's own, not in its stubs
        self._forget_statement_timeout()

    def _forget_statement_timeout(self) -> None:
        if self.timeout_was_set:
            self.statement_timeout_ms = UNKNOWN
