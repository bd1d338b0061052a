"""The worker's side of the task system: claims, leases with fencing, heartbeats, retries,
dead letters and paused queues (DESIGN rules 1, 2, 3, 6 and 10; the sweeper's part is in
test_sweeper).

Time moves by back-dating rows (``backdate``), never by sleeping. Tests that need a
second database connection (concurrent claims, the heartbeat thread) or a real commit
(doorbells published after commit) are transactional.
"""

from __future__ import annotations

import random
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import pytest
from django.conf import settings
from django.contrib.auth.models import Permission, User
from django.db import connection

from tasks_app import runner, services
from tasks_app.demo_workflows import flaky, validate_flaky
from tasks_app.exceptions import (
    InvalidInput,
    NotPermitted,
    OutcomeUnknown,
    PermanentError,
)
from tasks_app.models import Event, EventKind, Lease, QueueState, StepStatus, TaskStatus
from tasks_app.services import Claim
from tasks_app.tasks import run_step
from tasks_app.workflows import StepContext, StepSpec, Workflow, register, registry
from tests.conftest import BrokerView, backdate, only_step, worker_thread
from tests.e2e_support import wait_for

from .lease_support import LEASE, WORKER, claim, events, expire_lease, fresh, kinds, step_at

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
VERSIONED = "test.worker.versioned"
SLOW_RETRY = "test.worker.slow_retry"


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


@pytest.fixture
def versioned(recorder: Recorder) -> Iterator[str]:
    for version in (1, 2):
        register(Workflow(VERSIONED, version, steps=(StepSpec("only", recorder.handler),)))
    yield VERSIONED
    for version in (1, 2):
        registry.unregister(VERSIONED, version)


@pytest.fixture
def slow_retry() -> Iterator[str]:
    """demo.flaky's handler with a backoff long enough that "not yet due" is certain."""
    register(
        Workflow(
            SLOW_RETRY,
            1,
            steps=(StepSpec("flaky", flaky, backoff_base=3600, backoff_cap=3600),),
            validate_payload=validate_flaky,
        )
    )
    yield SLOW_RETRY
    registry.unregister(SLOW_RETRY, 1)


# --- 1. completing an unclaimed step is refused -------------------------------------------


@pytest.mark.django_db
@pytest.mark.parametrize("token", [0, 1])
def test_completing_a_step_nobody_claimed_is_refused_and_recorded(token: int) -> None:
    task = services.enqueue("demo.noop", {}).task
    step = only_step(task)
    made_up = Claim(
        step_id=step.pk,
        task_id=task.pk,
        token=token,
        attempt=1,
        worker_id="impostor",
        lease_seconds=LEASE,
    )

    assert services.complete_step(made_up, {"forged": True}) is False
    assert (
        services.fail_step(made_up, error_class="x", message="forged", retry_in=1, reason="")
        is False
    )

    step = fresh(step)
    assert (step.status, step.attempts, step.fencing_token) == (StepStatus.PENDING, 0, 0)
    assert step.result is None
    assert step.last_error == ""
    assert not Lease.objects.filter(step=step).exists()
    task.refresh_from_db()
    assert task.status == TaskStatus.PENDING
    rejected = events(task, EventKind.STALE_WRITE_REJECTED)
    assert [e.data["operation"] for e in rejected] == ["complete", "fail"]
    assert rejected[0].actor == "worker:impostor"
    assert rejected[0].step_id == step.pk
    assert rejected[0].data["token"] == token
    assert rejected[0].data["current_token"] == 0
    assert rejected[0].data["current_status"] == StepStatus.PENDING
    assert kinds(task) == ["enqueued", "stale_write_rejected", "stale_write_rejected"]


# --- 2. the success path ------------------------------------------------------------------


@pytest.mark.django_db
def test_a_step_that_succeeds_records_enqueued_claimed_and_succeeded() -> None:
    task = services.enqueue("demo.noop", {"hello": "world"}).task
    step = only_step(task)

    assert runner.run_claimed(step.pk) is True

    step = fresh(step)
    assert (step.status, step.attempts, step.fencing_token) == (StepStatus.SUCCEEDED, 1, 1)
    assert step.result == {}
    assert step.lease_expires_at is None
    assert step.finished_at is not None
    task.refresh_from_db()
    assert task.status == TaskStatus.SUCCEEDED
    assert task.finished_at is not None
    assert kinds(task) == ["enqueued", "claimed", "succeeded"]
    claimed = events(task, EventKind.CLAIMED)[0]
    assert claimed.step_id == step.pk
    assert claimed.actor == f"worker:{runner.worker_id()}"
    assert (claimed.data["token"], claimed.data["attempt"]) == (1, 1)
    lease = Lease.objects.get(step=step)
    assert (lease.token, lease.worker_id) == (1, runner.worker_id())
    assert lease.outcome == Lease.Outcome.SUCCEEDED
    assert lease.released_at is not None


@pytest.mark.django_db
def test_the_second_step_becomes_pending_only_after_the_first_succeeds(
    pair: str, recorder: Recorder
) -> None:
    task = services.enqueue(pair, {"draft": "fail_once"}, idempotency_key="post-7").task
    draft, publish = step_at(task, 0), step_at(task, 1)
    assert (draft.status, publish.status) == (StepStatus.PENDING, StepStatus.BLOCKED)
    assert publish.available_at is None
    assert services.claim_step(publish.pk, worker_id=WORKER) is None

    # The first attempt fails: the draft waits for its retry, the publish stays blocked.
    assert runner.run_claimed(draft.pk) is True
    assert fresh(draft).status == StepStatus.PENDING
    assert fresh(publish).status == StepStatus.BLOCKED
    assert services.claim_step(publish.pk, worker_id=WORKER) is None

    backdate(draft)
    assert runner.run_claimed(draft.pk) is True
    assert fresh(draft).status == StepStatus.SUCCEEDED
    publish = fresh(publish)
    assert publish.status == StepStatus.PENDING
    assert publish.available_at is not None
    assert publish.attempts == publish.fencing_token == 0

    assert runner.run_claimed(publish.pk) is True
    assert fresh(publish).status == StepStatus.SUCCEEDED
    assert fresh(publish).result == {"done": "publish", "attempt": 1}
    task.refresh_from_db()
    assert task.status == TaskStatus.SUCCEEDED
    assert kinds(task) == [
        "enqueued",
        "claimed",
        "retry_scheduled",
        "claimed",
        "succeeded",
        "claimed",
        "succeeded",
    ]
    # The draft's success is the event that made the publish due.
    made_due = events(task, EventKind.SUCCEEDED)[0]
    assert made_due.data["steps"][str(publish.pk)] == [StepStatus.PENDING, 0, 0]
    # The handler saw its place in the retry story and the earlier result.
    assert recorder.calls == [
        {
            "kind": "draft",
            "attempt": 1,
            "token": 1,
            "step_key": "post-7:0:draft",
            "results": {},
        },
        {
            "kind": "draft",
            "attempt": 2,
            "token": 2,
            "step_key": "post-7:0:draft",
            "results": {},
        },
        {
            "kind": "publish",
            "attempt": 1,
            "token": 1,
            "step_key": "post-7:1:publish",
            "results": {"draft": {"done": "draft", "attempt": 2}},
        },
    ]


# --- 3. a retry waits for its backoff -----------------------------------------------------


@pytest.mark.django_db
def test_a_failed_attempt_is_retried_after_its_backoff() -> None:
    task = services.enqueue("demo.flaky", {"fail_first": 1}).task
    step = only_step(task)

    assert runner.run_claimed(step.pk) is True

    step = fresh(step)
    assert (step.status, step.attempts, step.fencing_token) == (StepStatus.PENDING, 1, 1)
    assert step.error_class == "tasks_app.exceptions.RetryableError"
    assert "failing on claim 1" in step.last_error
    task.refresh_from_db()
    assert task.status == TaskStatus.PENDING
    assert task.finished_at is None
    retry = events(task, EventKind.RETRY_SCHEDULED)[0]
    # demo.flaky: base 0.1 s, so the first retry waits between 0 and 0.1 s (full jitter).
    assert 0 <= retry.data["retry_in"] <= 0.1
    assert retry.data["error_class"] == "tasks_app.exceptions.RetryableError"
    released = Lease.objects.get(step=step, token=1)
    assert released.outcome == Lease.Outcome.FAILED
    assert released.released_at is not None
    assert step.available_at is not None
    assert step.available_at > released.acquired_at
    assert step.available_at <= released.released_at + timedelta(seconds=0.1)
    assert step.dispatched_at == step.available_at

    backdate(step)
    assert runner.run_claimed(step.pk) is True

    step = fresh(step)
    assert (step.status, step.attempts, step.fencing_token) == (StepStatus.SUCCEEDED, 2, 2)
    assert step.result == {"token": 2, "attempt": 2}
    task.refresh_from_db()
    assert task.status == TaskStatus.SUCCEEDED
    assert kinds(task) == ["enqueued", "claimed", "retry_scheduled", "claimed", "succeeded"]


@pytest.mark.django_db
def test_a_retry_is_not_claimed_before_its_backoff_has_passed(slow_retry: str) -> None:
    task = services.enqueue(slow_retry, {"fail_first": 1}).task
    step = only_step(task)
    # Full jitter may pick any delay down to zero; this seed picks a long one.
    random.seed(20260601)
    assert runner.run_claimed(step.pk) is True
    retry_in = events(task, EventKind.RETRY_SCHEDULED)[0].data["retry_in"]
    assert 60 < retry_in <= 3600

    assert services.claim_step(step.pk, worker_id=WORKER) is None
    run_step(step.pk)
    assert runner.run_claimed(step.pk) is False
    # Looking did not count as an attempt.
    step = fresh(step)
    assert (step.status, step.attempts, step.fencing_token) == (StepStatus.PENDING, 1, 1)
    assert Lease.objects.filter(step=step).count() == 1

    backdate(step, seconds=retry_in - 30)
    assert services.claim_step(step.pk, worker_id=WORKER) is None

    backdate(step, seconds=60)
    again = claim(step)
    assert (again.attempt, again.token) == (2, 2)


# --- 4. max attempts dead-letters ---------------------------------------------------------


@pytest.mark.django_db
def test_a_step_that_keeps_failing_is_dead_lettered_after_max_attempts() -> None:
    task = services.enqueue("demo.flaky", {"fail_first": 5}).task
    step = only_step(task)
    assert step.max_attempts == 3

    for _ in range(3):
        backdate(step)
        assert runner.run_claimed(step.pk) is True

    step = fresh(step)
    assert (step.status, step.attempts, step.fencing_token) == (StepStatus.DEAD, 3, 3)
    assert step.error_class == "tasks_app.exceptions.RetryableError"
    assert "failing on claim 3" in step.last_error
    assert step.finished_at is not None
    task.refresh_from_db()
    assert task.status == TaskStatus.DEAD
    assert task.finished_at is not None
    assert kinds(task) == [
        "enqueued",
        "claimed",
        "retry_scheduled",
        "claimed",
        "retry_scheduled",
        "claimed",
        "dead_lettered",
    ]
    dead = events(task, EventKind.DEAD_LETTERED)[0]
    assert dead.reason == "max_attempts"
    assert dead.data["error_class"] == "tasks_app.exceptions.RetryableError"
    # A dead step waits for a person: no message runs it.
    backdate(step)
    run_step(step.pk)
    assert fresh(step).status == StepStatus.DEAD
    assert Lease.objects.filter(step=step).count() == 3


@pytest.mark.django_db
def test_the_attempt_budget_restarts_on_redrive_but_the_fencing_token_does_not() -> None:
    task = services.enqueue("demo.flaky", {"fail_first": 3}).task
    step = only_step(task)
    for _ in range(3):
        backdate(step)
        runner.run_claimed(step.pk)
    assert fresh(step).status == StepStatus.DEAD

    services.redrive(task, actor="cli:test", reason="the remote is back")
    step = fresh(step)
    assert (step.status, step.attempts, step.fencing_token) == (StepStatus.PENDING, 0, 3)

    after = claim(step)
    assert (after.attempt, after.token) == (1, 4)
    runner.execute(after)
    step = fresh(step)
    assert (step.status, step.attempts, step.fencing_token) == (StepStatus.SUCCEEDED, 1, 4)
    assert step.result == {"token": 4, "attempt": 1}
    assert list(Lease.objects.filter(step=step).values_list("token", flat=True)) == [1, 2, 3, 4]


# --- backoff ------------------------------------------------------------------------------


def test_backoff_is_capped_exponential_with_full_jitter() -> None:
    spec = StepSpec("x", flaky, backoff_base=1.0, backoff_cap=300.0)
    ceilings = [1, 2, 4, 8, 16, 32, 64, 128, 256, 300]
    rng, twin = random.Random(42), random.Random(42)
    for attempt, ceiling in enumerate(ceilings, start=1):
        delay = spec.backoff(attempt, rng)
        assert 0 <= delay <= ceiling
        # Full jitter: uniform over the whole range up to the capped ceiling.
        assert delay == twin.uniform(0, ceiling)

    for attempt, ceiling in enumerate(ceilings, start=1):
        delays = [spec.backoff(attempt, rng) for _ in range(500)]
        assert max(delays) <= ceiling
        assert max(delays) > 0.9 * ceiling
        assert min(delays) < 0.1 * ceiling


def test_backoff_never_exceeds_the_cap_even_for_huge_attempt_numbers() -> None:
    spec = StepSpec("x", flaky, backoff_base=0.1, backoff_cap=1.0)
    rng = random.Random(7)
    assert all(0 <= spec.backoff(attempt, rng) <= 1.0 for attempt in (11, 50, 1000))


# --- two workers, one step ----------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_only_one_of_many_workers_claiming_the_same_step_at_once_gets_it(
    broker: BrokerView,
) -> None:
    task = services.enqueue("demo.noop", {}).task
    step = only_step(task)
    workers = 8
    barrier = threading.Barrier(workers)
    claims: list[Claim | None] = []
    errors: list[BaseException] = []

    def race(index: int) -> None:
        try:
            barrier.wait(timeout=30)
            claims.append(services.claim_step(step.pk, worker_id=f"w{index}"))
        except BaseException as exc:
            errors.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=race, args=(i,)) for i in range(workers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)

    assert not errors
    assert len(claims) == workers
    won = [c for c in claims if c is not None]
    assert len(won) == 1
    assert (won[0].token, won[0].attempt) == (1, 1)
    step = fresh(step)
    assert (step.status, step.attempts, step.fencing_token) == (StepStatus.RUNNING, 1, 1)
    assert list(Lease.objects.filter(step=step).values_list("worker_id", flat=True)) == [
        won[0].worker_id
    ]
    assert len(events(task, EventKind.CLAIMED)) == 1


# --- a stale worker is fenced off ---------------------------------------------------------


@pytest.mark.django_db
def test_a_stale_worker_cannot_complete_fail_or_heartbeat_after_its_lease_was_reclaimed() -> None:
    task = services.enqueue("demo.noop", {}).task
    step = only_step(task)
    stale = claim(step, worker_id="slow")
    expire_lease(step)
    current = claim(step, worker_id="fast")
    assert (stale.token, current.token) == (1, 2)
    before = fresh(step)
    lease_before = Lease.objects.get(step=step, token=2).expires_at

    assert services.complete_step(stale, {"late": True}) is False
    assert (
        services.fail_step(stale, error_class="Late", message="late", retry_in=1, reason="")
        is False
    )
    beat = services.heartbeat(stale)
    assert (beat.alive, beat.cancel_requested) == (False, False)

    after = fresh(step)
    assert (after.status, after.attempts, after.fencing_token) == (StepStatus.RUNNING, 2, 2)
    assert after.lease_expires_at == before.lease_expires_at
    assert after.result is None
    assert after.last_error == before.last_error
    leases = {lease.token: lease for lease in Lease.objects.filter(step=step)}
    assert leases[1].outcome == Lease.Outcome.EXPIRED
    assert leases[2].released_at is None
    assert leases[2].expires_at == lease_before
    task.refresh_from_db()
    assert task.status == TaskStatus.RUNNING
    rejected = events(task, EventKind.STALE_WRITE_REJECTED)
    assert [e.data["operation"] for e in rejected] == ["complete", "fail", "heartbeat"]
    for event in rejected:
        assert event.actor == "worker:slow"
        assert (event.data["token"], event.data["current_token"]) == (1, 2)

    # The current holder is unaffected and finishes.
    assert services.heartbeat(current).alive is True
    assert services.complete_step(current, {"by": "fast"}) is True
    assert fresh(step).status == StepStatus.SUCCEEDED
    assert fresh(step).result == {"by": "fast"}
    task.refresh_from_db()
    assert task.status == TaskStatus.SUCCEEDED
    # ... and after it finished the stale worker is still refused.
    assert services.complete_step(stale, {"late": True}) is False
    assert fresh(step).result == {"by": "fast"}


# --- heartbeat ----------------------------------------------------------------------------


@pytest.mark.django_db
def test_a_heartbeat_extends_the_lease_by_the_database_clock() -> None:
    task = services.enqueue("demo.noop", {}).task
    step = only_step(task)
    held = claim(step)
    backdate(step, seconds=LEASE - 5)  # five seconds of lease left
    nearly_over = fresh(step).lease_expires_at
    assert nearly_over is not None

    start = services.db_now()
    beat = services.heartbeat(held)
    end = services.db_now()

    assert (beat.alive, beat.cancel_requested) == (True, False)
    renewed = fresh(step).lease_expires_at
    assert renewed is not None
    assert renewed > nearly_over
    lease = timedelta(seconds=held.lease_seconds)
    assert start + lease <= renewed <= end + lease
    lease_row = Lease.objects.get(step=step, token=held.token)
    assert start + lease <= lease_row.expires_at <= end + lease
    assert lease_row.released_at is None
    # The renewed lease is live: the reaper leaves it alone.
    backdate(step, seconds=LEASE - 5)
    assert services.reap_expired_leases() == 0


@pytest.mark.django_db
def test_a_heartbeat_reports_that_the_running_task_was_cancelled() -> None:
    task = services.enqueue("demo.noop", {}).task
    held = claim(only_step(task))
    assert services.heartbeat(held).cancel_requested is False

    services.cancel(task, actor="cli:x", reason="customer withdrew")

    beat = services.heartbeat(held)
    assert (beat.alive, beat.cancel_requested) == (True, True)
    assert fresh(only_step(task)).status == StepStatus.RUNNING


# --- duplicate and late messages ----------------------------------------------------------


@pytest.mark.django_db
def test_a_duplicated_message_runs_the_step_once() -> None:
    task = services.enqueue("demo.noop", {}).task
    step = only_step(task)

    run_step(step.pk)
    run_step(step.pk)

    step = fresh(step)
    assert (step.status, step.attempts, step.fencing_token) == (StepStatus.SUCCEEDED, 1, 1)
    assert Lease.objects.filter(step=step).count() == 1
    assert kinds(task) == ["enqueued", "claimed", "succeeded"]


@pytest.mark.django_db
def test_a_late_message_for_a_finished_step_changes_nothing(pair: str, recorder: Recorder) -> None:
    task = services.enqueue(pair, {}).task
    draft, publish = step_at(task, 0), step_at(task, 1)
    run_step(draft.pk)
    run_step(publish.pk)
    task.refresh_from_db()
    assert task.status == TaskStatus.SUCCEEDED
    history = kinds(task)

    backdate(draft)
    run_step(draft.pk)
    run_step(publish.pk)
    run_step(10**12)  # a step that does not exist (pruned)

    assert kinds(task) == history
    assert [call["kind"] for call in recorder.calls] == ["draft", "publish"]
    assert fresh(draft).fencing_token == fresh(publish).fencing_token == 1
    task.refresh_from_db()
    assert task.status == TaskStatus.SUCCEEDED


# --- a paused queue -----------------------------------------------------------------------


@pytest.mark.django_db
def test_a_paused_queue_is_not_claimed_until_it_is_resumed() -> None:
    task = services.enqueue("demo.noop", {}).task
    step = only_step(task)

    services.pause_queue("default", actor="cli:test", reason="incident 42")

    assert services.claim_step(step.pk, worker_id=WORKER) is None
    run_step(step.pk)
    step = fresh(step)
    assert (step.status, step.attempts, step.fencing_token) == (StepStatus.PENDING, 0, 0)
    state = QueueState.objects.get(name="default")
    assert (state.paused, state.changed_by, state.reason) == (True, "cli:test", "incident 42")
    assert services.paused_queues() == ["default"]

    services.resume_queue("default", actor="cli:test", reason="fixed")

    assert QueueState.objects.get(name="default").paused is False
    runner.execute(claim(step))
    assert fresh(step).status == StepStatus.SUCCEEDED
    queue_events = list(
        Event.objects.filter(kind__in=[EventKind.QUEUE_PAUSED, EventKind.QUEUE_RESUMED])
    )
    assert [(e.kind, e.actor, e.reason, e.task_id) for e in queue_events] == [
        (EventKind.QUEUE_PAUSED, "cli:test", "incident 42", None),
        (EventKind.QUEUE_RESUMED, "cli:test", "fixed", None),
    ]
    assert all(e.data["queue"] == "default" for e in queue_events)


@pytest.mark.django_db
def test_resuming_a_queue_rings_the_doorbell_for_its_due_steps(
    broker: BrokerView, django_capture_on_commit_callbacks: Any
) -> None:
    due = only_step(services.enqueue("demo.noop", {}).task)
    later = only_step(
        services.enqueue(
            "demo.noop", {"n": 2}, run_after=services.db_now() + timedelta(hours=1)
        ).task
    )
    services.pause_queue("default", actor="cli:test", reason="incident")
    backdate(due, seconds=settings.TASKS_REDISPATCH_SECONDS + 1)

    with django_capture_on_commit_callbacks(execute=True):
        services.resume_queue("default", actor="cli:test", reason="over")

    assert broker.step_ids() == [due.pk]
    assert later.pk not in broker.step_ids()


@pytest.mark.django_db
def test_a_running_step_in_a_paused_queue_still_finishes() -> None:
    task = services.enqueue("demo.noop", {}).task
    held = claim(only_step(task))
    services.pause_queue("default", actor="cli:test", reason="incident")

    assert services.heartbeat(held).alive is True
    assert services.complete_step(held, {}) is True
    task.refresh_from_db()
    assert task.status == TaskStatus.SUCCEEDED


@pytest.mark.django_db
def test_pausing_an_unknown_queue_is_refused_naming_the_queue() -> None:
    with pytest.raises(InvalidInput) as error:
        services.pause_queue("nope", actor="cli:test", reason="incident")
    assert error.value.field == "name"
    assert not QueueState.objects.exists()
    assert not Event.objects.exists()


@pytest.mark.django_db
@pytest.mark.parametrize("reason", ["", "   "])
def test_pausing_or_resuming_without_a_reason_is_refused(reason: str) -> None:
    for action in (services.pause_queue, services.resume_queue):
        with pytest.raises(InvalidInput) as error:
            action("default", actor="cli:test", reason=reason)
        assert error.value.field == "reason"
    assert not QueueState.objects.exists()
    assert not Event.objects.exists()


@pytest.mark.django_db
def test_a_user_without_permission_cannot_pause_a_queue(outsider: User) -> None:
    with pytest.raises(NotPermitted):
        services.pause_queue("default", actor=outsider, reason="because")
    services.pause_queue("default", actor="cli:test", reason="incident")
    with pytest.raises(NotPermitted):
        services.resume_queue("default", actor=outsider, reason="because")
    assert QueueState.objects.get(name="default").paused is True
    assert Event.objects.filter(actor=outsider.username).count() == 0


@pytest.mark.django_db
def test_pausing_needs_the_pause_permission_not_another_on_call_one(outsider: User) -> None:
    others = ["redrive_task", "resolve_task", "cancel_task"]
    outsider.user_permissions.add(*Permission.objects.filter(codename__in=others))
    user = User.objects.get(pk=outsider.pk)  # a fresh permission cache

    with pytest.raises(NotPermitted, match="pause_queue"):
        services.pause_queue("default", actor=user, reason="because")

    assert not QueueState.objects.exists()


@pytest.mark.django_db
def test_the_oncall_engineer_may_pause_and_resume_a_queue(oncall: User) -> None:
    services.pause_queue("default", actor=oncall, reason="incident 42")
    assert QueueState.objects.get(name="default").paused is True
    services.resume_queue("default", actor=oncall, reason="incident 42 over")
    assert QueueState.objects.get(name="default").paused is False
    assert list(
        Event.objects.filter(actor=oncall.username).values_list("kind", "actor_user_id")
    ) == [(EventKind.QUEUE_PAUSED, oncall.pk), (EventKind.QUEUE_RESUMED, oncall.pk)]


# --- an unregistered workflow version -----------------------------------------------------


@pytest.mark.django_db
def test_a_step_of_a_version_this_worker_lacks_waits_uncharged_for_a_worker_that_has_it(
    versioned: str, recorder: Recorder, settings: Any
) -> None:
    """A rolling deploy: a producer on the new code enqueued v2; an old worker (v1 only)
    claims it, hands it back marked, due again later, attempt not charged; a worker that
    has v2 then runs it."""
    settings.TASKS_VERSION_RETRY_SECONDS = 30
    task = services.enqueue(versioned, {}).task
    assert task.workflow_version == 2
    step = only_step(task)
    registry.unregister(versioned, 2)  # this worker runs the old release

    assert runner.run_claimed(step.pk) is True

    assert recorder.calls == []
    step = fresh(step)
    assert (step.status, step.attempts, step.fencing_token) == (StepStatus.PENDING, 0, 1)
    assert step.error_class == "awaiting_version"
    assert "v2 is not registered on worker" in step.last_error
    assert "it has v1" in step.last_error
    assert step.available_at is not None and step.available_at > services.db_now()
    assert runner.run_claimed(step.pk) is False  # not due before the retry interval
    released = events(task, EventKind.CLAIM_RELEASED)
    assert [(e.reason, e.data["version"]) for e in released] == [("awaiting_version", 2)]
    task.refresh_from_db()
    assert task.status == TaskStatus.PENDING

    # A worker of the new release takes it once it is due.
    register(Workflow(versioned, 2, steps=(StepSpec("only", recorder.handler),)))
    backdate(step, seconds=60)
    assert runner.run_claimed(step.pk) is True
    step = fresh(step)
    assert (step.status, step.attempts, step.fencing_token) == (StepStatus.SUCCEEDED, 1, 2)
    assert kinds(task) == ["enqueued", "claimed", "claim_released", "claimed", "succeeded"]


@pytest.mark.django_db
def test_a_step_that_waited_its_whole_time_for_its_version_is_dead_lettered_as_incompatible(
    versioned: str, recorder: Recorder, settings: Any
) -> None:
    settings.TASKS_VERSION_WAIT_SECONDS = 1
    task = services.enqueue(versioned, {}).task
    step = only_step(task)
    registry.unregister(versioned, 2)
    assert runner.run_claimed(step.pk) is True
    assert fresh(step).status == StepStatus.PENDING
    since = services.awaiting_version_since(task.pk, step.pk)
    assert since is not None
    wait_for(
        lambda: (services.db_now() - since).total_seconds() >= 1,
        timeout=10,
        what="the wait to pass by the database's clock",
    )

    backdate(step, seconds=60)
    assert runner.run_claimed(step.pk) is True

    assert recorder.calls == []
    step = fresh(step)
    assert (step.status, step.attempts) == (StepStatus.DEAD, 1)
    assert step.error_class == "incompatible_version"
    assert "v2 is not registered on any worker that claimed it" in step.last_error
    task.refresh_from_db()
    assert task.status == TaskStatus.DEAD
    assert [e.reason for e in events(task, EventKind.DEAD_LETTERED)] == ["incompatible_version"]


@pytest.mark.django_db
def test_with_no_wait_a_step_of_a_missing_version_is_dead_lettered_at_once(
    versioned: str, recorder: Recorder, settings: Any
) -> None:
    settings.TASKS_VERSION_WAIT_SECONDS = 0
    task = services.enqueue(versioned, {}).task
    step = only_step(task)
    registry.unregister(versioned, 2)  # a deploy rolled the worker back to v1

    assert runner.run_claimed(step.pk) is True

    assert recorder.calls == []
    step = fresh(step)
    assert (step.status, step.attempts) == (StepStatus.DEAD, 1)
    assert step.error_class == "incompatible_version"
    assert "v2" in step.last_error
    assert [e.reason for e in events(task, EventKind.DEAD_LETTERED)] == ["incompatible_version"]


@pytest.mark.django_db
def test_a_step_kind_the_workflow_does_not_have_is_dead_lettered(
    versioned: str, recorder: Recorder
) -> None:
    task = services.enqueue(versioned, {}).task
    step = only_step(task)
    registry.unregister(versioned, 2)
    register(Workflow(versioned, 2, steps=(StepSpec("renamed", recorder.handler),)))

    assert runner.run_claimed(step.pk) is True

    assert recorder.calls == []
    step = fresh(step)
    assert (step.status, step.error_class) == (StepStatus.DEAD, "unknown_step_kind")
    assert [e.reason for e in events(task, EventKind.DEAD_LETTERED)] == ["unknown_step_kind"]


# --- how handler errors are classified ----------------------------------------------------


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("mode", "error_class", "reason"),
    [
        ("permanent", "tasks_app.exceptions.PermanentError", "permanent_error"),
        ("invalid_input", "tasks_app.exceptions.InvalidInput", "permanent_error"),
        ("outcome_unknown", "tasks_app.exceptions.OutcomeUnknown", "outcome_unknown"),
        ("set", "invalid_result", "permanent_error"),
        ("nan", "invalid_result", "permanent_error"),
    ],
)
def test_a_handler_error_that_retrying_cannot_fix_dead_letters_at_once(
    pair: str, recorder: Recorder, mode: str, error_class: str, reason: str
) -> None:
    task = services.enqueue(pair, {"draft": mode}).task
    draft, publish = step_at(task, 0), step_at(task, 1)

    runner.execute(claim(draft))

    draft = fresh(draft)
    assert (draft.status, draft.attempts, draft.max_attempts) == (StepStatus.DEAD, 1, 3)
    assert draft.error_class == error_class
    assert draft.last_error
    assert draft.result is None
    assert fresh(publish).status == StepStatus.BLOCKED
    task.refresh_from_db()
    assert task.status == TaskStatus.DEAD
    assert task.finished_at is not None
    assert kinds(task) == ["enqueued", "claimed", "dead_lettered"]
    assert events(task, EventKind.DEAD_LETTERED)[0].reason == reason
    assert len(recorder.calls) == 1


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("mode", "error_class"),
    [("value_error", "builtins.ValueError"), ("runtime_error", "builtins.RuntimeError")],
)
def test_an_unexpected_handler_error_is_retried(pair: str, mode: str, error_class: str) -> None:
    task = services.enqueue(pair, {"draft": mode}).task
    draft = step_at(task, 0)
    start = services.db_now()

    runner.execute(claim(draft))

    draft = fresh(draft)
    assert (draft.status, draft.attempts) == (StepStatus.PENDING, 1)
    assert draft.error_class == error_class
    assert draft.available_at is not None
    assert draft.available_at > start
    retry = events(task, EventKind.RETRY_SCHEDULED)[0]
    assert 0 <= retry.data["retry_in"] <= 3600
    task.refresh_from_db()
    assert task.status == TaskStatus.PENDING


@pytest.mark.django_db
def test_a_handler_sees_earlier_results_its_attempt_and_its_step_key(
    pair: str, recorder: Recorder
) -> None:
    task = services.enqueue(pair, {"publish": "fail_once"}).task
    draft, publish = step_at(task, 0), step_at(task, 1)
    runner.execute(claim(draft))
    runner.execute(claim(publish))
    backdate(publish)
    runner.execute(claim(publish))

    assert fresh(publish).status == StepStatus.SUCCEEDED
    key = f"task-{task.pk}"
    assert [(c["kind"], c["attempt"], c["step_key"], c["results"]) for c in recorder.calls] == [
        ("draft", 1, f"{key}:0:draft", {}),
        ("publish", 1, f"{key}:1:publish", {"draft": {"done": "draft", "attempt": 1}}),
        ("publish", 2, f"{key}:1:publish", {"draft": {"done": "draft", "attempt": 1}}),
    ]
    assert fresh(publish).idempotency_key == f"{key}:1:publish"


# --- cancel while a step runs -------------------------------------------------------------


@pytest.mark.django_db
def test_a_cancelled_task_keeps_its_running_steps_result_but_ends_cancelled(pair: str) -> None:
    task = services.enqueue(pair, {}).task
    draft, publish = step_at(task, 0), step_at(task, 1)
    held = claim(draft)

    services.cancel(task, actor="cli:x", reason="r")

    task.refresh_from_db()
    assert task.status == TaskStatus.RUNNING
    assert task.cancel_requested_at is not None
    assert fresh(draft).status == StepStatus.RUNNING
    assert fresh(publish).status == StepStatus.CANCELLED
    requested = events(task, EventKind.CANCEL_REQUESTED)[0]
    assert (requested.actor, requested.reason) == ("cli:x", "r")

    assert services.complete_step(held, {"draft": "v1"}) is True

    draft = fresh(draft)
    assert (draft.status, draft.result) == (StepStatus.SUCCEEDED, {"draft": "v1"})
    assert fresh(publish).status == StepStatus.CANCELLED
    task.refresh_from_db()
    assert task.status == TaskStatus.CANCELLED
    assert task.finished_at is not None
    assert kinds(task) == ["enqueued", "claimed", "cancel_requested", "succeeded", "cancelled"]
    run_step(publish.pk)
    assert fresh(publish).fencing_token == 0
    assert not Lease.objects.filter(step=publish).exists()


@pytest.mark.django_db
def test_a_failure_after_cancel_does_not_schedule_a_retry(pair: str) -> None:
    task = services.enqueue(pair, {}).task
    draft = step_at(task, 0)
    held = claim(draft)
    services.cancel(task, actor="cli:x", reason="r")

    assert (
        services.fail_step(held, error_class="Boom", message="boom", retry_in=1, reason="") is True
    )

    draft = fresh(draft)
    assert (draft.status, draft.attempts) == (StepStatus.CANCELLED, 1)
    task.refresh_from_db()
    assert task.status == TaskStatus.CANCELLED
    assert task.finished_at is not None
    assert EventKind.RETRY_SCHEDULED not in kinds(task)
    assert kinds(task)[-1] == EventKind.CANCELLED
    backdate(draft)
    assert services.claim_step(draft.pk, worker_id=WORKER) is None


@pytest.mark.django_db
def test_a_lease_that_expires_after_cancel_cancels_the_step() -> None:
    task = services.enqueue("demo.noop", {}).task
    step = only_step(task)
    claim(step)
    services.cancel(task, actor="cli:x", reason="r")

    expire_lease(step)

    assert fresh(step).status == StepStatus.CANCELLED
    task.refresh_from_db()
    assert task.status == TaskStatus.CANCELLED
    assert task.finished_at is not None
    assert events(task, EventKind.LEASE_EXPIRED)[0].data["outcome"] == "cancelled"
    assert kinds(task)[-1] == EventKind.CANCELLED


@pytest.mark.django_db
def test_a_one_step_task_cancelled_while_running_ends_cancelled_with_its_result_kept() -> None:
    task = services.enqueue("demo.noop", {}).task
    step = only_step(task)
    held = claim(step)
    services.cancel(task, actor="cli:x", reason="no longer needed")
    task.refresh_from_db()
    assert task.status == TaskStatus.RUNNING

    assert services.complete_step(held, {"done": True}) is True

    step = fresh(step)
    assert (step.status, step.result) == (StepStatus.SUCCEEDED, {"done": True})
    task.refresh_from_db()
    assert task.status == TaskStatus.CANCELLED
    assert task.finished_at is not None
    assert kinds(task) == ["enqueued", "claimed", "cancel_requested", "succeeded", "cancelled"]


# --- the heartbeat thread, end to end -----------------------------------------------------


def _run_in_thread(held: Claim, errors: list[BaseException]) -> threading.Thread:
    thread = worker_thread(lambda: runner.execute(held), errors)
    thread.start()
    return thread


@pytest.mark.django_db(transaction=True)
def test_the_heartbeat_tells_a_running_handler_that_its_task_was_cancelled(
    pair: str, recorder: Recorder, broker: BrokerView
) -> None:
    task = services.enqueue(pair, {"draft": "wait_for_cancel"}).task
    draft = step_at(task, 0)
    # A one-second lease makes the heartbeat beat every third of a second.
    held = claim(draft, lease_seconds=1)
    errors: list[BaseException] = []
    thread = _run_in_thread(held, errors)
    assert recorder.started.wait(timeout=20)

    services.cancel(task, actor="cli:x", reason="stop it")
    thread.join(timeout=30)

    assert not thread.is_alive()
    assert not errors
    draft = fresh(draft)
    assert (draft.status, draft.result) == (StepStatus.SUCCEEDED, {"saw_cancel": True})
    assert fresh(step_at(task, 1)).status == StepStatus.CANCELLED
    task.refresh_from_db()
    assert task.status == TaskStatus.CANCELLED
    assert kinds(task) == ["enqueued", "claimed", "cancel_requested", "succeeded", "cancelled"]


@pytest.mark.django_db(transaction=True)
def test_the_heartbeat_tells_a_running_handler_that_its_lease_was_lost(
    pair: str, recorder: Recorder, broker: BrokerView
) -> None:
    task = services.enqueue(pair, {"draft": "wait_for_lease_loss"}).task
    draft = step_at(task, 0)
    held = claim(draft, worker_id="slow", lease_seconds=1)
    errors: list[BaseException] = []
    thread = _run_in_thread(held, errors)
    assert recorder.started.wait(timeout=20)

    # The heartbeat may renew between back-dating and reaping; try until the reap wins.
    for _ in range(50):
        backdate(draft)
        if services.reap_expired_leases():
            break
    else:
        pytest.fail("the lease was never reaped")
    current = claim(draft, worker_id="fast")
    thread.join(timeout=30)

    assert not thread.is_alive()
    assert not errors
    assert recorder.lease_lost == [True]
    draft = fresh(draft)
    # The late result was refused: the step belongs to the new claim.
    assert (draft.status, draft.fencing_token, draft.result) == (StepStatus.RUNNING, 2, None)
    operations = [e.data["operation"] for e in events(task, EventKind.STALE_WRITE_REJECTED)]
    assert operations == ["heartbeat", "complete"]
    assert services.complete_step(current, {"by": "fast"}) is True
    assert fresh(draft).result == {"by": "fast"}
