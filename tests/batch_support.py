"""Helpers for the tests of the batched hot path (test_batch_*): demo steps enqueued
many at once, claimed in batches, and the claims grouped by the statement that made them."""

from __future__ import annotations

from typing import Any

import pytest

from tasks_app import services
from tasks_app.engine import fastpath
from tasks_app.models import Lease, Step
from tasks_app.services import Claim
from tests.conftest import only_step
from tests.lease_support import WORKER

# --- helpers ------------------------------------------------------------------------------


def noops(count: int, *, queue: str = "default", **options: Any) -> list[Step]:
    """Enqueue ``count`` demo.noop tasks; their steps in enqueue order."""
    results = services.enqueue_many(
        [
            {"workflow": "demo.noop", "payload": {"n": n}, "queue": queue, **options}
            for n in range(count)
        ]
    )
    return [only_step(result.task) for result in results]


def claim_due(limit: int = 100, *, worker_id: str = WORKER, **options: Any) -> dict[int, Claim]:
    """Claim due steps of the default queue; the claims by step id."""
    options.setdefault("queue", "default")
    claims = fastpath.claim_batch(worker_id=worker_id, limit=limit, **options)
    return {claim.step_id: claim for claim in claims}


def claimed_batches(steps: list[Step]) -> list[list[int]]:
    """The steps' claims grouped by the statement that made them, in order.

    Each claim statement stamps its leases with its own ``statement_timestamp()``.
    """
    groups: dict[Any, list[int]] = {}
    for acquired_at, step_id in (
        Lease.objects.filter(step__in=steps).order_by("acquired_at", "step_id")
    ).values_list("acquired_at", "step_id"):
        groups.setdefault(acquired_at, []).append(step_id)
    return list(groups.values())


def lease_count(step: Step) -> int:
    return Lease.objects.filter(step=step).count()


# --- fixtures -----------------------------------------------------------------------------


@pytest.fixture
def two_queues(settings: Any) -> None:
    settings.TASKS_QUEUES = ["default", "other"]


@pytest.fixture
def patient_drain(settings: Any) -> None:
    """A drain that never runs out of time while a test is watching it."""
    settings.TASKS_DRAIN_SECONDS = 300
