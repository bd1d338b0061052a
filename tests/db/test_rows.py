"""Model instances built from hand-read rows (``tasks_app.db.rows``) are what the ORM
would build: same attributes, saved state, usable as any instance."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.db import connection

from tasks_app.db import rows
from tasks_app.engine import fastpath
from tasks_app.engine.sql import STEP_COLUMNS, TASK_COLUMNS
from tasks_app.models import Step, Task
from tests.factories import enqueued

pytestmark = pytest.mark.django_db


def _raw(table: str, columns: tuple[str, ...], pk: int) -> tuple[Any, ...]:
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT {', '.join(columns)} FROM {table} WHERE id = %s", [pk])
        row = cursor.fetchone()
    assert row is not None
    return tuple(row)


def _fields(obj: Any) -> dict[str, Any]:
    return {name: value for name, value in vars(obj).items() if name != "_state"}


def test_a_task_row_reads_as_the_orm_reads_it() -> None:
    task = enqueued("demo.noop", {"article": 7, "tags": ["a", "é"]})
    built = rows.from_row(Task, TASK_COLUMNS, _raw("tasks_app_task", TASK_COLUMNS, task.pk))
    read = Task.objects.get(pk=task.pk)

    assert _fields(built) == _fields(read)
    assert built.payload == {"article": 7, "tags": ["a", "é"]}
    assert built._state.adding is False
    assert built._state.db == read._state.db
    assert built == read


def test_a_step_built_from_its_row_saves_and_follows_its_task() -> None:
    task = enqueued()
    step = task.steps.get(position=0)
    built = rows.from_row(Step, STEP_COLUMNS, _raw("tasks_app_step", STEP_COLUMNS, step.pk))

    assert _fields(built) == _fields(Step.objects.get(pk=step.pk))
    assert built.task == task  # read through the foreign key, as any instance
    built.last_error = "noted"
    built.save(update_fields=["last_error"])  # an UPDATE, not an INSERT: the state is saved
    assert Step.objects.get(pk=step.pk).last_error == "noted"
    assert Step.objects.filter(task=task).count() == task.steps.count()


def test_a_row_without_every_field_is_refused() -> None:
    with pytest.raises(ValueError, match="every concrete field"):
        rows.from_row(Task, TASK_COLUMNS[:-1], [None] * (len(TASK_COLUMNS) - 1))


def test_a_claimed_step_and_its_task_read_as_the_orm_reads_them() -> None:
    # The hot path's cursor reads timestamps with psycopg's own loader, not Django's.
    task = enqueued("demo.noop", {"n": 1})
    [claim] = fastpath.claim_batch(worker_id="w1", limit=1, queue="default")
    assert claim.step is not None

    step = Step.objects.get(pk=claim.step_id)
    assert _fields(claim.step) == _fields(step)
    assert _fields(claim.step.task) == _fields(Task.objects.get(pk=task.pk))
    assert claim.step.started_at is not None and step.started_at is not None
    assert claim.step.started_at.utcoffset() == timedelta(0)
    assert claim.step.started_at.tzinfo == step.started_at.tzinfo
