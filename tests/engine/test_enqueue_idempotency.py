"""Enqueue's idempotency: a duplicate request gets the task it made, whatever the order of
its payload's keys or its other options, and is counted; the same key with another
payload or workflow is a conflict that changes nothing but a counter; the payload hash is
of the canonical form, with negative zero stored as zero; and producers racing on one key
make exactly one task, without deadlock (DESIGN §2 rule 4).

The races run in threads, each on its own database connection, and are transactional.
"""

from __future__ import annotations

import hashlib
import queue
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from datetime import timedelta
from functools import partial
from typing import Any

import pytest
from django.db import connection, transaction

from tasks_app import services
from tasks_app.exceptions import (
    IdempotencyConflict,
)
from tasks_app.models import Event, Step, Task, TaskStatus
from tasks_app.services import EnqueueResult
from tests.conftest import BrokerView, backdate, only_step
from tests.enqueue_support import assert_only_enqueued, canonical, counter, stored

# --- helpers ---------------------------------------------------------------------------------


def run_at_once[T](calls: Sequence[Callable[[], T]]) -> list[T | Exception]:
    """Run each call in its own thread and database connection, released together."""
    barrier = threading.Barrier(len(calls))
    outcomes: list[T | Exception | None] = [None] * len(calls)

    def run(index: int, call: Callable[[], T]) -> None:
        try:
            connection.ensure_connection()  # connect first, so the calls start together
            barrier.wait(timeout=30)
            outcomes[index] = call()
        except Exception as exc:
            outcomes[index] = exc
        finally:
            connection.close()

    threads = [threading.Thread(target=run, args=item) for item in enumerate(calls)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert not any(thread.is_alive() for thread in threads)
    assert all(outcome is not None for outcome in outcomes)
    return [outcome for outcome in outcomes if outcome is not None]


def backend_pid() -> int:
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        pid: int = cursor.fetchone()[0]
    return pid


class InThread[T]:
    """Runs a call at once in its own thread and database connection."""

    def __init__(self, call: Callable[[], T]) -> None:
        self._call = call
        self._pid: queue.Queue[int] = queue.Queue()
        self._outcome: T | Exception | None = None
        self._thread = threading.Thread(target=self._run)
        self._thread.start()

    def _run(self) -> None:
        try:
            self._pid.put(backend_pid())
            self._outcome = self._call()
        except Exception as exc:
            self._outcome = exc
        finally:
            connection.close()

    def wait_until_blocked(self) -> None:
        """Poll until the call waits for a lock another transaction holds."""
        pid = self._pid.get(timeout=30)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            with connection.cursor() as cursor:
                cursor.execute("SELECT cardinality(pg_blocking_pids(%s)) > 0", [pid])
                if cursor.fetchone()[0]:
                    return
            if not self._thread.is_alive():
                break
        pytest.fail(f"the call never waited for another transaction: {self._outcome!r}")

    def outcome(self) -> T | Exception:
        self._thread.join(timeout=60)
        assert not self._thread.is_alive()
        assert self._outcome is not None
        return self._outcome


@contextmanager
def held_open[T](call: Callable[[], T], *, commit: bool = True) -> Iterator[InThread[T]]:
    """Run ``call`` in a transaction of another connection, kept open (its rows written
    but not committed) until the block ends; then commit it or roll it back."""
    done, release = threading.Event(), threading.Event()

    def hold() -> T:
        try:
            with transaction.atomic():
                value = call()
                done.set()
                assert release.wait(timeout=60)
                transaction.set_rollback(not commit)
            return value
        finally:
            done.set()

    holder = InThread(hold)
    try:
        assert done.wait(timeout=30)
        yield holder
    finally:
        release.set()
        holder.outcome()


# --- duplicates and conflicts --------------------------------------------------------------


@pytest.mark.django_db
def test_it_returns_the_same_task_for_a_duplicate_request() -> None:
    first = services.enqueue("demo.noop", {"a": 1, "b": [1, 2]}, idempotency_key="order:1")
    before = stored()

    again = services.enqueue("demo.noop", {"a": 1, "b": [1, 2]}, idempotency_key="order:1")

    assert first.created is True
    assert again.created is False
    assert again.task.pk == first.task.pk
    assert stored() == {
        **before,
        "counters": before["counters"] + 1,
    }  # no second task, step or event
    assert_only_enqueued(first.task)
    assert counter("enqueue_duplicate") == 1
    assert counter("idempotency_conflict") == 0


@pytest.mark.django_db
def test_it_treats_the_same_payload_with_keys_in_another_order_as_a_duplicate() -> None:
    first = services.enqueue(
        "demo.noop", {"a": 1, "b": {"x": 1, "y": 2}}, idempotency_key="order:2"
    )

    again = services.enqueue(
        "demo.noop", {"b": {"y": 2, "x": 1}, "a": 1}, idempotency_key="order:2"
    )

    assert (again.task.pk, again.created) == (first.task.pk, False)
    assert Task.objects.count() == 1
    assert_only_enqueued(first.task)
    assert not Event.objects.exists()
    assert counter("enqueue_duplicate") == 1


@pytest.mark.django_db
def test_it_counts_every_duplicate() -> None:
    first = services.enqueue("demo.noop", {}, idempotency_key="order:3")
    for _ in range(3):
        assert services.enqueue("demo.noop", {}, idempotency_key="order:3").task == first.task

    assert counter("enqueue_duplicate") == 3
    assert Task.objects.count() == 1


@pytest.mark.django_db
def test_a_duplicate_with_other_options_returns_the_task_as_it_was_enqueued() -> None:
    # The identity is key + workflow + payload; queue, priority and run_after do not enter.
    first = services.enqueue("demo.noop", {"a": 1}, idempotency_key="order:4", priority=5)

    again = services.enqueue(
        "demo.noop",
        {"a": 1},
        idempotency_key="order:4",
        priority=-5,
        run_after=services.db_now() + timedelta(days=1),
    )

    assert (again.task.pk, again.created) == (first.task.pk, False)
    task = Task.objects.get()
    assert task.priority == 5
    assert only_step(task).available_at == only_step(first.task).available_at


@pytest.mark.django_db
def test_a_key_stays_taken_after_its_task_succeeded() -> None:
    first = services.enqueue("demo.noop", {}, idempotency_key="order:5")
    step = only_step(first.task)
    backdate(step, 60)
    claim = services.claim_step(step.pk, worker_id="w")
    assert claim is not None
    assert services.complete_step(claim, {})

    again = services.enqueue("demo.noop", {}, idempotency_key="order:5")

    assert (again.task.pk, again.created) == (first.task.pk, False)
    assert again.task.status == TaskStatus.SUCCEEDED
    assert Task.objects.count() == 1


@pytest.mark.django_db
def test_it_refuses_the_same_key_with_a_different_payload_and_changes_nothing_but_a_counter(
    broker: BrokerView, django_capture_on_commit_callbacks: Any
) -> None:
    first = services.enqueue("demo.noop", {"a": 1}, idempotency_key="order:6")
    task = Task.objects.get()
    before = stored()

    with (
        django_capture_on_commit_callbacks(execute=True) as callbacks,
        pytest.raises(IdempotencyConflict) as caught,
    ):
        services.enqueue("demo.noop", {"a": 2}, idempotency_key="order:6")

    assert caught.value.idempotency_key == "order:6"
    assert caught.value.task_id == first.task.pk
    assert callbacks == []
    assert broker.step_ids() == []
    after = Task.objects.get()
    assert (after.payload, after.payload_hash, after.updated_at) == (
        task.payload,
        task.payload_hash,
        task.updated_at,
    )
    assert stored() == {**before, "counters": before["counters"] + 1}
    assert counter("idempotency_conflict") == 1
    assert counter("enqueue_duplicate") == 0


@pytest.mark.django_db
def test_it_refuses_the_same_key_with_a_different_workflow_and_changes_nothing_but_a_counter() -> (
    None
):
    first = services.enqueue("demo.noop", {"a": 1}, idempotency_key="order:7")
    before = stored()

    with pytest.raises(IdempotencyConflict) as caught:
        services.enqueue("demo.flaky", {"a": 1}, idempotency_key="order:7")

    assert caught.value.task_id == first.task.pk
    task = Task.objects.get()
    assert (task.workflow, task.payload) == ("demo.noop", {"a": 1})
    assert stored() == {**before, "counters": before["counters"] + 1}
    assert counter("idempotency_conflict") == 1


@pytest.mark.django_db
def test_it_stores_the_sha256_of_workflow_and_canonical_payload() -> None:
    a = services.enqueue("demo.noop", {"b": 1, "a": "é"}).task
    b = services.enqueue("demo.noop", {"a": "é", "b": 1}).task
    c = services.enqueue("demo.flaky", {"a": "é", "b": 1}).task

    assert a.payload_hash == b.payload_hash != c.payload_hash
    canonical = '{"a":"é","b":1}'  # sorted keys, no spaces, not ASCII-escaped
    assert a.payload_hash == hashlib.sha256(f"demo.noop\n{canonical}".encode()).hexdigest()
    assert c.payload_hash == hashlib.sha256(f"demo.flaky\n{canonical}".encode()).hexdigest()
    assert Task.objects.get(pk=a.pk).payload == {"a": "é", "b": 1}


# PostgreSQL's jsonb has no negative zero: it keeps -0.0 as 0.0. Python's == cannot tell
# them apart either, so these tests compare canonical JSON, where the sign shows.
NEGATIVE_ZEROS = {"x": -0.0, "deep": {"list": [-0.0, [1.5, -0.0]]}, "text": "-0.0"}
AS_STORED = {"x": 0.0, "deep": {"list": [0.0, [1.5, 0.0]]}, "text": "-0.0"}


def enqueue_one(many: bool, payload: dict[str, Any], key: str) -> EnqueueResult:
    if many:
        item = {"workflow": "demo.noop", "payload": payload, "idempotency_key": key}
        return services.enqueue_many([item])[0]
    return services.enqueue("demo.noop", payload, idempotency_key=key)


@pytest.mark.django_db
@pytest.mark.parametrize("fast_path", [True, False], ids=["sql", "orm"])
@pytest.mark.parametrize("many", [False, True], ids=["enqueue", "enqueue_many"])
def test_a_negative_zero_is_hashed_and_stored_as_zero_so_the_stored_payload_is_a_duplicate(
    many: bool, fast_path: bool, settings: Any
) -> None:
    settings.TASKS_SQL_FAST_PATH = fast_path
    first = enqueue_one(many, NEGATIVE_ZEROS, "zero:1")
    task = Task.objects.get(pk=first.task.pk)

    again = enqueue_one(many, task.payload, "zero:1")

    assert (again.task.pk, again.created) == (first.task.pk, False)
    assert counter("idempotency_conflict") == 0
    assert canonical(task.payload) == canonical(first.task.payload) == canonical(AS_STORED)
    expected = hashlib.sha256(f"demo.noop\n{canonical(AS_STORED)}".encode()).hexdigest()
    assert task.payload_hash == expected
    # The payload given keeps its sign: only what is stored and hashed is normalised.
    assert canonical(NEGATIVE_ZEROS).count("-0.0") == 4


@pytest.mark.django_db
def test_a_negative_zero_and_a_zero_are_the_same_payload() -> None:
    first = services.enqueue("demo.noop", {"x": [0.0]}, idempotency_key="zero:2")
    again = services.enqueue("demo.noop", {"x": [-0.0]}, idempotency_key="zero:2")
    assert (again.task.pk, again.created) == (first.task.pk, False)


# --- concurrency -----------------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_concurrent_enqueues_of_one_key_make_exactly_one_task() -> None:
    calls = [
        lambda: services.enqueue("demo.noop", {"n": 1}, idempotency_key="race:1") for _ in range(8)
    ]

    outcomes = run_at_once(calls)

    results = [outcome for outcome in outcomes if isinstance(outcome, EnqueueResult)]
    assert len(results) == 8, outcomes
    assert sum(result.created for result in results) == 1
    task = Task.objects.get()
    assert {result.task.pk for result in results} == {task.pk}
    assert Step.objects.filter(task=task).count() == 1
    assert_only_enqueued(task)
    assert counter("enqueue_duplicate") == 7


@pytest.mark.django_db(transaction=True)
def test_concurrent_enqueues_of_one_key_with_different_payloads_let_one_win() -> None:
    calls = [
        partial(services.enqueue, "demo.noop", {"n": n}, idempotency_key="race:2") for n in range(8)
    ]

    outcomes = run_at_once(calls)

    winners = [outcome for outcome in outcomes if isinstance(outcome, EnqueueResult)]
    losers = [outcome for outcome in outcomes if isinstance(outcome, IdempotencyConflict)]
    assert (len(winners), len(losers)) == (1, 7), outcomes
    task = Task.objects.get()
    assert winners[0].created is True
    assert winners[0].task.pk == task.pk
    assert {loser.task_id for loser in losers} == {task.pk}
    assert_only_enqueued(task)
    assert not Event.objects.exists()
    assert counter("idempotency_conflict") == 7


@pytest.mark.django_db(transaction=True)
def test_an_enqueue_that_found_no_task_but_lost_the_insert_returns_the_winners_task() -> None:
    # The second call looks before the first commits, so only the unique constraint stops
    # it; it must then find the committed task instead of failing.
    def enqueue() -> EnqueueResult:
        return services.enqueue("demo.noop", {"n": 1}, idempotency_key="race:3")

    with held_open(enqueue) as first_call:
        second_call = InThread(enqueue)
        second_call.wait_until_blocked()
    first, second = first_call.outcome(), second_call.outcome()

    assert isinstance(first, EnqueueResult), first
    assert isinstance(second, EnqueueResult), second
    assert (first.created, second.created) == (True, False)
    assert second.task.pk == first.task.pk == Task.objects.get().pk
    assert_only_enqueued(first.task)
    assert not Event.objects.exists()
    assert counter("enqueue_duplicate") == 1


@pytest.mark.django_db(transaction=True)
def test_an_enqueue_that_lost_the_insert_with_another_payload_is_a_conflict() -> None:
    with held_open(
        lambda: services.enqueue("demo.noop", {"n": 1}, idempotency_key="race:4")
    ) as first_call:
        second_call = InThread(
            lambda: services.enqueue("demo.noop", {"n": 2}, idempotency_key="race:4")
        )
        second_call.wait_until_blocked()
    first, second = first_call.outcome(), second_call.outcome()

    assert isinstance(first, EnqueueResult), first
    assert isinstance(second, IdempotencyConflict), second
    assert second.task_id == first.task.pk
    assert Task.objects.get().payload == {"n": 1}
    assert_only_enqueued(first.task)
    assert not Event.objects.exists()
    assert counter("idempotency_conflict") == 1


def batch(*keys: str) -> list[dict[str, Any]]:
    return [{"workflow": "demo.noop", "payload": {}, "idempotency_key": key} for key in keys]


@pytest.mark.django_db(transaction=True)
def test_concurrent_batches_sharing_keys_in_opposite_orders_do_not_deadlock() -> None:
    # Both batches stop at "c", held by a third transaction, each having written its own
    # first key. When "c" is freed, a batch that inserts in its input order would take "c"
    # and then wait for the other's first key while the other waits for "c": a deadlock.
    with held_open(lambda: services.enqueue("demo.noop", {}, idempotency_key="c"), commit=False):
        forward = InThread(lambda: services.enqueue_many(batch("a", "c", "b")))
        forward.wait_until_blocked()
        backward = InThread(lambda: services.enqueue_many(batch("b", "c", "a")))
        backward.wait_until_blocked()
    outcomes = [forward.outcome(), backward.outcome()]

    assert all(isinstance(outcome, list) for outcome in outcomes), outcomes
    results = [result for outcome in outcomes if isinstance(outcome, list) for result in outcome]
    tasks = {task.idempotency_key: task.pk for task in Task.objects.all()}
    assert set(tasks) == {"a", "b", "c"}
    assert {(r.task.idempotency_key, r.task.pk) for r in results} == set(tasks.items())
    assert sorted(r.task.idempotency_key or "" for r in results if r.created) == ["a", "b", "c"]
    assert_only_enqueued(*Task.objects.all())
    assert not Event.objects.exists()
