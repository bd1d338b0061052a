"""Rows no Python process can decode, written the way an import or an older writer would:
by SQL, behind the services' back.

PostgreSQL's ``jsonb`` takes arrays nested some 14,500 deep under its default 2 MB stack
(``max_stack_depth``) and refuses deeper ones ("stack depth limit exceeded"); Python's
``json`` decoder gives up near 10,000 with ``RecursionError``. :data:`DEPTH` sits between
the two, and :func:`poison` checks that both hold before a test relies on it.
"""

from __future__ import annotations

import json

import pytest
from django.db import connection

DEPTH = 12_000

# (table, column) of the JSON columns a worker, the sweeper or a page decodes.
COLUMNS = {
    "payload": "tasks_app_task",
    "result": "tasks_app_step",
    "change_request": "tasks_app_step",
}


def nested_json(depth: int = DEPTH) -> str:
    """An SQL expression: ``{"doc": [[[…]]]}``, the arrays ``depth`` deep, as ``jsonb``."""
    return f"jsonb_build_object('doc', (repeat('[', {depth}) || repeat(']', {depth}))::jsonb)"


def poison(pk: int, column: str = "payload", depth: int = DEPTH) -> None:
    """Store the nested document in ``column`` of the task (``payload``) or step row ``pk``,
    and check that PostgreSQL kept it and Python cannot decode it."""
    table = COLUMNS[column]
    with connection.cursor() as cursor:
        cursor.execute(f"UPDATE {table} SET {column} = {nested_json(depth)} WHERE id = %s", [pk])
        assert cursor.rowcount == 1
        cursor.execute(f"SELECT {column}::text FROM {table} WHERE id = %s", [pk])
        (text,) = cursor.fetchone()
    with pytest.raises(RecursionError):
        json.loads(text)
