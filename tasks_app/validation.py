"""Input rules for enqueue (DESIGN §4). Every rejection names the field and the rule."""

from __future__ import annotations

import hashlib
import json
import math
import re
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.utils import timezone

from tasks_app.exceptions import InvalidInput, InvalidPayload, refuse_all

MAX_PAYLOAD_BYTES = 65_536
MAX_DEPTH = 32
# Python writes floats from 1e16 up in exponent form, which PostgreSQL's jsonb keeps as an
# integer-valued decimal and hands back as an int (1e23 comes back as 10**23).
MAX_JSON_FLOAT = 1e16
MIN_PRIORITY, MAX_PRIORITY = -100, 100
# Integers up to 1,000 digits round-trip through PostgreSQL's jsonb and Python alike.
MAX_INT_DIGITS = 1000
MAX_INT_BITS = 3321  # 2**3321 < 10**1000 < 2**3322: below it, no need to compare
INT_LIMIT = 10**MAX_INT_DIGITS
# How many broken rules one refusal of a payload lists; the walk stops there.
MAX_ERRORS = 50


def _dumps(payload: Any) -> str:
    return json.dumps(
        payload, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
    )


def _unsigned_float(token: str) -> float:
    return float(token) or 0.0  # -0.0 is falsy, so both zeros come back as 0.0


def canonical_json(payload: Any) -> str:
    """The canonical form (DESIGN rule 4), with every negative zero written as ``0.0``.

    PostgreSQL's jsonb keeps no sign on zero: a payload with ``-0.0`` is read back with
    ``0.0``, so its hash and the stored payload are both taken from this form, or the
    stored payload would no longer match its own key. Python writes negative zero as
    ``-0.0`` only; when that text appears (in a string too, rarely), the numbers are read
    back unsigned and written again, which leaves every string and other number as it was.
    """
    text = _dumps(payload)
    if "-0.0" in text:
        text = _dumps(json.loads(text, parse_float=_unsigned_float))
    return text


def payload_hash(workflow: str, canonical: str) -> str:
    return hashlib.sha256(f"{workflow}\n{canonical}".encode()).hexdigest()


def _string_errors(value: str, where: str, field: str) -> list[InvalidInput]:
    if "\x00" in value:
        return [InvalidPayload(field, "no_nul", f"{field}: {where} contains \\u0000")]
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return [
            InvalidPayload(field, "valid_unicode", f"{field}: {where} contains a lone surrogate")
        ]
    return []


def validate_payload(payload: Any, *, field: str = "payload") -> str:
    """Check ``payload`` against the rules and return its canonical JSON; refuse it with
    every rule it breaks at once (:func:`tasks_app.exceptions.all_of`).

    1. The top value is a dict (a JSON object).
    2. One walk that stops at the first thing it doubts (:func:`plainly_valid`): the
       payloads producers send pass it. The strings are checked on the canonical text
       instead: its UTF-8 encoding (which the size check needs anyway) finds a lone
       surrogate, and JSON writes a NUL as ``\\u0000``.
    3. A payload in doubt is walked again by :func:`payload_errors`, which names where
       each broken rule is, up to :data:`MAX_ERRORS`.
    4. The canonical form's size in UTF-8 bytes is checked last.
    """
    if not isinstance(payload, dict):
        raise _bad(field, "object", "must be a JSON object")
    if not plainly_valid(payload):
        refuse_all(payload_errors(payload, field=field))
    canonical = canonical_json(payload)
    try:
        size = len(canonical.encode("utf-8"))
    except UnicodeEncodeError:
        size = None
    if size is None or "\\u0000" in canonical:
        # A lone surrogate or a NUL somewhere (or a string that spells one out): say where.
        refuse_all(payload_errors(payload, field=field))
    if size is None:
        raise _bad(field, "valid_unicode", "contains a lone surrogate")
    if size > MAX_PAYLOAD_BYTES:
        raise _bad(field, "max_bytes", f"canonical JSON is larger than {MAX_PAYLOAD_BYTES} bytes")
    return canonical


def _bad(field: str, rule: str, message: str) -> InvalidPayload:
    return InvalidPayload(field, rule, f"{field}: {message}")


def plainly_valid(payload: dict[Any, Any]) -> bool:
    """Whether the structure and numbers of ``payload`` keep every rule (strings aside):
    a walk that keeps no paths and stops at the first doubt."""
    stack: list[tuple[Any, int]] = [(payload, 1)]
    while stack:
        value, depth = stack.pop()
        kind = type(value)
        if kind is str or kind is bool or value is None:
            continue
        if kind is dict:
            if depth > MAX_DEPTH:
                return False
            for key, item in value.items():
                if type(key) is not str:
                    return False
                stack.append((item, depth + 1))
        elif kind is list:
            if depth > MAX_DEPTH:
                return False
            stack.extend((item, depth + 1) for item in value)
        elif kind is int:
            if value.bit_length() > MAX_INT_BITS:
                return False
        elif kind is float:
            if not math.isfinite(value) or abs(value) >= MAX_JSON_FLOAT:
                return False
        else:
            # Subclasses and every other type: the full walk decides.
            return False
    return True


def payload_errors(payload: dict[Any, Any], *, field: str = "payload") -> list[InvalidInput]:
    """Every rule ``payload`` breaks (up to :data:`MAX_ERRORS`), each saying where: the walk
    of a payload :func:`validate_payload` doubts. Iterative (no recursion, so a deep
    payload cannot blow the stack); a value too deep is not walked further."""

    def bad(rule: str, message: str) -> InvalidPayload:
        return InvalidPayload(field, rule, f"{field}: {message}")

    errors: list[InvalidInput] = []
    stack: list[tuple[Any, int, str]] = [(payload, 1, "$")]
    while stack and len(errors) < MAX_ERRORS:
        value, depth, where = stack.pop()
        if isinstance(value, dict | list) and depth > MAX_DEPTH:
            errors.append(bad("max_depth", f"nesting deeper than {MAX_DEPTH} levels at {where}"))
        elif isinstance(value, dict):
            for key, item in value.items():
                if not isinstance(key, str):
                    errors.append(bad("string_keys", f"key {key!r} at {where} is not a string"))
                    continue
                errors.extend(_string_errors(key, f"key at {where}", field))
                stack.append((item, depth + 1, f"{where}.{key}"))
        elif isinstance(value, list):
            for index, item in enumerate(value):
                stack.append((item, depth + 1, f"{where}[{index}]"))
        elif isinstance(value, str):
            errors.extend(_string_errors(value, where, field))
        elif isinstance(value, bool) or value is None:
            pass
        elif isinstance(value, int):
            # Checked by size, not by printing it: Python refuses to print integers of
            # more than 4,300 digits, and nothing this large is a business value.
            if value.bit_length() > MAX_INT_BITS and abs(value) >= INT_LIMIT:
                errors.append(
                    bad(
                        "integer_range",
                        f"{where} is an integer of more than {MAX_INT_DIGITS} digits; "
                        "send it as a string",
                    )
                )
        elif isinstance(value, float):
            if not math.isfinite(value):
                errors.append(bad("finite_numbers", f"{where} is NaN or Infinity"))
            elif abs(value) >= MAX_JSON_FLOAT:
                errors.append(
                    bad(
                        "float_range",
                        f"{where} is a float of 1e16 or more, which does not round-trip; "
                        "send an int or a string",
                    )
                )
        else:
            errors.append(
                bad(
                    "json_types",
                    f"{where} is a {type(value).__name__}, which does not round-trip through JSON",
                )
            )
    return errors


def validate_idempotency_key(key: Any) -> str | None:
    if key is None:
        return None
    if not isinstance(key, str):
        raise InvalidInput("idempotency_key", "string", "idempotency_key: must be a string or None")
    if not 1 <= len(key) <= 255:
        raise InvalidInput("idempotency_key", "length", "idempotency_key: 1 to 255 characters")
    if any(not ("!" <= ch <= "~") for ch in key):
        raise InvalidInput(
            "idempotency_key",
            "printable_ascii",
            "idempotency_key: printable ASCII characters only, no spaces",
        )
    if key.startswith("task-"):
        raise InvalidInput(
            "idempotency_key", "reserved_prefix", "idempotency_key: may not start with 'task-'"
        )
    return key


def validate_queue(queue: Any, *, field: str = "queue") -> str:
    if not isinstance(queue, str) or queue not in settings.TASKS_QUEUES:
        raise InvalidInput(
            field, "known_queue", f"{field}: must be one of {', '.join(settings.TASKS_QUEUES)}"
        )
    return queue


def validate_priority(priority: Any) -> int:
    if isinstance(priority, bool) or not isinstance(priority, int):
        raise InvalidInput("priority", "integer", "priority: must be an integer")
    value: int = priority
    if not MIN_PRIORITY <= value <= MAX_PRIORITY:
        raise InvalidInput(
            "priority", "range", f"priority: must be from {MIN_PRIORITY} to {MAX_PRIORITY}"
        )
    return value


def validate_run_after(run_after: Any) -> datetime | None:
    if run_after is None:
        return None
    if not isinstance(run_after, datetime):
        raise InvalidInput("run_after", "datetime", "run_after: must be a datetime")
    if timezone.is_naive(run_after):
        raise InvalidInput("run_after", "timezone_aware", "run_after: must be timezone-aware")
    return run_after


def require_text(value: Any, field: str) -> str:
    if not isinstance(value, str) or not value.strip():
        raise InvalidInput(field, "required", f"{field}: is required and may not be empty")
    return value.strip()


# How far ahead an operator may put off a dead step's next run (``redrive_later``).
MAX_DELAY = timedelta(days=7)
DELAY_RULE = (
    "more than 0 and at most 7 days: minutes (15), or a number and s, m, h or d (90s, 5m, 1h, 2d)"
)
_DELAY_TEXT = re.compile(r"(\d{1,9})\s*([smhd]?)")
_DELAY_UNITS = {"": "minutes", "s": "seconds", "m": "minutes", "h": "hours", "d": "days"}


def validate_delay(value: Any, *, field: str = "delay") -> timedelta:
    """A delay as a :class:`timedelta`, from a timedelta, a whole number of seconds or
    text as people type it (``15`` minutes, ``90s``, ``5m``, ``1h``, ``2d``); more than 0
    and at most :data:`MAX_DELAY`, else :class:`InvalidInput` naming ``field``."""
    if isinstance(value, str):
        match = _DELAY_TEXT.fullmatch(value.strip().lower())
        if match is None:
            raise InvalidInput(field, "format", f"{field}: {DELAY_RULE}")
        value = timedelta(**{_DELAY_UNITS[match[2]]: int(match[1])})
    elif isinstance(value, int) and not isinstance(value, bool):
        # Clamped first: a huge number of seconds is no timedelta at all.
        value = timedelta(seconds=max(-1, min(value, MAX_DELAY.total_seconds() + 1)))
    if not isinstance(value, timedelta):
        raise InvalidInput(field, "format", f"{field}: {DELAY_RULE}")
    if not timedelta(0) < value <= MAX_DELAY:
        raise InvalidInput(field, "range", f"{field}: {DELAY_RULE}")
    return value
