"""Django's PostgreSQL backend with every statement, commit and rollback bounded on the
client side (``tasks_app.db.deadlines``), so a hung server cannot hold a process forever, and
a migration's DDL waiting only briefly for a table's lock (``schema``)."""

from __future__ import annotations

from typing import Any

from django.db.backends.postgresql import base

from tasks_app.db.deadlines import bounded, bounded_execute
from tasks_app.db.pg_backend.schema import DatabaseSchemaEditor


class DatabaseWrapper(base.DatabaseWrapper):
    SchemaEditorClass = DatabaseSchemaEditor

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.execute_wrappers.append(bounded_execute)

    def _commit(self) -> None:
        with bounded(self.connection):
            super()._commit()  # type: ignore[misc]  # Django's own, not in its stubs

    def _rollback(self) -> None:
        with bounded(self.connection):
            super()._rollback()  # type: ignore[misc]  # Django's own, not in its stubs
