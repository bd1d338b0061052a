"""Drill 27: rows no Python process can decode among healthy work. Payloads nested past
Python's JSON decoder (stored by SQL, as an import or an older writer would) on a due step,
and on a step left running on an expired lease; beside them 60 healthy tasks, whose
doorbells are all lost, and a healthy step whose worker is gone.

The workers dead-letter the due one as ``undecodable_payload`` and run the rest of its
batch; the sweeper keeps sweeping: it dead-letters the running one the same way, reaps the
healthy step's lease (which then runs again) and rings for the due work. A person then
mends both with a redrive carrying an edited payload, and the checker is clean.
"""

from __future__ import annotations

import time
from datetime import datetime

import pytest
from django.db.models.functions import Now

from tasks_app import services
from tasks_app.db.clock import db_now
from tasks_app.exceptions import UNDECODABLE_PAYLOAD
from tasks_app.models import Event, EventKind, Lease, Step, StepStatus, Task, TaskStatus
from tests.chaos.harness import (
    Cluster,
    Record,
    Remotes,
    assert_nothing_lost_or_done_twice,
    enqueue_workload,
    wait_for_drain,
)
from tests.chaos.services import OwnRedis
from tests.poison_support import poison

pytestmark = [pytest.mark.chaos, pytest.mark.timeout(240)]

GONE = "gone-host:1"


def _left_running(task_id: int) -> Step:
    """Claim the task's step for a worker that then vanished, its lease already run out."""
    step = Step.objects.get(task_id=task_id)
    claim = services.claim_step(step.pk, worker_id=GONE)
    assert claim is not None
    Step.objects.filter(pk=step.pk).update(lease_expires_at=Now())
    return step


def _seconds(since: datetime, moment: datetime | None) -> float | None:
    return round((moment - since).total_seconds(), 2) if moment else None


def test_row_27_undecodable_rows_stop_neither_the_workers_nor_the_sweeper(
    cluster: Cluster, counting_remotes: Remotes, own_redis: OwnRedis, record_property: Record
) -> None:
    ids = enqueue_workload(63, label="row27")
    due_poisoned, running_poisoned, running_healthy = ids[0], ids[3], ids[6]
    poison(due_poisoned)
    running = {pk: _left_running(pk) for pk in (running_poisoned, running_healthy)}
    poison(running_poisoned)
    own_redis.flush()  # every doorbell lost: the sweeper (and the nodes' backstop) ring again
    started, began = db_now(), time.monotonic()
    cluster.start(workers=1, concurrency=2)

    drained = wait_for_drain(ids, cluster, timeout=150)

    for pk in (due_poisoned, running_poisoned):
        step = Step.objects.get(task_id=pk)
        assert (step.status, step.error_class) == (StepStatus.DEAD, UNDECODABLE_PAYLOAD), step
        assert "payload of task" in step.last_error
        assert Event.objects.filter(task_id=pk, kind=EventKind.DEAD_LETTERED).count() == 1
    # The due one was claimed and dead-lettered by a worker, the running one by the sweeper.
    assert Step.objects.get(task_id=due_poisoned).leases.get().outcome == Lease.Outcome.FAILED
    assert running[running_poisoned].leases.get().outcome == Lease.Outcome.EXPIRED
    # The healthy step left running was reaped and ran again.
    healthy = Step.objects.get(task_id=running_healthy)
    assert healthy.status == StepStatus.SUCCEEDED
    assert healthy.leases.get(worker_id=GONE).outcome == Lease.Outcome.EXPIRED
    assert healthy.fencing_token == 2
    others = [pk for pk in ids if pk not in (due_poisoned, running_poisoned)]
    assert set(Task.objects.filter(pk__in=others).values_list("status", flat=True)) <= {
        TaskStatus.SUCCEEDED,
        TaskStatus.DEAD,
    }

    record_property(
        "poison_claimed_dead_s",
        _seconds(started, Step.objects.get(task_id=due_poisoned).finished_at),
    )
    record_property(
        "poison_running_dead_s",
        _seconds(started, Step.objects.get(task_id=running_poisoned).finished_at),
    )
    record_property(
        "healthy_reaped_s",
        _seconds(started, healthy.leases.get(worker_id=GONE).released_at),
    )
    record_property("drained_s", round(drained - began, 1))

    # A person mends both with an edited payload; then nothing is lost or done twice, and
    # the checker (which names undecodable rows) is clean.
    for pk in (due_poisoned, running_poisoned):
        services.redrive(
            Task.objects.get(pk=pk), actor="cli:oncall", reason="imported wrong", payload={}
        )
    wait_for_drain(ids, cluster, timeout=60)
    assert_nothing_lost_or_done_twice(ids, counting_remotes)
    for pk in (due_poisoned, running_poisoned):
        assert Task.objects.get(pk=pk).status == TaskStatus.SUCCEEDED
