"""``enqueue_many``: results in input order, all or nothing when one item is bad or in
conflict, the bad item named, duplicate keys within a batch collapsed, existing and new
keys mixed, and one doorbell for the queue naming the first new step (DESIGN §2 rules 1
and 4). Every refusal is checked against the database and the broker: no task, no step,
no event, no counter beyond the conflict's, no message.
"""

from __future__ import annotations

from typing import Any

import pytest

from tasks_app import services
from tasks_app.exceptions import (
    IdempotencyConflict,
    InvalidInput,
    InvalidPayload,
)
from tasks_app.models import Step, Task
from tests.conftest import BrokerView
from tests.enqueue_support import NOTHING, assert_only_enqueued, counter, stored

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
    assert_only_enqueued(*(r.task for r in results))


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
    assert_only_enqueued(results[0].task, results[1].task)
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
    # One enqueue each in their histories: the duplicates recorded none.
    assert_only_enqueued(*Task.objects.filter(pk__in={old_a.pk, old_c.pk, *new_ids}))
    assert counter("enqueue_duplicate") == 2
    # Only a new task rings (once for the queue, naming the first new step): the existing
    # ones were rung when they were made.
    assert broker.step_ids() == [results[1].task.steps.get().pk]
