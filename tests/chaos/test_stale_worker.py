"""Drill 6: a worker paused (SIGSTOP) while its write to a remote is in flight, past its
lease, while another worker finishes the step; then resumed. Its late writes are refused,
and the write reached the remote once, although it was sent twice with the same key."""

from __future__ import annotations

import signal

import pytest

from tasks_app import services
from tasks_app.db.clock import db_now
from tasks_app.models import Event, EventKind, Lease, Step, StepStatus
from tests.chaos.harness import (
    Cluster,
    Record,
    Remotes,
    assert_nothing_lost_or_done_twice,
    wait_for_drain,
)
from tests.e2e_support import wait_for

pytestmark = [pytest.mark.chaos, pytest.mark.timeout(240)]


def test_row_6_a_worker_paused_past_its_lease_has_its_writes_refused(
    cluster: Cluster,
    counting_remotes: Remotes,
    record_property: Record,
) -> None:
    publishing, _ = counting_remotes
    # The paused worker's call must still be waiting for its answer when it resumes.
    cluster.env.update(REMOTE_TIMEOUT_SECONDS="60")
    cluster.start(workers=1, concurrency=1)
    [paused] = cluster.workers
    publishing.time_out_after_accepting(1)  # applies the write, holds the answer
    task = services.enqueue("demo.deliver", {"remote": "publish"}, idempotency_key="row6").task
    wait_for(lambda: publishing.received, timeout=30, what="the write to reach the remote")

    cluster.signal(paused, signal.SIGSTOP, whole_group=True)
    paused_at = db_now()
    publishing.release()  # the answer arrives while the worker cannot read it
    cluster.add_worker(concurrency=1)
    wait_for_drain([task.pk], cluster)
    step = Step.objects.get(task=task)
    assert (step.status, step.fencing_token) == (StepStatus.SUCCEEDED, 2)
    finished = (step.status, step.fencing_token, step.result, step.finished_at)

    cluster.signal(paused, signal.SIGCONT, whole_group=True)
    refused = Event.objects.filter(task_id=task.pk, kind=EventKind.STALE_WRITE_REJECTED)
    wait_for(
        lambda: refused.filter(data__operation="complete").exists(),
        timeout=30,
        what=lambda: "the resumed worker's completion to be refused\n" + paused.tail(),
    )

    step.refresh_from_db()
    assert (step.status, step.fencing_token, step.result, step.finished_at) == finished
    assert {(event.data["token"], event.data["current_token"]) for event in refused} == {(1, 2)}
    leases = list(step.leases.order_by("token").values_list("token", "outcome", "worker_id"))
    assert [(token, outcome) for token, outcome, _ in leases] == [
        (1, Lease.Outcome.EXPIRED),
        (2, Lease.Outcome.SUCCEEDED),
    ]
    assert leases[0][2] != leases[1][2]
    # Sent twice with one key (the second attempt called again), applied once.
    assert [request["key"] for request in publishing.received] == [publishing.applied[0]["key"]] * 2
    assert len(publishing.applied) == 1
    assert_nothing_lost_or_done_twice([task.pk], counting_remotes)
    assert step.finished_at is not None
    record_property("stale_writes_refused", refused.count())
    record_property("recovery_s", round((step.finished_at - paused_at).total_seconds(), 1))
