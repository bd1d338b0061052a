"""The invariant checker finds a history of the wrong shape (events appended or rows edited
behind the services' back): an enqueue that does not start it, claims whose tokens do not
rise or that nothing answers, a run ended twice."""

from __future__ import annotations

import pytest

from tasks_app import services
from tasks_app.engine import leases
from tasks_app.engine.leases import Claim
from tasks_app.models import EventKind, Task, TaskStatus
from tests.approval_support import advance
from tests.conftest import only_step
from tests.factories import dead_task, noop, succeeded
from tests.invariant_support import assert_clean, event, events_of, findings, running, sql


def test_it_finds_a_task_without_the_steps_its_enqueue_makes(db: None) -> None:
    # The task row and its first steps record the enqueue: a row inserted alone has none.
    sql(
        "INSERT INTO tasks_app_task (workflow, workflow_version, payload, payload_hash, "
        "idempotency_key, queue, priority, status, created_by, created_at, updated_at) "
        "VALUES ('demo.noop', 1, '{}', '', NULL, 'default', 0, 'pending', 'test', "
        "statement_timestamp(), statement_timestamp())"
    )
    task = Task.objects.get()

    assert findings() == [
        f"enqueued: task {task.pk}: its first steps (revision 0) are at positions none, "
        "not one each from 0"
    ]


@pytest.mark.no_fold_check
def test_it_finds_first_steps_with_a_position_missing(db: None) -> None:
    task = succeeded()
    sql(
        "INSERT INTO tasks_app_step (task_id, position, revision, kind, status, queue, "
        "priority, attempts, max_attempts, idempotency_key, fencing_token, result, "
        "last_error, error_class, lease_worker) SELECT task_id, 2, 0, kind, 'blocked', "
        "queue, priority, 0, max_attempts, idempotency_key || ':2', 0, NULL, '', '', '' "
        "FROM tasks_app_step WHERE task_id = %s",
        task.pk,
    )

    assert findings() == [
        f"enqueued: task {task.pk}: its first steps (revision 0) are at positions 0, 2, "
        "not one each from 0",
        # The step inserted is blocked: by the fold, the task has not finished.
        f"history: task {task.pk}: stored state differs from its events: status succeeded "
        "(events say pending)",
    ]


def test_it_finds_a_recorded_enqueue_that_does_not_start_its_history(db: None) -> None:
    # A history written before the task row recorded its enqueue: an `enqueued` Event,
    # which is read instead of the row, and another event placed before it.
    task = succeeded()
    step = only_step(task)
    recorded = event(
        task,
        EventKind.ENQUEUED,
        workflow=task.workflow,
        version=task.workflow_version,
        queue=task.queue,
        payload_hash=task.payload_hash,
        steps={str(step.pk): ["pending", 0, 0]},
    )
    first = event(task, EventKind.STALE_WRITE_REJECTED, step, pk=recorded - 1)

    assert findings() == [
        f"enqueued: task {task.pk}: its history starts with event {first} "
        "(stale_write_rejected), not enqueued"
    ]


def test_it_finds_a_claim_that_does_not_raise_the_token(db: None) -> None:
    task = succeeded()
    step = only_step(task)
    again = event(task, EventKind.CLAIMED, step, token=1, attempt=2)
    event(task, EventKind.LEASE_EXPIRED, step, token=1, step_status="pending")

    assert findings() == [
        f"fencing: task {task.pk}: claim of token 1 on step {step.pk} (event {again} "
        "(claimed)) does not raise the token of its previous claim (1)"
    ]


@pytest.mark.no_fold_check
def test_it_finds_a_stored_token_below_the_claims(db: None) -> None:
    task = succeeded()
    step = only_step(task)
    sql("UPDATE tasks_app_step SET fencing_token = 0 WHERE id = %s", step.pk)

    assert findings() == [
        f"fencing: task {task.pk}: step {step.pk} stores fencing token 0, below token 1 "
        "named by the claimed of token 1 (its Lease row)",
        f"history: task {task.pk}: stored state differs from its events: "
        f"step {step.pk} succeeded/1/0 (events say succeeded/1/1)",
    ]


def test_a_refused_stale_write_names_no_token_the_step_must_have(db: None) -> None:
    # A worker may present any token; refusing it is what fencing is for.
    task = succeeded()
    event(task, EventKind.STALE_WRITE_REJECTED, only_step(task), token=9, operation="complete")

    assert_clean(tasks=1)


def test_it_finds_a_claim_with_no_outcome(db: None) -> None:
    task = noop()
    step = running(task)
    # The step went back to pending by an event that does not name the claim it ended.
    state = {str(step.pk): ["pending", 1, 1]}
    event(task, EventKind.RETRY_SCHEDULED, step, steps=state, task_status="pending")
    sql(
        "UPDATE tasks_app_step SET status = 'pending', lease_expires_at = NULL WHERE id = %s",
        step.pk,
    )
    sql("UPDATE tasks_app_task SET status = 'pending' WHERE id = %s", task.pk)

    assert findings() == [
        f"claim: task {task.pk}: step {step.pk} reached token 1 but its history has no "
        "claim of token 1"
    ]


def test_a_released_claim_is_answered_by_its_release(db: None) -> None:
    task = noop()
    step = running(task)
    held = Claim.of(step, worker_id="w-died", lease_seconds=30)
    assert leases.release_claim(held, actor="worker:host:1", reason="worker_lost")

    assert_clean(tasks=1)


def test_a_claim_still_running_on_its_lease_needs_no_outcome_yet(db: None) -> None:
    running(noop())

    assert_clean(tasks=1)


def test_it_finds_a_run_ended_twice(db: None) -> None:
    task = succeeded()
    step = only_step(task)
    state = {str(step.pk): ["succeeded", 1, 1]}
    first = event(task, EventKind.SUCCEEDED, step, steps=state, token=1, task_status="succeeded")
    again = event(task, EventKind.SUCCEEDED, step, steps=state, token=1, task_status="succeeded")

    assert findings() == [
        f"terminal: task {task.pk}: event {again} (succeeded) ends as succeeded a run that "
        f"event {first} (succeeded) already ended as succeeded"
    ]


def test_it_finds_a_cancelled_task_cancelled_again(db: None) -> None:
    task = noop()
    services.cancel(task, actor="cli:ann", reason="not needed")
    [first] = events_of(task, EventKind.CANCELLED)
    again = event(task, EventKind.CANCELLED, task_status="cancelled")

    assert findings() == [
        f"terminal: task {task.pk}: event {again} (cancelled) ends as cancelled a run that "
        f"event {first} (cancelled) already ended as cancelled"
    ]


def test_a_run_may_end_again_after_a_redrive(db: None) -> None:
    task = dead_task({"error": "permanent", "fail_first": 2})
    services.redrive(task, actor="cli:ann", reason="again")
    advance(task)
    task.refresh_from_db()
    assert task.status == TaskStatus.DEAD
    services.cancel(task, actor="cli:ann", reason="give up")

    assert_clean(tasks=1)
