"""The event history is append-only (DESIGN rule 8): PostgreSQL refuses UPDATE always and
DELETE outside the retention service, the model refuses both too, and events outlive the
rows they name."""

from __future__ import annotations

import psycopg.errors
import pytest
from django.contrib.auth.models import User
from django.db import DatabaseError, IntegrityError, connection, transaction

from tasks_app import services
from tasks_app.history import timeline
from tasks_app.models import AppendOnlyError, Event, EventKind, Lease, Step, Task
from tasks_app.operations import retention
from tests.conftest import only_step
from tests.factories import dead_task

TABLE = Event._meta.db_table


def _task_with_an_event(key: str = "events:1") -> Task:
    """A task whose history holds one Event row: it died at its first attempt
    (``dead_lettered``; its enqueue and claim are recorded by its rows)."""
    return dead_task(key=key)


def _first_event(task: Task) -> Event:
    return Event.objects.for_task(task.pk).first() or pytest.fail("the task has no event")


def _prune(task: Task) -> list[int]:
    """Delete a task and its events, as retention prunes finished history."""
    ids = list(Event.objects.for_task(task.pk).values_list("pk", flat=True))
    Task.objects.filter(pk=task.pk).delete()
    assert retention.delete_events(ids) == len(ids) > 0
    return ids


def _raw(sql: str, params: list[int]) -> int:
    """Run one statement in its own savepoint, so a refusal leaves the test usable."""
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(sql, params)
        count: int = cursor.rowcount
        return count


def _assert_refused_by_trigger(excinfo: pytest.ExceptionInfo[DatabaseError], op: str) -> None:
    assert isinstance(excinfo.value.__cause__, psycopg.errors.InsufficientPrivilege)
    assert f"append-only: {op} refused" in str(excinfo.value)


# --- PostgreSQL refuses --------------------------------------------------------------------


def test_postgresql_refuses_an_update_of_an_event(db: None) -> None:
    event = _first_event(_task_with_an_event())

    with pytest.raises(DatabaseError) as excinfo:
        _raw(
            f"UPDATE {TABLE} SET reason = 'rewritten', actor = 'mallory' WHERE id = %s", [event.pk]
        )

    _assert_refused_by_trigger(excinfo, "UPDATE")
    stored = Event.objects.get(pk=event.pk)
    assert (stored.reason, stored.actor) == (event.reason, event.actor) != ("rewritten", "mallory")


def test_postgresql_refuses_a_delete_of_an_event_outside_retention(db: None) -> None:
    event = _first_event(_task_with_an_event())

    with pytest.raises(DatabaseError) as excinfo:
        _raw(f"DELETE FROM {TABLE} WHERE id = %s", [event.pk])

    _assert_refused_by_trigger(excinfo, "DELETE")
    assert Event.objects.filter(pk=event.pk).exists()


def test_postgresql_refuses_an_update_even_with_the_retention_flag_set(db: None) -> None:
    event = _first_event(_task_with_an_event())

    with (
        pytest.raises(DatabaseError) as excinfo,
        transaction.atomic(),
        connection.cursor() as cursor,
    ):
        cursor.execute("SET LOCAL tasks_app.operations.retention = 'on'")
        cursor.execute(f"UPDATE {TABLE} SET reason = 'rewritten' WHERE id = %s", [event.pk])

    _assert_refused_by_trigger(excinfo, "UPDATE")
    assert Event.objects.get(pk=event.pk).reason == event.reason == "permanent_error"


def test_the_retention_service_deletes_events(db: None) -> None:
    task = _task_with_an_event()
    kept = _task_with_an_event("events:2")
    ids = list(Event.objects.for_task(task.pk).values_list("pk", flat=True))
    Task.objects.filter(pk=task.pk).delete()

    assert retention.delete_events(ids) == len(ids) == 1

    assert not Event.objects.filter(pk__in=ids).exists()
    assert Event.objects.for_task(kept.pk).count() == 1
    assert retention.delete_events([]) == 0


def test_a_plain_delete_is_refused_again_after_retention_within_the_same_transaction(
    db: None,
) -> None:
    # The test runs inside one transaction, so the retention service's block is a savepoint
    # here: its transaction-local flag must not outlive it.
    _prune(_task_with_an_event())
    event = _first_event(_task_with_an_event("events:2"))

    with pytest.raises(DatabaseError) as excinfo:
        _raw(f"DELETE FROM {TABLE} WHERE id = %s", [event.pk])

    _assert_refused_by_trigger(excinfo, "DELETE")
    assert Event.objects.filter(pk=event.pk).exists()


@pytest.mark.django_db(transaction=True)
def test_a_plain_delete_is_refused_again_after_the_retention_transaction() -> None:
    pruned = _prune(_task_with_an_event())
    event = _first_event(_task_with_an_event("events:2"))

    with pytest.raises(DatabaseError) as excinfo:
        _raw(f"DELETE FROM {TABLE} WHERE id = %s", [event.pk])

    _assert_refused_by_trigger(excinfo, "DELETE")
    assert Event.objects.filter(pk=event.pk).exists()
    assert not Event.objects.filter(pk__in=pruned).exists()


# --- the model refuses ---------------------------------------------------------------------


def test_the_model_refuses_to_save_an_existing_event(db: None) -> None:
    event = _first_event(_task_with_an_event())
    event.reason = "rewritten"

    with pytest.raises(AppendOnlyError):
        event.save()
    with pytest.raises(AppendOnlyError):
        event.save(update_fields=["reason"])

    assert Event.objects.get(pk=event.pk).reason == "permanent_error"


def test_the_model_refuses_to_overwrite_an_event_through_a_new_instance_with_its_id(
    db: None,
) -> None:
    event = _first_event(_task_with_an_event())
    forged = Event(pk=event.pk, task_id=event.task_id, kind=EventKind.CANCELLED, actor="mallory")

    # An INSERT that collides with the existing id, not an UPDATE.
    with pytest.raises(IntegrityError, match="duplicate key"), transaction.atomic():
        forged.save()

    stored = Event.objects.get(pk=event.pk)
    assert (stored.kind, stored.actor) == (EventKind.DEAD_LETTERED, event.actor)


def test_the_model_refuses_to_delete_an_event(db: None) -> None:
    event = _first_event(_task_with_an_event())

    with pytest.raises(AppendOnlyError):
        event.delete()

    assert Event.objects.filter(pk=event.pk).exists()


def test_the_queryset_refuses_update_and_delete(db: None) -> None:
    task = _task_with_an_event()
    event = _first_event(task)

    with pytest.raises(AppendOnlyError):
        Event.objects.update(reason="rewritten")
    with pytest.raises(AppendOnlyError):
        Event.objects.filter(task_id=task.pk).update(reason="rewritten")
    with pytest.raises(AppendOnlyError):
        Event.objects.filter(task_id=task.pk).delete()
    with pytest.raises(AppendOnlyError):
        Event.objects.all().delete()
    event.reason = "rewritten"
    # bulk_update runs inside an atomic block without a savepoint; ours contains the error.
    with pytest.raises(AppendOnlyError), transaction.atomic():
        Event.objects.bulk_update([event], ["reason"])

    assert list(Event.objects.filter(task_id=task.pk).values_list("pk", "reason")) == [
        (event.pk, "permanent_error")
    ]


# --- events outlive what they name ------------------------------------------------------------


def test_deleting_a_task_leaves_its_events(db: None) -> None:
    task = _task_with_an_event()
    step = only_step(task)
    before = list(Event.objects.for_task(task.pk).values_list("pk", "kind", "step_id"))
    # Its enqueue is its row, its claim and death its attempt's Lease row and one event.
    assert [kind for _, kind, _ in before] == ["dead_lettered"]
    assert [entry.kind for entry in timeline.history(task.pk)] == [
        "enqueued",
        "claimed",
        "dead_lettered",
    ]

    Task.objects.filter(pk=task.pk).delete()

    assert not Task.objects.filter(pk=task.pk).exists()
    assert not Step.objects.filter(pk=step.pk).exists()
    assert not Lease.objects.filter(step_id=step.pk).exists()
    assert list(Event.objects.for_task(task.pk).values_list("pk", "kind", "step_id")) == before


def test_deleting_a_user_leaves_the_events_that_name_them(db: None, oncall: User) -> None:
    task = _task_with_an_event()
    services.cancel(task, actor=oncall, reason="not needed")
    user_id = oncall.pk

    oncall.delete()

    cancelled = Event.objects.get(task_id=task.pk, kind=EventKind.CANCELLED)
    assert (cancelled.actor, cancelled.actor_user_id) == ("olivia-oncall", user_id)
