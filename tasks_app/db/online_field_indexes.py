"""``AlterFieldIndexOnline``: a change of a column's own index or unique constraint
(``db_index``, ``unique``) made without locking its table, the foreign key on the column
left as it is."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django.db import NotSupportedError, models
from django.db.backends.base.schema import BaseDatabaseSchemaEditor
from django.db.migrations.operations import AlterField
from django.db.migrations.state import ProjectState

from tasks_app.db.online_ddl import (
    CONCURRENT_INDEX,
    add_constraint,
    build_index_concurrently,
    concurrent_sql,
    drop_index_concurrently,
    outside_transaction,
    runs_online,
)


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
        if not runs_online(self, schema_editor, new_model):
            super().database_forwards(app_label, schema_editor, from_state, to_state)
            return
        outside_transaction(schema_editor, f"changing the index of {self.name}")
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
                drop_index_concurrently(schema_editor, name)
        if after.unique and not before.unique:
            name = schema_editor._create_index_name(table, [new.column], suffix="_uniq")  # type: ignore[attr-defined]
            add_constraint(
                schema_editor, new_model, models.UniqueConstraint(fields=[new.name], name=name)
            )
        for kind in ("plain", "like"):
            if getattr(after, kind) and not getattr(before, kind):
                statement = (
                    schema_editor._create_index_sql(new_model, fields=[new])  # type: ignore[attr-defined]
                    if kind == "plain"
                    else schema_editor._create_like_index_sql(new_model, new)  # type: ignore[attr-defined]
                )
                sql = concurrent_sql(statement, "CREATE INDEX", CONCURRENT_INDEX)
                build_index_concurrently(
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
