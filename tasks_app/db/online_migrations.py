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
timeout and are tried again (``tasks_app.db.pg_backend.schema``); concurrent builds and
validations make nobody wait behind them and run under the session's own lock timeout.
``tests/db/test_online_migrations.py`` checks the statements of every migration.

The statements themselves are in :mod:`tasks_app.db.online_ddl`, and
``AlterFieldIndexOnline`` in :mod:`tasks_app.db.online_field_indexes`; migrations import
every operation from here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django.db.backends.base.schema import BaseDatabaseSchemaEditor
from django.db.migrations.operations import (
    AddConstraint,
    AddIndex,
    RemoveConstraint,
    RemoveIndex,
)
from django.db.migrations.operations.base import Operation
from django.db.migrations.state import ModelState, ProjectState
from django.db.models import Model

from tasks_app.db.online_ddl import (
    CONCURRENT_INDEX,
    add_constraint,
    build_index,
    build_index_concurrently,
    drop_index_concurrently,
    is_online,
    outside_transaction,
    remove_constraint,
    runs_online,
)
from tasks_app.db.online_field_indexes import AlterFieldIndexOnline

__all__ = [
    "AddConstraintOnline",
    "AddIndexOnline",
    "AlterFieldIndexOnline",
    "PostgresIndexOnline",
    "RemoveConstraintOnline",
    "RemoveIndexOnline",
    "RemovePostgresIndexOnline",
]


# --- one model's indexes and constraints ---------------------------------------------------


@dataclass(frozen=True)
class Moving:
    """The two states an operation moves its model between, ``before`` to ``after``."""

    app_label: str
    before: ProjectState
    after: ProjectState

    def model_state(self, state: ProjectState, model_name: str) -> ModelState:
        found: ModelState = state.models[self.app_label, model_name.lower()]
        return found


class OnlineOperation(Operation):
    """The online form of one of Django's operations on a model's table, placed before it
    in the bases: where :func:`runs_online` says so, ``online_forwards`` and
    ``online_backwards`` make the change; elsewhere Django's own operation does.

    Each is given the model as the state it moves to has it (the later state going
    forwards, the earlier going backwards: an index or constraint operation leaves the
    model in both)."""

    model_name: str

    def database_forwards(
        self,
        app_label: str,
        schema_editor: BaseDatabaseSchemaEditor,
        from_state: ProjectState,
        to_state: ProjectState,
    ) -> None:
        model = to_state.apps.get_model(app_label, self.model_name)
        if runs_online(self, schema_editor, model):
            self.online_forwards(schema_editor, model, Moving(app_label, from_state, to_state))
        else:
            super().database_forwards(app_label, schema_editor, from_state, to_state)

    def database_backwards(
        self,
        app_label: str,
        schema_editor: BaseDatabaseSchemaEditor,
        from_state: ProjectState,
        to_state: ProjectState,
    ) -> None:
        model = to_state.apps.get_model(app_label, self.model_name)
        if runs_online(self, schema_editor, model):
            self.online_backwards(schema_editor, model, Moving(app_label, from_state, to_state))
        else:
            super().database_backwards(app_label, schema_editor, from_state, to_state)

    def online_forwards(
        self, schema_editor: BaseDatabaseSchemaEditor, model: type[Model], moving: Moving
    ) -> None:
        raise NotImplementedError

    def online_backwards(
        self, schema_editor: BaseDatabaseSchemaEditor, model: type[Model], moving: Moving
    ) -> None:
        raise NotImplementedError


class AddIndexOnline(OnlineOperation, AddIndex):
    """``AddIndex``, built concurrently on PostgreSQL."""

    def online_forwards(
        self, schema_editor: BaseDatabaseSchemaEditor, model: type[Model], moving: Moving
    ) -> None:
        build_index(schema_editor, model, self.index)

    def online_backwards(
        self, schema_editor: BaseDatabaseSchemaEditor, model: type[Model], moving: Moving
    ) -> None:
        drop_index_concurrently(schema_editor, self.index.name)


class RemoveIndexOnline(OnlineOperation, RemoveIndex):
    """``RemoveIndex``, dropped concurrently on PostgreSQL (built so when reversed)."""

    def online_forwards(
        self, schema_editor: BaseDatabaseSchemaEditor, model: type[Model], moving: Moving
    ) -> None:
        drop_index_concurrently(schema_editor, self.name)

    def online_backwards(
        self, schema_editor: BaseDatabaseSchemaEditor, model: type[Model], moving: Moving
    ) -> None:
        index = moving.model_state(moving.after, self.model_name).get_index_by_name(self.name)
        build_index(schema_editor, model, index)


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
        if is_online(schema_editor):
            qn = schema_editor.quote_name
            sql = f"{CONCURRENT_INDEX} {qn(self.name)} ON {qn(self.table)} {self.definition}"
            build_index_concurrently(schema_editor, self.name, sql)

    def database_backwards(
        self,
        app_label: str,
        schema_editor: BaseDatabaseSchemaEditor,
        from_state: ProjectState,
        to_state: ProjectState,
    ) -> None:
        if is_online(schema_editor):
            drop_index_concurrently(schema_editor, self.name)

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


class AddConstraintOnline(OnlineOperation, AddConstraint):
    """``AddConstraint`` without checking or indexing the table under a lock on
    PostgreSQL: unique constraints and check constraints."""

    def online_forwards(
        self, schema_editor: BaseDatabaseSchemaEditor, model: type[Model], moving: Moving
    ) -> None:
        outside_transaction(schema_editor, f"adding constraint {self.constraint.name}")
        add_constraint(schema_editor, model, self.constraint)

    def online_backwards(
        self, schema_editor: BaseDatabaseSchemaEditor, model: type[Model], moving: Moving
    ) -> None:
        outside_transaction(schema_editor, f"removing constraint {self.constraint.name}")
        remove_constraint(schema_editor, model, self.constraint)


class RemoveConstraintOnline(OnlineOperation, RemoveConstraint):
    """``RemoveConstraint``; on PostgreSQL a unique index is dropped concurrently, and
    the constraint is added back as :class:`AddConstraintOnline` adds it."""

    def online_forwards(
        self, schema_editor: BaseDatabaseSchemaEditor, model: type[Model], moving: Moving
    ) -> None:
        outside_transaction(schema_editor, f"removing constraint {self.name}")
        model_state = moving.model_state(moving.before, self.model_name)
        remove_constraint(schema_editor, model, model_state.get_constraint_by_name(self.name))

    def online_backwards(
        self, schema_editor: BaseDatabaseSchemaEditor, model: type[Model], moving: Moving
    ) -> None:
        outside_transaction(schema_editor, f"adding constraint {self.name}")
        model_state = moving.model_state(moving.after, self.model_name)
        add_constraint(schema_editor, model, model_state.get_constraint_by_name(self.name))
