"""The draining worker (``runner.drain``, ``runner.run_batch``): a doorbell drains its step
and every other due step of its queue, in batches that grow while steps are fast; a drain
out of time rings for the rest; failures inside a batch are retried while its successes
are recorded; and the heartbeat covers every claim of the batch, renewing a waiting one,
without a stale write. Batches keep every guarantee of the one-step path (DESIGN rules 1,
2, 3, 8 and 10), on PostgreSQL.

Time moves by back-dating rows (``backdate``), never by sleeping. Tests that need other
database connections (the heartbeat thread) or a real commit (doorbells published after
commit) are transactional.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from itertools import pairwise
from typing import Any

import pytest
from django.db import connection, transaction
from django.db.models.functions import Now

from tasks_app import services
from tasks_app.engine import fastpath, runner
from tasks_app.models import Event, EventKind, Lease, Step, StepStatus, Task, TaskStatus
from tasks_app.tasks import run_step
from tasks_app.workflows import StepContext, StepSpec, Workflow, register, registry
from tests.batch_support import claimed_batches, lease_count, noops
from tests.batch_support import patient_drain as patient_drain  # a fixture, for pytest to find
from tests.batch_support import two_queues as two_queues  # a fixture, for pytest to find
from tests.conftest import BrokerView, backdate, event_kinds, only_step, worker_thread
from tests.e2e_support import wait_for
from tests.lease_support import WORKER, events, fresh

GATE = "test.batch.gate"


# --- test workflows -----------------------------------------------------------------------


@dataclass
class Gate:
    """A handler that runs until the heartbeat tells it its task was cancelled."""

    started: threading.Event = field(default_factory=threading.Event)

    def handler(self, ctx: StepContext) -> dict[str, Any]:
        self.started.set()
        ctx._cancelled.wait(timeout=20)
        return {"saw_cancel": ctx.cancelled}


@pytest.fixture
def gate() -> Iterator[Gate]:
    opened = Gate()
    register(Workflow(GATE, 1, steps=(StepSpec("wait", opened.handler),)))
    yield opened
    registry.unregister(GATE, 1)


# --- the draining worker ------------------------------------------------------------------


@pytest.mark.django_db
def test_a_doorbell_drains_its_step_and_every_other_due_step_of_its_queue(
    patient_drain: None, settings: Any
) -> None:
    settings.TASKS_CLAIM_BATCH = 4
    steps = noops(30)
    named = steps[17]

    assert runner.drain(named.pk) == 30

    for step in map(fresh, steps):
        assert (step.status, step.attempts, step.fencing_token) == (StepStatus.SUCCEEDED, 1, 1)
        assert lease_count(step) == 1
        assert event_kinds(step.task) == ["enqueued", "claimed", "succeeded"]
    assert Task.objects.filter(status=TaskStatus.SUCCEEDED).count() == 30
    sizes = [len(group) for group in claimed_batches(steps)]
    assert claimed_batches(steps)[0] == [named.pk]  # the named step first, alone
    assert sum(sizes) == 30
    assert max(sizes) <= 4
    assert all(later <= 2 * earlier for earlier, later in pairwise(sizes))


@pytest.mark.django_db
def test_batches_double_while_steps_are_fast_up_to_the_configured_size(
    patient_drain: None, settings: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings.TASKS_CLAIM_BATCH = 4
    # Every step counts as fast, so the growth does not depend on this machine's speed.
    monkeypatch.setattr(runner, "FAST_STEP_SECONDS", 3600.0)
    steps = noops(30)

    assert runner.drain(steps[0].pk) == 30

    assert [len(group) for group in claimed_batches(steps)] == [1, 2, 4, 4, 4, 4, 4, 4, 3]


@pytest.mark.django_db
def test_with_a_claim_batch_of_one_a_drain_still_runs_every_step(
    patient_drain: None, settings: Any
) -> None:
    settings.TASKS_CLAIM_BATCH = 1
    steps = noops(5)

    assert runner.drain(steps[2].pk) == 5

    assert all(fresh(step).status == StepStatus.SUCCEEDED for step in steps)
    assert [len(group) for group in claimed_batches(steps)] == [1] * 5


@pytest.mark.django_db
def test_the_celery_entry_point_drains_the_queue_of_the_step_it_names(patient_drain: None) -> None:
    steps = noops(3)

    run_step(steps[1].pk)

    assert [fresh(step).status for step in steps] == [StepStatus.SUCCEEDED] * 3


@pytest.mark.django_db
def test_draining_leaves_other_and_paused_queues_alone(
    patient_drain: None, two_queues: None
) -> None:
    here = noops(5)
    there = noops(3, queue="other")

    assert runner.drain(here[0].pk) == 5

    assert all(fresh(step).status == StepStatus.SUCCEEDED for step in here)
    for step in map(fresh, there):
        assert (step.status, step.fencing_token) == (StepStatus.PENDING, 0)
        assert lease_count(step) == 0

    services.pause_queue("other", actor="cli:t", reason="incident")
    assert runner.drain(there[0].pk) == 0
    assert all(fresh(step).fencing_token == 0 for step in there)
    services.resume_queue("other", actor="cli:t", reason="over")
    assert runner.drain(there[0].pk) == 3


@pytest.mark.django_db
def test_a_doorbell_for_a_step_that_already_finished_still_drains_its_queue(
    patient_drain: None,
) -> None:
    finished = noops(1)[0]
    assert runner.drain(finished.pk) == 1
    later = noops(3)

    assert runner.drain(finished.pk) == 3

    assert all(fresh(step).status == StepStatus.SUCCEEDED for step in later)
    assert fresh(finished).fencing_token == 1
    assert event_kinds(finished.task) == ["enqueued", "claimed", "succeeded"]


def follow_doorbells(broker: BrokerView, *, limit: int = 50) -> list[int]:
    """Answer every doorbell rung, and those they ring in turn, as a worker would; how
    many steps each drain ran."""
    ran: list[int] = []
    bells = broker.step_ids()
    broker.purge()
    while bells:
        assert len(ran) < limit, "the doorbells never stopped ringing"
        ran.append(runner.drain(bells.pop(0)))
        bells += broker.step_ids()
        broker.purge()
    return ran


@pytest.mark.django_db(transaction=True)
def test_a_drain_out_of_time_runs_one_batch_and_rings_for_the_rest(
    broker: BrokerView, settings: Any
) -> None:
    settings.TASKS_DRAIN_SECONDS = 0
    steps = noops(5)
    broker.purge()

    assert runner.drain(steps[0].pk) == 1

    assert [fresh(step).status for step in steps] == [StepStatus.SUCCEEDED] + [
        StepStatus.PENDING
    ] * 4
    assert broker.step_ids() != []  # rung for the rest, in the same queue
    settings.TASKS_DRAIN_SECONDS = 300
    assert sum(follow_doorbells(broker)) == 4
    assert all(fresh(step).status == StepStatus.SUCCEEDED for step in steps)
    assert all(lease_count(step) == 1 for step in steps)


@pytest.mark.django_db(transaction=True)
def test_a_chain_of_drains_out_of_time_runs_every_step_without_the_sweeper(
    broker: BrokerView, settings: Any
) -> None:
    settings.TASKS_DRAIN_SECONDS = 0
    steps = noops(4)
    broker.purge()

    assert runner.drain(steps[0].pk) == 1
    ran = follow_doorbells(broker)

    # Each drain ran at most one batch of one (batches start at one step).
    assert sorted(set(ran)) in ([0, 1], [1])
    assert sum(ran) == 3
    assert all(fresh(step).status == StepStatus.SUCCEEDED for step in steps)
    assert all(lease_count(step) == 1 for step in steps)


def _flaky_and_noops() -> tuple[list[Step], list[Step]]:
    """noop, flaky, noop, flaky, noop: the flaky ones fail their first claim."""
    failing, passing = [], []
    for n in range(5):
        if n % 2:
            failing.append(only_step(services.enqueue("demo.flaky", {"fail_first": 1}).task))
        else:
            passing.append(only_step(services.enqueue("demo.noop", {"n": n}).task))
    return failing, passing


@pytest.mark.django_db
def test_failures_inside_a_batch_are_retried_with_backoff_while_its_successes_are_recorded(
    patient_drain: None,
) -> None:
    failing, passing = _flaky_and_noops()
    claims = fastpath.claim_batch(worker_id=WORKER, limit=10, queue="default")
    assert len(claims) == 5

    runner.run_batch(claims)

    for step in map(fresh, passing):
        assert (step.status, step.result) == (StepStatus.SUCCEEDED, {})
        assert Lease.objects.get(step=step).outcome == Lease.Outcome.SUCCEEDED
        assert Task.objects.get(pk=step.task_id).status == TaskStatus.SUCCEEDED
    for step in map(fresh, failing):
        assert (step.status, step.attempts, step.fencing_token) == (StepStatus.PENDING, 1, 1)
        assert step.result is None
        assert step.error_class == "tasks_app.exceptions.RetryableError"
        assert "fail_first" in step.last_error
        lease = Lease.objects.get(step=step)
        assert lease.outcome == Lease.Outcome.FAILED
        assert step.available_at is not None
        assert step.available_at >= lease.acquired_at
        task = Task.objects.get(pk=step.task_id)
        assert task.status == TaskStatus.PENDING
        assert event_kinds(task) == ["enqueued", "claimed", "retry_scheduled"]
        [retry] = events(task, EventKind.RETRY_SCHEDULED)
        assert 0 <= retry.data["retry_in"] <= 0.1  # demo.flaky: base 0.1 s, first retry

    for step in failing:
        backdate(step)
    assert runner.drain(failing[0].pk) == 2
    for step in map(fresh, failing):
        assert (step.status, step.attempts, step.fencing_token) == (StepStatus.SUCCEEDED, 2, 2)
        assert step.result == {"token": 2, "attempt": 2}
        outcomes = list(Lease.objects.filter(step=step).values_list("outcome", flat=True))
        assert outcomes == [Lease.Outcome.FAILED, Lease.Outcome.SUCCEEDED]


@pytest.mark.django_db
def test_a_drain_retries_the_failures_of_its_batches_and_still_runs_the_rest(
    patient_drain: None,
) -> None:
    failing, passing = _flaky_and_noops()

    ran = runner.drain(passing[0].pk)

    # The retry may come due while the drain still runs (demo.flaky waits at most 0.1 s).
    assert ran in (5, 6, 7)
    assert all(fresh(step).status == StepStatus.SUCCEEDED for step in passing)
    assert all(lease_count(step) == 1 for step in passing)
    for step in failing:
        if fresh(step).status == StepStatus.PENDING:
            backdate(step)
    runner.drain(failing[0].pk)
    for step in map(fresh, failing):
        assert (step.status, step.fencing_token) == (StepStatus.SUCCEEDED, 2)
        assert event_kinds(step.task) == [
            "enqueued",
            "claimed",
            "retry_scheduled",
            "claimed",
            "succeeded",
        ]


# --- the heartbeat covers the whole batch -------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_the_heartbeat_keeps_a_waiting_claim_of_the_batch_alive_while_an_earlier_step_runs(
    gate: Gate, broker: BrokerView
) -> None:
    slow = only_step(services.enqueue(GATE, {}, priority=10).task)
    waiting = noops(1)[0]
    claims = fastpath.claim_batch(worker_id=WORKER, limit=2, queue="default", lease_seconds=1)
    assert [claim.step_id for claim in claims] == [slow.pk, waiting.pk]
    errors: list[BaseException] = []

    thread = worker_thread(lambda: runner.run_batch(claims), errors)
    thread.start()
    assert gate.started.wait(timeout=20)

    # The waiting step's lease looks long gone; the heartbeat (every third of a second)
    # renews it although its handler has not started.
    backdate(waiting)
    live = Step.objects.filter(pk=waiting.pk, lease_expires_at__gt=Now())
    wait_for(live.exists, timeout=20, interval=0.01, what="the waiting claim's lease renewed")
    assert fresh(waiting).status == StepStatus.RUNNING
    assert fresh(waiting).result is None  # ... and it still has not run
    assert services.reap_expired_leases() == 0

    services.cancel(slow.task, actor="cli:t", reason="let the batch go on")
    thread.join(timeout=30)

    assert not thread.is_alive()
    assert not errors
    assert fresh(slow).result == {"saw_cancel": True}
    waiting = fresh(waiting)
    assert (waiting.status, waiting.fencing_token, waiting.result) == (StepStatus.SUCCEEDED, 1, {})
    assert EventKind.STALE_WRITE_REJECTED not in event_kinds(waiting.task)
    assert Task.objects.get(pk=slow.task_id).status == TaskStatus.CANCELLED


def _waiting_statements() -> list[str]:
    """Statements of other sessions on this database that wait for a lock."""
    with connection.cursor() as cursor:
        # Activity is snapshotted once per transaction unless the snapshot is cleared.
        cursor.execute("SELECT pg_stat_clear_snapshot()")
        cursor.execute(
            "SELECT query FROM pg_stat_activity WHERE datname = current_database()"
            " AND wait_event_type = 'Lock' AND pid <> pg_backend_pid()"
        )
        return [query for (query,) in cursor.fetchall()]


@pytest.mark.django_db(transaction=True)
def test_a_renewal_racing_the_batchs_own_completion_is_not_recorded_as_a_stale_write(
    broker: BrokerView,
) -> None:
    step = noops(1)[0]
    claims = fastpath.claim_batch(worker_id=WORKER, limit=1, queue="default", lease_seconds=1)
    errors: list[BaseException] = []

    thread = worker_thread(lambda: runner.run_batch(claims), errors)
    with transaction.atomic():
        # Hold the step row so the completion queues on it, then let a renewal (due every
        # third of the one-second lease) queue behind it if the claim is still renewed.
        Step.objects.select_for_update().get(pk=step.pk)
        thread.start()
        wait_for(
            # The completion statement opens with its task locks (its text is cut short here).
            lambda: any("WITH locked AS" in query for query in _waiting_statements()),
            timeout=20,
            interval=0.01,
            what="the completion to reach the step row",
        )
        # A renewal may or may not come due while the row is held; give it the time to.
        with contextlib.suppress(AssertionError):
            wait_for(lambda: len(_waiting_statements()) >= 2, timeout=2, interval=0.01)
        renewal_queued = len(_waiting_statements()) >= 2
    thread.join(timeout=30)
    if renewal_queued:
        # The queued renewal ends moments after the completion commits, on its own thread.
        stale = Event.objects.filter(task_id=step.task_id, kind=EventKind.STALE_WRITE_REJECTED)
        with contextlib.suppress(AssertionError):
            wait_for(stale.exists, timeout=3, interval=0.01)

    assert not thread.is_alive()
    assert not errors
    assert fresh(step).status == StepStatus.SUCCEEDED
    assert event_kinds(step.task) == ["enqueued", "claimed", "succeeded"]


@pytest.mark.django_db(transaction=True)
def test_a_cancel_committed_while_the_completion_waits_for_its_task_is_seen_by_it() -> None:
    # The completion is one statement whose snapshot is taken before it waits for the task
    # locks: it must read the cancel from the locked row, not from that snapshot.
    cancelled, other = noops(2)
    claims = fastpath.claim_batch(worker_id=WORKER, limit=2, queue="default")
    assert {claim.step_id for claim in claims} == {cancelled.pk, other.pk}
    errors: list[BaseException] = []
    accepted: set[int] = set()

    thread = worker_thread(
        lambda: accepted.update(fastpath.complete_many([(claim, None) for claim in claims])),
        errors,
    )
    with transaction.atomic():
        services.cancel(cancelled.task, actor="cli:t", reason="withdrawn")
        thread.start()
        wait_for(
            lambda: any("WITH locked AS" in query for query in _waiting_statements()),
            timeout=20,
            interval=0.01,
            what="the completion to wait for the task's lock",
        )
    thread.join(timeout=30)

    assert not thread.is_alive()
    assert not errors
    assert accepted == {cancelled.pk, other.pk}
    assert Task.objects.get(pk=cancelled.task_id).status == TaskStatus.CANCELLED
    assert event_kinds(cancelled.task)[-3:] == ["cancel_requested", "succeeded", "cancelled"]
    assert Task.objects.get(pk=other.task_id).status == TaskStatus.SUCCEEDED
    assert EventKind.STALE_WRITE_REJECTED not in event_kinds(other.task)
