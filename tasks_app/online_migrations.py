"""Migration operations that leave the big tables writable while they run.

On PostgreSQL a plain ``CREATE INDEX`` holds a lock that stops every write to its table
until the build ends (and every transition writes an event); ``ADD CONSTRAINT`` checks
every row under its lock; a UNIQUE constraint builds its index under it; dropping and
adding a foreign key again checks the whole table again. These operations make the same
schema changes the way PostgreSQL allows while the table is being written:

- ``AddIndexOnline``, ``RemoveIndexOnline``: ``CREATE``/``DROP INDEX CONCURRENTLY``;
- ``AddConstraintOnline``, ``RemoveConstraintOnline``: a unique constraint's index is
  built concurrently (then attached with ``ADD CONSTRAINT … USING INDEX`` when Django
  makes it a table constraint); a check constraint is added ``NOT VALID``, then validated
  (a scan that blocks no writes);
- ``AlterFieldIndexOnline``: an ``AlterField`` whose only change is the column's own
  index or unique constraint (``db_index``, ``unique``): those are built or dropped as
  above, and a foreign key on the column is left alone (Django would drop it and add it
  back, checking every row);
- ``PostgresIndexOnline``: an index the models do not declare (a GIN index on a JSON
  column), PostgreSQL's only.

Elsewhere (SQLite, the embedded mode) each does what Django's own operation does.

A concurrent build cannot run inside a transaction, so a migration using these is
``atomic = False``; each operation may be run again after a failure (``IF NOT EXISTS``;
an invalid index that a failed build left is dropped and built again). Statements that
take a brief lock (adding or dropping a constraint) wait at most the migration's lock
timeout and are tried again (``tasks_app.pg_backend.schema``); concurrent builds and
validations make nobody wait behind them and run under the session's own lock timeout.
``tests/test_online_migrations.py`` checks the statements of every migration.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import psycopg
from django.conf import settings
from django.db import NotSupportedError, OperationalError, models
from django.db.backends.base.schema import BaseDatabaseSchemaEditor
from django.db.migrations.operations import (
    AddConstraint,
    AddIndex,
    AlterField,
    RemoveConstraint,
    RemoveIndex,
)
from django.db.migrations.operations.base import Operation
from django.db.migrations.state import ProjectState

from .pg_backend.schema import retry_lock_waits

CONCURRENT_INDEX = "CREATE INDEX CONCURRENTLY IF NOT EXISTS"
CONCURRENT_UNIQUE_INDEX = "CREATE UNIQUE INDEX CONCURRENTLY IF NOT EXISTS"


def _online(schema_editor: BaseDatabaseSchemaEditor) -> bool:
    return schema_editor.connection.vendor == "postgresql"


def _outside_transaction(schema_editor: BaseDatabaseSchemaEditor, what: str) -> None:
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


def _drop_index_concurrently(schema_editor: BaseDatabaseSchemaEditor, name: str) -> None:
    _outside_transaction(schema_editor, f"dropping index {name}")
    sql = f"DROP INDEX CONCURRENTLY IF EXISTS {schema_editor.quote_name(name)}"
    with _session_lock_wait(schema_editor):
        schema_editor.execute(sql)


def _build_index_concurrently(schema_editor: BaseDatabaseSchemaEditor, name: str, sql: str) -> None:
    """Run ``sql``, a ``CREATE [UNIQUE] INDEX CONCURRENTLY IF NOT EXISTS`` of ``name``;
    an invalid index of that name (a build that failed) is dropped first, every time."""
    _outside_transaction(schema_editor, f"building index {name}")
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


def _concurrent(statement: object, plain: str, concurrent: str) -> str:
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


# --- indexes --------------------------------------------------------------------------------


class AddIndexOnline(AddIndex):
    """``AddIndex``, built concurrently on PostgreSQL."""

    def database_forwards(
        self,
        app_label: str,
        schema_editor: BaseDatabaseSchemaEditor,
        from_state: ProjectState,
        to_state: ProjectState,
    ) -> None:
        model = to_state.apps.get_model(app_label, self.model_name)
        if not _online(schema_editor) or not self.allow_migrate_model(
            schema_editor.connection.alias, model
        ):
            super().database_forwards(app_label, schema_editor, from_state, to_state)
            return
        statement = self.index.create_sql(model, schema_editor, concurrently=True)
        sql = _concurrent(statement, "CREATE INDEX CONCURRENTLY", CONCURRENT_INDEX)
        _build_index_concurrently(schema_editor, self.index.name, sql)

    def database_backwards(
        self,
        app_label: str,
        schema_editor: BaseDatabaseSchemaEditor,
        from_state: ProjectState,
        to_state: ProjectState,
    ) -> None:
        model = from_state.apps.get_model(app_label, self.model_name)
        if not _online(schema_editor) or not self.allow_migrate_model(
            schema_editor.connection.alias, model
        ):
            super().database_backwards(app_label, schema_editor, from_state, to_state)
            return
        _drop_index_concurrently(schema_editor, self.index.name)


class RemoveIndexOnline(RemoveIndex):
    """``RemoveIndex``, dropped concurrently on PostgreSQL (built so when reversed)."""

    def database_forwards(
        self,
        app_label: str,
        schema_editor: BaseDatabaseSchemaEditor,
        from_state: ProjectState,
        to_state: ProjectState,
    ) -> None:
        model = from_state.apps.get_model(app_label, self.model_name)
        if not _online(schema_editor) or not self.allow_migrate_model(
            schema_editor.connection.alias, model
        ):
            super().database_forwards(app_label, schema_editor, from_state, to_state)
            return
        _drop_index_concurrently(schema_editor, self.name)

    def database_backwards(
        self,
        app_label: str,
        schema_editor: BaseDatabaseSchemaEditor,
        from_state: ProjectState,
        to_state: ProjectState,
    ) -> None:
        model = to_state.apps.get_model(app_label, self.model_name)
        if not _online(schema_editor) or not self.allow_migrate_model(
            schema_editor.connection.alias, model
        ):
            super().database_backwards(app_label, schema_editor, from_state, to_state)
            return
        index = to_state.models[app_label, self.model_name_lower].get_index_by_name(self.name)
        statement = index.create_sql(model, schema_editor, concurrently=True)
        sql = _concurrent(statement, "CREATE INDEX CONCURRENTLY", CONCURRENT_INDEX)
        _build_index_concurrently(schema_editor, index.name, sql)


class PostgresIndexOnline(Operation):
    """An index the models do not declare, PostgreSQL's only (``definition`` follows the
    table's name: ``USING gin (payload jsonb_path_ops)``), built concurrently; nothing on
    other databases, and nothing in the migration state."""

    reversible = True
    reduces_to_sql = True

    def __init__(self, name: str, table: str, definition: str) -> None:
        self.name = name
        self.table = table
        self.definition = definition

    def deconstruct(self) -> tuple[str, list[Any], dict[str, Any]]:
        kwargs = {"name": self.name, "table": self.table, "definition": self.definition}
        return self.__class__.__name__, [], kwargs

    def state_forwards(self, app_label: str, state: ProjectState) -> None:
        pass

    def database_forwards(
        self,
        app_label: str,
        schema_editor: BaseDatabaseSchemaEditor,
        from_state: ProjectState,
        to_state: ProjectState,
    ) -> None:
        if _online(schema_editor):
            qn = schema_editor.quote_name
            sql = f"{CONCURRENT_INDEX} {qn(self.name)} ON {qn(self.table)} {self.definition}"
            _build_index_concurrently(schema_editor, self.name, sql)

    def database_backwards(
        self,
        app_label: str,
        schema_editor: BaseDatabaseSchemaEditor,
        from_state: ProjectState,
        to_state: ProjectState,
    ) -> None:
        if _online(schema_editor):
            _drop_index_concurrently(schema_editor, self.name)

    def describe(self) -> str:
        return f"Create index {self.name} on {self.table} (PostgreSQL), concurrently"

    @property
    def migration_name_fragment(self) -> str:
        return self.name.lower()


class RemovePostgresIndexOnline(PostgresIndexOnline):
    """Drop, concurrently, an index :class:`PostgresIndexOnline` made (the same arguments, so
    going backwards builds it again)."""

    def database_forwards(
        self,
        app_label: str,
        schema_editor: BaseDatabaseSchemaEditor,
        from_state: ProjectState,
        to_state: ProjectState,
    ) -> None:
        super().database_backwards(app_label, schema_editor, from_state, to_state)

    def database_backwards(
        self,
        app_label: str,
        schema_editor: BaseDatabaseSchemaEditor,
        from_state: ProjectState,
        to_state: ProjectState,
    ) -> None:
        super().database_forwards(app_label, schema_editor, from_state, to_state)

    def describe(self) -> str:
        return f"Drop index {self.name} on {self.table} (PostgreSQL), concurrently"

    @property
    def migration_name_fragment(self) -> str:
        return f"remove_{self.name.lower()}"


# --- constraints ----------------------------------------------------------------------------


def _add_constraint(
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
        sql = _concurrent(sql, "CREATE UNIQUE INDEX", CONCURRENT_UNIQUE_INDEX)
        _build_index_concurrently(schema_editor, constraint.name, sql)
    elif (
        isinstance(constraint, models.UniqueConstraint)
        and not constraint.deferrable
        and constraint.nulls_distinct is None
    ):
        fields: list[Any] = [model._meta.get_field(field) for field in constraint.fields]
        columns = ", ".join(qn(field.column) for field in fields)
        index = f"{CONCURRENT_UNIQUE_INDEX} {name} ON {qn(table)} ({columns})"
        _build_index_concurrently(schema_editor, constraint.name, index)
        if not _constraint_exists(schema_editor, table, constraint.name):
            schema_editor.execute(
                f"ALTER TABLE {qn(table)} ADD CONSTRAINT {name} UNIQUE USING INDEX {name}"
            )
    else:
        raise NotSupportedError(f"no online form for the constraint {constraint!r}")


def _remove_constraint(
    schema_editor: BaseDatabaseSchemaEditor,
    model: type[models.Model],
    constraint: models.BaseConstraint,
) -> None:
    sql = str(constraint.remove_sql(model, schema_editor))
    if sql.startswith("DROP INDEX"):
        _drop_index_concurrently(schema_editor, constraint.name)
    else:
        qn = schema_editor.quote_name
        schema_editor.execute(
            f"ALTER TABLE {qn(model._meta.db_table)} DROP CONSTRAINT IF EXISTS "
            f"{qn(constraint.name)}"
        )


class AddConstraintOnline(AddConstraint):
    """``AddConstraint`` without checking or indexing the table under a lock on
    PostgreSQL: unique constraints and check constraints."""

    def database_forwards(
        self,
        app_label: str,
        schema_editor: BaseDatabaseSchemaEditor,
        from_state: ProjectState,
        to_state: ProjectState,
    ) -> None:
        model = to_state.apps.get_model(app_label, self.model_name)
        if not _online(schema_editor) or not self.allow_migrate_model(
            schema_editor.connection.alias, model
        ):
            super().database_forwards(app_label, schema_editor, from_state, to_state)
            return
        _outside_transaction(schema_editor, f"adding constraint {self.constraint.name}")
        _add_constraint(schema_editor, model, self.constraint)

    def database_backwards(
        self,
        app_label: str,
        schema_editor: BaseDatabaseSchemaEditor,
        from_state: ProjectState,
        to_state: ProjectState,
    ) -> None:
        model = to_state.apps.get_model(app_label, self.model_name)
        if not _online(schema_editor) or not self.allow_migrate_model(
            schema_editor.connection.alias, model
        ):
            super().database_backwards(app_label, schema_editor, from_state, to_state)
            return
        _outside_transaction(schema_editor, f"removing constraint {self.constraint.name}")
        _remove_constraint(schema_editor, model, self.constraint)


class RemoveConstraintOnline(RemoveConstraint):
    """``RemoveConstraint``; on PostgreSQL a unique index is dropped concurrently, and
    the constraint is added back as :class:`AddConstraintOnline` adds it."""

    def database_forwards(
        self,
        app_label: str,
        schema_editor: BaseDatabaseSchemaEditor,
        from_state: ProjectState,
        to_state: ProjectState,
    ) -> None:
        model = to_state.apps.get_model(app_label, self.model_name)
        if not _online(schema_editor) or not self.allow_migrate_model(
            schema_editor.connection.alias, model
        ):
            super().database_forwards(app_label, schema_editor, from_state, to_state)
            return
        _outside_transaction(schema_editor, f"removing constraint {self.name}")
        model_state = from_state.models[app_label, self.model_name_lower]
        _remove_constraint(schema_editor, model, model_state.get_constraint_by_name(self.name))

    def database_backwards(
        self,
        app_label: str,
        schema_editor: BaseDatabaseSchemaEditor,
        from_state: ProjectState,
        to_state: ProjectState,
    ) -> None:
        model = to_state.apps.get_model(app_label, self.model_name)
        if not _online(schema_editor) or not self.allow_migrate_model(
            schema_editor.connection.alias, model
        ):
            super().database_backwards(app_label, schema_editor, from_state, to_state)
            return
        _outside_transaction(schema_editor, f"adding constraint {self.name}")
        model_state = to_state.models[app_label, self.model_name_lower]
        _add_constraint(schema_editor, model, model_state.get_constraint_by_name(self.name))


# --- a column's own index -------------------------------------------------------------------


class AlterFieldIndexOnline(AlterField):
    """``AlterField`` for a change of the column's own index or unique constraint only
    (``db_index``, ``unique``). On PostgreSQL the index is built or dropped concurrently,
    a unique constraint is attached to an index built so, and a foreign key on the column
    stays as it is."""

    def database_forwards(
        self,
        app_label: str,
        schema_editor: BaseDatabaseSchemaEditor,
        from_state: ProjectState,
        to_state: ProjectState,
    ) -> None:
        # AlterField runs backwards by running forwards from the later state.
        old_model = from_state.apps.get_model(app_label, self.model_name)
        new_model = to_state.apps.get_model(app_label, self.model_name)
        old: Any = old_model._meta.get_field(self.name)
        new: Any = new_model._meta.get_field(self.name)
        _only_index_changes(old, new, self)
        if not _online(schema_editor) or not self.allow_migrate_model(
            schema_editor.connection.alias, new_model
        ):
            super().database_forwards(app_label, schema_editor, from_state, to_state)
            return
        _outside_transaction(schema_editor, f"changing the index of {self.name}")
        before, after = _own_indexes(schema_editor, old), _own_indexes(schema_editor, new)
        table = new_model._meta.db_table
        qn = schema_editor.quote_name
        existing = _column_indexes(
            schema_editor, table, old, _declared_names(old_model) | _declared_names(new_model)
        )
        # Drop what goes first (a unique constraint in a brief lock, indexes concurrently),
        # then build what comes.
        for name, is_constraint, unique in existing:
            like = name.endswith("_like")
            goes = (
                (unique and before.unique and not after.unique)
                or (not unique and like and before.like and not after.like)
                or (not unique and not like and before.plain and not after.plain)
            )
            if goes and is_constraint:
                schema_editor.execute(
                    f"ALTER TABLE {qn(table)} DROP CONSTRAINT IF EXISTS {qn(name)}"
                )
            elif goes:
                _drop_index_concurrently(schema_editor, name)
        if after.unique and not before.unique:
            name = schema_editor._create_index_name(table, [new.column], suffix="_uniq")  # type: ignore[attr-defined]
            _add_constraint(
                schema_editor, new_model, models.UniqueConstraint(fields=[new.name], name=name)
            )
        for kind in ("plain", "like"):
            if getattr(after, kind) and not getattr(before, kind):
                statement = (
                    schema_editor._create_index_sql(new_model, fields=[new])  # type: ignore[attr-defined]
                    if kind == "plain"
                    else schema_editor._create_like_index_sql(new_model, new)  # type: ignore[attr-defined]
                )
                sql = _concurrent(statement, "CREATE INDEX", CONCURRENT_INDEX)
                _build_index_concurrently(
                    schema_editor, str(statement.parts["name"]).strip('"'), sql
                )


@dataclass(frozen=True)
class _OwnIndexes:
    """What Django makes of a field's ``db_index`` and ``unique`` on PostgreSQL."""

    plain: bool  # an index of the column
    like: bool  # a varchar_pattern_ops / text_pattern_ops index, for LIKE
    unique: bool  # a unique constraint


def _own_indexes(schema_editor: BaseDatabaseSchemaEditor, field: Any) -> _OwnIndexes:
    db_type = field.db_type(connection=schema_editor.connection) or ""
    text = db_type.startswith(("varchar", "text")) and "[" not in db_type
    return _OwnIndexes(
        plain=bool(field.db_index and not field.unique),
        like=bool(text and (field.db_index or field.unique)),
        unique=bool(field.unique),
    )


def _declared_names(model: type[models.Model]) -> set[str]:
    meta = model._meta
    return {index.name for index in meta.indexes} | {c.name for c in meta.constraints}


def _column_indexes(
    schema_editor: BaseDatabaseSchemaEditor, table: str, field: Any, declared: set[str]
) -> list[tuple[str, bool, bool]]:
    """The indexes and unique constraints of the column alone, as the database has them
    now: (name, whether a constraint, whether unique); not those a model's ``Meta``
    declares (they have operations of their own)."""
    connection = schema_editor.connection
    with connection.cursor() as cursor:
        found = connection.introspection.get_constraints(cursor, table)
    return sorted(
        (name, not info["index"], bool(info["unique"]))
        for name, info in found.items()
        if info["columns"] == [field.column]
        and name not in declared
        and not (info["primary_key"] or info["foreign_key"] or info["check"])
        and (info["index"] or info["unique"])
    )


def _only_index_changes(old: Any, new: Any, operation: AlterField) -> None:
    ignored = {"db_index", "unique"}
    old_kwargs = {k: v for k, v in old.deconstruct()[3].items() if k not in ignored}
    new_kwargs = {k: v for k, v in new.deconstruct()[3].items() if k not in ignored}
    if type(old) is not type(new) or old_kwargs != new_kwargs:
        raise NotSupportedError(
            f"{operation.describe()}: AlterFieldIndexOnline changes only db_index and "
            f"unique; use AlterField for other changes"
        )
