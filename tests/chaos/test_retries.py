"""Drill 12 with real processes: many steps failing on their first attempts, run by a
worker. Every retry waits a delay within the full-jitter bound of its attempt, the delays
spread over that range, and no step is claimed again before its delay has passed (the
database's clock)."""

from __future__ import annotations

import pytest

from tasks_app import services
from tasks_app.models import Event, EventKind, Step, TaskStatus
from tasks_app.workflows import registry
from tests.chaos.harness import (
    Cluster,
    Record,
    Remotes,
    assert_nothing_lost_or_done_twice,
    wait_for_drain,
)

pytestmark = [pytest.mark.chaos, pytest.mark.timeout(240)]


def test_row_12_retry_delays_lie_within_their_jitter_bounds(
    cluster: Cluster, counting_remotes: Remotes, record_property: Record
) -> None:
    cluster.start(workers=1, concurrency=2)
    spec = registry.latest("demo.flaky").steps[0]
    ids = [
        result.task.pk
        for result in services.enqueue_many(
            [
                {"workflow": "demo.flaky", "payload": {"fail_first": 2, "seed": n}}
                for n in range(60)
            ],
            actor="test:chaos",
        )
    ]

    wait_for_drain(ids, cluster)
    statuses = assert_nothing_lost_or_done_twice(ids, counting_remotes)
    assert statuses == {TaskStatus.SUCCEEDED: len(ids)}
    delays: dict[int, list[float]] = {1: [], 2: []}
    for step in Step.objects.filter(task__in=ids):
        retries = list(
            Event.objects.filter(step_id=step.pk, kind=EventKind.RETRY_SCHEDULED).order_by("id")
        )
        leases = list(step.leases.order_by("token"))
        assert len(retries) == 2
        assert [lease.outcome for lease in leases] == ["failed", "failed", "succeeded"]
        for attempt, (retry, failed, next_lease) in enumerate(
            zip(retries, leases, leases[1:], strict=False), start=1
        ):
            delay = retry.data["retry_in"]
            ceiling = min(spec.backoff_cap, spec.backoff_base * 2 ** (attempt - 1))
            assert 0 <= delay <= ceiling, (step.pk, attempt, delay)
            # Due at the failure (after the lease's release) plus the delay: never before.
            assert failed.released_at is not None
            waited = (next_lease.acquired_at - failed.released_at).total_seconds()
            assert waited >= delay, (step.pk, attempt, delay, waited)
            delays[attempt].append(delay)
    for attempt, seen in delays.items():
        ceiling = min(spec.backoff_cap, spec.backoff_base * 2 ** (attempt - 1))
        # Full jitter: spread over the range, not bunched at one end.
        assert min(seen) < ceiling / 4 and max(seen) > ceiling * 3 / 4, (attempt, seen)
    record_property("retries", sum(len(seen) for seen in delays.values()))
