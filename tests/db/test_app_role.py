"""History that only retention may delete, tried as the role the processes run as.

``docs/app-role.sql`` is the deployment guide's role: it owns nothing and may not change
the history. Each test creates it under a name of its own inside the test's transaction
(roles, grants and the role switch roll back with it) and acts as it with ``SET LOCAL
ROLE``, as a process connecting with that role would.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import psycopg.errors
import pytest
from django.contrib.auth.models import User
from django.db import DatabaseError, connection, transaction

from tasks_app import services
from tasks_app.engine import runner
from tasks_app.history import audit_verify
from tasks_app.models import AuditCheckpoint, Event, Task, TaskStatus
from tasks_app.operations import retention
from tests.conftest import backdate, only_step
from tests.factories import retrying

pytestmark = pytest.mark.skipif(
    connection.vendor != "postgresql", reason="roles and triggers are PostgreSQL's"
)

GUIDE = Path(__file__).resolve().parents[2] / "docs" / "app-role.sql"
EVENTS = Event._meta.db_table


def run(sql: str, params: list[Any] | None = None) -> None:
    with connection.cursor() as cursor:
        cursor.execute(sql, params or [])


def refused(sql: str, params: list[Any] | None = None) -> str:
    """Run one statement in a savepoint; it must be refused for want of privilege."""
    with pytest.raises(DatabaseError) as excinfo, transaction.atomic():
        run(sql, params)
    assert isinstance(excinfo.value.__cause__, psycopg.errors.InsufficientPrivilege), excinfo.value
    return str(excinfo.value)


@pytest.fixture
def app_role(db: None) -> Iterator[str]:
    """The guide's role, made under a name of its own; the test acts as it."""
    name = f"task_console_app_{uuid.uuid4().hex[:8]}"
    run(GUIDE.read_text(encoding="utf-8").replace("task_console_app", name).replace("%", "%%"))
    yield name
    run("RESET ROLE")


def act_as(role: str) -> None:
    run(f"SET LOCAL ROLE {role}")


def finished_days_ago(task: Task, days: int) -> None:
    Task.objects.filter(pk=task.pk).update(finished_at=services.db_now() - timedelta(days=days))


def succeeded() -> Task:
    task = services.enqueue("demo.noop", {}, actor="cli:producer").task
    backdate(only_step(task))
    assert runner.run_claimed(only_step(task).pk)
    task.refresh_from_db()
    assert task.status == TaskStatus.SUCCEEDED
    return task


def test_the_app_role_runs_work_and_prunes_history(app_role: str, oncall: User) -> None:
    act_as(app_role)
    done = succeeded()
    cancelled = services.enqueue("demo.noop", {}, actor="cli:producer").task
    services.cancel(cancelled, actor=oncall, reason="not needed")
    running = retrying()
    for task in (done, cancelled, running):
        finished_days_ago(task, 400)

    report = retention.prune(
        retention.cutoffs(now=services.db_now() + timedelta(days=400), audit_days=365)
    )

    assert report.tasks == {TaskStatus.SUCCEEDED: 1, TaskStatus.CANCELLED: 1}
    assert not Task.objects.filter(pk__in=[done.pk, cancelled.pk]).exists()
    assert not Event.objects.filter(task_id__in=[done.pk, cancelled.pk]).exists()
    assert Event.objects.filter(task_id=running.pk, kind="retry_scheduled").exists()
    assert AuditCheckpoint.objects.count() == 1  # the cancel's events were sealed first
    assert audit_verify.verify().ok


@pytest.mark.parametrize(
    "setting", ["tasks_app.retention", "tasks_app.operations.retention", "tasks_app.allow_delete"]
)
def test_no_setting_a_session_may_set_lets_a_role_delete_events(
    app_role: str, oncall: User, setting: str
) -> None:
    # A role given plain table grants on the history, against the guide.
    run(f"GRANT DELETE, UPDATE ON {EVENTS} TO {app_role}")
    act_as(app_role)
    task = services.enqueue("demo.noop", {}, actor="cli:producer").task
    services.cancel(task, actor=oncall, reason="not needed")
    run(f"SET LOCAL {setting} = 'on'")

    error = refused(f"DELETE FROM {EVENTS}")

    assert "tasks_app_event is append-only: DELETE refused" in error
    assert Event.objects.filter(task_id=task.pk, kind="cancelled").exists()


def test_the_owner_deletes_no_event_but_through_the_prune_function(db: None) -> None:
    task = retrying()
    assert Event.objects.filter(task_id=task.pk).exists()
    Task.objects.filter(pk=task.pk).delete()
    run("SET LOCAL tasks_app.operations.retention = 'on'")

    error = refused(f"DELETE FROM {EVENTS} WHERE task_id = %s", [task.pk])

    assert "append-only: DELETE refused" in error
    assert Event.objects.filter(task_id=task.pk).exists()


def test_the_app_role_cannot_set_the_triggers_aside(app_role: str) -> None:
    act_as(app_role)

    assert "must be owner" in refused(f"ALTER TABLE {EVENTS} DISABLE TRIGGER USER")
    assert "must be owner" in refused("DROP FUNCTION tasks_app_event_append_only() CASCADE")


def test_the_history_is_not_truncated_where_the_database_does_not_allow_it(
    app_role: str, oncall: User
) -> None:
    services.pause_queue("default", actor=oncall, reason="incident")
    # The test database allows TRUNCATE for its flushes (tests/conftest.py); withdrawn here
    # inside the test's transaction, which rolls it back. The session's own SET, and a
    # TRUNCATE grant, count for nothing.
    run(f"ALTER DATABASE {connection.settings_dict['NAME']} RESET tasks_app.allow_truncate")
    run(f"GRANT TRUNCATE ON {EVENTS} TO {app_role}")
    act_as(app_role)
    run("SET LOCAL tasks_app.allow_truncate = 'on'")

    error = refused(f"TRUNCATE {EVENTS}")

    assert f"{EVENTS} is append-only: TRUNCATE refused" in error
    assert Event.objects.filter(kind="queue_paused").exists()


def test_the_prune_function_takes_only_what_retention_may(app_role: str, oncall: User) -> None:
    act_as(app_role)
    pending = retrying()
    services.pause_queue("default", actor=oncall, reason="incident")
    unsealed = list(Event.objects.filter(kind="queue_paused").values_list("pk", flat=True))
    ids = [*Event.objects.filter(task_id=pending.pk).values_list("pk", flat=True), *unsealed]
    assert len(ids) > len(unsealed)

    # Asked directly for the history of unfinished work and for chained events no
    # checkpoint sealed, it deletes nothing.
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM tasks_app_prune_events(%s::bigint[])", [ids])
        assert cursor.fetchone() == (0,)

    assert Event.objects.filter(pk__in=ids).count() == len(ids)
