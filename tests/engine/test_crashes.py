"""A crash costs only the step that crashed (``tasks_app.engine.crashes``): releasing a claim
without charging its attempt, fenced by token; ending a lease now; what a pool process
records about its batch, read back; and handing a dead process's batch back.

The worker processes themselves die in the fault drill (``tests/chaos/test_crashes.py``);
here a process that dies is a plain child process, killed.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import pytest

from tasks_app import services
from tasks_app.engine import crashes, fastpath, leases, runner
from tasks_app.exceptions import LEASE_EXPIRED
from tasks_app.history import TaskState, fold
from tasks_app.models import Event, EventKind, Lease, Step, StepStatus, Task, TaskStatus
from tasks_app.observability import invariants
from tests.conftest import BrokerView, event_kinds, only_step
from tests.e2e_support import wait_for
from tests.lease_support import claim, events, expire_lease, fresh, lease_of

ACTOR = "worker:host:1"


def released(claim: leases.Claim, **data: Any) -> bool:
    return leases.release_claim(claim, actor=ACTOR, reason="worker_lost", **data)


def assert_checker_clean() -> None:
    report = invariants.check(since=None)
    assert report.ok, "\n".join(map(str, report.findings))


def noops(count: int) -> list[Task]:
    return [services.enqueue("demo.noop", {}).task for _ in range(count)]


# --- releasing a claim ---------------------------------------------------------------------


@pytest.mark.django_db
def test_a_released_claim_is_due_again_without_charging_its_attempt(
    broker: BrokerView, django_capture_on_commit_callbacks: Any
) -> None:
    task = services.enqueue("demo.noop", {}).task
    step = only_step(task)
    held = claim(step)
    broker.purge()

    with django_capture_on_commit_callbacks(execute=True):
        assert released(held, ran=False)

    step = fresh(step)
    assert (step.status, step.attempts, step.fencing_token) == (StepStatus.PENDING, 0, 1)
    assert step.lease_expires_at is None
    assert step.error_class == ""  # not LEASE_EXPIRED: it may be claimed in any batch
    task.refresh_from_db()
    assert task.status == TaskStatus.PENDING
    lease = Lease.objects.get(step=step, token=1)
    assert (lease.outcome, lease.released_at is not None) == (Lease.Outcome.RELEASED, True)
    [event] = events(task, EventKind.CLAIM_RELEASED)
    assert (event.actor, event.reason, event.step_id) == (ACTOR, "worker_lost", step.pk)
    assert event.data["token"] == 1
    assert event.data["step_status"] == "pending"
    assert event.data["ran"] is False
    assert event.data["task_status"] == TaskStatus.PENDING
    assert event.data["steps"] == {str(step.pk): [StepStatus.PENDING, 0, 1]}
    assert broker.step_ids() == [step.pk]  # rung, to run again within seconds
    assert fold(task) == TaskState.from_db(task)
    assert_checker_clean()


@pytest.mark.django_db
def test_a_released_step_runs_again_and_only_its_runs_count_as_attempts() -> None:
    task = services.enqueue("demo.flaky", {"fail_first": 2}).task
    step = only_step(task)
    for _ in range(3):
        assert released(claim(step))
    assert (fresh(step).attempts, fresh(step).fencing_token) == (0, 3)

    # Tokens 1 and 2 went to released claims: the next claim (token 4) is its first
    # attempt, and fail_first counts tokens, so it succeeds.
    again = claim(step)
    assert (again.token, again.attempt) == (4, 1)
    runner.execute(again)

    step = fresh(step)
    assert (step.status, step.attempts, step.fencing_token) == (StepStatus.SUCCEEDED, 1, 4)
    assert event_kinds(task) == [
        "enqueued",
        *["claimed", "claim_released"] * 3,
        "claimed",
        "succeeded",
    ]
    assert_checker_clean()


@pytest.mark.django_db
def test_a_release_on_the_last_attempt_does_not_dead_letter() -> None:
    task = services.enqueue("demo.noop", {}).task
    step = only_step(task)
    for _ in range(step.max_attempts - 1):
        claim(step)
        expire_lease(step)
    last = claim(step)
    assert last.attempt == step.max_attempts

    assert released(last)

    step = fresh(step)
    assert (step.status, step.attempts) == (StepStatus.PENDING, step.max_attempts - 1)
    assert step.error_class == LEASE_EXPIRED  # its earlier expiries still keep it alone
    runner.execute(claim(step))
    assert fresh(step).status == StepStatus.SUCCEEDED
    assert_checker_clean()


@pytest.mark.django_db
def test_a_release_is_fenced_by_token() -> None:
    task = services.enqueue("demo.noop", {}).task
    step = only_step(task)
    old = claim(step)
    expire_lease(step)
    current = claim(step, worker_id="w2")
    before = Event.objects.count()

    assert not released(old)

    step = fresh(step)
    assert (step.status, step.attempts, step.fencing_token) == (StepStatus.RUNNING, 2, 2)
    # Not the old worker's write: nothing is recorded, not even a stale write.
    assert Event.objects.count() == before
    assert lease_of(step, current.token).outcome == ""
    runner.execute(current)
    assert fresh(step).status == StepStatus.SUCCEEDED
    assert_checker_clean()


@pytest.mark.django_db
def test_a_claim_whose_outcome_was_recorded_is_left_alone() -> None:
    done, failed = noops(2)
    finished = claim(only_step(done))
    assert services.complete_step(finished, {})
    retried = claim(only_step(failed))
    assert services.fail_step(
        retried, error_class="RetryableError", message="no", retry_in=60, reason=""
    )
    before = Event.objects.count()

    assert not released(finished)
    assert not released(retried)

    assert fresh(only_step(done)).status == StepStatus.SUCCEEDED
    step = fresh(only_step(failed))
    assert (step.status, step.attempts) == (StepStatus.PENDING, 1)
    assert Event.objects.count() == before
    assert_checker_clean()


@pytest.mark.django_db
def test_a_release_after_a_cancel_was_requested_cancels_the_step() -> None:
    task = services.enqueue("demo.noop", {}).task
    step = only_step(task)
    held = claim(step)
    services.cancel(task, actor="cli:ann", reason="stop")

    assert released(held)

    step = fresh(step)
    assert (step.status, step.attempts) == (StepStatus.CANCELLED, 0)
    task.refresh_from_db()
    assert task.status == TaskStatus.CANCELLED
    assert event_kinds(task) == [
        "enqueued",
        "claimed",
        "cancel_requested",
        "claim_released",
        "cancelled",
    ]
    assert events(task, EventKind.CLAIM_RELEASED)[0].data["step_status"] == "cancelled"
    assert_checker_clean()


# --- ending a lease now --------------------------------------------------------------------


@pytest.mark.django_db
def test_a_lease_ended_now_is_reaped_at_the_next_sweep_and_charged() -> None:
    task = services.enqueue("demo.noop", {}).task
    step = only_step(task)
    held = claim(step)
    assert services.reap_expired_leases() == 0

    assert leases.expire_lease_now(held)

    assert services.reap_expired_leases() == 1
    step = fresh(step)
    assert (step.status, step.attempts, step.error_class) == (StepStatus.PENDING, 1, LEASE_EXPIRED)
    assert Lease.objects.get(step=step, token=1).outcome == Lease.Outcome.EXPIRED
    assert event_kinds(task) == ["enqueued", "claimed", "lease_expired"]
    # Fenced: the claim no longer holds the step.
    assert not leases.expire_lease_now(held)
    assert_checker_clean()


# --- what a pool process records -------------------------------------------------------------


def _claims(count: int) -> list[leases.Claim]:
    noops(count)
    claims = fastpath.claim_batch(worker_id="host:7", limit=count, queue="default")
    assert len(claims) == count
    return claims


@pytest.mark.django_db
def test_the_record_reads_back_the_batch_and_the_running_step(tmp_path: Path) -> None:
    record = crashes.ClaimsRecord()
    path = tmp_path / "7"
    record.holding(_claims(1))  # not open: records nothing
    assert not path.exists()

    record.open(path)
    assert crashes.read_batch(path) is None  # nothing held yet
    longer = _claims(5)
    record.holding(longer)
    shorter = longer[:2]
    record.holding(shorter)
    held = crashes.read_batch(path)
    assert held is not None
    assert (held.claims, held.running, held.culprit) == (shorter, crashes.NOTHING_STARTED, None)

    record.running(1)
    held = crashes.read_batch(path)
    assert held is not None
    assert (held.running, held.culprit) == (1, shorter[1])
    record.running(2)
    held = crashes.read_batch(path)
    assert held is not None
    assert held.culprit is None  # every handler returned

    record.clear()
    assert crashes.read_batch(path) is None
    record.close()
    path.write_bytes(b"          3\n[[1,2")  # cut mid-write
    assert crashes.read_batch(path) is None


@pytest.mark.django_db
def test_a_record_that_cannot_be_written_stops_without_failing_the_batch() -> None:
    record = crashes.ClaimsRecord()
    record.open(Path("/dev/full"))  # every write fails: no space left

    record.holding(_claims(2))
    record.running(0)

    assert not record.is_open


# --- handing back a dead process's batch -------------------------------------------------------


@pytest.mark.django_db
def test_a_dead_processs_batch_is_handed_back_but_for_the_step_that_ran() -> None:
    recorded, finished, culprit, unstarted = _claims(4)
    assert services.complete_step(recorded, {})  # recorded before the process died

    done = crashes.hand_back(
        crashes.HeldBatch(claims=[recorded, finished, culprit, unstarted], running=2),
        actor=ACTOR,
    )

    assert (done.released, done.expired) == (2, 1)
    assert fresh_step(recorded).status == StepStatus.SUCCEEDED
    for claim_, ran in ((finished, True), (unstarted, False)):
        step = fresh_step(claim_)
        assert (step.status, step.attempts) == (StepStatus.PENDING, 0)
        [event] = Event.objects.filter(step_id=step.pk, kind=EventKind.CLAIM_RELEASED)
        assert (event.data["ran"], event.data["running_step"]) == (ran, culprit.step_id)
    assert fresh_step(culprit).status == StepStatus.RUNNING
    assert services.reap_expired_leases() == 1
    step = fresh_step(culprit)
    assert (step.status, step.attempts, step.error_class) == (StepStatus.PENDING, 1, LEASE_EXPIRED)
    assert_checker_clean()


@pytest.mark.django_db
def test_a_process_that_died_between_steps_blames_none() -> None:
    claims = _claims(3)

    done = crashes.hand_back(crashes.HeldBatch(claims=claims, running=len(claims)), actor=ACTOR)

    assert (done.released, done.expired) == (3, 0)
    assert {fresh_step(c).status for c in claims} == {StepStatus.PENDING}
    assert_checker_clean()


def fresh_step(claim_: leases.Claim) -> Step:
    return Step.objects.get(pk=claim_.step_id)


@pytest.mark.django_db(transaction=True)
def test_the_watcher_hands_back_what_a_killed_child_held(tmp_path: Path) -> None:
    first, second = _claims(2)
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        record = crashes.ClaimsRecord()
        record.open(tmp_path / str(child.pid))
        record.holding([first, second])
        record.running(0)
        watcher = crashes.ChildWatcher(tmp_path)
        assert watcher.exited() == []

        child.send_signal(signal.SIGKILL)
        assert wait_for(watcher.exited, timeout=10, what="the child to exit") == [child.pid]
        done = crashes.recover(child.pid, tmp_path / str(child.pid))
        record.close()
    finally:
        child.kill()
        child.wait()

    assert done == crashes.Recovery(released=1, expired=1)
    assert not (tmp_path / str(child.pid)).exists()
    assert watcher.exited() == []
    assert (fresh_step(second).status, fresh_step(second).attempts) == (StepStatus.PENDING, 0)
    assert services.reap_expired_leases() == 1
    assert fresh_step(first).error_class == LEASE_EXPIRED
    assert_checker_clean()


def test_a_worker_makes_its_directory_and_removes_those_of_workers_gone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    stale = tmp_path / f"{crashes.DIRECTORY_PREFIX}{gone.pid}-abc"
    (stale / "123").parent.mkdir()
    (stale / "123").write_bytes(b"")
    alive = tmp_path / f"{crashes.DIRECTORY_PREFIX}{os.getppid()}-def"
    alive.mkdir()

    def directories() -> set[Path]:
        return set(tmp_path.glob(f"{crashes.DIRECTORY_PREFIX}*"))

    crashes.prepare()
    try:
        [made] = directories() - {alive}
        assert made.name.startswith(f"{crashes.DIRECTORY_PREFIX}{os.getpid()}-")
        assert not stale.exists()
        crashes.watch()
    finally:
        crashes.clean_up()

    assert directories() == {alive}
