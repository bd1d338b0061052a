"""Upgrading a database migrated by an earlier release, then pruning its history.

A database migrated before the layout by concern holds the event trigger as migration 0002
first installed it: it let a DELETE through when the session had set
``tasks_app.retention`` (0002's text was later edited to another name, which such a
database never saw). Migration 0019 installs the current trigger functions whatever a
database's history. The test builds its own database with ``manage.py migrate``, as a
release step would, puts the old trigger back as that database holds it (kept here as a
fixture), upgrades it and prunes; then drops it.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator

import psycopg
import pytest
from django.db import connection

from tests.e2e_support import database_url, manage

pytestmark = pytest.mark.skipif(
    connection.vendor != "postgresql", reason="the triggers are PostgreSQL's"
)

# The event trigger as the releases before the layout by concern installed it (migration
# 0002's text at 9254a09): what a database migrated then still holds.
OLD_EVENT_TRIGGER = """
CREATE OR REPLACE FUNCTION tasks_app_event_append_only() RETURNS trigger AS $$
BEGIN
    IF TG_OP = 'DELETE' AND current_setting('tasks_app.retention', true) = 'on' THEN
        RETURN OLD;
    END IF;
    RAISE EXCEPTION 'tasks_app_event is append-only: % refused', TG_OP
        USING ERRCODE = 'insufficient_privilege';
END;
$$ LANGUAGE plpgsql;
"""


def _url(name: str) -> str:
    return database_url({**connection.settings_dict, "NAME": name})


def _admin() -> psycopg.Connection[tuple[object, ...]]:
    return psycopg.connect(_url("postgres"), autocommit=True)


@pytest.fixture
def old_database() -> Iterator[str]:
    """A database of its own, dropped afterwards."""
    name = f"task_console_upgrade_{uuid.uuid4().hex[:10]}"
    with _admin() as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    try:
        yield name
    finally:
        with _admin() as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def on(database: str, *args: str) -> str:
    """``manage.py`` with ``args`` against ``database``; its output (it must succeed)."""
    env = {key: value for key, value in os.environ.items() if key != "DJANGO_SETTINGS_MODULE"}
    return manage(*args, env={**env, "DATABASE_URL": _url(database)}, timeout=300)


def sql(database: str, statement: str) -> list[tuple[object, ...]]:
    with psycopg.connect(_url(database), autocommit=True) as conn:
        cursor = conn.execute(statement)
        return cursor.fetchall() if cursor.description else []


def _old_finished_history(database: str) -> int:
    """A cancelled task that finished 400 days ago, with its events; returns its id."""
    on(database, "enqueue", "demo.noop", "--payload", "{}", "--key", "old:1")
    (task_id,) = sql(database, "SELECT id FROM tasks_app_task WHERE idempotency_key = 'old:1'")[0]
    on(database, "cancel", str(task_id), "--reason", "no longer needed")
    sql(
        database,
        "UPDATE tasks_app_task SET finished_at = now() - interval '400 days', "
        f"created_at = now() - interval '400 days' WHERE id = {task_id}",
    )
    return int(str(task_id))


def _migrate_as_an_earlier_release(database: str) -> None:
    """Every app as the release before 0019 left it (the approvals app's latest
    migration depends on the core's 0018): the core's later migrations unapplied."""
    on(database, "migrate", "tasks_app", "0018", "--noinput")
    assert "[ ] 0019_history_only_retention_deletes" in on(database, "showmigrations", "tasks_app")


def _event_trigger(database: str) -> str:
    [(source,)] = sql(
        database, "SELECT prosrc FROM pg_proc WHERE proname = 'tasks_app_event_append_only'"
    )
    return str(source)


def test_a_database_migrated_by_an_earlier_release_prunes_after_the_upgrade(
    old_database: str,
) -> None:
    # The history is written by this release's code, on its schema, then the schema goes
    # back to the earlier release's (this code cannot run on that one: its steps lack the
    # columns added since).
    on(old_database, "migrate", "--noinput")
    task_id = _old_finished_history(old_database)
    _migrate_as_an_earlier_release(old_database)
    sql(old_database, OLD_EVENT_TRIGGER)
    assert sql(old_database, f"SELECT count(*) FROM tasks_app_event WHERE task_id = {task_id}")[0][
        0
    ]

    on(old_database, "migrate", "--noinput")
    output = on(old_database, "prune_history")

    assert "tasks_app.retention" not in _event_trigger(old_database)
    assert sql(old_database, f"SELECT count(*) FROM tasks_app_task WHERE id = {task_id}") == [(0,)]
    # Its worker events went with it; the operator's cancel stays for the audit retention.
    remaining = {
        kind
        for (kind,) in sql(
            old_database, f"SELECT kind FROM tasks_app_event WHERE task_id = {task_id}"
        )
    }
    assert "enqueued" not in remaining, output
    assert "cancelled" in remaining and remaining <= {"cancel_requested", "cancelled"}, output
    # The sweeper's share runs too, as every sweep does.
    on(old_database, "sweep")
