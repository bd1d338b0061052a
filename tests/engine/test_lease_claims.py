"""Claims and fencing on the one-step path: completing or failing a step nobody claimed is
refused and recorded; of many workers claiming one step at once only one gets it; a stale
worker cannot complete, fail or heartbeat after its lease was reclaimed; a duplicated or
late message runs nothing twice; and a paused queue is not claimed until it is resumed,
by someone allowed to (DESIGN rules 1, 2, 3 and 10).

Time moves by back-dating rows (``backdate``), never by sleeping. The test of concurrent
claims needs other database connections and is transactional.
"""

from __future__ import annotations

import threading
from datetime import timedelta
from typing import Any

import pytest
from django.conf import settings
from django.contrib.auth.models import Permission, User
from django.db import connection

from tasks_app import services
from tasks_app.engine import runner
from tasks_app.exceptions import InvalidInput, NotPermitted
from tasks_app.models import Event, EventKind, Lease, QueueState, StepStatus, TaskStatus
from tasks_app.services import Claim
from tasks_app.tasks import run_step
from tests.conftest import BrokerView, backdate, event_kinds, only_step
from tests.lease_support import (
    LEASE,
    WORKER,
    Recorder,
    attempts_of,
    claim,
    events,
    expire_lease,
    fresh,
    lease_of,
    step_at,
)
from tests.lease_support import pair as pair  # a fixture, for pytest to find
from tests.lease_support import recorder as recorder  # a fixture, for pytest to find

# --- completing an unclaimed step is refused ----------------------------------------------


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
    assert event_kinds(task) == ["enqueued", "stale_write_rejected", "stale_write_rejected"]


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
    assert [lease.worker_id for lease in attempts_of(step).values()] == [won[0].worker_id]
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
    lease_before = lease_of(step, 2).expires_at

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
    leases = attempts_of(step)
    assert leases[1].outcome == Lease.Outcome.EXPIRED
    assert leases[2].released_at is None
    assert leases[2].expires_at == lease_before
    task.refresh_from_db()
    assert task.live_status == TaskStatus.RUNNING
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
    assert event_kinds(task) == ["enqueued", "claimed", "succeeded"]


@pytest.mark.django_db
def test_a_late_message_for_a_finished_step_changes_nothing(pair: str, recorder: Recorder) -> None:
    task = services.enqueue(pair, {}).task
    draft, publish = step_at(task, 0), step_at(task, 1)
    run_step(draft.pk)
    run_step(publish.pk)
    task.refresh_from_db()
    assert task.status == TaskStatus.SUCCEEDED
    history = event_kinds(task)

    backdate(draft)
    run_step(draft.pk)
    run_step(publish.pk)
    run_step(10**12)  # a step that does not exist (pruned)

    assert event_kinds(task) == history
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
