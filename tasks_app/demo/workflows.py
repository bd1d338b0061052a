"""Workflows shipped for demos, tests and the benchmark."""

from __future__ import annotations

import os
import random
import signal
import time
from typing import Any

from tasks_app.exceptions import (
    InvalidInput,
    InvalidPayload,
    OutcomeUnknown,
    PermanentError,
    RetryableError,
    refuse_all,
)
from tasks_app.workflows import StepContext, StepSpec, Workflow, register

FLAKY_ERRORS = {
    "retryable": RetryableError,
    "permanent": PermanentError,
    "outcome_unknown": OutcomeUnknown,
    # Not an exception: the process running the step dies (a poison step).
    "crash": None,
}


def noop(ctx: StepContext) -> dict[str, Any]:
    return {}


def validate_flaky(payload: dict[str, Any]) -> None:
    def bad(name: str, rule: str, message: str) -> InvalidPayload:
        return InvalidPayload(f"payload.{name}", rule, f"payload.{name}: {message}")

    errors: list[InvalidInput] = []
    for name in ("fail_first", "seed"):
        value = payload.get(name, 0)
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            errors.append(bad(name, "non_negative_integer", "must be an integer >= 0"))
    for name, upper in (("fail_rate", 1.0), ("sleep", 3600.0)):
        value = payload.get(name, 0)
        if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value <= upper:
            errors.append(bad(name, "range", f"must be a number from 0 to {upper:g}"))
    error = payload.get("error", "retryable")
    if not isinstance(error, str) or error not in FLAKY_ERRORS:
        errors.append(bad("error", "choice", f"must be one of {', '.join(FLAKY_ERRORS)}"))
    refuse_all(errors)


def pause(ctx: StepContext, seconds: float) -> None:
    """Sleep for ``seconds``, or less once the step should stop (cancelled, lease lost)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and not ctx.should_stop:
        time.sleep(min(0.05, max(deadline - time.monotonic(), 0)))


def _fail(error: str, message: str) -> None:
    exception = FLAKY_ERRORS[error]
    if exception is None:
        os.kill(os.getpid(), signal.SIGKILL)
    else:
        raise exception(message)


def flaky(ctx: StepContext) -> dict[str, Any]:
    """Fails on its first ``fail_first`` claims over the step's whole life (its fencing
    token, so a redrive can succeed), then with probability ``fail_rate``. The error
    ``crash`` kills the process running the step instead of raising."""
    payload = ctx.payload
    if payload.get("sleep"):
        pause(ctx, float(payload["sleep"]))
    error = payload.get("error", "retryable")
    if ctx.fencing_token <= int(payload.get("fail_first", 0)):
        token, first = ctx.fencing_token, payload["fail_first"]
        _fail(error, f"failing on claim {token} of {first} (fail_first)")
    rate = float(payload.get("fail_rate", 0))
    if rate and random.Random(f"{payload.get('seed', 0)}:{ctx.fencing_token}").random() < rate:
        _fail(error, f"failing on claim {ctx.fencing_token} (fail_rate {rate})")
    return {"token": ctx.fencing_token, "attempt": ctx.attempt}


register(Workflow("demo.noop", 1, steps=(StepSpec("noop", noop),), description="Does nothing."))
register(
    Workflow(
        "demo.flaky",
        1,
        steps=(StepSpec("flaky", flaky, max_attempts=3, backoff_base=0.1, backoff_cap=1.0),),
        validate_payload=validate_flaky,
        description="Fails on demand, for retries and dead letters.",
    )
)
