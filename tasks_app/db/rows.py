"""Model instances from rows read by hand: what the hot path's statements return.

``Model.from_db`` goes through ``Model.__init__``, which sets every field through its
descriptor, checks the arguments and sends ``post_init``: about 12 µs for a task row, three
times per executed step. A row read from the database needs none of it: its values are
the instance's attributes as they are, and its state says it is saved. :func:`instance`
builds it so; the result is what ``from_db`` gives (``tests/db/test_rows.py`` compares
them field by field). No model of this project listens to ``post_init``, and the models
built here are never ones whose fields compute on assignment.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import cache
from typing import Any

from django.db import connection, models
from django.db.models.base import ModelState


def instance[M: models.Model](model: type[M], attnames: Sequence[str], values: Sequence[Any]) -> M:
    """A saved ``model`` instance whose fields ``attnames`` (every concrete field's) hold
    ``values``, already in Python's types."""
    obj = model.__new__(model)
    obj.__dict__.update(zip(attnames, values, strict=True))
    state = obj._state = ModelState()
    state.adding = False
    state.db = connection.alias
    return obj


def from_row[M: models.Model](model: type[M], columns: Sequence[str], values: Sequence[Any]) -> M:
    """A ``model`` instance from a row of ``columns`` (every concrete field's attname),
    each value converted as the ORM converts it (JSON columns arrive as text)."""
    converted = list(values)
    for index, convert in converters(model, tuple(columns)):
        value = converted[index]
        if value is not None:
            converted[index] = convert(value, None, connection)
    return instance(model, columns, converted)


@cache
def converters(model: type[models.Model], columns: tuple[str, ...]) -> list[tuple[int, Any]]:
    """Where in a row of ``columns`` a field turns the database's value into Python's."""
    fields = {field.attname: field for field in model._meta.concrete_fields}
    if set(columns) != set(fields):
        raise ValueError(f"a {model.__name__} row needs every concrete field, not {columns}")
    found = [
        (index, getattr(fields[name], "from_db_value", None)) for index, name in enumerate(columns)
    ]
    return [(index, convert) for index, convert in found if convert is not None]
