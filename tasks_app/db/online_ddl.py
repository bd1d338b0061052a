"""The statements behind the online migration operations: indexes built and dropped
concurrently under the session's own lock wait (an invalid index a failed build left is
dropped first), constraints added ``NOT VALID`` then validated or attached ``USING INDEX``."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import psycopg
from django.conf import settings
from django.db import NotSupportedError, OperationalError, models
from django.db.backends.base.schema import BaseDatabaseSchemaEditor
from django.db.migrations.operations.base import Operation

from tasks_app.db.pg_backend.schema import retry_lock_waits

CONCURRENT_INDEX = "CREATE INDEX CONCURRENTLY IF NOT EXISTS"
CONCURRENT_UNIQUE_INDEX = "CREATE UNIQUE INDEX CONCURRENTLY IF NOT EXISTS"


def is_online(schema_editor: BaseDatabaseSchemaEditor) -> bool:
    return schema_editor.connection.vendor == "postgresql"


def runs_online(
    operation: Operation, schema_editor: BaseDatabaseSchemaEditor, model: type[models.Model]
) -> bool:
    """Whether ``operation`` does its online work on ``model`` here; otherwise it does what
    Django's own operation does (SQLite, or a model this database does not migrate)."""
    return is_online(schema_editor) and operation.allow_migrate_model(
        schema_editor.connection.alias, model
    )


def outside_transaction(schema_editor: BaseDatabaseSchemaEditor, what: str) -> None:
    if not schema_editor.collect_sql and schema_editor.connection.in_atomic_block:
        raise NotSupportedError(
            f"{what} runs outside a transaction (PostgreSQL builds an index concurrently "
            f"only there): set atomic = False on its migration"
        )


@contextlib.contextmanager
def _session_lock_wait(schema_editor: BaseDatabaseSchemaEditor) -> Iterator[None]:
    """Run the enclosed statements under the session's own lock timeout: a concurrent
    build's waits make nobody wait behind it, and one that gave up late would have built
    for nothing. The migration's short timeout is set again after."""
    short = getattr(schema_editor, "ddl_lock_timeout_ms", None)
    schema_editor.execute("RESET lock_timeout")
    try:
        yield
    finally:
        if short is not None and (
            schema_editor.collect_sql or schema_editor.connection.is_usable()
        ):
            schema_editor.execute(f"SET lock_timeout = '{short}ms'")


def _index_validity(schema_editor: BaseDatabaseSchemaEditor, name: str) -> bool | None:
    """Whether the index ``name`` is valid; None when there is none."""
    with schema_editor.connection.cursor() as cursor:
        cursor.execute(
            "SELECT indisvalid FROM pg_index WHERE indexrelid = to_regclass(%s)",
            [schema_editor.quote_name(name)],
        )
        row = cursor.fetchone()
    return None if row is None else bool(row[0])


def drop_index_concurrently(schema_editor: BaseDatabaseSchemaEditor, name: str) -> None:
    outside_transaction(schema_editor, f"dropping index {name}")
    sql = f"DROP INDEX CONCURRENTLY IF EXISTS {schema_editor.quote_name(name)}"
    with _session_lock_wait(schema_editor):
        schema_editor.execute(sql)


def build_index_concurrently(schema_editor: BaseDatabaseSchemaEditor, name: str, sql: str) -> None:
    """Run ``sql``, a ``CREATE [UNIQUE] INDEX CONCURRENTLY IF NOT EXISTS`` of ``name``;
    an invalid index of that name (a build that failed) is dropped first, every time."""
    outside_transaction(schema_editor, f"building index {name}")
    if schema_editor.collect_sql:
        with _session_lock_wait(schema_editor):
            schema_editor.execute(sql)
        return
    quoted = schema_editor.quote_name(name)

    def drop_invalid() -> None:
        if _index_validity(schema_editor, name) is False:
            schema_editor.execute(f"DROP INDEX CONCURRENTLY IF EXISTS {quoted}")

    with _session_lock_wait(schema_editor):
        try:
            retry_lock_waits(
                schema_editor.connection,
                sql,
                lambda: schema_editor.execute(sql),
                before_each=drop_invalid,
            )
        except OperationalError as exc:
            if not isinstance(exc.__cause__, psycopg.errors.QueryCanceled):
                raise
            if schema_editor.connection.is_usable():
                drop_invalid()
            raise OperationalError(
                f"building index {name} concurrently took longer than the statement "
                f"timeout ({settings.TASKS_DB_STATEMENT_TIMEOUT_MS} ms): run migrations "
                f"with TASKS_DB_STATEMENT_TIMEOUT_MS=0, as the Procfile's release line "
                f"does (the half-built index was dropped)"
            ) from exc


def build_index(
    schema_editor: BaseDatabaseSchemaEditor, model: type[models.Model], index: models.Index
) -> None:
    """Build ``index`` of ``model`` concurrently (see :func:`build_index_concurrently`)."""
    statement = index.create_sql(model, schema_editor, concurrently=True)
    sql = concurrent_sql(statement, "CREATE INDEX CONCURRENTLY", CONCURRENT_INDEX)
    build_index_concurrently(schema_editor, index.name, sql)


def concurrent_sql(statement: object, plain: str, concurrent: str) -> str:
    sql = str(statement)
    if not sql.startswith(plain):
        raise NotSupportedError(f"expected {plain!r}, got {sql[:80]!r}")
    return concurrent + sql[len(plain) :]


def _constraint_exists(schema_editor: BaseDatabaseSchemaEditor, table: str, name: str) -> bool:
    if schema_editor.collect_sql:
        return False
    with schema_editor.connection.cursor() as cursor:
        cursor.execute(
            "SELECT 1 FROM pg_constraint WHERE conname = %s AND conrelid = to_regclass(%s)",
            [name, schema_editor.quote_name(table)],
        )
        return cursor.fetchone() is not None


def _validate(schema_editor: BaseDatabaseSchemaEditor, table: str, name: str) -> None:
    """Check the existing rows against a ``NOT VALID`` constraint: a scan that lets the
    table be written meanwhile (SHARE UPDATE EXCLUSIVE)."""
    qn = schema_editor.quote_name
    with _session_lock_wait(schema_editor):
        schema_editor.execute(f"ALTER TABLE {qn(table)} VALIDATE CONSTRAINT {qn(name)}")


def add_constraint(
    schema_editor: BaseDatabaseSchemaEditor,
    model: type[models.Model],
    constraint: models.BaseConstraint,
) -> None:
    table = model._meta.db_table
    qn = schema_editor.quote_name
    name = qn(constraint.name)
    sql = str(constraint.create_sql(model, schema_editor))
    if isinstance(constraint, models.CheckConstraint):
        if not _constraint_exists(schema_editor, table, constraint.name):
            schema_editor.execute(sql + " NOT VALID")
        _validate(schema_editor, table, constraint.name)
    elif isinstance(constraint, models.UniqueConstraint) and sql.startswith("CREATE UNIQUE INDEX"):
        # A partial or expression unique constraint is only an index on PostgreSQL.
        sql = concurrent_sql(sql, "CREATE UNIQUE INDEX", CONCURRENT_UNIQUE_INDEX)
        build_index_concurrently(schema_editor, constraint.name, sql)
    elif (
        isinstance(constraint, models.UniqueConstraint)
        and not constraint.deferrable
        and constraint.nulls_distinct is None
    ):
        fields: list[Any] = [model._meta.get_field(field) for field in constraint.fields]
        columns = ", ".join(qn(field.column) for field in fields)
        index = f"{CONCURRENT_UNIQUE_INDEX} {name} ON {qn(table)} ({columns})"
        build_index_concurrently(schema_editor, constraint.name, index)
        if not _constraint_exists(schema_editor, table, constraint.name):
            schema_editor.execute(
                f"ALTER TABLE {qn(table)} ADD CONSTRAINT {name} UNIQUE USING INDEX {name}"
            )
    else:
        raise NotSupportedError(f"no online form for the constraint {constraint!r}")


def remove_constraint(
    schema_editor: BaseDatabaseSchemaEditor,
    model: type[models.Model],
    constraint: models.BaseConstraint,
) -> None:
    sql = str(constraint.remove_sql(model, schema_editor))
    if sql.startswith("DROP INDEX"):
        drop_index_concurrently(schema_editor, constraint.name)
    else:
        qn = schema_editor.quote_name
        schema_editor.execute(
            f"ALTER TABLE {qn(model._meta.db_table)} DROP CONSTRAINT IF EXISTS "
            f"{qn(constraint.name)}"
        )
