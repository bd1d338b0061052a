"""The hot path's cursor on Django's connection (``tasks_app.engine.fastpath``,
``fast_inserts``, ``limited_claims``)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import psycopg
from django.db import connection
from psycopg.types.datetime import TimestamptzLoader

from tasks_app.db.deadlines import bounded


@contextmanager
def hot_cursor() -> Iterator[psycopg.Cursor[Any]]:
    """A psycopg cursor with server-side parameter binding on Django's connection.

    Arrays of thousands of values are sent as parameters instead of being quoted into the
    statement text, and statements run often are prepared by psycopg.
    """
    connection.ensure_connection()
    with (
        connection.wrap_database_errors,
        bounded(connection.connection),
        psycopg.Cursor(connection.connection) as cursor,
    ):
        # psycopg's own loader, in C: the session's time zone is UTC (Django sets it), so
        # it reads what Django's wrapper around it reads, without a Python call for each of
        # the nine timestamps of a claimed step and its task.
        cursor.adapters.register_loader("timestamptz", TimestamptzLoader)
        yield cursor
