"""The one path allowed to delete events: pruning history past its retention.

On PostgreSQL the append-only trigger lets a DELETE through only inside a transaction
that set ``tasks_app.retention`` locally; the setting dies with the transaction.
"""

from __future__ import annotations

from collections.abc import Sequence

from django.db import connection, transaction

from .models import Event


def delete_events(event_ids: Sequence[int]) -> int:
    """Delete the given events; returns how many went."""
    if not event_ids:
        return 0
    table = Event._meta.db_table
    with transaction.atomic(), connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute("SET LOCAL tasks_app.retention = 'on'")
        placeholders = ", ".join(["%s"] * len(event_ids))
        cursor.execute(f"DELETE FROM {table} WHERE id IN ({placeholders})", list(event_ids))  # noqa: S608
        deleted: int = cursor.rowcount
        if connection.vendor == "postgresql":
            # Called inside an outer transaction, this block is only a savepoint and the
            # SET LOCAL would last until the outer transaction ends: switch it off again so
            # nothing after this call can delete events.
            cursor.execute("SET LOCAL tasks_app.retention = 'off'")
        return deleted
