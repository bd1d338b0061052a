"""Migrations leave the big tables writable: every migration's statements pass the lock
check (``tests/migration_lint.py``), a migration written in Django's plain form does not,
and the online operations (``tasks_app/db/online_migrations.py``) build concurrently, wait
briefly for their locks and try again, and can be run again after a failure."""

from __future__ import annotations

import logging
import os
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from django.conf import settings
from django.db import NotSupportedError, OperationalError, connection, migrations, models
from django.db.migrations.loader import MigrationLoader
from django.db.migrations.operations.base import Operation
from django.db.migrations.state import ModelState, ProjectState

from tasks_app.db import online_migrations as online
from tasks_app.db.pg_backend.schema import LockNotAcquired
from tests.e2e_support import PYTHON, ROOT, database_url
from tests.migration_lint import Captured, capture, existing_indexes, findings

pytestmark = pytest.mark.skipif(
    connection.vendor != "postgresql", reason="the lock check is PostgreSQL's"
)


def _lint(
    captured: list[Captured],
    session_lock_timeout_ms: int | None = None,
    indexes: dict[str, str] | None = None,
) -> list[str]:
    """The lock check's findings, the workers' lock timeout the session's own unless
    told; ``indexes``: the table of each index that existed before."""
    session = settings.TASKS_DB_LOCK_TIMEOUT_MS
    return findings(
        captured,
        session_lock_timeout_ms=session
        if session_lock_timeout_ms is None
        else session_lock_timeout_ms,
        workers_lock_timeout_ms=settings.TASKS_DB_LOCK_TIMEOUT_MS,
        indexes=indexes,
    )


def _server(dbname: str) -> psycopg.Connection[Any]:
    url = database_url({**connection.settings_dict, "NAME": dbname})
    return psycopg.connect(url, autocommit=True)


@pytest.fixture(scope="module")
def every_migration_ran() -> Iterator[list[Captured]]:
    """The statements of every migration, from an empty database to the latest and back."""
    name = f"lint_{uuid.uuid4().hex[:12]}"
    with _server("postgres") as server:
        server.execute(f'CREATE DATABASE "{name}"')
    try:
        yield capture(database_url({**connection.settings_dict, "NAME": name}))
    finally:
        with _server("postgres") as server:
            server.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def test_every_migration_forwards_and_back_leaves_the_big_tables_writable(
    every_migration_ran: list[Captured],
) -> None:
    labels = {item.label for item in every_migration_ran}
    assert "tasks_app.0006_partial_task_indexes" in labels
    assert "tasks_app.0003_lighter_indexes (backwards)" in labels
    assert _lint(every_migration_ran) == []


def test_the_index_migrations_build_concurrently_and_keep_their_foreign_keys(
    every_migration_ran: list[Captured],
) -> None:
    index_migrations = {f"tasks_app.{n}" for n in ("0003", "0005", "0006", "0008", "0010")}
    concurrent = [
        item.sql
        for item in every_migration_ran
        if item.label[: len("tasks_app.0000")] in index_migrations
        and "backwards" not in item.label
        and "INDEX CONCURRENTLY IF NOT EXISTS" in item.sql
    ]
    # 11 indexes on task, step and event, the GIN and the unique among them.
    assert len(concurrent) == 11, concurrent
    assert any("USING gin (payload jsonb_path_ops)" in sql for sql in concurrent)
    assert any(sql.startswith("CREATE UNIQUE INDEX CONCURRENTLY") for sql in concurrent)
    # Foreign keys are added once, with their tables, and never dropped and checked again.
    touching_foreign_keys = [
        item
        for item in every_migration_ran
        if item.label.startswith(("tasks_app.", "approvals."))
        and "backwards" not in item.label
        and ("FOREIGN KEY" in item.sql or ("DROP CONSTRAINT" in item.sql and "_fk_" in item.sql))
    ]
    assert {item.label for item in touching_foreign_keys} <= {
        "tasks_app.0001_initial",
        "approvals.0001_initial",
    }


# --- the check catches what locks --------------------------------------------------------------

PLAIN: list[Operation] = [
    migrations.AddIndex("task", models.Index(fields=["workflow", "created_at"], name="task_p_idx")),
    migrations.RemoveIndex("task", "task_cancelled_idx"),
    migrations.AddConstraint(
        "step", models.CheckConstraint(condition=models.Q(attempts__lte=1000), name="step_p_check")
    ),
    migrations.AddConstraint(
        "event", models.UniqueConstraint(fields=["task_id", "id"], name="event_p_unique")
    ),
    migrations.AlterField(
        "lease",
        "step",
        models.ForeignKey("tasks_app.step", models.CASCADE, related_name="leases", db_index=True),
    ),
    migrations.AddField(
        "step",
        "reviewer",
        models.ForeignKey(settings.AUTH_USER_MODEL, models.SET_NULL, null=True, related_name="+"),
    ),
    migrations.AlterField("step", "kind", models.CharField(max_length=200)),
    migrations.RunSQL(
        "CREATE INDEX task_p_gin ON tasks_app_task USING gin (payload jsonb_path_ops)",
        migrations.RunSQL.noop,
    ),
]
ONLINE: list[Operation] = [
    online.AddIndexOnline(
        "task", models.Index(fields=["workflow", "created_at"], name="task_p_idx")
    ),
    online.RemoveIndexOnline("task", "task_cancelled_idx"),
    online.AddConstraintOnline(
        "step", models.CheckConstraint(condition=models.Q(attempts__lte=1000), name="step_p_check")
    ),
    online.AddConstraintOnline(
        "event", models.UniqueConstraint(fields=["task_id", "id"], name="event_p_unique")
    ),
    online.AlterFieldIndexOnline(
        "lease",
        "step",
        models.ForeignKey("tasks_app.step", models.CASCADE, related_name="leases", db_index=True),
    ),
    online.PostgresIndexOnline(
        "task_p_gin", "tasks_app_task", "USING gin (payload jsonb_path_ops)"
    ),
]


def _collected(operation: Operation) -> list[Captured]:
    """What ``operation`` would run on the latest schema (as ``sqlmigrate`` shows it)."""
    before = MigrationLoader(connection).project_state()
    after = before.clone()
    operation.state_forwards("tasks_app", after)
    with connection.schema_editor(collect_sql=True, atomic=False) as editor:
        operation.database_forwards("tasks_app", editor, before, after)
    return [Captured("tasks_app.9999_probe", sql) for sql in editor.collected_sql]


@pytest.mark.django_db
@pytest.mark.parametrize("operation", PLAIN, ids=lambda op: op.describe())
def test_a_migration_in_django_s_plain_form_is_caught(operation: Operation) -> None:
    collected = _collected(operation)
    assert _lint(collected, indexes=existing_indexes(connection)), [c.sql for c in collected]


@pytest.mark.django_db
@pytest.mark.parametrize("operation", ONLINE, ids=lambda op: op.describe())
def test_its_online_form_passes(operation: Operation) -> None:
    assert _lint(_collected(operation), indexes=existing_indexes(connection)) == []


def test_a_lock_taken_without_a_short_lock_timeout_is_caught() -> None:
    add_column = 'ALTER TABLE "tasks_app_step" ADD COLUMN "note" text NULL'
    assert _lint([Captured("m", add_column)], session_lock_timeout_ms=10_000)
    assert _lint([Captured("m", add_column)], session_lock_timeout_ms=0)
    assert _lint([Captured("m", "SET lock_timeout = '2s'"), Captured("m", add_column)]) == []
    assert _lint([Captured("m", 'ALTER TABLE "tasks_app_heartbeat" ADD COLUMN "n" int')]) == []


# --- the operations on a table of their own ------------------------------------------------------

PROBE = "online_probe"


@pytest.fixture
def probe(transactional_db: None) -> Iterator[ProjectState]:
    """A table of 1,000 rows, and the migration state that describes it."""
    with connection.cursor() as cursor:
        cursor.execute(
            f"CREATE TABLE {PROBE} (id bigserial PRIMARY KEY, n integer NOT NULL, "
            f"label varchar(50), parent_id bigint REFERENCES {PROBE} (id))"
        )
        cursor.execute(f"CREATE INDEX {PROBE}_parent ON {PROBE} (parent_id)")
        cursor.execute(
            f"INSERT INTO {PROBE} (n, label) SELECT g, 'l' || g FROM generate_series(1, 1000) g"
        )
    state = ProjectState()
    state.add_model(
        ModelState(
            "tasks_app",
            "Probe",
            [
                ("id", models.BigAutoField(primary_key=True)),
                ("n", models.IntegerField()),
                ("label", models.CharField(max_length=50, null=True)),
                ("parent", models.ForeignKey("tasks_app.Probe", models.CASCADE, null=True)),
            ],
            options={"db_table": PROBE},
        )
    )
    yield state
    with connection.cursor() as cursor:
        cursor.execute(f"DROP TABLE IF EXISTS {PROBE}")


def _apply(operation: Operation, state: ProjectState, *, atomic: bool = False) -> ProjectState:
    after = state.clone()
    operation.state_forwards("tasks_app", after)
    with connection.schema_editor(atomic=atomic) as editor:
        operation.database_forwards("tasks_app", editor, state, after)
    return after


def _unapply(operation: Operation, state: ProjectState, after: ProjectState) -> None:
    with connection.schema_editor(atomic=False) as editor:
        operation.database_backwards("tasks_app", editor, after, state)


def _index(name: str) -> tuple[bool, bool] | None:
    """(valid, unique) of the index ``name``; None when there is none."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT indisvalid, indisunique FROM pg_index WHERE indexrelid = to_regclass(%s)",
            [name],
        )
        row = cursor.fetchone()
    return None if row is None else (bool(row[0]), bool(row[1]))


def _constraints() -> dict[str, tuple[str, bool, int]]:
    """The probe's constraints: name -> (type, validated, oid)."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT conname, contype, convalidated, oid FROM pg_constraint "
            "WHERE conrelid = to_regclass(%s)",
            [PROBE],
        )
        return {name: (kind, valid, oid) for name, kind, valid, oid in cursor.fetchall()}


def test_a_failed_concurrent_build_is_dropped_and_built_again(probe: ProjectState) -> None:
    with _server(connection.settings_dict["NAME"]) as other:
        other.execute(f"INSERT INTO {PROBE} (n) VALUES (1)")  # n is not unique now
        with pytest.raises(psycopg.errors.UniqueViolation):
            other.execute(f"CREATE UNIQUE INDEX CONCURRENTLY {PROBE}_n ON {PROBE} (n)")
    assert _index(f"{PROBE}_n") == (False, True)  # left invalid by the failed build

    operation = online.AddIndexOnline("probe", models.Index(fields=["n"], name=f"{PROBE}_n"))
    _apply(operation, probe)
    assert _index(f"{PROBE}_n") == (True, False)
    _apply(operation, probe)  # again, as after a migration that failed further on
    assert _index(f"{PROBE}_n") == (True, False)


def test_a_build_cut_by_the_statement_timeout_leaves_no_invalid_index(
    probe: ProjectState,
) -> None:
    with connection.cursor() as cursor:
        # 1,000 rows at 2 ms each: longer than the 300 ms the statement may take.
        cursor.execute(
            f"CREATE FUNCTION {PROBE}_slow(integer) RETURNS integer IMMUTABLE "
            f"LANGUAGE plpgsql AS $$ BEGIN PERFORM pg_sleep(0.002); RETURN $1; END $$"
        )
        cursor.execute("SET statement_timeout = '300ms'")
    operation = online.PostgresIndexOnline(f"{PROBE}_slow", PROBE, f"(({PROBE}_slow(n)))")
    try:
        with pytest.raises(OperationalError, match="TASKS_DB_STATEMENT_TIMEOUT_MS=0"):
            _apply(operation, probe)
        assert _index(f"{PROBE}_slow") is None
    finally:
        with connection.cursor() as cursor:
            cursor.execute("RESET statement_timeout")
            cursor.execute(f"DROP FUNCTION {PROBE}_slow CASCADE")


def test_a_concurrent_build_refuses_to_run_in_a_transaction(probe: ProjectState) -> None:
    operation = online.AddIndexOnline("probe", models.Index(fields=["n"], name=f"{PROBE}_n"))
    with pytest.raises(NotSupportedError, match="atomic = False"):
        _apply(operation, probe, atomic=True)
    assert _index(f"{PROBE}_n") is None


def test_constraints_are_added_not_valid_then_validated_or_using_an_index(
    probe: ProjectState,
) -> None:
    ran: list[str] = []

    def record(execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
        ran.append(sql)
        return execute(sql, params, many, context)

    check = online.AddConstraintOnline(
        "probe", models.CheckConstraint(condition=models.Q(n__gte=0), name=f"{PROBE}_n_check")
    )
    unique = online.AddConstraintOnline(
        "probe", models.UniqueConstraint(fields=["n"], name=f"{PROBE}_n_unique")
    )
    with connection.execute_wrapper(record):
        checked = _apply(check, probe)
        both = _apply(unique, checked)
    assert any(sql.endswith("NOT VALID") for sql in ran)
    assert any("VALIDATE CONSTRAINT" in sql for sql in ran)
    assert any(sql.startswith("CREATE UNIQUE INDEX CONCURRENTLY") for sql in ran)
    assert any("UNIQUE USING INDEX" in sql for sql in ran)
    found = _constraints()
    assert found[f"{PROBE}_n_check"][:2] == ("c", True)
    assert found[f"{PROBE}_n_unique"][:2] == ("u", True)

    _unapply(unique, checked, both)
    assert f"{PROBE}_n_unique" not in _constraints() and _index(f"{PROBE}_n_unique") is None


def test_a_column_s_index_changes_leave_its_foreign_key_alone(probe: ProjectState) -> None:
    fk_before = {n: c for n, c in _constraints().items() if c[0] == "f"}
    no_index = online.AlterFieldIndexOnline(
        "probe",
        "parent",
        models.ForeignKey("tasks_app.Probe", models.CASCADE, null=True, db_index=False),
    )
    after = _apply(no_index, probe)
    assert _index(f"{PROBE}_parent") is None
    assert {n: c for n, c in _constraints().items() if c[0] == "f"} == fk_before

    _unapply(no_index, probe, after)  # the index is built again, concurrently
    assert {n: c for n, c in _constraints().items() if c[0] == "f"} == fk_before
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_index WHERE indrelid = to_regclass(%s) AND indisvalid "
            "AND NOT indisunique AND indkey::text = "
            "(SELECT attnum::text FROM pg_attribute WHERE attrelid = to_regclass(%s) "
            "AND attname = 'parent_id')",
            [PROBE, PROBE],
        )
        assert cursor.fetchone() == (1,)

    unique_label = online.AlterFieldIndexOnline(
        "probe", "label", models.CharField(max_length=50, null=True, unique=True)
    )
    after = _apply(unique_label, probe)
    kinds = sorted(kind for kind, _, _ in _constraints().values())
    assert kinds == ["f", "p", "u"]
    _unapply(unique_label, probe, after)
    assert sorted(kind for kind, _, _ in _constraints().values()) == ["f", "p"]


@pytest.fixture
def holder(probe: ProjectState) -> Iterator[psycopg.Connection[Any]]:
    """Another session, in a transaction that has read the probe table (ACCESS SHARE: no
    ALTER TABLE can have it until the transaction ends)."""
    other = psycopg.connect(database_url(connection.settings_dict), application_name="probe-holder")
    yield other
    other.close()


def test_a_brief_lock_is_tried_again_until_its_holder_lets_go(
    probe: ProjectState,
    holder: psycopg.Connection[Any],
    settings: Any,
    caplog: pytest.LogCaptureFixture,
) -> None:
    settings.TASKS_MIGRATION_LOCK_TIMEOUT_MS = 200
    settings.TASKS_MIGRATION_LOCK_ATTEMPTS = 10
    # The holder's session is ended by the server after 1.5 s idle in its transaction.
    holder.execute("SET idle_in_transaction_session_timeout = '1500ms'")
    holder.execute(f"SELECT count(*) FROM {PROBE}")
    check = online.AddConstraintOnline(
        "probe", models.CheckConstraint(condition=models.Q(n__gte=0), name=f"{PROBE}_n_check")
    )
    with caplog.at_level(logging.WARNING, logger="tasks_app.db.pg_backend.schema"):
        _apply(check, probe)
    assert _constraints()[f"{PROBE}_n_check"][:2] == ("c", True)
    assert any("trying again" in record.getMessage() for record in caplog.records)


def test_a_lock_held_past_every_attempt_fails_naming_its_holder(
    probe: ProjectState, holder: psycopg.Connection[Any], settings: Any
) -> None:
    settings.TASKS_MIGRATION_LOCK_TIMEOUT_MS = 100
    settings.TASKS_MIGRATION_LOCK_ATTEMPTS = 2
    holder.execute(f"SELECT count(*) FROM {PROBE}")
    pid = holder.info.backend_pid
    check = online.AddConstraintOnline(
        "probe", models.CheckConstraint(condition=models.Q(n__gte=0), name=f"{PROBE}_n_check")
    )
    with pytest.raises(LockNotAcquired, match=rf"2 times.*pid {pid} \(probe-holder"):
        _apply(check, probe)
    holder.rollback()
    assert f"{PROBE}_n_check" not in _constraints()


# --- the embedded mode ---------------------------------------------------------------------------


def test_the_migrations_run_on_sqlite_forwards_and_back(tmp_path: Path) -> None:
    env = {
        key: value
        for key, value in os.environ.items()
        if key not in {"DATABASE_URL", "REDIS_URL", "DJANGO_PRODUCTION"}
    }
    env["TASKS_VAR_DIR"] = str(tmp_path)
    for args in (["migrate"], ["migrate", "tasks_app", "0002"], ["migrate"]):
        done = subprocess.run(
            [PYTHON, "manage.py", *args, "--noinput", "-v", "0"],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
        assert done.returncode == 0, done.stderr
    assert (tmp_path / "db.sqlite3").exists()
