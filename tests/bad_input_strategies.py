"""Valid calls and bad ones for the bad-input tests (``tests/core/test_bad_input.py``, and
drill 17 in its own process): hypothesis strategies that draw a valid enqueue and corrupt
exactly one field, with the field the refusal must name, and the call as the ``enqueue``
command's arguments."""

from __future__ import annotations

import json
import string
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

from django.conf import settings
from hypothesis import HealthCheck
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st

from tasks_app.models import Event, Step, Task
from tasks_app.validation import MAX_DEPTH, MAX_PAYLOAD_BYTES, canonical_json
from tasks_app.workflows import registry

Call = dict[str, Any]
# (the call, the field the refusal must name, the rule when the call is Python's)
Bad = tuple[Call, str, str]


def examples(n: int) -> Callable[[Any], Any]:
    return hypothesis_settings(
        max_examples=n,
        derandomize=True,
        deadline=None,
        suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
    )


def stored() -> tuple[int, int, int]:
    return Task.objects.count(), Step.objects.count(), Event.objects.count()


# --- valid values -----------------------------------------------------------------------------

# Text the rules accept: no lone surrogates, no NUL.
safe_text = st.text(st.characters(exclude_categories=["Cs"], exclude_characters="\x00"), max_size=8)
# Text a form or a command line can carry (no lone surrogates; anything else goes).
form_text = st.text(st.characters(exclude_categories=["Cs"]), max_size=12)
json_leaves = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(10**20), max_value=10**20)
    # Integers up to 1,000 digits and floats below 1e16 round-trip.
    | st.integers(min_value=-(10**1000 - 1), max_value=10**1000 - 1)
    | st.floats(min_value=-1e16, max_value=1e16, exclude_min=True, exclude_max=True)
    | safe_text
)
json_values = st.recursive(
    json_leaves,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(safe_text, inner, max_size=4),
    max_leaves=12,
)
json_objects = st.dictionaries(safe_text, json_values, max_size=5)

printable_key_chars = "".join(chr(c) for c in range(ord("!"), ord("~") + 1))
good_keys = st.text(printable_key_chars, min_size=1, max_size=40).filter(
    lambda key: not key.startswith("task-")
)
run_afters = st.none() | st.integers(min_value=0, max_value=10**6).map(
    lambda minutes: datetime(2031, 1, 2, 3, 4, 5, tzinfo=UTC) + timedelta(minutes=minutes)
)

ARTICLE_LIMITS = {"article_id": 100, "title": 300, "brief": 10_000}
TICKET_LIMITS = {"ticket_id": 100, "customer_id": 100, "message": 10_000}
TEXT_RULES = {"publish_article": ARTICLE_LIMITS, "ticket_reply": TICKET_LIMITS}
FLAKY_INTEGERS = ("fail_first", "seed")
FLAKY_NUMBERS = {"fail_rate": 1.0, "sleep": 3600.0}
FLAKY_ERRORS = ("retryable", "permanent", "outcome_unknown", "crash")


@st.composite
def flaky_payloads(draw: st.DrawFn) -> dict[str, Any]:
    fields = {
        # A failure is never due: these payloads are only validated, never run.
        "fail_first": st.integers(min_value=0, max_value=10**6),
        "seed": st.integers(min_value=0, max_value=10**9),
        "fail_rate": st.floats(min_value=0, max_value=1) | st.sampled_from([0, 1]),
        "sleep": st.floats(min_value=0, max_value=3600) | st.integers(0, 3600),
        "error": st.sampled_from(FLAKY_ERRORS),
    }
    names = draw(st.lists(st.sampled_from(sorted(fields)), unique=True))
    return {name: draw(fields[name]) for name in names}


def text_payloads(limits: dict[str, int]) -> st.SearchStrategy[dict[str, Any]]:
    word = st.text(string.ascii_letters + string.digits + " -é", min_size=1, max_size=20)
    return st.fixed_dictionaries(
        {name: word.filter(lambda text: bool(text.strip())) for name in limits}
    )


PAYLOADS: dict[str, st.SearchStrategy[dict[str, Any]]] = {
    "demo.noop": json_objects,
    "demo.flaky": flaky_payloads(),
    "publish_article": text_payloads(ARTICLE_LIMITS),
    "ticket_reply": text_payloads(TICKET_LIMITS),
}


@st.composite
def valid_calls(draw: st.DrawFn, workflows: tuple[str, ...] = tuple(PAYLOADS)) -> Call:
    workflow = draw(st.sampled_from(workflows))
    return {
        "workflow": workflow,
        "payload": draw(PAYLOADS[workflow]),
        "idempotency_key": draw(st.none() | good_keys),
        "queue": draw(st.sampled_from(settings.TASKS_QUEUES)),
        "priority": draw(st.integers(min_value=-100, max_value=100)),
        "run_after": draw(run_afters),
    }


def depth(value: Any) -> int:
    if isinstance(value, dict):
        return 1 + max(map(depth, value.values()), default=0)
    if isinstance(value, list):
        return 1 + max(map(depth, value), default=0)
    return 0


# --- bad payloads -----------------------------------------------------------------------------


def _spliced(draw: st.DrawFn, bad: str) -> str:
    """``bad`` with accepted text on either side (only one bad character in all)."""
    return draw(safe_text) + bad + draw(safe_text)


def _fresh_key(draw: st.DrawFn, payload: dict[str, Any]) -> str:
    return draw(safe_text.map(lambda text: "x-" + text).filter(lambda key: key not in payload))


def _place(draw: st.DrawFn, payload: dict[str, Any], value: Any) -> dict[str, Any]:
    """``payload`` with ``value`` added at the top, in an array or in an object."""
    where = draw(st.sampled_from(["top", "array", "object"]))
    wrapped = value if where == "top" else [value] if where == "array" else {"v": value}
    return {**payload, _fresh_key(draw, payload): wrapped}


def _place_key(draw: st.DrawFn, payload: dict[str, Any], key: Any) -> dict[str, Any]:
    """``payload`` with ``key`` used as a key at the top or one level down."""
    leaf = draw(json_leaves)
    if draw(st.booleans()):
        return {**payload, key: leaf}
    return {**payload, _fresh_key(draw, payload): {key: leaf}}


@st.composite
def structurally_bad(draw: st.DrawFn, payload: dict[str, Any], python: bool) -> tuple[Any, str]:
    """``payload`` broken by one of the input rules every payload follows; with the rule."""
    rules = ["object", "max_depth", "no_nul", "valid_unicode", "finite_numbers"]
    rules += ["float_range", "integer_range", "max_bytes"]
    if python:
        rules += ["string_keys", "json_types"]
    rule = draw(st.sampled_from(rules))
    if rule == "object":
        return draw(
            st.lists(json_values, max_size=3)
            | safe_text
            | st.integers()
            | st.floats(min_value=-1e15, max_value=1e15)
            | st.booleans()
            | st.none()
        ), rule
    if rule == "max_depth":
        # The top object is level one; ``levels`` more containers take it past the limit.
        levels = draw(st.integers(min_value=MAX_DEPTH, max_value=MAX_DEPTH + 40))
        kinds = draw(st.lists(st.booleans(), min_size=levels, max_size=levels))
        value: Any = draw(json_leaves)
        for is_object in kinds:
            value = {"d": value} if is_object else [value]
        return {**payload, _fresh_key(draw, payload): value}, rule
    if rule in ("no_nul", "valid_unicode"):
        bad = "\x00" if rule == "no_nul" else chr(draw(st.integers(0xD800, 0xDFFF)))
        text = _spliced(draw, bad)
        if draw(st.booleans()):
            return _place_key(draw, payload, text), rule
        return _place(draw, payload, text), rule
    if rule == "finite_numbers":
        return _place(draw, payload, draw(st.sampled_from([float("nan"), float("inf")]))), rule
    if rule == "float_range":
        big = draw(st.floats(min_value=1e16, allow_infinity=False))
        return _place(draw, payload, big if draw(st.booleans()) else -big), rule
    if rule == "integer_range":
        # More than 1,000 digits (and fewer than the 4,300 Python will print).
        big = draw(st.integers(min_value=10**1000, max_value=10**1200))
        return _place(draw, payload, big if draw(st.booleans()) else -big), rule
    if rule == "max_bytes":
        char = draw(st.sampled_from(["x", "é", "€", "😀"]))
        key = _fresh_key(draw, payload)
        size = len(canonical_json({**payload, key: ""}).encode())
        width = len(char.encode())
        count = (MAX_PAYLOAD_BYTES - size) // width + 1 + draw(st.integers(0, 100))
        return {**payload, key: char * count}, rule
    if rule == "string_keys":
        not_text: Any = draw(
            st.integers()
            | st.none()
            | st.booleans()
            | st.floats(allow_nan=False)
            | st.binary(max_size=3)
            | st.tuples(st.integers())
        )
        return _place_key(draw, payload, not_text), rule
    assert rule == "json_types"
    value = draw(
        st.tuples(json_leaves)
        | st.just(())
        | st.frozensets(st.integers(), max_size=2)
        | st.sets(st.integers(), max_size=2)
        | st.binary(max_size=4)
        | st.datetimes()
        | st.dates()
        | st.decimals(allow_nan=False, places=2, max_value=10**6, min_value=-(10**6))
        | st.complex_numbers(max_magnitude=10)
    )
    return _place(draw, payload, value), rule


not_a_number = (
    st.lists(st.integers(), max_size=2)
    | st.dictionaries(safe_text, st.integers(), max_size=2)
    | safe_text
    | st.booleans()
    | st.none()
)


@st.composite
def against_workflow_rules(draw: st.DrawFn, workflow: str, payload: dict[str, Any]) -> Bad:
    """``payload`` given a wrong JSON value for one of the workflow's own fields."""
    if workflow == "demo.flaky":
        name = draw(st.sampled_from([*FLAKY_INTEGERS, *FLAKY_NUMBERS, "error"]))
        if name in FLAKY_INTEGERS:
            rule = "non_negative_integer"
            value = draw(
                not_a_number
                | st.floats(min_value=-1e6, max_value=1e6)
                | st.integers(max_value=-1, min_value=-(10**6))
            )
        elif name in FLAKY_NUMBERS:
            rule = "range"
            upper = FLAKY_NUMBERS[name]
            value = draw(
                not_a_number
                | st.floats(min_value=-1e6, max_value=-1e-9)
                | st.floats(min_value=upper, max_value=1e6, exclude_min=True)
                | st.integers(min_value=int(upper) + 1, max_value=10**6)
            )
        else:
            rule = "choice"
            value = draw(
                not_a_number.filter(lambda v: not isinstance(v, str))
                | safe_text.filter(lambda text: text not in FLAKY_ERRORS)
            )
        return {**payload, name: value}, f"payload.{name}", rule
    limits = TEXT_RULES[workflow]
    name = draw(st.sampled_from([*limits, "unknown"]))
    if name == "unknown":
        extra = draw(st.text(string.ascii_lowercase, min_size=1, max_size=8).map("x_".__add__))
        return {**payload, extra: draw(json_leaves)}, f"payload.{extra}", "known_field"
    wrong: Any = draw(
        st.integers()
        | st.floats(min_value=-1e6, max_value=1e6)
        | st.booleans()
        | st.none()
        | st.lists(safe_text, max_size=2)
        | st.dictionaries(safe_text, safe_text, max_size=2)
        | st.text(" \t\n", max_size=3)
        | st.just("x" * (limits[name] + 1))
    )
    rule = "max_length" if isinstance(wrong, str) and wrong.strip() else "required"
    return {**payload, name: wrong}, f"payload.{name}", rule


@st.composite
def bad_payloads(draw: st.DrawFn, workflow: str, payload: dict[str, Any], python: bool) -> Bad:
    """The call's payload corrupted once: by a rule for every payload, or, for a workflow
    with its own rules, by those."""
    if workflow != "demo.noop" and draw(st.booleans()):
        return draw(against_workflow_rules(workflow, payload))
    bad, rule = draw(structurally_bad(payload, python))
    return bad, "payload", rule


# --- bad calls --------------------------------------------------------------------------------


def unknown(choices: Callable[[], list[str]]) -> st.SearchStrategy[str]:
    return form_text.filter(lambda text: text not in choices())


@st.composite
def bad_keys(draw: st.DrawFn, python: bool, allow_empty: bool = True) -> tuple[Any, str]:
    rules = ["too_long", "space", "non_ascii", "control", "reserved_prefix"]
    rules += ["empty"] * allow_empty + ["string"] * python
    rule = draw(st.sampled_from(rules))
    if rule == "empty":
        return "", "length"
    if rule == "too_long":
        return draw(st.text(printable_key_chars, min_size=256, max_size=300)), "length"
    if rule == "reserved_prefix":
        return "task-" + draw(st.text(printable_key_chars, max_size=40)), rule
    if rule == "string":
        return draw(st.integers() | st.binary(max_size=4) | st.lists(good_keys, max_size=2)), rule
    bad = {
        "space": st.sampled_from([" ", "  "]),
        "non_ascii": st.characters(min_codepoint=0x7F, exclude_categories=["Cs"]),
        "control": st.characters(max_codepoint=0x1F),
    }[rule]
    key = draw(st.text(printable_key_chars, max_size=20)) + draw(bad) + draw(good_keys)
    return key, "printable_ascii"


@st.composite
def bad_python_calls(draw: st.DrawFn) -> Bad:
    call = draw(valid_calls())
    target = draw(
        st.sampled_from(["payload"] * 4 + ["idempotency_key"] * 2 + ["queue", "priority"])
        | st.sampled_from(["run_after", "workflow"])
    )
    field, rule = target, ""
    if target == "payload":
        call["payload"], field, rule = draw(bad_payloads(call["workflow"], call["payload"], True))
    elif target == "idempotency_key":
        call[target], rule = draw(bad_keys(python=True))
    elif target == "queue":
        call[target], rule = draw(unknown(lambda: settings.TASKS_QUEUES) | st.none()), "known_queue"
    elif target == "priority":
        out_of_range = st.integers(max_value=-101) | st.integers(min_value=101)
        wrong_type = st.booleans() | st.floats(-100, 100) | st.sampled_from(["1", None, Decimal(1)])
        value = draw(out_of_range | wrong_type)
        call[target], rule = value, "range" if type(value) is int else "integer"
    elif target == "run_after":
        naive = st.datetimes(min_value=datetime(2000, 1, 1), max_value=datetime(2100, 1, 1))
        when: Any = draw(naive | st.dates() | st.sampled_from(["2031-01-02T03:04:05+00:00", 0]))
        call[target] = when
        rule = "timezone_aware" if isinstance(when, datetime) else "datetime"
    else:
        value = draw(unknown(registry.names) | st.none() | st.integers())
        call[target], rule = value, "registered"
    return call, field, rule


@st.composite
def bad_text_calls(draw: st.DrawFn, admin: bool) -> tuple[Call, str]:
    """A call whose values a command line or a form can carry (priority and run_after as
    text), with one corrupted; and the field the refusal names."""
    call = draw(valid_calls())
    target = draw(
        st.sampled_from(["payload"] * 4 + ["idempotency_key"] * 2 + ["queue", "priority"])
        | st.sampled_from(["run_after", "workflow"])
    )
    field = target
    if target == "payload":
        call["payload"], field, _ = draw(bad_payloads(call["workflow"], call["payload"], False))
    elif target == "idempotency_key":
        # The form reads an empty key as no key.
        call[target], _ = draw(bad_keys(python=False, allow_empty=not admin))
    elif target == "queue":
        call[target] = draw(unknown(lambda: settings.TASKS_QUEUES))
    elif target == "priority":
        out_of_range = st.integers(max_value=-101) | st.integers(min_value=101)
        call[target] = draw(
            out_of_range.map(str) | st.sampled_from(["", "abc", "1.5", "1e3", "true", "0x10"])
        )
    elif target == "run_after":
        if admin:
            call[target] = draw(
                st.sampled_from(
                    [("2031-13-02", "03:04:05"), ("2031-02-30", "10:00"), ("tomorrow", "noon")]
                )
            )
        else:
            naive = st.datetimes(min_value=datetime(2000, 1, 1), max_value=datetime(2100, 1, 1))
            call[target] = draw(
                naive.map(datetime.isoformat)
                | st.sampled_from(["tomorrow", "2031-13-02T00:00:00+00:00", "2031-01-02T25:00"])
            )
    else:
        call[target] = draw(unknown(registry.names))
    return call, field


def json_text(payload: Any) -> str:
    """JSON text for ``payload``, as a client writes it (escaped where UTF-8 cannot say it:
    a lone surrogate)."""
    text = json.dumps(payload, ensure_ascii=False)
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return json.dumps(payload)
    return text


def argv(call: Call) -> list[str]:
    args = [
        f"--payload={json_text(call['payload'])}",
        f"--queue={call['queue']}",
        f"--priority={call['priority']}",
    ]
    if call["idempotency_key"] is not None:
        args.append(f"--key={call['idempotency_key']}")
    run_after = call["run_after"]
    if run_after is not None:
        text = run_after if isinstance(run_after, str) else run_after.isoformat()
        args.append(f"--run-after={text}")
    # After "--", a workflow name starting with "-" is still the positional argument.
    return [*args, "--actor=cli:hypothesis", "--", call["workflow"]]
