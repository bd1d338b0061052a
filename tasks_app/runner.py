"""Running one claimed step: the handler, its heartbeat, and the classification of its
outcome (DESIGN rule 6)."""

from __future__ import annotations

import json
import logging
import os
import socket
import threading
import time
import traceback

from django.core.exceptions import ValidationError
from django.db import connections

from . import services
from .effects import Effects, LeaseLost
from .exceptions import InvalidInput, OutcomeUnknown, PermanentError
from .models import Step, StepStatus
from .workflows import StepContext, StepSpec, registry

logger = logging.getLogger(__name__)

# Errors that retrying cannot fix: dead-letter at once.
PERMANENT = (PermanentError, InvalidInput, ValidationError)


def worker_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


class Heartbeat(threading.Thread):
    """Renews the lease while the handler runs, on its own database connection.

    It tells the handler (through the context) when the task was cancelled or the lease
    was lost, and stops renewing once the step's timeout has passed so a hung handler's
    lease runs out and the sweeper hands the step to another attempt.
    """

    def __init__(self, claim: services.Claim, ctx: StepContext, timeout: float | None) -> None:
        super().__init__(name=f"heartbeat-{claim.step_id}", daemon=True)
        self.claim = claim
        self.ctx = ctx
        self.deadline = time.monotonic() + timeout if timeout else None
        self.interval = max(claim.lease_seconds / 3, 0.05)
        self._stop_event = threading.Event()

    def run(self) -> None:
        try:
            while not self._stop_event.wait(self.interval):
                if self.deadline is not None and time.monotonic() > self.deadline:
                    logger.warning(
                        "step %s passed its timeout; lease left to expire", self.claim.step_id
                    )
                    return
                try:
                    beat = services.heartbeat(self.claim)
                except Exception:
                    logger.exception("heartbeat failed for step %s", self.claim.step_id)
                    continue
                if beat.cancel_requested:
                    self.ctx._cancelled.set()
                if not beat.alive:
                    self.ctx._lease_lost.set()
                    return
        finally:
            connections.close_all()

    def stop(self) -> None:
        self._stop_event.set()
        self.join(timeout=10)


def _error_text(exc: BaseException) -> str:
    return "".join(traceback.format_exception(exc, limit=8))[-10_000:]


def _error_class(exc: BaseException) -> str:
    return f"{type(exc).__module__}.{type(exc).__qualname__}"


def _dead(claim: services.Claim, error_class: str, message: str, reason: str) -> None:
    services.fail_step(
        claim, error_class=error_class, message=message, retry_in=None, reason=reason
    )


def execute(claim: services.Claim) -> None:
    """Run a claimed step and record its outcome under the claim's fencing token.

    1. Find the workflow version the task was enqueued under; if it is gone, or the step's
       kind is not that version's, dead-letter (``incompatible_version`` /
       ``unknown_step_kind``) rather than run it under other rules.
    2. Build the context (payload, earlier results, attempt, step key, effects ledger) and
       start the heartbeat.
    3. Run the handler and classify: a result completes the step; ``OutcomeUnknown`` and
       permanent errors dead-letter; anything else retries with backoff.
    """
    step = Step.objects.select_related("task").get(pk=claim.step_id)
    task = step.task
    flow = registry.get(task.workflow, task.workflow_version)
    if flow is None:
        _dead(
            claim,
            "incompatible_version",
            f"workflow {task.workflow} v{task.workflow_version} is not registered on this worker",
            "incompatible_version",
        )
        return
    spec = flow.step(step.position)
    if spec is None or spec.kind != step.kind:
        _dead(
            claim,
            "unknown_step_kind",
            f"step kind {step.kind!r} is not registered",
            "unknown_step_kind",
        )
        return

    earlier = (
        task.steps.filter(status=StepStatus.SUCCEEDED, position__lt=step.position)
        .order_by("position", "revision")
        .values_list("kind", "result")
    )
    ctx = StepContext(
        task_id=task.pk,
        step_id=step.pk,
        payload=task.payload,
        results=dict(earlier),
        attempt=claim.attempt,
        fencing_token=claim.token,
        step_key=step.idempotency_key,
        effects=Effects(step_id=step.pk, step_key=step.idempotency_key, fencing_token=claim.token),
        timeout=spec.timeout,
    )
    heartbeat = Heartbeat(claim, ctx, spec.timeout)
    heartbeat.start()
    try:
        result = spec.handler(ctx)
    except LeaseLost as exc:
        logger.warning("step %s lost its lease: %s", step.pk, exc)
        services.fail_step(
            claim, error_class=_error_class(exc), message=str(exc), retry_in=0, reason=""
        )
        return
    except OutcomeUnknown as exc:
        _dead(claim, _error_class(exc), _error_text(exc), "outcome_unknown")
        return
    except PERMANENT as exc:
        _dead(claim, _error_class(exc), _error_text(exc), "permanent_error")
        return
    except Exception as exc:
        _retry(claim, spec, exc)
        return
    finally:
        heartbeat.stop()
    try:
        json.dumps(result, allow_nan=False)
    except (TypeError, ValueError) as exc:
        _dead(claim, "invalid_result", f"handler result is not JSON: {exc}", "permanent_error")
        return
    services.complete_step(claim, result)


def _retry(claim: services.Claim, spec: StepSpec, exc: Exception) -> None:
    services.fail_step(
        claim,
        error_class=_error_class(exc),
        message=_error_text(exc),
        retry_in=spec.backoff(claim.attempt),
        reason="",
    )


def run_claimed(step_id: int) -> bool:
    """Claim ``step_id`` and run it; False when there was nothing to claim."""
    claim = services.claim_step(step_id, worker_id=worker_id())
    if claim is None:
        return False
    execute(claim)
    return True
