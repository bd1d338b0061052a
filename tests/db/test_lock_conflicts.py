"""Rows held by other transactions: the sweeper never waits on one, and a worker's batch
completion that loses a deadlock is tried again instead of leaving its steps to expire.

Another session holds its locks on a connection of its own (as a person's action, a
stuck client or another process would); the sweeper runs in a thread whose end is
awaited with a deadline, so a sweeper that waited on the held row fails the test instead
of hanging it.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager

import psycopg
import pytest
from django.conf import settings
from django.db import connection, transaction

from tasks_app import services
from tasks_app.db.lock_conflicts import lock_wait
from tasks_app.engine import fastpath, limited_claims
from tasks_app.engine.limit_standing import SLICES, Window
from tasks_app.engine.sweeper import SweepReport
from tasks_app.models import EventKind, LimitKey, LimitState, Step, StepStatus, Task
from tests.conftest import BrokerView, backdate, event_kinds, only_step, worker_thread
from tests.e2e_support import database_url, wait_for
from tests.lease_support import claim, fresh

pytestmark = pytest.mark.django_db(transaction=True)


@contextmanager
def other_session() -> Iterator[psycopg.Connection]:
    """A session of its own, outside Django: whatever it locks stays locked until the
    block ends (its transaction is rolled back then)."""
    with psycopg.connect(database_url(connection.settings_dict)) as conn:
        try:
            yield conn
        finally:
            conn.rollback()


def lock_row(conn: psycopg.Connection, table: str, pk: int) -> None:
    conn.execute(f"SELECT id FROM {table} WHERE id = %s FOR UPDATE", [pk])


def sweep_within(seconds: float = 10) -> SweepReport:
    """Run a sweep in a thread of its own and wait for it at most ``seconds``."""
    reports: list[SweepReport] = []
    errors: list[BaseException] = []
    thread = worker_thread(lambda: reports.append(services.sweep()), errors)
    thread.start()
    thread.join(timeout=seconds)
    assert not thread.is_alive(), "the sweep waited on a row another session holds"
    assert not errors, errors
    return reports[0]


def noop_steps(count: int) -> list[Step]:
    return [only_step(services.enqueue("demo.noop", {"n": n}).task) for n in range(count)]


def test_the_sweeper_rings_for_every_due_step_but_one_another_session_holds(
    broker: BrokerView,
) -> None:
    steps = noop_steps(3)
    broker.purge()  # the doorbells were lost
    for step in steps:
        backdate(step, seconds=settings.TASKS_REDISPATCH_SECONDS + 1)
    held = steps[1]
    before = {step.pk: fresh(step).dispatched_at for step in steps}

    with other_session() as other:
        lock_row(other, "tasks_app_step", held.pk)
        report = sweep_within()
        assert report.redispatched == 2
        rung = {step.pk for step in steps if fresh(step).dispatched_at != before[step.pk]}
        assert rung == {steps[0].pk, steps[2].pk}
        # One doorbell per queue: the woken worker drains every due step of it.
        assert broker.step_ids() == [steps[0].pk]

    # Once the row is free again, the next sweep rings for it too.
    broker.purge()
    assert sweep_within().redispatched == 1
    assert broker.step_ids() == [held.pk]


def test_the_reaper_leaves_a_held_task_for_the_next_sweep_and_reaps_the_others() -> None:
    steps = noop_steps(2)
    for step in steps:
        claim(step)
        backdate(step, seconds=settings.TASKS_LEASE_SECONDS + 1)
    held_task = steps[0].task_id

    with other_session() as other:
        lock_row(other, "tasks_app_task", held_task)
        assert sweep_within().reaped == 1
        assert fresh(steps[0]).status == StepStatus.RUNNING
        assert fresh(steps[1]).status == StepStatus.PENDING

    assert sweep_within().reaped == 1
    assert fresh(steps[0]).status == StepStatus.PENDING
    assert event_kinds(Task.objects.get(pk=held_task)).count(EventKind.LEASE_EXPIRED) == 1


def test_the_reaper_leaves_a_held_step_row_alone() -> None:
    [step] = noop_steps(1)
    claim(step)
    backdate(step, seconds=settings.TASKS_LEASE_SECONDS + 1)

    with other_session() as other:
        lock_row(other, "tasks_app_step", step.pk)
        assert sweep_within().reaped == 0
    assert sweep_within().reaped == 1


def test_a_sweep_job_stopped_by_a_lock_it_cannot_skip_leaves_the_rest_of_the_sweep(
    broker: BrokerView,
) -> None:
    """The sweeper's own lock timeout: a job that must wait (here one that locks without
    skipping) fails alone, after the timeout, and the sweep goes on and reports."""
    from tasks_app.engine import sweeper

    [step] = noop_steps(1)
    broker.purge()
    backdate(step, seconds=settings.TASKS_REDISPATCH_SECONDS + 1)

    def waits_on_the_step(limit: int) -> int:
        with transaction.atomic():
            return len(list(Step.objects.select_for_update().filter(pk=step.pk)))

    sweeper.register_sweep_job("test_waits", waits_on_the_step)
    try:
        with other_session() as other:
            lock_row(other, "tasks_app_step", step.pk)
            report = sweep_within()
        assert report.jobs["test_waits"] == 0
        assert report.redispatched == 0  # the held step, skipped
    finally:
        sweeper._sweep_jobs.pop("test_waits")


def test_lock_wait_restores_the_sessions_own_lock_timeout() -> None:
    def current() -> str:
        with connection.cursor() as cursor:
            cursor.execute("SHOW lock_timeout")
            row = cursor.fetchone()
        assert row is not None
        return str(row[0])

    before = current()
    with lock_wait(250):
        assert current() == "250ms"
    assert current() == before


def test_a_batch_completion_that_loses_a_deadlock_is_tried_again(
    caplog: pytest.LogCaptureFixture,
) -> None:
    first, second = noop_steps(2)
    claims = fastpath.claim_batch(worker_id="w1", limit=2, queue="default")
    assert {c.step_id for c in claims} == {first.pk, second.pk}
    accepted: list[set[int]] = []
    errors: list[BaseException] = []

    with other_session() as other:
        # The other session holds the second step's row and does not detect deadlocks
        # itself for a while: the completion, which waits first, is the one the server
        # picks to end.
        other.execute("SET deadlock_timeout = '30s'")
        lock_row(other, "tasks_app_step", second.pk)
        completing = worker_thread(
            lambda: accepted.append(fastpath.complete_many([(c, {"ok": 1}) for c in claims])),
            errors,
        )
        with caplog.at_level(logging.WARNING, logger="tasks_app.db.lock_conflicts"):
            completing.start()
            # The completion holds both tasks and waits for the second step's row ...
            wait_for(
                lambda: _waiting_on_a_lock() >= 1,
                timeout=20,
                what="the completion to wait on the held step",
            )
            # ... and the other session now asks for the first task: a deadlock. The
            # server ends the completion's transaction, which lets this lock through.
            lock_row(other, "tasks_app_task", first.task_id)
            other.commit()
            completing.join(timeout=30)

    assert not completing.is_alive()
    assert not errors, errors
    assert accepted == [{first.pk, second.pk}]
    assert {fresh(first).status, fresh(second).status} == {StepStatus.SUCCEEDED}
    assert "a batch completion lost a lock conflict (DeadlockDetected)" in caplog.text
    for step in (first, second):
        history = event_kinds(Task.objects.get(pk=step.task_id))
        assert history.count(EventKind.SUCCEEDED) == 1
        assert EventKind.STALE_WRITE_REJECTED not in history


@contextmanager
def limit_keys_collated(collation: str) -> Iterator[None]:
    """The limit keys' column sorted by ``collation`` rather than by code point, as on a
    database created with a linguistic locale (``en_US.UTF-8``, say)."""
    alter = "ALTER TABLE tasks_app_limitkey ALTER COLUMN key TYPE varchar(200) COLLATE {}"
    with connection.cursor() as cursor:
        cursor.execute(alter.format(f'"{collation}"'))
    try:
        yield
    finally:
        with connection.cursor() as cursor:
            cursor.execute(alter.format('"default"'))


def test_a_claim_books_limit_keys_in_the_order_enqueue_locks_them_whatever_the_collation() -> None:
    # Enqueue and a limit's hold lock keys in Python's order (code points): "B" before "a".
    # A linguistic collation sorts "a" first; a booking that followed it would take "a"
    # and wait for "B" while an enqueue held "B" and waited for "a".
    LimitState.objects.create(name="llm")
    for key in ("B", "a"):
        LimitKey.objects.create(limit="llm", key=key)
    window = Window(width=0.1, slice=1, spent=[0] * SLICES + [1])
    errors: list[BaseException] = []
    with limit_keys_collated("en-x-icu"), other_session() as other:
        other.execute("SELECT 1 FROM tasks_app_limitkey WHERE key = 'B' FOR UPDATE")
        booking = worker_thread(
            lambda: limited_claims._book_at_once({("llm", "B"): window, ("llm", "a"): window}, {}),
            errors,
        )
        booking.start()
        wait_for(lambda: _waiting_on_a_lock() >= 1, timeout=20, what="the booking to wait")
        # The booking waits for "B" holding nothing: "a" is free for the other session.
        other.execute("SELECT 1 FROM tasks_app_limitkey WHERE key = 'a' FOR UPDATE NOWAIT")
        other.commit()
        booking.join(timeout=30)
    assert not booking.is_alive()
    assert not errors, errors
    assert {k.key: k.window for k in LimitKey.objects.all()} == {
        "B": window.stored(),
        "a": window.stored(),
    }


def _waiting_on_a_lock() -> int:
    """Sessions of this database waiting for a lock now (asked outside a transaction: one
    sees a snapshot of the activity taken at its start)."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_stat_activity "
            "WHERE wait_event_type = 'Lock' AND datname = current_database()"
        )
        row = cursor.fetchone()
    return int(row[0]) if row else 0
