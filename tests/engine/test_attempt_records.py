"""An attempt's lease lives on its step while it runs, and its Lease row is written once,
when it ends (DESIGN rules 2 and 11), on both paths; a lease an earlier release opened as a
row at its claim is closed by the same write."""

from __future__ import annotations

from typing import Any

import pytest

from tasks_app import services
from tasks_app.engine import fastpath
from tasks_app.models import Lease, Step, StepStatus
from tests.batch_support import claim_due
from tests.conftest import only_step
from tests.lease_support import attempts_of

pytestmark = pytest.mark.django_db


@pytest.fixture(params=["sql", "orm"])
def path(request: pytest.FixtureRequest, settings: Any) -> str:
    settings.TASKS_SQL_FAST_PATH = request.param == "sql"
    return str(request.param)


def test_a_claim_writes_no_lease_row_and_its_end_writes_one(path: str) -> None:
    task = services.enqueue("demo.noop", {}).task
    [claim] = claim_due(limit=1, worker_id="box:7").values()

    step = Step.objects.get(pk=claim.step_id)
    assert (step.status, step.lease_worker) == (StepStatus.RUNNING, "box:7")
    assert step.lease_expires_at is not None and step.started_at is not None
    assert not Lease.objects.exists()
    [live] = attempts_of(step).values()
    assert live._state.adding  # not a row: the lease on the step
    assert (live.token, live.worker_id, live.released_at) == (1, "box:7", None)
    assert (live.acquired_at, live.expires_at) == (step.started_at, step.lease_expires_at)

    assert fastpath.complete_many([(claim, {})]) == {step.pk}

    [lease] = Lease.objects.filter(step=step)
    assert (lease.token, lease.worker_id, lease.outcome) == (1, "box:7", Lease.Outcome.SUCCEEDED)
    assert (lease.acquired_at, lease.expires_at) == (step.started_at, step.lease_expires_at)
    assert lease.released_at is not None and lease.released_at >= lease.acquired_at
    after = only_step(task)
    assert (after.lease_worker, after.lease_expires_at) == ("", None)


def test_a_failed_attempt_is_recorded_by_its_end_too(path: str) -> None:
    services.enqueue("demo.noop", {})
    [claim] = claim_due(limit=1, worker_id="box:8").values()

    assert services.fail_step(
        claim, error_class="RetryableError", message="remote down", retry_in=1.0, reason=""
    )

    [lease] = Lease.objects.filter(step_id=claim.step_id)
    assert (lease.worker_id, lease.outcome) == ("box:8", Lease.Outcome.FAILED)
    assert Step.objects.get(pk=claim.step_id).status == StepStatus.PENDING


def test_a_lease_an_earlier_release_opened_at_the_claim_is_closed_at_the_end(path: str) -> None:
    services.enqueue("demo.noop", {})
    [claim] = claim_due(limit=1, worker_id="box:9").values()
    step = Step.objects.get(pk=claim.step_id)
    assert step.started_at is not None and step.lease_expires_at is not None
    # As the release before this one wrote it: a row at the claim, without a holder on the step.
    Step.objects.filter(pk=step.pk).update(lease_worker="")
    Lease.objects.create(
        step=step,
        token=1,
        worker_id="old:1",
        acquired_at=step.started_at,
        expires_at=step.lease_expires_at,
    )

    assert fastpath.complete_many([(claim, {})]) == {step.pk}

    [lease] = Lease.objects.filter(step=step)
    assert (lease.worker_id, lease.outcome) == ("old:1", Lease.Outcome.SUCCEEDED)
    assert lease.released_at is not None
