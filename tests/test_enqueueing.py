"""Enqueue: idempotency, input rules, the first doorbell, and what a refusal leaves behind.

DESIGN §2 rules 1, 3, 4 and 5, and §4. Every refusal is checked against the database and
the broker: no task, no step, no event, no counter, no message.
"""

from __future__ import annotations

import hashlib
import json
import queue
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal
from functools import partial
from typing import Any

import pytest
from django.db import InterfaceError, OperationalError, connection, transaction
from kombu import pools

from config.celery import app as celery_app
from tasks_app import services
from tasks_app.demo_workflows import noop
from tasks_app.dispatch import publisher
from tasks_app.exceptions import (
    IdempotencyConflict,
    InvalidInput,
    InvalidPayload,
    UnknownWorkflow,
)
from tasks_app.models import Counter, Event, EventKind, Lease, Step, StepStatus, Task, TaskStatus
from tasks_app.services import EnqueueResult
from tasks_app.workflows import StepSpec, Workflow, register, registry
from tests.conftest import BrokerView, backdate, only_step

LIMIT = 65_536
DOWN_BROKER_URL = "redis://127.0.0.1:1/0"  # nothing listens on port 1: connection refused


# --- helpers ---------------------------------------------------------------------------------


def canonical(payload: Any) -> str:
    """DESIGN §2 rule 4, written out here rather than borrowed from the code under test."""
    return json.dumps(
        payload, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
    )


def payload_of_size(size: int, char: str = "x") -> dict[str, str]:
    """A payload whose canonical UTF-8 form is exactly ``size`` bytes."""
    room = size - len(canonical({"a": ""}))
    width = len(char.encode())
    assert room % width == 0, "pick a size the character fills exactly"
    payload = {"a": char * (room // width)}
    assert len(canonical(payload).encode()) == size
    return payload


def nested_dicts(levels: int) -> dict[str, Any]:
    """``levels`` objects inside each other, the top one included."""
    value: dict[str, Any] = {}
    for _ in range(levels - 1):
        value = {"k": value}
    return value


def nested_lists(levels: int) -> dict[str, Any]:
    """A top object holding ``levels - 1`` lists inside each other."""
    value: list[Any] = []
    for _ in range(levels - 2):
        value = [value]
    return {"k": value}


def counter(name: str) -> int:
    return Counter.objects.filter(name=name).values_list("value", flat=True).first() or 0


def stored() -> dict[str, int]:
    return {
        "tasks": Task.objects.count(),
        "steps": Step.objects.count(),
        "events": Event.objects.count(),
        "leases": Lease.objects.count(),
        "counters": Counter.objects.count(),
    }


NOTHING = {"tasks": 0, "steps": 0, "events": 0, "leases": 0, "counters": 0}


def enqueue_any(workflow: Any, payload: Any, **kwargs: Any) -> EnqueueResult:
    """``services.enqueue`` with arguments of any type, as a careless caller passes them."""
    return services.enqueue(workflow, payload, **kwargs)


def point_broker_at(url: str) -> None:
    """Make the Celery app publish to ``url``, dropping every pooled broker connection.

    kombu caches connection and producer pools per URL (globally) and Celery caches them on
    the app, so all three are reset for the new URL to take effect.
    """
    celery_app.conf.update(broker_url=url)
    pools.reset()
    # What Celery itself does after a fork; it has no public call for it.
    celery_app._pool = None  # type: ignore[attr-defined]
    celery_app.amqp._producer_pool = None  # type: ignore[attr-defined]


@pytest.fixture
def three_steps() -> Iterator[Workflow]:
    """A registered workflow with three steps, to see positions and blocked steps."""
    flow = Workflow(
        "test.enqueue.three",
        1,
        steps=(StepSpec("fetch", noop), StepSpec("draft", noop), StepSpec("send", noop)),
    )
    registry.register(flow)
    yield flow
    registry.unregister(flow.name, flow.version)


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
    assert Event.objects.filter(task_id=first.task.pk).count() == 1
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
    assert Event.objects.count() == 1
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
    assert Event.objects.filter(task_id=task.pk).count() == 1
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
    assert Event.objects.count() == 1
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
    assert Event.objects.count() == 1
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
    assert Event.objects.count() == 1
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
    assert Event.objects.count() == 3


# --- enqueue_many ------------------------------------------------------------------------------


@pytest.mark.django_db
def test_enqueue_many_returns_results_in_input_order() -> None:
    items = [
        {"workflow": "demo.noop", "payload": {"n": n}, "idempotency_key": f"many:{n}"}
        for n in (3, 1, 2)
    ]

    results = services.enqueue_many(items, actor="cli:bob")

    assert [r.task.idempotency_key for r in results] == ["many:3", "many:1", "many:2"]
    assert [r.task.payload for r in results] == [{"n": 3}, {"n": 1}, {"n": 2}]
    assert all(r.created for r in results)
    assert set(Task.objects.values_list("created_by", flat=True)) == {"cli:bob"}
    assert Event.objects.filter(kind=EventKind.ENQUEUED).count() == 3


@pytest.mark.django_db
def test_enqueue_many_of_nothing_stores_nothing() -> None:
    assert services.enqueue_many([]) == []
    assert stored() == NOTHING


@pytest.mark.django_db
def test_enqueue_many_stores_nothing_when_one_item_is_bad(
    broker: BrokerView, django_capture_on_commit_callbacks: Any
) -> None:
    items = [
        {"workflow": "demo.noop", "payload": {"n": 0}, "idempotency_key": "bad:0"},
        {"workflow": "demo.noop", "payload": {"n": 1}},
        {"workflow": "demo.noop", "payload": {"n": float("nan")}},
        {"workflow": "demo.noop", "payload": {"n": 3}},
    ]

    with (
        django_capture_on_commit_callbacks(execute=True) as callbacks,
        pytest.raises(InvalidPayload) as caught,
    ):
        services.enqueue_many(items)

    assert (caught.value.field, caught.value.rule) == ("items[2].payload", "finite_numbers")
    assert str(caught.value).startswith("items[2].payload")
    assert callbacks == []
    assert broker.step_ids() == []
    assert stored() == NOTHING


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("item", "field", "rule"),
    [
        pytest.param(["demo.noop", {}], "items[1]", "object", id="not-a-dict"),
        pytest.param({"payload": {}}, "items[1].workflow", "required", id="no-workflow"),
        pytest.param({"workflow": "demo.noop"}, "items[1].payload", "required", id="no-payload"),
        pytest.param(
            {"workflow": "demo.noop", "payload": {}, "colour": "red"},
            "items[1].colour",
            "known_field",
            id="unknown-field",
        ),
        pytest.param(
            {"workflow": "demo.noop", "payload": {}, "actor": "cli:eve"},
            "items[1].actor",
            "known_field",
            id="actor-per-item",
        ),
        pytest.param(
            {"workflow": "demo.noop", "payload": {}, "priority": 101},
            "items[1].priority",
            "range",
            id="bad-priority",
        ),
        pytest.param(
            {"workflow": "demo.flaky", "payload": {"fail_rate": 2}},
            "items[1].payload.fail_rate",
            "range",
            id="workflow-payload-rule",
        ),
    ],
)
def test_enqueue_many_names_the_bad_item(item: Any, field: str, rule: str) -> None:
    items = [{"workflow": "demo.noop", "payload": {}}, item]

    with pytest.raises(InvalidInput) as caught:
        services.enqueue_many(items)

    assert (caught.value.field, caught.value.rule) == (field, rule)
    assert stored() == NOTHING


@pytest.mark.django_db
def test_enqueue_many_collapses_duplicate_keys_within_one_batch(
    broker: BrokerView, django_capture_on_commit_callbacks: Any
) -> None:
    items = [
        {"workflow": "demo.noop", "payload": {"a": 1, "b": 2}, "idempotency_key": "dup:1"},
        {"workflow": "demo.noop", "payload": {}, "idempotency_key": "dup:2"},
        {"workflow": "demo.noop", "payload": {"b": 2, "a": 1}, "idempotency_key": "dup:1"},
    ]

    with django_capture_on_commit_callbacks(execute=True):
        results = services.enqueue_many(items)

    assert [r.created for r in results] == [True, True, False]
    assert results[2].task.pk == results[0].task.pk != results[1].task.pk
    assert Task.objects.count() == 2
    assert Step.objects.count() == 2
    assert Event.objects.count() == 2
    assert counter("enqueue_duplicate") == 1
    # One doorbell for the queue, naming the first new step: its worker drains the rest.
    assert broker.step_ids() == [results[0].task.steps.get().pk]


@pytest.mark.django_db
def test_enqueue_many_refuses_a_conflict_within_one_batch_and_stores_nothing(
    broker: BrokerView, django_capture_on_commit_callbacks: Any
) -> None:
    items = [
        {"workflow": "demo.noop", "payload": {"a": 1}, "idempotency_key": "clash:1"},
        {"workflow": "demo.noop", "payload": {}, "idempotency_key": "clash:2"},
        {"workflow": "demo.noop", "payload": {"a": 2}, "idempotency_key": "clash:1"},
    ]

    with (
        django_capture_on_commit_callbacks(execute=True) as callbacks,
        pytest.raises(IdempotencyConflict) as caught,
    ):
        services.enqueue_many(items)

    assert caught.value.idempotency_key == "clash:1"
    assert caught.value.task_id is None
    assert "earlier item of this batch" in str(caught.value)
    assert callbacks == []
    assert broker.step_ids() == []
    assert stored() == {**NOTHING, "counters": 1}
    assert counter("idempotency_conflict") == 1


@pytest.mark.django_db
def test_enqueue_many_refuses_a_conflict_with_an_existing_task_and_stores_nothing_new() -> None:
    existing = services.enqueue("demo.noop", {"a": 1}, idempotency_key="old:1").task
    before = stored()
    items = [
        {"workflow": "demo.noop", "payload": {}, "idempotency_key": "new:1"},
        {"workflow": "demo.noop", "payload": {}},
        {"workflow": "demo.noop", "payload": {"a": 2}, "idempotency_key": "old:1"},
    ]

    with pytest.raises(IdempotencyConflict) as caught:
        services.enqueue_many(items)

    assert caught.value.task_id == existing.pk
    assert stored() == {**before, "counters": before["counters"] + 1}
    assert services.get_task(idempotency_key="new:1") is None
    assert Task.objects.get().payload == {"a": 1}


@pytest.mark.django_db
def test_enqueue_many_mixes_existing_and_new_keys(
    broker: BrokerView, django_capture_on_commit_callbacks: Any
) -> None:
    old_a = services.enqueue("demo.noop", {"a": 1}, idempotency_key="mix:a").task
    old_c = services.enqueue("demo.noop", {"c": 1}, idempotency_key="mix:c").task
    items = [
        {"workflow": "demo.noop", "payload": {"c": 1}, "idempotency_key": "mix:c"},
        {"workflow": "demo.noop", "payload": {"b": 1}, "idempotency_key": "mix:b"},
        {"workflow": "demo.noop", "payload": {"a": 1}, "idempotency_key": "mix:a"},
        {"workflow": "demo.noop", "payload": {"d": 1}},
    ]

    with django_capture_on_commit_callbacks(execute=True):
        results = services.enqueue_many(items)

    assert [r.created for r in results] == [False, True, False, True]
    assert results[0].task.pk == old_c.pk
    assert results[2].task.pk == old_a.pk
    new_ids = {results[1].task.pk, results[3].task.pk}
    assert Task.objects.count() == 4
    assert set(Event.objects.values_list("task_id", flat=True)) == {old_a.pk, old_c.pk, *new_ids}
    assert Event.objects.count() == 4
    assert counter("enqueue_duplicate") == 2
    # Only a new task rings (once for the queue, naming the first new step): the existing
    # ones were rung when they were made.
    assert broker.step_ids() == [results[1].task.steps.get().pk]


# --- what an enqueue writes --------------------------------------------------------------------


@pytest.mark.django_db
def test_it_writes_the_task_the_enqueued_event_and_makes_only_the_first_step_due(
    three_steps: Workflow,
) -> None:
    result = services.enqueue(
        three_steps.name,
        {"article_id": "a-1"},
        idempotency_key="publish:article-001:v3",
        priority=7,
        actor="cli:alice",
    )

    assert result.created is True
    task = Task.objects.get()
    assert task == result.task
    assert (task.workflow, task.workflow_version, task.payload) == (
        three_steps.name,
        1,
        {"article_id": "a-1"},
    )
    assert (task.status, task.queue, task.priority) == (TaskStatus.PENDING, "default", 7)
    assert (task.created_by, task.created_by_user, task.finished_at) == ("cli:alice", None, None)
    steps = list(task.steps.order_by("position"))
    assert [(s.position, s.revision, s.kind, s.status) for s in steps] == [
        (0, 0, "fetch", StepStatus.PENDING),
        (1, 0, "draft", StepStatus.BLOCKED),
        (2, 0, "send", StepStatus.BLOCKED),
    ]
    assert [s.idempotency_key for s in steps] == [
        "publish:article-001:v3:0:fetch",
        "publish:article-001:v3:1:draft",
        "publish:article-001:v3:2:send",
    ]
    assert all(
        (s.attempts, s.fencing_token, s.queue, s.priority) == (0, 0, "default", 7) for s in steps
    )
    assert steps[0].available_at is not None
    assert steps[0].available_at <= services.db_now()
    assert [s.available_at for s in steps[1:]] == [None, None]
    event = Event.objects.get()
    assert (event.kind, event.task_id, event.step_id) == (EventKind.ENQUEUED, task.pk, None)
    assert (event.actor, event.actor_user_id) == ("cli:alice", None)
    assert event.data["steps"] == {
        str(steps[0].pk): ["pending", 0, 0],
        str(steps[1].pk): ["blocked", 0, 0],
        str(steps[2].pk): ["blocked", 0, 0],
    }
    assert event.data["payload_hash"] == task.payload_hash


@pytest.mark.django_db
def test_a_task_without_a_key_derives_its_step_keys_from_its_id() -> None:
    task = services.enqueue("demo.noop", {}).task

    assert task.idempotency_key is None
    assert only_step(task).idempotency_key == f"task-{task.pk}:0:noop"


@pytest.mark.django_db
def test_it_records_a_user_who_enqueues(oncall: Any) -> None:
    task = services.enqueue("demo.noop", {}, actor=oncall).task

    task.refresh_from_db()
    assert (task.created_by, task.created_by_user) == ("olivia-oncall", oncall)
    event = Event.objects.get()
    assert (event.actor, event.actor_user_id) == ("olivia-oncall", oncall.pk)


@pytest.mark.django_db
def test_get_task_finds_a_task_by_its_key_or_returns_none() -> None:
    task = services.enqueue("demo.noop", {}, idempotency_key="find:me").task
    services.enqueue("demo.noop", {})

    assert services.get_task(idempotency_key="find:me") == task
    assert services.get_task(idempotency_key="find:nobody") is None
    assert services.get_task(idempotency_key=f"task-{task.pk}") is None


# --- run_after --------------------------------------------------------------------------------


@pytest.mark.django_db
def test_a_step_to_run_later_cannot_be_claimed_before_its_time() -> None:
    run_after = services.db_now() + timedelta(hours=1)
    task = services.enqueue("demo.noop", {}, run_after=run_after).task
    step = only_step(task)
    assert (step.status, step.available_at) == (StepStatus.PENDING, run_after)

    assert services.claim_step(step.pk, worker_id="w") is None
    backdate(step, 3600 - 60)  # a minute to go
    assert services.claim_step(step.pk, worker_id="w") is None
    step.refresh_from_db()
    assert (step.status, step.attempts, step.fencing_token) == (StepStatus.PENDING, 0, 0)

    backdate(step, 120)  # a minute past
    claim = services.claim_step(step.pk, worker_id="w")

    assert claim is not None
    step.refresh_from_db()
    assert (step.status, step.attempts, step.fencing_token) == (StepStatus.RUNNING, 1, 1)


@pytest.mark.django_db
def test_a_step_due_in_an_hour_is_rung_by_the_sweeper_once_it_is_due(
    broker: BrokerView, django_capture_on_commit_callbacks: Any
) -> None:
    with django_capture_on_commit_callbacks(execute=True):
        task = services.enqueue(
            "demo.noop", {}, run_after=services.db_now() + timedelta(hours=1)
        ).task
    step = only_step(task)
    assert broker.step_ids() == []  # too far out for a countdown; the sweeper will ring

    with django_capture_on_commit_callbacks(execute=True):
        assert services.sweep().redispatched == 0
    assert broker.step_ids() == []

    backdate(step, 3600 + 60)
    with django_capture_on_commit_callbacks(execute=True):
        assert services.sweep().redispatched == 1
    assert broker.step_ids() == [step.pk]


# --- the doorbell ------------------------------------------------------------------------------


@pytest.mark.django_db
def test_the_first_step_is_rung_once_the_enqueue_commits(
    broker: BrokerView, django_capture_on_commit_callbacks: Any, three_steps: Workflow
) -> None:
    with django_capture_on_commit_callbacks(execute=True) as callbacks:
        task = services.enqueue(three_steps.name, {}).task
        assert broker.step_ids() == []  # not before commit

    assert len(callbacks) == 1
    first = task.steps.get(position=0)
    assert broker.step_ids() == [first.pk]


@pytest.mark.django_db(transaction=True)
def test_a_rolled_back_enqueue_leaves_no_task_and_rings_nothing(broker: BrokerView) -> None:
    with pytest.raises(RuntimeError, match="caller changed its mind"), transaction.atomic():
        services.enqueue("demo.noop", {}, idempotency_key="rollback:1")
        assert Task.objects.count() == 1
        raise RuntimeError("caller changed its mind")

    assert stored() == NOTHING
    assert broker.step_ids() == []
    # The key was never taken.
    assert services.enqueue("demo.noop", {"other": 1}, idempotency_key="rollback:1").created


@pytest.mark.django_db(transaction=True)
def test_a_committed_enqueue_rings_the_first_step_after_commit(broker: BrokerView) -> None:
    with transaction.atomic():
        task = services.enqueue("demo.noop", {}).task
        assert broker.step_ids() == []

    assert broker.step_ids() == [only_step(task).pk]


@pytest.mark.django_db(transaction=True)
def test_a_broker_that_is_down_does_not_fail_the_enqueue_and_the_sweeper_rings_later(
    broker: BrokerView, caplog: pytest.LogCaptureFixture
) -> None:
    original = celery_app.conf.broker_url
    try:
        point_broker_at(DOWN_BROKER_URL)
        started = time.monotonic()
        result = services.enqueue("demo.noop", {}, idempotency_key="down:1")
        took = time.monotonic() - started
        # Doorbells go out from a background thread: let it try while the broker is down.
        assert publisher.flush(timeout=10)
    finally:
        point_broker_at(original)

    # The publish was tried and failed, and neither failed nor held up the enqueue
    # (DESIGN rule 1: short broker timeouts, no blocking retries).
    assert any("could not ring" in record.getMessage() for record in caplog.records)
    assert took < 1.0, f"enqueue with the broker down took {took:.1f}s"
    assert result.created is True
    task = Task.objects.get()
    step = only_step(task)
    assert (task.status, step.status) == (TaskStatus.PENDING, StepStatus.PENDING)
    assert broker.step_ids() == []

    assert services.sweep().redispatched == 0  # rung a moment ago, as far as it knows
    assert broker.step_ids() == []
    backdate(step, 60)
    assert services.sweep().redispatched == 1
    assert broker.step_ids() == [step.pk]


# --- input rules (DESIGN §4) -------------------------------------------------------------------

NAIVE = datetime(2030, 1, 1, 12, 0)

REFUSALS = [
    # payload: a JSON object
    pytest.param({"payload": [1, 2]}, "payload", "object", InvalidPayload, id="payload-list"),
    pytest.param({"payload": "{}"}, "payload", "object", InvalidPayload, id="payload-str"),
    pytest.param({"payload": None}, "payload", "object", InvalidPayload, id="payload-none"),
    pytest.param({"payload": 7}, "payload", "object", InvalidPayload, id="payload-int"),
    # size, in canonical UTF-8 bytes
    pytest.param(
        {"payload": payload_of_size(LIMIT + 1)},
        "payload",
        "max_bytes",
        InvalidPayload,
        id="payload-one-byte-too-big",
    ),
    pytest.param(
        # Fewer characters than the limit, more bytes: the size is counted in UTF-8.
        {"payload": payload_of_size(LIMIT + 2, "é")},
        "payload",
        "max_bytes",
        InvalidPayload,
        id="payload-too-many-utf8-bytes",
    ),
    # nesting
    pytest.param(
        {"payload": nested_dicts(33)}, "payload", "max_depth", InvalidPayload, id="33-objects"
    ),
    pytest.param(
        {"payload": nested_lists(33)}, "payload", "max_depth", InvalidPayload, id="33-lists"
    ),
    pytest.param(
        {"payload": nested_lists(10_000)},
        "payload",
        "max_depth",
        InvalidPayload,
        id="10000-lists",
    ),
    pytest.param(
        {"payload": nested_dicts(10_000)},
        "payload",
        "max_depth",
        InvalidPayload,
        id="10000-objects",
    ),
    # keys
    pytest.param({"payload": {1: "a"}}, "payload", "string_keys", InvalidPayload, id="int-key"),
    pytest.param({"payload": {None: 1}}, "payload", "string_keys", InvalidPayload, id="none-key"),
    pytest.param(
        {"payload": {"a": {(1, 2): 1}}},
        "payload",
        "string_keys",
        InvalidPayload,
        id="nested-tuple-key",
    ),
    # strings
    pytest.param(
        {"payload": {"a": "x\ud800y"}},
        "payload",
        "valid_unicode",
        InvalidPayload,
        id="lone-surrogate-value",
    ),
    pytest.param(
        {"payload": {"a\udfff": 1}},
        "payload",
        "valid_unicode",
        InvalidPayload,
        id="lone-surrogate-key",
    ),
    pytest.param(
        {"payload": {"a": ["ok", {"b": "\udc80"}]}},
        "payload",
        "valid_unicode",
        InvalidPayload,
        id="lone-surrogate-deep",
    ),
    pytest.param(
        {"payload": {"a": "x\u0000y"}}, "payload", "no_nul", InvalidPayload, id="nul-in-value"
    ),
    pytest.param({"payload": {"a\u0000": 1}}, "payload", "no_nul", InvalidPayload, id="nul-in-key"),
    # numbers
    pytest.param(
        {"payload": {"a": float("nan")}}, "payload", "finite_numbers", InvalidPayload, id="nan"
    ),
    pytest.param(
        {"payload": {"a": [float("inf")]}},
        "payload",
        "finite_numbers",
        InvalidPayload,
        id="infinity",
    ),
    pytest.param(
        {"payload": {"a": float("-inf")}},
        "payload",
        "finite_numbers",
        InvalidPayload,
        id="minus-infinity",
    ),
    pytest.param({"payload": {"a": 1e23}}, "payload", "float_range", InvalidPayload, id="1e23"),
    pytest.param(
        {"payload": {"a": [-1e16]}}, "payload", "float_range", InvalidPayload, id="minus-1e16"
    ),
    # values that do not round-trip through JSON
    pytest.param({"payload": {"a": (1, 2)}}, "payload", "json_types", InvalidPayload, id="tuple"),
    pytest.param({"payload": {"a": {1, 2}}}, "payload", "json_types", InvalidPayload, id="set"),
    pytest.param({"payload": {"a": b"xy"}}, "payload", "json_types", InvalidPayload, id="bytes"),
    pytest.param(
        {"payload": {"a": datetime(2030, 1, 1, tzinfo=UTC)}},
        "payload",
        "json_types",
        InvalidPayload,
        id="datetime",
    ),
    pytest.param(
        {"payload": {"a": Decimal("1.5")}}, "payload", "json_types", InvalidPayload, id="decimal"
    ),
    pytest.param(
        {"payload": {"a": [frozenset()]}},
        "payload",
        "json_types",
        InvalidPayload,
        id="frozenset-in-list",
    ),
    # idempotency key
    pytest.param(
        {"idempotency_key": ""}, "idempotency_key", "length", InvalidInput, id="key-empty"
    ),
    pytest.param(
        {"idempotency_key": "k" * 256}, "idempotency_key", "length", InvalidInput, id="key-256"
    ),
    pytest.param(
        {"idempotency_key": "has space"},
        "idempotency_key",
        "printable_ascii",
        InvalidInput,
        id="key-space",
    ),
    pytest.param(
        {"idempotency_key": "clé"},
        "idempotency_key",
        "printable_ascii",
        InvalidInput,
        id="key-non-ascii",
    ),
    pytest.param(
        {"idempotency_key": "bell\x07"},
        "idempotency_key",
        "printable_ascii",
        InvalidInput,
        id="key-control-char",
    ),
    pytest.param(
        {"idempotency_key": "tab\tkey"},
        "idempotency_key",
        "printable_ascii",
        InvalidInput,
        id="key-tab",
    ),
    pytest.param(
        {"idempotency_key": "del\x7f"},
        "idempotency_key",
        "printable_ascii",
        InvalidInput,
        id="key-del",
    ),
    pytest.param(
        {"idempotency_key": "task-12"},
        "idempotency_key",
        "reserved_prefix",
        InvalidInput,
        id="key-task-prefix",
    ),
    pytest.param({"idempotency_key": 12}, "idempotency_key", "string", InvalidInput, id="key-int"),
    pytest.param(
        {"idempotency_key": b"k"}, "idempotency_key", "string", InvalidInput, id="key-bytes"
    ),
    # workflow
    pytest.param(
        {"workflow": "demo.nope"}, "workflow", "registered", UnknownWorkflow, id="unknown-workflow"
    ),
    pytest.param({"workflow": None}, "workflow", "registered", InvalidInput, id="workflow-none"),
    # queue
    pytest.param({"queue": "nope"}, "queue", "known_queue", InvalidInput, id="unknown-queue"),
    pytest.param(
        {"queue": "maintenance"}, "queue", "known_queue", InvalidInput, id="maintenance-queue"
    ),
    pytest.param({"queue": None}, "queue", "known_queue", InvalidInput, id="queue-none"),
    # run_after
    pytest.param({"run_after": NAIVE}, "run_after", "timezone_aware", InvalidInput, id="naive"),
    pytest.param(
        {"run_after": date(2030, 1, 1)}, "run_after", "datetime", InvalidInput, id="run-after-date"
    ),
    pytest.param(
        {"run_after": "2030-01-01T00:00:00Z"},
        "run_after",
        "datetime",
        InvalidInput,
        id="run-after-str",
    ),
    # priority
    pytest.param({"priority": -101}, "priority", "range", InvalidInput, id="priority--101"),
    pytest.param({"priority": 101}, "priority", "range", InvalidInput, id="priority-101"),
    pytest.param({"priority": 1.5}, "priority", "integer", InvalidInput, id="priority-float"),
    pytest.param({"priority": True}, "priority", "integer", InvalidInput, id="priority-bool"),
    pytest.param({"priority": "1"}, "priority", "integer", InvalidInput, id="priority-str"),
    pytest.param({"priority": None}, "priority", "integer", InvalidInput, id="priority-none"),
    # demo.flaky's own payload rules
    pytest.param(
        {"workflow": "demo.flaky", "payload": {"fail_rate": 2}},
        "payload.fail_rate",
        "range",
        InvalidPayload,
        id="flaky-fail-rate",
    ),
    pytest.param(
        {"workflow": "demo.flaky", "payload": {"error": "boom"}},
        "payload.error",
        "choice",
        InvalidPayload,
        id="flaky-error",
    ),
    pytest.param(
        {"workflow": "demo.flaky", "payload": {"fail_first": -1}},
        "payload.fail_first",
        "non_negative_integer",
        InvalidPayload,
        id="flaky-fail-first",
    ),
    # Integers are bounded by size, before Python would refuse to print them.
    pytest.param(
        {"payload": {"x": 10**5000}}, "payload", "integer_range", InvalidPayload, id="int-huge"
    ),
    pytest.param(
        {"payload": {"x": [-(10**1000)]}},
        "payload",
        "integer_range",
        InvalidPayload,
        id="int-1001-digits",
    ),
    # A workflow's own rules answer for any JSON value, not only the ones they expect.
    pytest.param(
        {"workflow": "demo.flaky", "payload": {"error": []}},
        "payload.error",
        "choice",
        InvalidPayload,
        id="flaky-error-list",
    ),
    pytest.param(
        {"workflow": "demo.flaky", "payload": {"error": {"a": 1}}},
        "payload.error",
        "choice",
        InvalidPayload,
        id="flaky-error-object",
    ),
]


@pytest.mark.django_db
def test_integers_of_a_thousand_digits_are_accepted_and_round_trip() -> None:
    task = services.enqueue("demo.noop", {"x": 10**999, "y": -(10**999)}).task
    task.refresh_from_db()
    assert task.payload == {"x": 10**999, "y": -(10**999)}


@pytest.mark.django_db
def test_a_workflow_rule_that_trips_over_a_value_is_a_refusal_not_a_crash() -> None:
    def fussy(payload: dict[str, Any]) -> None:
        payload["name"].upper()  # assumes text

    steps = (StepSpec("noop", noop),)
    flow = register(Workflow("test.fussy", 1, steps=steps, validate_payload=fussy))
    try:
        with pytest.raises(InvalidPayload) as caught:
            services.enqueue("test.fussy", {"name": [1]})
        assert (caught.value.field, caught.value.rule) == ("payload", "workflow_rules")
        assert "AttributeError" in str(caught.value)
        assert not Task.objects.filter(workflow="test.fussy").exists()
    finally:
        registry.unregister(flow.name, flow.version)


@pytest.mark.django_db
@pytest.mark.parametrize(("kwargs", "field", "rule", "error"), REFUSALS)
def test_it_refuses_bad_input_naming_field_and_rule_and_stores_nothing(
    kwargs: dict[str, Any],
    field: str,
    rule: str,
    error: type[InvalidInput],
    broker: BrokerView,
    django_capture_on_commit_callbacks: Any,
) -> None:
    call: dict[str, Any] = {"workflow": "demo.noop", "payload": {}, "idempotency_key": "k:1"}
    call.update(kwargs)
    workflow, payload = call.pop("workflow"), call.pop("payload")

    with (
        django_capture_on_commit_callbacks(execute=True) as callbacks,
        pytest.raises(InvalidInput) as caught,
    ):
        enqueue_any(workflow, payload, **call)

    assert isinstance(caught.value, error)
    assert (caught.value.field, caught.value.rule) == (field, rule)
    assert str(caught.value).startswith(field)
    assert callbacks == []
    assert broker.step_ids() == []
    assert stored() == NOTHING


@pytest.mark.django_db
@pytest.mark.parametrize(("kwargs", "field", "rule", "error"), REFUSALS)
def test_enqueue_many_refuses_bad_input_naming_the_item_and_stores_nothing(
    kwargs: dict[str, Any],
    field: str,
    rule: str,
    error: type[InvalidInput],
    broker: BrokerView,
    django_capture_on_commit_callbacks: Any,
) -> None:
    good = [{"workflow": "demo.noop", "payload": {"n": n}} for n in range(2)]
    bad: dict[str, Any] = {"workflow": "demo.noop", "payload": {}, **kwargs}

    with (
        django_capture_on_commit_callbacks(execute=True) as callbacks,
        pytest.raises(InvalidInput) as caught,
    ):
        services.enqueue_many([*good, bad, {"workflow": "demo.noop", "payload": {}}])

    assert isinstance(caught.value, error)
    assert (caught.value.field, caught.value.rule) == (f"items[2].{field}", rule)
    assert callbacks == []
    assert broker.step_ids() == []
    assert stored() == NOTHING


ACCEPTED = [
    pytest.param({}, id="defaults"),
    pytest.param({"payload": payload_of_size(LIMIT)}, id="payload-exactly-at-the-limit"),
    pytest.param({"payload": payload_of_size(LIMIT, "é")}, id="utf8-payload-at-the-limit"),
    pytest.param(
        # Canonical form exactly at the limit; json.dumps' default spacing would be over it.
        {"payload": {"b": 1, "a": "x" * (LIMIT - len('{"a":"","b":1}'))}},
        id="canonical-spacing-at-the-limit",
    ),
    pytest.param({"payload": nested_dicts(32)}, id="32-objects"),
    pytest.param({"payload": nested_lists(32)}, id="32-lists"),
    pytest.param(
        {"payload": {"s": "日本語 😀 \\u0000", "n": [1, -2.5, True, None], "o": {"": ""}}},
        id="json-types",
    ),
    pytest.param(
        {"payload": {"big": 9.9e15, "small": 1e-300, "int": 10**30}}, id="numbers-that-round-trip"
    ),
    pytest.param({"idempotency_key": "k" * 255}, id="key-255"),
    pytest.param({"idempotency_key": "x"}, id="key-1"),
    pytest.param({"idempotency_key": "publish:article-001:v3!~"}, id="key-punctuation"),
    pytest.param({"idempotency_key": "mytask-1"}, id="key-task-not-prefix"),
    pytest.param({"priority": -100}, id="priority--100"),
    pytest.param({"priority": 100}, id="priority-100"),
    pytest.param({"run_after": datetime(2030, 1, 1, tzinfo=UTC)}, id="aware-run-after"),
    pytest.param(
        {"workflow": "demo.flaky", "payload": {"fail_rate": 1, "error": "permanent"}},
        id="flaky-within-rules",
    ),
]


@pytest.mark.django_db
@pytest.mark.parametrize("kwargs", ACCEPTED)
def test_it_accepts_input_at_the_edge_of_the_rules_and_stores_it_unchanged(
    kwargs: dict[str, Any],
) -> None:
    call: dict[str, Any] = {"workflow": "demo.noop", "payload": {}, **kwargs}
    workflow, payload = call.pop("workflow"), call.pop("payload")

    result = enqueue_any(workflow, payload, **call)

    assert result.created is True
    task = Task.objects.get()
    assert task.payload == kwargs.get("payload", {})
    assert canonical(task.payload) == canonical(kwargs.get("payload", {}))
    assert task.idempotency_key == kwargs.get("idempotency_key")
    assert Step.objects.filter(task=task).count() == 1
    assert Event.objects.filter(task_id=task.pk, kind=EventKind.ENQUEUED).count() == 1


def test_the_input_errors_form_one_family() -> None:
    assert issubclass(InvalidInput, ValueError)
    assert issubclass(InvalidPayload, InvalidInput)
    assert issubclass(UnknownWorkflow, InvalidInput)
    assert not issubclass(IdempotencyConflict, InvalidInput)
    error = InvalidInput("priority", "range")
    assert (error.field, error.rule, str(error)) == ("priority", "range", "priority: range")


# --- a connection the database dropped --------------------------------------------------------


def _drop_django_connection() -> None:
    """Terminate this process's database session from another one, as a restart does."""
    connection.ensure_connection()
    pid = connection.connection.info.backend_pid
    params = connection.get_connection_params()
    other = connection.get_new_connection(params)
    try:
        other.execute("SELECT pg_terminate_backend(%s)", [pid])
    finally:
        other.close()


@pytest.mark.django_db(transaction=True)
def test_a_producer_outside_a_transaction_recovers_from_a_dropped_connection() -> None:
    services.enqueue("demo.noop", {"n": 0}, idempotency_key="drop:0")

    # With a key, the enqueue tries again on a new connection and succeeds at once.
    _drop_django_connection()
    keyed = services.enqueue("demo.noop", {"n": 1}, idempotency_key="drop:1")
    assert keyed.created and Task.objects.filter(idempotency_key="drop:1").count() == 1

    # Without one, a second try could copy a task whose commit went unanswered: the call
    # fails, and the producer's next call runs on a new connection.
    _drop_django_connection()
    with pytest.raises(OperationalError):
        services.enqueue("demo.noop", {"n": 2})
    assert services.enqueue("demo.noop", {"n": 3}).created
    assert Task.objects.filter(workflow="demo.noop").count() == 3


@pytest.mark.django_db(transaction=True)
def test_inside_a_callers_transaction_a_dropped_connection_is_an_error() -> None:
    with pytest.raises((OperationalError, InterfaceError)), transaction.atomic():
        Task.objects.count()
        _drop_django_connection()
        services.enqueue("demo.noop", {"n": 1}, idempotency_key="drop:in")
    connection.close()
    assert not Task.objects.filter(idempotency_key="drop:in").exists()
