"""Heartbeats: a heartbeat renews the lease by the database's clock and reports a cancel
request; the heartbeat thread tells a running handler that its task was cancelled or its
lease lost, and the late result of a lost lease is refused (DESIGN rules 2 and 3).

Time moves by back-dating rows (``backdate``), never by sleeping. The tests of the
heartbeat thread need other database connections and are transactional.
"""

from __future__ import annotations

import threading
from datetime import timedelta

import pytest

from tasks_app import services
from tasks_app.engine import runner
from tasks_app.models import EventKind, StepStatus, TaskStatus
from tasks_app.services import Claim
from tests.conftest import BrokerView, backdate, event_kinds, only_step, worker_thread
from tests.lease_support import LEASE, Recorder, claim, events, fresh, lease_of, step_at
from tests.lease_support import pair as pair  # a fixture, for pytest to find
from tests.lease_support import recorder as recorder  # a fixture, for pytest to find

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
    lease_row = lease_of(step, held.token)
    assert start + lease <= lease_row.expires_at <= end + lease
    assert lease_row.released_at is None
    # The renewed lease is live: the reaper leaves it alone.
    backdate(step, seconds=LEASE - 5)
    assert services.reap_expired_leases() == 0


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
    assert event_kinds(task) == [
        "enqueued",
        "claimed",
        "cancel_requested",
        "succeeded",
        "cancelled",
    ]


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
