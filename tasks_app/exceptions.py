"""The errors callers and handlers see."""

from __future__ import annotations

import traceback
from collections.abc import Sequence
from typing import ClassVar

from django.core.exceptions import PermissionDenied

# Each refusal a caller may show a person carries its HTTP status (``http_status``), the
# way Django's own errors do: 400 bad input, 403 not permitted, 409 not possible now. The
# console answers with it (``console.errors.refusal``); nothing maps them by hand.


class InvalidInput(ValueError):
    """Bad input, refused before anything is written. Names the field and the rule."""

    http_status: ClassVar[int] = 400

    def __init__(self, field: str, rule: str, message: str | None = None) -> None:
        self.field = field
        self.rule = rule
        # Every rule the input broke, this one alone unless made by :func:`all_of`.
        self.errors: tuple[InvalidInput, ...] = (self,)
        super().__init__(message or f"{field}: {rule}")

    @property
    def top_field(self) -> str:
        """The input the error is in: ``payload`` for ``payload.title`` or ``items[2]``."""
        return self.field.split(".", 1)[0].split("[", 1)[0]


class InvalidPayload(InvalidInput):
    pass


class UnknownWorkflow(InvalidInput):
    pass


def all_of(errors: Sequence[InvalidInput]) -> InvalidInput:
    """One error for every rule an input broke, so a person fixes them all at once: the
    first's field and rule, each one's message (``; ``-separated) and each in ``.errors``.
    A single error is itself; several are an :class:`InvalidPayload` when all are."""
    flat = [each for error in errors for each in error.errors]
    if not flat:
        raise ValueError("all_of needs at least one error")
    if len(flat) == 1:
        return flat[0]
    kind = InvalidPayload if all(isinstance(e, InvalidPayload) for e in flat) else InvalidInput
    combined = kind(flat[0].field, flat[0].rule, "; ".join(str(error) for error in flat))
    combined.errors = tuple(flat)
    return combined


def refuse_all(errors: Sequence[InvalidInput]) -> None:
    """Raise :func:`all_of` the errors, if there are any."""
    if errors:
        raise all_of(errors)


class IdempotencyConflict(Exception):
    """The key is taken by a task with a different workflow or payload."""

    http_status: ClassVar[int] = 409

    def __init__(self, idempotency_key: str, task_id: int | None) -> None:
        self.idempotency_key = idempotency_key
        self.task_id = task_id
        holder = f"task #{task_id}" if task_id is not None else "an earlier item of this batch"
        super().__init__(
            f"idempotency key {idempotency_key!r} is taken by {holder} "
            "with a different workflow or payload"
        )


class InvalidTransition(Exception):
    """The action does not apply to the current state."""

    http_status: ClassVar[int] = 409


class AlreadyDecided(InvalidTransition):
    def __init__(self, message: str, *, decided_by: str = "", status: str = "") -> None:
        self.decided_by = decided_by
        self.status = status
        super().__init__(message)


class StaleApproval(InvalidTransition):
    pass


class ApprovalExpired(InvalidTransition):
    pass


class NotPermitted(PermissionDenied):
    http_status: ClassVar[int] = 403


# --- raised by handlers -----------------------------------------------------------------


class HandlerError(Exception):
    """Base of the errors a step handler raises to say how its failure should be treated."""


class RetryableError(HandlerError):
    """Try again after a backoff, while attempts remain."""


class RateLimited(RetryableError):
    """A remote said "too many requests" (HTTP 429), and when to come back: the step is
    retried after ``retry_after`` seconds (its attempt is spent, so a remote that never
    lets it in still dead-letters it in the end), and every limit key the step runs under
    is held until then, so the steps waiting behind it stay pending and spend nothing."""

    def __init__(self, message: str = "", *, retry_after: float) -> None:
        super().__init__(message or f"too many requests: retry after {retry_after:g} s")
        self.retry_after = float(retry_after)


class PermanentError(HandlerError):
    """Retrying cannot help: dead-letter now."""


class OutcomeUnknown(HandlerError):
    """An external write may or may not have happened; a person must decide."""


class EffectNotApplied(RetryableError):
    """The remote definitely did not apply the write (refused before acting)."""


class UndecodableValue(PermanentError):
    """A stored JSON value a step needs cannot be decoded (``models.json_columns``): no
    attempt can run it, so its step is dead-lettered as :data:`UNDECODABLE_PAYLOAD`."""


class RemoteRefused(PermanentError):
    """The remote refused the write for good (a 4xx): it did not happen, and retrying with
    the same request cannot help."""


# The ``error_class`` of a step whose attempt's lease ran out: its process may have died
# running it (a poison step kills every process that runs it), so it is claimed only in a
# batch of its own, never with other steps (``tasks_app.engine.fastpath.claim_batch``).
LEASE_EXPIRED = "lease_expired"
# The ``error_class`` of a step handed back by a worker that does not have its task's
# workflow, version or step kind registered (a rolling deploy): it waits for a worker that
# does, for ``TASKS_VERSION_WAIT_SECONDS``, then is dead-lettered as ``incompatible_version``
# (or ``unknown_step_kind``, when only the kind is missing).
AWAITING_VERSION = "awaiting_version"  # models.AWAITING_VERSION_Q restates it
# The ``error_class`` of a step whose row holds a JSON value no Python process can decode
# (nested past the decoder's recursion limit, stored by SQL): no attempt can run it, so it
# is dead-lettered where a worker or the sweeper meets it (``tasks_app.models.json_columns``).
UNDECODABLE_PAYLOAD = "undecodable_payload"


def error_class(exc: BaseException) -> str:
    """The dotted name a failed step records as its ``error_class``."""
    return f"{type(exc).__module__}.{type(exc).__qualname__}"


def error_text(exc: BaseException) -> str:
    """The traceback a failed step records as its ``last_error`` (its last 10,000 chars)."""
    return "".join(traceback.format_exception(exc, limit=8))[-10_000:]


def error_summary(text: str) -> str:
    """The line of a stored error that says what went wrong: a traceback's last line."""
    lines = [line.strip() for line in (text or "").strip().splitlines() if line.strip()]
    return lines[-1] if lines else ""
