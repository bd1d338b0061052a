"""The sweeper (DESIGN rules 1 and 2): an expired lease is reaped, its step claimable again
or dead-lettered on its last attempt; a lost doorbell is rung again once per interval,
never for a retry not yet due nor for a paused queue.

Time moves by back-dating rows (``backdate``), never by sleeping.
"""

from __future__ import annotations

import pytest
from django.conf import settings

from tasks_app import services
from tasks_app.engine import runner
from tasks_app.models import EventKind, Lease, StepStatus, TaskStatus
from tasks_app.tasks import run_step
from tests.conftest import BrokerView, backdate, event_kinds, only_step
from tests.lease_support import LEASE, WORKER, claim, events, expire_lease, fresh

# --- 5. an expired lease makes the step claimable again -----------------------------------


@pytest.mark.django_db
def test_an_expired_lease_is_reaped_and_the_step_can_be_claimed_again() -> None:
    task = services.enqueue("demo.noop", {}).task
    step = only_step(task)
    first = claim(step)
    assert services.reap_expired_leases() == 0  # a live lease is left alone

    backdate(step, seconds=LEASE + 1)
    assert services.reap_expired_leases() == 1

    step = fresh(step)
    assert (step.status, step.attempts, step.fencing_token) == (StepStatus.PENDING, 1, 1)
    assert step.lease_expires_at is None
    task.refresh_from_db()
    assert task.status == TaskStatus.PENDING
    lease = Lease.objects.get(step=step, token=first.token)
    assert lease.outcome == Lease.Outcome.EXPIRED
    assert lease.released_at is not None
    expired = events(task, EventKind.LEASE_EXPIRED)[0]
    assert expired.actor == services.SWEEPER
    assert (expired.data["token"], expired.data["step_status"]) == (1, "pending")
    assert services.reap_expired_leases() == 0

    second = claim(step, worker_id="w2")
    assert (second.token, second.attempt) == (2, 2)
    runner.execute(second)
    assert fresh(step).status == StepStatus.SUCCEEDED
    assert event_kinds(task) == ["enqueued", "claimed", "lease_expired", "claimed", "succeeded"]


@pytest.mark.django_db
def test_an_expired_lease_on_the_last_attempt_dead_letters_the_step() -> None:
    task = services.enqueue("demo.noop", {}).task
    step = only_step(task)
    for _ in range(2):
        claim(step)
        expire_lease(step)
        assert fresh(step).status == StepStatus.PENDING

    claim(step)
    expire_lease(step)

    step = fresh(step)
    assert (step.status, step.attempts, step.fencing_token) == (StepStatus.DEAD, 3, 3)
    assert step.error_class == "lease_expired"
    assert "token 3" in step.last_error
    assert step.finished_at is not None
    task.refresh_from_db()
    assert task.status == TaskStatus.DEAD
    assert task.finished_at is not None
    assert events(task, EventKind.LEASE_EXPIRED)[-1].data["step_status"] == "dead"
    dead = events(task, EventKind.DEAD_LETTERED)
    assert [(e.reason, e.actor) for e in dead] == [("lease_expired", services.SWEEPER)]
    assert services.claim_step(step.pk, worker_id=WORKER) is None


# --- a lost message is re-dispatched by the sweeper ---------------------------------------


@pytest.mark.django_db(transaction=True)
def test_a_lost_message_is_rung_again_by_the_sweeper_once_per_interval(
    broker: BrokerView,
) -> None:
    task = services.enqueue("demo.noop", {}).task
    step = only_step(task)
    assert broker.step_ids() == [step.pk]  # rung after commit
    broker.purge()  # ... and lost

    report = services.sweep()
    assert (report.reaped, report.redispatched) == (0, 0)
    assert broker.step_ids() == []

    backdate(step, seconds=settings.TASKS_REDISPATCH_SECONDS + 1)
    start = services.db_now()
    assert services.sweep().redispatched == 1
    assert broker.step_ids() == [step.pk]
    dispatched = fresh(step).dispatched_at
    assert dispatched is not None
    assert dispatched >= start

    # Sweeping again right away rings nothing more: no flood while nobody answers.
    assert services.sweep().redispatched == 0
    assert broker.step_ids() == [step.pk]

    # The doorbell is answered and the step runs.
    run_step(step.pk)
    assert fresh(step).status == StepStatus.SUCCEEDED


@pytest.mark.django_db(transaction=True)
def test_the_sweeper_does_not_ring_for_a_retry_that_is_not_due_yet(broker: BrokerView) -> None:
    task = services.enqueue("demo.flaky", {"fail_first": 1}).task
    step = only_step(task)
    held = claim(step)
    services.fail_step(held, error_class="Boom", message="boom", retry_in=3600, reason="")
    broker.purge()

    backdate(step, seconds=settings.TASKS_REDISPATCH_SECONDS + 1)
    assert services.sweep().redispatched == 0
    assert broker.step_ids() == []


@pytest.mark.django_db(transaction=True)
def test_the_sweeper_does_not_ring_for_a_paused_queue_and_resume_rings(
    broker: BrokerView,
) -> None:
    task = services.enqueue("demo.noop", {}).task
    step = only_step(task)
    services.pause_queue("default", actor="cli:test", reason="incident 42")
    broker.purge()

    backdate(step, seconds=settings.TASKS_REDISPATCH_SECONDS + 1)
    dispatched = fresh(step).dispatched_at
    assert services.sweep().redispatched == 0
    assert broker.step_ids() == []
    assert fresh(step).dispatched_at == dispatched

    services.resume_queue("default", actor="cli:test", reason="incident 42 over")
    assert broker.step_ids() == [step.pk]
    assert services.sweep().redispatched == 0  # resume counted as the dispatch
    assert broker.step_ids() == [step.pk]
