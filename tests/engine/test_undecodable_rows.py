"""A row no Python process can decode (a payload nested past the decoder's recursion limit,
stored by SQL) is isolated where a worker or the sweeper meets it: its step is
dead-lettered as ``undecodable_payload`` with its events, and the rest of the batch, and
every part of the sweep, goes on.

The rows are poisoned by SQL (``tests.poison_support``); time moves by back-dating rows.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from django.db.models import F

from tasks_app import services
from tasks_app.engine import fastpath, runner, sweeper
from tasks_app.exceptions import UNDECODABLE_PAYLOAD
from tasks_app.models import EventKind, StepStatus, Task, TaskStatus
from tests.conftest import backdate, event_kinds, only_step
from tests.factories import noop, succeeded
from tests.lease_support import LEASE, WORKER, claim, events, fresh, step_at
from tests.poison_support import poison

RETENTION_DAYS = 30


@pytest.fixture(params=[True, False], ids=["sql-fast-path", "orm-path"])
def either_path(request: pytest.FixtureRequest, settings: Any) -> Iterator[None]:
    settings.TASKS_SQL_FAST_PATH = request.param
    yield


def _assert_dead_undecodable(task: Task, column: str) -> None:
    step = fresh(only_step(task)) if task.steps.count() == 1 else None
    task.refresh_from_db()
    assert task.status == TaskStatus.DEAD
    if step is not None:
        assert (step.status, step.error_class) == (StepStatus.DEAD, UNDECODABLE_PAYLOAD)
        assert column in step.last_error, step.last_error


# --- the claim and the runner -------------------------------------------------------------------


@pytest.mark.django_db
def test_a_batch_claim_dead_letters_an_undecodable_payload_and_runs_the_rest(
    either_path: None,
) -> None:
    poisoned, healthy = noop(), noop()
    poison(poisoned.pk)

    claims = fastpath.claim_batch(worker_id=WORKER, limit=2, queue="default")
    assert sorted(claim.task_id for claim in claims) == [poisoned.pk, healthy.pk]
    assert runner.run_batch(claims) == 1

    _assert_dead_undecodable(poisoned, "payload")
    assert event_kinds(poisoned) == ["enqueued", "claimed", "dead_lettered"]
    assert fresh(only_step(healthy)).status == StepStatus.SUCCEEDED
    healthy.refresh_from_db()
    assert healthy.status == TaskStatus.SUCCEEDED


@pytest.mark.django_db
def test_an_undecodable_result_of_an_earlier_step_dead_letters_the_step_that_reads_it(
    pair: str,
) -> None:
    task = services.enqueue(pair, {}).task
    assert runner.run_claimed(step_at(task, 0).pk)
    poison(step_at(task, 0).pk, "result")

    assert runner.run_claimed(step_at(task, 1).pk)

    second = fresh(step_at(task, 1))
    assert (second.status, second.error_class) == (StepStatus.DEAD, UNDECODABLE_PAYLOAD)
    assert "result of step 'draft'" in second.last_error
    task.refresh_from_db()
    assert task.status == TaskStatus.DEAD


# --- the sweeper --------------------------------------------------------------------------------


def _finished_long_ago(task: Task) -> None:
    Task.objects.filter(pk=task.pk).update(
        finished_at=F("finished_at") - timedelta(days=RETENTION_DAYS + 1)
    )


@pytest.mark.django_db
def test_a_sweep_past_an_undecodable_row_still_reaps_rings_and_prunes(settings: Any) -> None:
    settings.RETENTION_DAYS = RETENTION_DAYS
    # A step left running with its payload undecodable (as a claim that could not decode
    # it left it), a healthy step whose worker is gone, a step whose doorbell was lost, and
    # finished tasks past their retention, one of them undecodable too.
    stuck_poisoned = noop()
    claim(only_step(stuck_poisoned))
    poison(stuck_poisoned.pk)
    backdate(only_step(stuck_poisoned), seconds=LEASE + 60)
    stuck = noop()
    claim(only_step(stuck))
    backdate(only_step(stuck), seconds=LEASE + 60)
    lost = noop()
    backdate(only_step(lost))
    old, old_poisoned = succeeded(), succeeded()
    poison(old_poisoned.pk)
    for task in (old, old_poisoned):
        _finished_long_ago(task)

    report = sweeper.sweep()

    assert (report.reaped, report.redispatched) == (2, 1)
    assert report.jobs["pruned"] == 2
    assert not Task.objects.filter(pk__in=[old.pk, old_poisoned.pk]).exists()
    assert fresh(only_step(stuck)).status == StepStatus.PENDING
    _assert_dead_undecodable(stuck_poisoned, "payload")
    assert event_kinds(stuck_poisoned) == ["enqueued", "claimed", "lease_expired", "dead_lettered"]
    # The next sweep finds nothing left to do with it, and fails on nothing.
    assert sweeper.sweep().reaped == 0


@pytest.mark.django_db
def test_a_part_of_the_sweep_that_fails_leaves_the_others_to_run(settings: Any) -> None:
    settings.RETENTION_DAYS = RETENTION_DAYS
    stuck = noop()
    claim(only_step(stuck))
    backdate(only_step(stuck), seconds=LEASE + 60)
    old = succeeded()
    _finished_long_ago(old)

    def broken(limit: int) -> int:
        raise RecursionError("maximum recursion depth exceeded while decoding a JSON array")

    # First among the registered jobs, so the jobs after it (retention) must still run.
    jobs = dict(sweeper._sweep_jobs)
    sweeper._sweep_jobs.clear()
    sweeper._sweep_jobs.update({"test_broken": broken, **jobs})
    try:
        report = sweeper.sweep()
        again = sweeper.sweep()
    finally:
        sweeper._sweep_jobs.clear()
        sweeper._sweep_jobs.update(jobs)

    assert report.reaped == 1
    assert report.jobs["test_broken"] == 0
    assert report.jobs["pruned"] == 1
    assert not Task.objects.filter(pk=old.pk).exists()
    assert again.jobs["test_broken"] == 0


@pytest.mark.django_db
def test_a_redrive_with_an_edited_payload_mends_the_task_and_notes_the_old_one(
    oncall: Any,
) -> None:
    task = noop()
    poison(task.pk)
    assert runner.run_claimed(only_step(task).pk)
    _assert_dead_undecodable(task, "payload")

    services.redrive(task, actor=oncall, reason="imported wrong", payload={"doc": []})
    assert runner.run_claimed(only_step(task).pk)

    task.refresh_from_db()
    assert (task.status, task.payload) == (TaskStatus.SUCCEEDED, {"doc": []})
    [redriven] = events(task, EventKind.REDRIVEN)
    assert redriven.data["old_payload"] == {
        "undecodable": "cannot be decoded (nested deeper than Python's JSON decoder reads; "
        "24,009 characters as stored)"
    }
