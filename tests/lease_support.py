"""Helpers for the tests of the worker's side: claims, leases and the sweeper."""

from __future__ import annotations

from django.conf import settings

from tasks_app import services
from tasks_app.models import Event, Step, Task
from tasks_app.services import Claim
from tests.conftest import backdate

WORKER = "w1"
LEASE = settings.TASKS_LEASE_SECONDS


# --- helpers ------------------------------------------------------------------------------


def kinds(task: Task) -> list[str]:
    return list(Event.objects.for_task(task.pk).values_list("kind", flat=True))


def events(task: Task, kind: str) -> list[Event]:
    return list(Event.objects.for_task(task.pk).filter(kind=kind))


def step_at(task: Task, position: int) -> Step:
    return task.steps.get(position=position, revision=0)


def fresh(step: Step) -> Step:
    return Step.objects.get(pk=step.pk)


def claim(step: Step, worker_id: str = WORKER, lease_seconds: int | None = None) -> Claim:
    """Claim a step that must be claimable."""
    result = services.claim_step(step.pk, worker_id=worker_id, lease_seconds=lease_seconds)
    assert result is not None, f"step {step.pk} ({fresh(step).status}) could not be claimed"
    return result


def expire_lease(step: Step) -> None:
    """Let the step's lease run out and have the sweeper reap it."""
    backdate(step, seconds=LEASE + 60)
    assert services.reap_expired_leases() == 1
