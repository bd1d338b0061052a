"""The payload filter's table (models.PayloadSearch): PostgreSQL's triggers keep it in step
with the tasks, whatever writes them, and the task row's transitions never touch it."""

from __future__ import annotations

import importlib
from datetime import timedelta
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.db import connection
from django.utils import timezone

from tasks_app import services
from tasks_app.engine import runner
from tasks_app.exceptions import InvalidInput
from tasks_app.models import PayloadSearch, Task
from tasks_app.operations import listings, retention
from tests.factories import dead_task

pytestmark = pytest.mark.skipif(
    connection.vendor != "postgresql", reason="the table and its triggers are PostgreSQL's"
)

backfill_migration = importlib.import_module("tasks_app.migrations.0014_payload_search")


def searched(payload: dict[str, Any]) -> set[int]:
    """The tasks the task list's payload filter finds for ``payload`` (one path)."""
    ((path, value),) = _flatten(payload).items()
    filters = listings.TaskFilter(payload=(path, value))
    return set(listings.tasks(filters).values_list("pk", flat=True))


def _flatten(value: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, item in value.items():
        if isinstance(item, dict):
            out.update(_flatten(item, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = item
    return out


def stored() -> dict[int, Any]:
    return dict(PayloadSearch.objects.values_list("task_id", "payload"))


def test_every_way_of_creating_tasks_writes_the_payload_once(db: None) -> None:
    one = services.enqueue("demo.noop", {"customer": {"id": 1}}).task
    many = [
        result.task
        for result in services.enqueue_many(
            [{"workflow": "demo.noop", "payload": {"customer": {"id": n}}} for n in (2, 3)]
        )
    ]
    again = services.enqueue("demo.noop", {"customer": {"id": 1}}, idempotency_key="k").task
    services.enqueue("demo.noop", {"customer": {"id": 1}}, idempotency_key="k")  # a repeat

    assert stored() == {
        one.pk: {"customer": {"id": 1}},
        many[0].pk: {"customer": {"id": 2}},
        many[1].pk: {"customer": {"id": 3}},
        again.pk: {"customer": {"id": 1}},
    }
    assert searched({"customer": {"id": 1}}) == {one.pk, again.pk}


def test_running_a_task_leaves_its_search_row_alone(db: None) -> None:
    task = services.enqueue("demo.noop", {"n": 5}).task
    before = PayloadSearch.objects.get(pk=task.pk)
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT xmin::text FROM tasks_app_payloadsearch WHERE task_id = %s", [task.pk]
        )
        (xmin,) = cursor.fetchone()
        runner.run_task_steps(task)
        cursor.execute(
            "SELECT xmin::text FROM tasks_app_payloadsearch WHERE task_id = %s", [task.pk]
        )
        assert cursor.fetchone() == (xmin,)  # the same row version: never rewritten
    task.refresh_from_db()
    assert task.status == "succeeded"
    assert PayloadSearch.objects.get(pk=task.pk).payload == before.payload
    assert searched({"n": 5}) == {task.pk}


def test_a_redrive_that_edits_the_payload_is_found_by_its_new_payload_only(
    db: None, oncall: User
) -> None:
    task = dead_task({"error": "permanent", "fail_first": 1, "ticket": "t-1"})
    services.redrive(
        task,
        actor=oncall,
        reason="wrong ticket",
        payload={"error": "permanent", "fail_first": 1, "ticket": "t-2"},
    )
    assert searched({"ticket": "t-2"}) == {task.pk}
    assert searched({"ticket": "t-1"}) == set()


def test_pruned_tasks_take_their_search_rows_with_them(db: None) -> None:
    old, kept = (services.enqueue("demo.noop", {"n": n}).task for n in (1, 2))
    for task in (old, kept):
        runner.run_task_steps(task)
    Task.objects.filter(pk=old.pk).update(finished_at=timezone.now() - timedelta(days=400))

    retention.prune(retention.cutoffs())

    assert set(stored()) == {kept.pk}
    # Deleted by SQL, not the ORM: the trigger takes the row along.
    with connection.cursor() as cursor:
        for sql in (
            "DELETE FROM tasks_app_lease WHERE step_id IN"
            " (SELECT id FROM tasks_app_step WHERE task_id = %s)",
            "DELETE FROM tasks_app_step WHERE task_id = %s",
            "DELETE FROM tasks_app_task WHERE id = %s",
        ):
            cursor.execute(sql, [kept.pk])
    assert stored() == {}


def test_the_migration_copies_the_payloads_of_tasks_from_before_it(db: None) -> None:
    tasks = [services.enqueue("demo.noop", {"n": n}).task for n in range(5)]
    PayloadSearch.objects.filter(pk__in=[tasks[1].pk, tasks[3].pk]).delete()

    backfill_migration.backfill(None, connection.schema_editor())

    assert stored() == {task.pk: {"n": n} for n, task in enumerate(tasks)}


def test_the_listing_itself_refuses_a_payload_filter_on_a_secret(db: None) -> None:
    services.enqueue("demo.noop", {"api_token": "right"})
    for path, value in [("api_token", "right"), ("outer", {"api_token": "right"})]:
        with pytest.raises(InvalidInput) as refused:
            listings.tasks(listings.TaskFilter(payload=(path, value)))
        assert refused.value.field == "payload"
        assert "'api_token' is a secret by the redaction rule" in refused.value.rule
