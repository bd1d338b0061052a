"""Helpers for the tests of the worker's side: claims, leases and the sweeper; and the
recorder workflow (``pair``) whose payload says how each of its steps behaves."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from django.conf import settings

from tasks_app import services
from tasks_app.exceptions import InvalidInput, OutcomeUnknown, PermanentError
from tasks_app.history import timeline
from tasks_app.history.timeline import HistoryEntry
from tasks_app.models import Lease, Step, Task, leases_of
from tasks_app.services import Claim
from tasks_app.workflows import StepContext, StepSpec, Workflow, register, registry
from tests.conftest import backdate

WORKER = "w1"
LEASE = settings.TASKS_LEASE_SECONDS


# --- helpers ------------------------------------------------------------------------------


def events(task: Task, kind: str) -> list[HistoryEntry]:
    """``task``'s history entries of ``kind``: events, or transitions an attempt's record holds."""
    return [entry for entry in timeline.history(task.pk) if entry.kind == kind]


def step_at(task: Task, position: int) -> Step:
    return task.steps.get(position=position, revision=0)


def fresh(step: Step) -> Step:
    return Step.objects.get(pk=step.pk)


def claim(step: Step, worker_id: str = WORKER, lease_seconds: int | None = None) -> Claim:
    """Claim a step that must be claimable."""
    result = services.claim_step(step.pk, worker_id=worker_id, lease_seconds=lease_seconds)
    assert result is not None, f"step {step.pk} ({fresh(step).status}) could not be claimed"
    return result


def expire_lease(step: Step) -> None:
    """Let the step's lease run out and have the sweeper reap it."""
    backdate(step, seconds=LEASE + 60)
    assert services.reap_expired_leases() == 1


# --- test workflows -----------------------------------------------------------------------


@dataclass
class Recorder:
    """What the test handlers saw, and switches a handler running in a thread waits on."""

    calls: list[dict[str, Any]] = field(default_factory=list)
    started: threading.Event = field(default_factory=threading.Event)
    lease_lost: list[bool] = field(default_factory=list)

    def handler(self, ctx: StepContext) -> Any:
        kind = ctx.step_key.split(":")[-1]
        self.calls.append(
            {
                "kind": kind,
                "attempt": ctx.attempt,
                "token": ctx.fencing_token,
                "step_key": ctx.step_key,
                "results": dict(ctx.results),
            }
        )
        mode = ctx.payload.get(kind, "ok")
        if mode == "ok":
            return {"done": kind, "attempt": ctx.attempt}
        if mode == "fail_once" and ctx.attempt == 1:
            raise RuntimeError(f"{kind} failed on attempt 1")
        if mode == "fail_once":
            return {"done": kind, "attempt": ctx.attempt}
        if mode == "permanent":
            raise PermanentError("the input cannot work")
        if mode == "outcome_unknown":
            raise OutcomeUnknown("the remote may have applied it")
        if mode == "invalid_input":
            raise InvalidInput("payload.x", "range", "payload.x: out of range")
        if mode == "value_error":
            raise ValueError("a bug in the handler")
        if mode == "runtime_error":
            raise RuntimeError("the remote hiccuped")
        if mode == "set":
            return {1, 2, 3}
        if mode == "nan":
            return {"value": float("nan")}
        if mode == "wait_for_cancel":
            # Runs in a worker thread: only the heartbeat thread can set this event.
            self.started.set()
            ctx._cancelled.wait(timeout=20)
            return {"saw_cancel": ctx.cancelled}
        if mode == "wait_for_lease_loss":
            self.started.set()
            ctx._lease_lost.wait(timeout=20)
            # Its result will be refused, so what it saw is kept here.
            self.lease_lost.append(ctx.lease_lost)
            return {"saw_lease_lost": ctx.lease_lost}
        raise AssertionError(f"unknown mode {mode!r}")


PAIR = "test.worker.pair"


@pytest.fixture
def recorder() -> Recorder:
    return Recorder()


@pytest.fixture
def pair(recorder: Recorder) -> Iterator[str]:
    """A two-step workflow, ``draft`` then ``publish``, whose payload says how each behaves."""
    register(
        Workflow(
            PAIR,
            1,
            steps=(
                StepSpec("draft", recorder.handler, backoff_base=3600, backoff_cap=3600),
                StepSpec("publish", recorder.handler, backoff_base=3600, backoff_cap=3600),
            ),
        )
    )
    yield PAIR
    registry.unregister(PAIR, 1)


def attempts_of(step: Step) -> dict[int, Lease]:
    """The step's attempts by token as people read them: its Lease rows (one per attempt that
    ended) and, while it runs, the live lease on the step row (``models.leases_of``)."""
    stored = Step.objects.get(pk=step.pk)
    return {lease.token: lease for lease in leases_of([stored])[stored.pk]}


def lease_of(step: Step, token: int) -> Lease:
    return attempts_of(step)[token]
