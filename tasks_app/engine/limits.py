"""Flow control: limits on how many steps run at once and how many start per period.

A :class:`Limit` is declared with a workflow (on every step) or with one step kind, and is
optionally partitioned by a key computed from the payload (``key="customer_id"``): then
each key has the limit to itself. ``concurrency`` caps the steps running at once;
``rate`` caps the claims per period (``"200/s"``, ``"1000/m"``, ``"50/10s"``), each claim
spending its ``weight`` (1, or a number computed from the payload, such as the tokens a
call will spend). One limit may be shared by several workflows (the same remote), by
declaring the same :class:`Limit` object in each.

The numbers come from three places, the later winning: the declaration in code, the
``TASKS_LIMITS`` setting (per environment: ``{"llm": {"rate": "300/m"}}``), and a change an
operator made live (``LimitState``, ``tasks_app.operations.limits``). Enqueue records on
each step the limits it is under, with its key and weight, and the step's turn (fairness:
``tasks_app.engine.limited_claims``); the claim enforces them.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from django.conf import settings

from tasks_app.exceptions import InvalidPayload

if TYPE_CHECKING:
    from tasks_app.engine.workflows import StepSpec, Workflow

NAME = re.compile(r"^[a-z0-9][a-z0-9_.-]{0,63}$")
_RATE = re.compile(r"^\s*(\d+)\s*/\s*(\d*(?:\.\d+)?)\s*([smh])\s*$")
_UNIT_SECONDS = {"s": 1.0, "m": 60.0, "h": 3600.0}
# The longest partition key kept (a payload value, turned into text).
MAX_KEY_LENGTH = 200

PayloadValue = Callable[[Mapping[str, Any]], Any]


@dataclass(frozen=True)
class Rate:
    """At most ``count`` units per ``seconds``."""

    count: int
    seconds: float

    def __post_init__(self) -> None:
        if self.count < 1 or not math.isfinite(self.seconds) or self.seconds <= 0:
            raise ValueError(f"rate {self}: needs a count of at least 1 and a period above 0")

    @classmethod
    def parse(cls, text: str | Rate) -> Rate:
        """``"200/s"``, ``"1000/m"``, ``"50/10s"``, ``"5/h"``."""
        if isinstance(text, Rate):
            return text
        match = _RATE.match(str(text))
        if match is None:
            raise ValueError(f"rate {text!r}: write it as count/period, such as 200/s or 50/10s")
        count, number, unit = match.groups()
        return cls(int(count), float(number or 1) * _UNIT_SECONDS[unit])

    def __str__(self) -> str:
        for unit, seconds in (("h", 3600.0), ("m", 60.0), ("s", 1.0)):
            if self.seconds == seconds:
                return f"{self.count}/{unit}"
        return f"{self.count}/{self.seconds:g}s"


@dataclass(frozen=True)
class Numbers:
    """A limit's numbers in effect: ``None`` where it sets no such cap."""

    concurrency: int | None
    rate: Rate | None

    def __post_init__(self) -> None:
        if self.concurrency is not None and self.concurrency < 0:
            raise ValueError("concurrency: 0 or more (0 lets nothing start)")


@dataclass(frozen=True)
class Limit:
    name: str
    concurrency: int | None = None
    rate: Rate | str | None = None
    # A payload field's name, or a function of the payload; None: one limit for all.
    key: str | PayloadValue | None = None
    # A payload field's name, or a function of the payload: the units a claim spends of
    # the rate (1 when not given).
    weight: str | PayloadValue | None = None

    def __post_init__(self) -> None:
        if not NAME.match(self.name):
            raise ValueError(
                f"limit {self.name!r}: 1-64 lowercase letters, digits, '_', '.' or '-'"
            )
        if self.rate is not None:
            object.__setattr__(self, "rate", Rate.parse(self.rate))
        if self.concurrency is None and self.rate is None:
            raise ValueError(f"limit {self.name}: set concurrency, rate or both")
        if self.concurrency is not None and self.concurrency < 1:
            raise ValueError(f"limit {self.name}: concurrency must be at least 1")
        if self.weight is not None and self.rate is None:
            raise ValueError(f"limit {self.name}: a weight needs a rate to spend it on")

    @property
    def declared(self) -> Numbers:
        rate = self.rate if isinstance(self.rate, Rate) else None
        return Numbers(self.concurrency, rate)

    def key_of(self, payload: Mapping[str, Any]) -> str:
        """The partition this payload's steps fall in ('' for an unpartitioned limit)."""
        if self.key is None:
            return ""
        value = _read(self.key, payload, self.name, "key")
        if isinstance(value, bool) or not isinstance(value, str | int):
            raise _refusal(self.key, self.name, "key", "text or a whole number")
        text = str(value)
        if not text or len(text) > MAX_KEY_LENGTH:
            raise _refusal(self.key, self.name, "key", f"1 to {MAX_KEY_LENGTH} characters")
        return text

    def weight_of(self, payload: Mapping[str, Any], numbers: Numbers) -> int:
        """The units a claim of this payload's step spends of the rate."""
        if self.weight is None:
            return 1
        value = _read(self.weight, payload, self.name, "weight")
        ceiling = numbers.rate.count if numbers.rate else None
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise _refusal(self.weight, self.name, "weight", "a whole number of at least 1")
        if ceiling is not None and value > ceiling:
            raise _refusal(
                self.weight, self.name, "weight", f"at most the rate's {ceiling} per period"
            )
        return int(value)


def _read(source: str | PayloadValue, payload: Mapping[str, Any], name: str, what: str) -> Any:
    if callable(source):
        try:
            return source(payload)
        except Exception as exc:
            raise InvalidPayload(
                "payload",
                f"limit_{what}",
                f"payload: the {what} of limit {name} cannot be computed from it "
                f"({type(exc).__name__}: {exc})",
            ) from exc
    if source not in payload:
        raise _refusal(source, name, what, "required")
    return payload[source]


def _refusal(source: str | PayloadValue, name: str, what: str, rule: str) -> InvalidPayload:
    field = f"payload.{source}" if isinstance(source, str) else "payload"
    return InvalidPayload(
        field, f"limit_{what}", f"{field}: the {what} of limit {name} must be {rule}"
    )


def of_step(workflow: Workflow, spec: StepSpec) -> tuple[Limit, ...]:
    """The limits a step kind runs under: its workflow's, then its own (none for an
    approval step, which no worker claims)."""
    return () if spec.approval else workflow.limits + spec.limits


def declared() -> dict[str, Limit]:
    """Every limit the registered workflows declare, by name."""
    from tasks_app.engine.workflows import registry

    return registry.limits()


def configured(limit: Limit) -> Numbers:
    """The declaration's numbers with ``TASKS_LIMITS`` applied (an operator's live change
    wins over both: ``limit_standing.numbers``)."""
    override = getattr(settings, "TASKS_LIMITS", {}).get(limit.name)
    if not override:
        return limit.declared
    numbers = limit.declared
    concurrency = override.get("concurrency", numbers.concurrency)
    rate = override.get("rate", numbers.rate)
    return Numbers(concurrency, Rate.parse(rate) if rate is not None else None)


def check_settings(known: Mapping[str, Limit]) -> list[str]:
    """What is wrong with ``TASKS_LIMITS`` (each problem in words; empty when nothing)."""
    problems = []
    for name, override in getattr(settings, "TASKS_LIMITS", {}).items():
        if not isinstance(override, Mapping) or set(override) - {"concurrency", "rate"}:
            problems.append(f"TASKS_LIMITS[{name!r}]: a dict of concurrency and rate")
            continue
        concurrency = override.get("concurrency")
        if concurrency is not None and (
            isinstance(concurrency, bool) or not isinstance(concurrency, int) or concurrency < 0
        ):
            problems.append(f"TASKS_LIMITS[{name!r}]['concurrency']: a whole number, 0 or more")
        if override.get("rate") is not None:
            try:
                Rate.parse(override["rate"])
            except ValueError as exc:
                problems.append(f"TASKS_LIMITS[{name!r}]['rate']: {exc}")
        if name not in known:
            problems.append(f"TASKS_LIMITS[{name!r}]: no workflow declares a limit of that name")
    return problems


@dataclass(frozen=True)
class Placement:
    """Where one enqueued item's steps stand under limits: per position, the limits as
    stored on the step (``[[name, key, weight], ...]``, or None when it has none), and the
    limit and key its turns are counted in (the first partitioned one, else the first)."""

    steps: tuple[list[list[Any]] | None, ...]
    turn_key: tuple[str, str] | None


def place(workflow: Workflow, payload: Mapping[str, Any]) -> Placement:
    """The limits of each of ``workflow``'s steps for ``payload``; raises
    :class:`InvalidPayload` naming the field when a key or weight cannot be read."""
    if not workflow.limited:
        return Placement(tuple(None for _ in workflow.steps), None)
    stored: list[list[list[Any]] | None] = []
    turn_key: tuple[str, str] | None = None
    first: tuple[str, str] | None = None
    for spec in workflow.steps:
        own = of_step(workflow, spec)
        entries = []
        for limit in own:
            key = limit.key_of(payload)
            entries.append([limit.name, key, limit.weight_of(payload, configured(limit))])
            first = first or (limit.name, key)
            if turn_key is None and limit.key is not None:
                turn_key = (limit.name, key)
        stored.append(entries or None)
    return Placement(tuple(stored), turn_key or first)
