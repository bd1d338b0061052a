"""Enqueue's input rules (DESIGN §4): every bad workflow, payload, key, queue, run_after or
priority is refused with an error naming its field and rule, by ``enqueue`` and by
``enqueue_many`` (naming the item), and input at the edge of the rules is accepted and
stored unchanged. Every refusal is checked against the database and the broker: no task,
no step, no event, no counter, no message.
"""

from __future__ import annotations

from datetime import UTC, date, datetime
from decimal import Decimal
from typing import Any

import pytest

from tasks_app import services
from tasks_app.demo.workflows import noop
from tasks_app.exceptions import (
    IdempotencyConflict,
    InvalidInput,
    InvalidPayload,
    UnknownWorkflow,
)
from tasks_app.models import Step, Task
from tasks_app.services import EnqueueResult
from tasks_app.workflows import StepSpec, Workflow, register, registry
from tests.conftest import BrokerView
from tests.enqueue_support import NOTHING, assert_only_enqueued, canonical, stored

LIMIT = 65_536


# --- helpers ---------------------------------------------------------------------------------


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


def enqueue_any(workflow: Any, payload: Any, **kwargs: Any) -> EnqueueResult:
    """``services.enqueue`` with arguments of any type, as a careless caller passes them."""
    return services.enqueue(workflow, payload, **kwargs)


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
    assert_only_enqueued(task)


def test_the_input_errors_form_one_family() -> None:
    assert issubclass(InvalidInput, ValueError)
    assert issubclass(InvalidPayload, InvalidInput)
    assert issubclass(UnknownWorkflow, InvalidInput)
    assert not issubclass(IdempotencyConflict, InvalidInput)
    error = InvalidInput("priority", "range")
    assert (error.field, error.rule, str(error)) == ("priority", "range", "priority: range")
