"""Where the engine lets a tracer watch its work without knowing it: an enqueue, the
attempts of a claimed batch, a call through the effects ledger.

The tracer is :mod:`tasks_app.observability.tracing`, a layer above the engine, which
installs itself here (:func:`install`) when ``TASKS_TRACING`` is on. Until then, and
whenever tracing is off, each hook checks the module's one flag (``_tracer is None``) and
hands back the shared no-op below: no span, no context, nothing allocated per call.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager
from types import TracebackType
from typing import TYPE_CHECKING, Protocol, TypeVar

if TYPE_CHECKING:
    from tasks_app.engine.enqueueing import EnqueueResult, PreparedItem
    from tasks_app.engine.leases import Claim
    from tasks_app.models import Step

T = TypeVar("T")


class EnqueueTrace(Protocol):
    """The spans of one enqueue (one per item)."""

    def stamped(self, items: list[PreparedItem]) -> list[PreparedItem]:
        """``items``, each with its span's traceparent, which its task row stores."""
        ...

    def created(self, results: Sequence[EnqueueResult]) -> None:
        """The tasks the items made or found, in order (their ids join the spans)."""
        ...


class AttemptsTrace(Protocol):
    """The spans of a claimed batch's attempts, from the claim to each attempt's end."""

    def running(self, claim: Claim) -> AbstractContextManager[object]:
        """While ``claim``'s handler runs: its attempt's span is the current one."""
        ...


class EffectTrace(Protocol):
    """The span of one call through the effects ledger."""

    def wrap(self, call: Callable[[str], T]) -> Callable[[str], T]:
        """``call``, telling the span when it runs (else the ledger replayed its result)."""
        ...


class Tracer(Protocol):
    def enqueue(self, items: Sequence[PreparedItem]) -> AbstractContextManager[EnqueueTrace]: ...
    def attempts(
        self, claims: Sequence[Claim], steps: Mapping[int, Step]
    ) -> AbstractContextManager[AttemptsTrace]: ...
    def effect(self, key: str, name: str) -> AbstractContextManager[EffectTrace]: ...


class _Off:
    """Every hook with tracing off: itself, as a context manager that does nothing."""

    def __enter__(self) -> _Off:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        value: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        return None

    def stamped(self, items: list[PreparedItem]) -> list[PreparedItem]:
        return items

    def created(self, results: Sequence[EnqueueResult]) -> None:
        return None

    def running(self, claim: Claim) -> _Off:
        return self

    def wrap(self, call: Callable[[str], T]) -> Callable[[str], T]:
        return call


OFF = _Off()
_tracer: Tracer | None = None


def install(tracer: Tracer | None) -> None:
    """Have ``tracer`` watch the engine from now on; None: nobody (tracing off)."""
    global _tracer
    _tracer = tracer


def enqueue(items: Sequence[PreparedItem]) -> AbstractContextManager[EnqueueTrace]:
    return OFF if _tracer is None else _tracer.enqueue(items)


def attempts(
    claims: Sequence[Claim], steps: Mapping[int, Step]
) -> AbstractContextManager[AttemptsTrace]:
    return OFF if _tracer is None else _tracer.attempts(claims, steps)


def effect(key: str, name: str) -> AbstractContextManager[EffectTrace]:
    return OFF if _tracer is None else _tracer.effect(key, name)
