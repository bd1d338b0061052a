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
    RateLimited,
    RetryableError,
    refuse_all,
)
from tasks_app.workflows import Limit, StepContext, StepSpec, Workflow, register

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


# The demo's model provider lets six calls a minute in, and one summary per customer runs at
# a time: the seed's dozen summaries (seed_demo.SUMMARIES) wait for each in turn.
DEMO_LLM = Limit("demo_llm", rate="6/m")
DEMO_CUSTOMER = Limit("demo_customer", concurrency=1, key="customer_id")
# Seconds a page of a document takes to summarize, and the longest a summary takes.
SECONDS_PER_PAGE = 0.5
MAX_SUMMARY_SECONDS = 5.0
# What the fake provider asks for when it answers 429.
RETRY_AFTER_SECONDS = 30.0


def validate_summary(payload: dict[str, Any]) -> None:
    errors: list[InvalidInput] = []
    customer = payload.get("customer_id")
    if not isinstance(customer, str) or not customer:
        errors.append(
            InvalidPayload("payload.customer_id", "required", "payload.customer_id: text")
        )
    for name, lowest in (("pages", 1), ("throttled_first", 0)):
        value = payload.get(name, lowest)
        if isinstance(value, bool) or not isinstance(value, int) or not lowest <= value <= 1000:
            errors.append(
                InvalidPayload(
                    f"payload.{name}", "range", f"payload.{name}: a whole number {lowest}-1000"
                )
            )
    refuse_all(errors)


def llm_summary(ctx: StepContext) -> dict[str, Any]:
    """A stand-in for a call to a language model that summarizes a customer's document:
    it takes half a second a page (at most five), and on its first ``throttled_first``
    claims the provider answers 429, so the step and every step under its limits wait the
    provider's retry-after (``RateLimited``)."""
    payload = ctx.payload
    if ctx.fencing_token <= int(payload.get("throttled_first", 0)):
        raise RateLimited("the model provider answered 429", retry_after=RETRY_AFTER_SECONDS)
    pages = int(payload.get("pages", 1))
    pause(ctx, min(pages * SECONDS_PER_PAGE, MAX_SUMMARY_SECONDS))
    document = str(payload.get("document", "a document"))
    return {
        "summary": f"{document}, {pages} page{'s' if pages != 1 else ''}: the key points.",
        "model": "demo-llm",
        "tokens": 350 * pages,
    }


register(
    Workflow(
        "demo.llm_summary",
        1,
        steps=(StepSpec("summarize", llm_summary, limits=(DEMO_LLM, DEMO_CUSTOMER)),),
        validate_payload=validate_summary,
        description="Summarizes a customer's document with a rate-limited model, one at a "
        "time per customer.",
    )
)
