"""Running claimed steps: draining a queue in batches, the handlers, and the classification
of each outcome (DESIGN rule 6); the leases are renewed meanwhile by
:mod:`tasks_app.engine.lease_keeper`."""

from __future__ import annotations

import logging
import os
import socket
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.core.exceptions import ValidationError

from tasks_app.db import clock
from tasks_app.engine import crashes, fan_outs, fastpath, leases, limited_claims, stopping
from tasks_app.engine.dispatch import Doorbell, ring_on_commit
from tasks_app.engine.effects import LeaseLost
from tasks_app.engine.lease_keeper import lease_keeper
from tasks_app.engine.limit_keys import hold
from tasks_app.engine.tracing_hooks import attempts as attempt_spans
from tasks_app.engine.transitions import completes_alone, step_context
from tasks_app.engine.workflows import StepContext, StepSpec, Workflow, registry
from tasks_app.exceptions import (
    AWAITING_VERSION,
    UNDECODABLE_PAYLOAD,
    InvalidInput,
    OutcomeUnknown,
    PermanentError,
    RateLimited,
    UndecodableValue,
    error_class,
    error_text,
)
from tasks_app.models import Step, Task
from tasks_app.models.json_columns import first_undecodable, strict_json

logger = logging.getLogger(__name__)

# Errors that retrying cannot fix: dead-letter at once.
PERMANENT = (PermanentError, InvalidInput, ValidationError)
# A batch grows while its steps take less than this each, and shrinks once a batch takes
# longer than the second figure.
FAST_STEP_SECONDS = 0.01
SLOW_BATCH_SECONDS = 1.0
# Why a stopping worker hands back the claims it has not started.
WORKER_STOPPING = "worker_stopping"


def worker_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


def _dead(claim: leases.Claim, error_class: str, message: str, reason: str) -> None:
    lease_keeper.forget(claim)
    leases.fail_step(claim, error_class=error_class, message=message, retry_in=None, reason=reason)


# What _run_one returns once the step's outcome is recorded (it failed): nothing left to
# complete.
_RECORDED = object()


def execute(claim: leases.Claim) -> None:
    """Run one claimed step and record its outcome under its fencing token."""
    run_batch([claim])


def run_batch(claims: Sequence[leases.Claim]) -> int:
    """Run claimed steps one after another and record their outcomes; returns how many
    returned a result (the rest failed: retried or dead-lettered).

    Failures are recorded as they happen; successes are recorded together at the end in
    one transaction (:func:`fastpath.complete_many`), each still fenced by its token, except
    those that reach an approval step (recorded one by one, opening its request). The
    lease keeper keeps every lease of the batch alive until then. The batch and the step
    running are kept in the process's claims record, so that if a step kills the process
    the others are handed back at once, uncharged (:mod:`tasks_app.engine.crashes`).
    """
    if not claims:
        return 0
    rows = {claim.step_id: claim.step for claim in claims if claim.step is not None}
    if len(rows) < len(claims):
        rows = Step.objects.select_related("task").in_bulk([claim.step_id for claim in claims])
    # Each attempt's span, from here to its end (tracing_hooks: nothing with tracing off).
    with attempt_spans(claims, rows) as attempts:
        lease_keeper.watch(claims)
        # Where the parent finds what this process holds, should a step kill it (crashes).
        crashes.record.holding(claims)
        succeeded: list[tuple[leases.Claim, Any]] = []
        try:
            for index, claim in enumerate(claims):
                if stopping.is_stopping():
                    _hand_back(claims[index:])
                    break
                crashes.record.running(index)
                with attempts.running(claim):  # a handler's own spans are the attempt's
                    result = _run_one(claim, rows[claim.step_id])
                if result is not _RECORDED:
                    succeeded.append((claim, result))
            crashes.record.running(len(claims))
        finally:
            for claim in claims:
                lease_keeper.forget(claim)
        # A step of a graph, and a success that reaches an approval step (which opens its
        # request in the same transaction), are recorded one by one; the rest together.
        together: list[tuple[leases.Claim, Any]] = []
        one_by_one: list[tuple[leases.Claim, Any]] = []
        for claim, result in succeeded:
            step = rows[claim.step_id]
            alone = completes_alone(step.task, step)
            (one_by_one if alone else together).append((claim, result))
        fastpath.complete_many(together)
        for claim, result in one_by_one:
            leases.complete_step(claim, result)
        crashes.record.clear()
        return len(succeeded)


def _hand_back(claims: Sequence[leases.Claim]) -> None:
    """The worker is stopping (:mod:`tasks_app.engine.stopping`): release the claims whose
    handlers have not started, uncharged and due again at once, each with its doorbell
    (``claim_released``, reason ``worker_stopping``), for another worker to run now rather
    than this one holding the rest of its batch up to its end."""
    for claim in claims:
        lease_keeper.forget(claim)
        leases.release_claim(
            claim, actor=f"worker:{claim.worker_id}", reason=WORKER_STOPPING, ran=False
        )


def _run_one(claim: leases.Claim, step: Step) -> Any:
    """Run one handler; returns its result, or ``_RECORDED`` once its outcome is recorded.

    1. Find the workflow version the task was enqueued under and the step's kind in it; if
       this worker lacks either (a new workflow, a new version, a kind it does not have),
       never run it under other rules: hand it back to wait for a worker that has them (a
       rolling deploy; :func:`_await_version`), and dead-letter it once it waited too long.
    2. Build the context (payload, earlier results, attempt, step key, effects ledger).
    3. Run the handler and classify: a JSON result is returned; ``OutcomeUnknown`` and
       permanent errors dead-letter; anything else retries with backoff.
    """
    task = step.task
    flow = registry.get(task.workflow, task.workflow_version)
    spec = flow.step(step.position) if flow is not None else None
    if spec is None or spec.kind != step.kind:
        _await_version(claim, task, step, flow)
        return _RECORDED

    if spec.approval:
        # Opened when its task reaches it, never claimed: a claim means a bug elsewhere.
        _dead(
            claim,
            "unexpected_claim",
            f"approval step {step.kind!r} is opened when its task reaches it, not run",
            "permanent_error",
        )
        return _RECORDED
    ctx = step_context(task, step, attempt=claim.attempt, token=claim.token, timeout=spec.timeout)
    unreadable = _undecodable_input(ctx)
    if unreadable is not None:
        _dead(claim, UNDECODABLE_PAYLOAD, unreadable, UNDECODABLE_PAYLOAD)
        return _RECORDED
    if spec.fan_out is not None:
        try:
            ctx.item, ctx.item_index = fan_outs.item_of(spec, ctx.results, step.item), step.item
        except ValueError as exc:
            _dead(claim, fan_outs.FAN_OUT_REFUSED, str(exc), "permanent_error")
            return _RECORDED
    lease_keeper.started(claim, ctx, spec.timeout)
    try:
        result = spec.handler(ctx)
    except LeaseLost as exc:
        logger.warning("step %s lost its lease: %s", step.pk, exc)
        lease_keeper.forget(claim)
        leases.fail_step(
            claim, error_class=error_class(exc), message=str(exc), retry_in=0, reason=""
        )
    except OutcomeUnknown as exc:
        _dead(claim, error_class(exc), error_text(exc), "outcome_unknown")
    except UndecodableValue as exc:
        _dead(claim, UNDECODABLE_PAYLOAD, str(exc), UNDECODABLE_PAYLOAD)
    except PERMANENT as exc:
        _dead(claim, error_class(exc), error_text(exc), "permanent_error")
    except RateLimited as exc:
        # The remote's own word on when to come back: the keys the step runs under wait
        # that long too, so the steps behind it are not claimed only to meet a 429 as well.
        lease_keeper.forget(claim)
        seconds = hold(step.limits or (), exc.retry_after, error_text(exc))
        message = error_text(exc)
        leases.fail_step(
            claim, error_class=error_class(exc), message=message, retry_in=seconds, reason=""
        )
    except Exception as exc:
        _retry(claim, spec, exc)
    else:
        try:
            strict_json(result)
        except (TypeError, ValueError) as exc:
            _dead(claim, "invalid_result", f"handler result is not JSON: {exc}", "permanent_error")
        else:
            return result
    return _RECORDED


def _undecodable_input(ctx: StepContext) -> str | None:
    """What of a handler's input cannot be decoded (``models.json_columns``), said for the
    step's error; None when all of it can. Such a step is dead-lettered before its handler
    runs: no attempt could read what it needs."""
    return first_undecodable(
        {
            f"payload of task {ctx.task_id}": ctx.payload,
            f"change request of step {ctx.step_id}": ctx.change_request,
            **{f"result of step {kind!r}": result for kind, result in ctx.results.items()},
        }
    )


def _await_version(claim: leases.Claim, task: Task, step: Step, flow: Workflow | None) -> None:
    """A step this worker cannot run by its task's rules: the workflow (by name or by
    version) is not registered here, or that version has no such step kind. During a
    rolling deploy a producer on the new code enqueues what only the new workers know, so
    the step is handed back uncharged, due again in ``TASKS_VERSION_RETRY_SECONDS``,
    marked ``awaiting_version`` (the console shows it, ``tasks_steps_awaiting_version``
    counts it), for a worker that has it to take.

    A worker that lacks it and claims it once ``TASKS_VERSION_WAIT_SECONDS`` have passed
    since it was first handed back dead-letters it: ``incompatible_version`` for a missing
    workflow or version, ``unknown_step_kind`` for a missing kind (DESIGN rule 6). The wait
    is measured by the database's clock (rule 3): the first hand-back records when it began
    (``waiting_since``), so a worker with a slow clock cannot cut it short."""
    lease_keeper.forget(claim)
    now = clock.db_now()
    since = leases.awaiting_version_since(task.pk, claim.step_id)
    waited = 0.0 if since is None else (now - since).total_seconds()
    versions = ", ".join(f"v{v}" for v in registry.versions(task.workflow)) or "no version"
    wanted = f"workflow {task.workflow} v{task.workflow_version}"
    if flow is None:
        dead_as, has = "incompatible_version", f"has {versions}"
    else:
        wanted = f"step kind {step.kind!r} (position {step.position}) of {wanted}"
        kinds = ", ".join(spec.kind for spec in flow.steps)
        dead_as, has = "unknown_step_kind", f"has {kinds} in v{flow.version}"
    if waited >= settings.TASKS_VERSION_WAIT_SECONDS:
        leases.fail_step(
            claim,
            error_class=dead_as,
            message=f"{wanted} is not registered on any worker that claimed it in "
            f"{round(waited)} s of waiting (this worker {has})",
            retry_in=None,
            reason=dead_as,
        )
        return
    message = (
        f"{wanted} is not registered on worker {claim.worker_id} (it {has}); "
        f"waiting for a worker that has it, up to {settings.TASKS_VERSION_WAIT_SECONDS} s"
    )
    leases.release_claim(
        claim,
        actor=f"worker:{claim.worker_id}",
        reason=AWAITING_VERSION,
        retry_in=settings.TASKS_VERSION_RETRY_SECONDS,
        error=(AWAITING_VERSION, message),
        version=task.workflow_version,
        waiting_since=(since or now).isoformat(),
    )


def _retry(claim: leases.Claim, spec: StepSpec, exc: Exception) -> None:
    lease_keeper.forget(claim)
    leases.fail_step(
        claim,
        error_class=error_class(exc),
        message=error_text(exc),
        retry_in=spec.backoff(claim.attempt),
        reason="",
    )


def drain(step_id: int) -> int:
    """Run ``step_id`` if it can be claimed, then keep claiming due steps of its queue.

    Batches start at one step and double while steps are quick (up to
    ``TASKS_CLAIM_BATCH``), so slow handlers are not hoarded by one worker. After
    ``TASKS_DRAIN_SECONDS`` the worker rings for the rest and returns, so one message
    never holds a worker for long. Steps whose last lease ran out come one per batch, once
    a larger batch finds nothing else. A drain that finds a backlog (a full batch past the
    first) rings once more, so a burst recruits workers one after another. Returns how
    many steps were run, and logs one line at INFO when it ran any.
    """
    tally = _Tally(started=time.monotonic())
    try:
        _drain(step_id, tally)
    finally:
        if tally.ran:
            logger.info(
                "drained %d step(s) from queue %s in %.0f ms: %d returned, %d failed",
                tally.ran,
                tally.queue,
                (time.monotonic() - tally.started) * 1000,
                tally.returned,
                tally.ran - tally.returned,
            )
    return tally.ran


@dataclass
class _Tally:
    """What one drain did, for its log line."""

    started: float
    queue: str | None = None
    ran: int = 0
    returned: int = 0


def _drain(step_id: int, tally: _Tally) -> None:
    worker = worker_id()
    deadline = time.monotonic() + settings.TASKS_DRAIN_SECONDS
    size, recruited = 1, False
    named: int | None = step_id
    last = step_id
    while True:
        if stopping.is_stopping():
            # Its worker is stopping: it claims nothing more, and rings for what is due so
            # that another worker takes it now.
            _pass_on(last, tally.queue)
            return
        queue = tally.queue
        claims = fastpath.claim_batch(worker_id=worker, limit=size, step_id=named, queue=queue)
        if not claims and size > 1:
            # What is left may be steps claimed only in a batch of one (LEASE_EXPIRED).
            size = 1
            claims = fastpath.claim_batch(worker_id=worker, limit=1, queue=queue)
        if not claims:
            return
        if not recruited and size > 1 and len(claims) == size:
            # A full batch past the first: a backlog, so wake one more worker to help.
            ring_on_commit([Doorbell(claims[-1].step_id, claims[0].queue)])
            recruited = True
        tally.queue, named, last = claims[0].queue, None, claims[-1].step_id
        began = time.monotonic()
        tally.returned += run_batch(claims)
        tally.ran += len(claims)
        per_step = (time.monotonic() - began) / len(claims)
        if per_step < FAST_STEP_SECONDS:
            size = min(size * 2, settings.TASKS_CLAIM_BATCH)
        elif per_step * size > SLOW_BATCH_SECONDS:
            size = max(size // 2, 1)
        if time.monotonic() >= deadline:
            if fastpath.queue_has_due_steps(tally.queue):
                ring_on_commit([Doorbell(claims[-1].step_id, tally.queue)])
            return


def _pass_on(step_id: int, queue: str | None) -> None:
    """Ring for the queue's due work (naming ``step_id``, as a drain's deadline does), so
    another worker takes it now instead of after the sweeper's next round; the queue is
    the named step's when this drain claimed nothing yet."""
    if queue is None:
        queue = Step.objects.filter(pk=step_id).values_list("queue", flat=True).first()
    if queue is not None and fastpath.queue_has_due_steps(queue):
        ring_on_commit([Doorbell(step_id, queue)])


def run_task_steps(task: Task, *, limit: int = 50) -> int:
    """Run a task's due steps in this process, one claim at a time, until none is due or
    ``limit`` ran (for commands such as the demo seed; workers drain queues instead).
    Returns how many ran."""
    ran = 0
    while ran < limit:
        due = task.steps.due().order_by("position").values_list("pk", flat=True).first()
        if due is None or not run_claimed(due):
            break
        ran += 1
    return ran


def run_claimed(step_id: int) -> bool:
    """Claim ``step_id`` and run it; False when there was nothing to claim."""
    worker = worker_id()
    claim = leases.claim_step(step_id, worker_id=worker)
    if claim is None:
        # A step under limits, claimed as they let it.
        limited = limited_claims.claim(
            queue=None,
            worker_id=worker,
            limit=1,
            lease_seconds=settings.TASKS_LEASE_SECONDS,
            step_id=step_id,
            only_named=True,
        ).claims
        if not limited:
            return False
        claim = limited[0]
    execute(claim)
    return True
