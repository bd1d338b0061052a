"""JSON columns that read a value Python cannot decode as :class:`Undecodable`, not as an error.

PostgreSQL's ``jsonb`` keeps documents nested far deeper (some 14,500 levels under its
default stack) than Python's ``json`` decoder reads (it raises ``RecursionError`` near
10,000). Such a value never comes through the services (the input rules stop payloads at
``validation.MAX_DEPTH`` levels) but an import, an older writer or a hand-written statement
can store one; decoding its row then raised wherever the row was read: in the claim that
had just committed, in every sweep, on the console's pages. Read as :class:`Undecodable`,
the row loads like any other, and whoever needs the value decides what to do without it:
the runner and the sweeper dead-letter its step as ``undecodable_payload``, the pages show
a note, ``check_invariants`` names it.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from django.db import models

# JSON text of a value, refusing NaN and infinities (which PostgreSQL's jsonb rejects):
# ``json.dumps(value, allow_nan=False)`` without building an encoder per call.
strict_json = json.JSONEncoder(allow_nan=False).encode


@dataclass(frozen=True)
class Undecodable:
    """A stored JSON value Python could not decode; ``text`` is the value as stored."""

    text: str = field(repr=False)
    reason: str

    def __str__(self) -> str:
        return f"cannot be decoded ({self.reason}; {len(self.text):,} characters as stored)"


def is_undecodable(value: object) -> bool:
    return isinstance(value, Undecodable)


def described(value: Any) -> Any:
    """``value``, or for an undecodable one a short JSON description of it: what a copy of
    the value (an event's data) keeps instead, so the copy stays decodable."""
    if isinstance(value, Undecodable):
        return {"undecodable": str(value)}
    return value


class _AsStored(json.JSONEncoder):
    """Encodes an :class:`Undecodable` as the text it was read from."""

    def encode(self, o: Any) -> str:
        if isinstance(o, Undecodable):
            return o.text
        return super().encode(o)


class TolerantJSONField(models.JSONField):
    """A ``JSONField`` whose values Python cannot decode read as :class:`Undecodable`; saved
    back unchanged (a model saved whole writes its JSON columns too), they are written as
    they were read."""

    def from_db_value(self, value: Any, expression: Any, connection: Any) -> Any:
        try:
            return super().from_db_value(value, expression, connection)
        except RecursionError:
            return Undecodable(value, "nested deeper than Python's JSON decoder reads")

    def get_db_prep_value(self, value: Any, connection: Any, prepared: bool = False) -> Any:
        if isinstance(value, Undecodable):
            return connection.ops.adapt_json_value(value, _AsStored)
        return super().get_db_prep_value(value, connection, prepared)

    def deconstruct(self) -> Any:
        # The column is Django's jsonb column; only reading differs, which migrations do not
        # see. Named as Django's field, the migration state is unchanged (no migration).
        name, _, args, kwargs = super().deconstruct()
        return name, "django.db.models.JSONField", args, kwargs


def first_undecodable(values: Mapping[str, object]) -> str | None:
    """The first of the named ``values`` that cannot be decoded, said for a step's error
    ("the payload of task 7 cannot be decoded (…)"); None when every one can."""
    for name, value in values.items():
        if isinstance(value, Undecodable):
            return f"the {name} {value}"
    return None
