"""Helpers for the invariant checker's tests (test_invariants, test_invariant_histories):
raw SQL behind the services' back, ``check_invariants`` run and read, and events appended
where the services would not write them."""

from __future__ import annotations

import json
import re
from io import StringIO
from typing import Any

from django.core.management import CommandError, call_command
from django.db import connection

from tasks_app import services
from tasks_app.models import Event, Step, Task
from tests.conftest import backdate, only_step


def sql(statement: str, *params: Any) -> None:
    with connection.cursor() as cursor:
        cursor.execute(statement, params)


def ago(table: str, column: str, age: str, pk: int) -> None:
    """Set a row's timestamp ``age`` (an SQL interval) before the database's clock."""
    sql(
        f"UPDATE {table} SET {column} = statement_timestamp() - %s::interval WHERE id = %s", age, pk
    )


def running(task: Task) -> Step:
    """``task``'s one step, claimed by worker w1 and running."""
    step = only_step(task)
    backdate(step)
    assert services.claim_step(step.pk, worker_id="w1") is not None
    step.refresh_from_db()
    return step


def check(*args: str) -> tuple[int, list[str]]:
    """Run ``check_invariants``: its exit status and its lines on stdout."""
    out = StringIO()
    try:
        call_command("check_invariants", *args, stdout=out, stderr=StringIO())
    except CommandError as exc:
        assert "\n" not in str(exc)
        return exc.returncode, out.getvalue().splitlines()
    return 0, out.getvalue().splitlines()


def assert_clean(*args: str, tasks: int, scope: str = r"since \S+") -> None:
    status, lines = check(*args)
    assert status == 0, lines
    [line] = lines
    assert re.fullmatch(rf"ok: no findings; {tasks} task\(s\) folded \({scope}\)", line), line


def findings(*args: str) -> list[str]:
    status, lines = check(*args)
    assert status == 1, lines
    return lines


def event(
    task: Task, kind: str, step: Step | None = None, pk: int | None = None, **data: Any
) -> int:
    """Append an event behind the services' back (the table refuses UPDATE and DELETE,
    not INSERT); ``pk`` places it in the history's order. Returns its id."""
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO tasks_app_event (id, task_id, step_id, kind, actor, actor_user_id, "
            "reason, data, created_at) VALUES (COALESCE(%s, nextval(pg_get_serial_sequence("
            "'tasks_app_event', 'id'))), %s, %s, %s, 'test', NULL, '', %s::jsonb, "
            "statement_timestamp()) RETURNING id",
            [pk, task.pk, step.pk if step else None, kind, json.dumps(data)],
        )
        inserted: int = cursor.fetchone()[0]
    return inserted


def events_of(task: Task, kind: str) -> list[int]:
    return list(Event.objects.filter(task_id=task.pk, kind=kind).values_list("pk", flat=True))
