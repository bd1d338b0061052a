"""Drill 13: a worker and a sweeper whose clocks are ten minutes off (libfaketime) get
doorbells for a step another worker holds and for a step not due yet. The database's clock
decides: neither steals the live lease, nothing runs early."""

from __future__ import annotations

import glob
import subprocess
import time
from datetime import timedelta

import pytest

from tasks_app import services
from tasks_app.db.clock import db_now
from tasks_app.engine.dispatch import Doorbell, publish
from tasks_app.history import timeline
from tasks_app.models import Event, EventKind, Step, StepStatus
from tests.chaos.harness import (
    Cluster,
    Record,
    Remotes,
    assert_nothing_lost_or_done_twice,
    wait_for_drain,
)
from tests.e2e_support import PYTHON, ROOT, wait_for

pytestmark = [pytest.mark.chaos, pytest.mark.timeout(240)]

RUN_STEP_DONE = r"Task tasks_app\.tasks\.run_step\[[^\]]+\] succeeded in"


def skewed_clock(offset: str) -> dict[str, str]:
    """The environment that sets a process's clocks ``offset`` off (``+10m``)."""
    found = sorted(glob.glob("/usr/lib/*/faketime/libfaketimeMT.so.1"))
    if not found:
        raise RuntimeError("drill 13 needs libfaketime: apt-get install faketime")
    return {"LD_PRELOAD": found[0], "FAKETIME": offset, "DONT_FAKE_MONOTONIC": "1"}


def _clock_of(env: dict[str, str]) -> float:
    done = subprocess.run(
        [PYTHON, "-c", "import time; print(time.time())"],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    return float(done.stdout) - time.time()


@pytest.mark.parametrize("offset", ["+10m", "-10m"])
def test_row_13_a_worker_whose_clock_is_off_neither_steals_a_lease_nor_runs_early(
    cluster: Cluster, counting_remotes: Remotes, record_property: Record, offset: str
) -> None:
    cluster.start(workers=1, concurrency=1)
    [honest] = cluster.workers
    held = services.enqueue("demo.flaky", {"sleep": 8}, idempotency_key="row13-held").task
    held_step = Step.objects.get(task=held)
    wait_for(
        lambda: Step.objects.filter(pk=held_step.pk, status=StepStatus.RUNNING).exists(),
        timeout=30,
        what="the honest worker to claim the long step",
    )
    not_yet = services.enqueue(
        "demo.noop", {}, idempotency_key="row13-later", run_after=db_now() + timedelta(seconds=12)
    ).task
    later_step = Step.objects.get(task=not_yet)

    skew = {**cluster.env, **skewed_clock(offset)}
    seconds = 600 if offset.startswith("+") else -600
    assert abs(_clock_of(skew) - seconds) < 60, "the clock is not off"
    skewed = cluster.add_worker(concurrency=2, env=skewed_clock(offset))
    mark = skewed.mark()
    # Stray doorbells: the honest worker (one process, busy) takes none of them.
    for _ in range(3):
        publish([Doorbell(held_step.pk, "default"), Doorbell(later_step.pk, "default")])
    for _ in range(3):  # a sweeper with the same clock
        subprocess.run(
            [PYTHON, "manage.py", "sweep"], cwd=ROOT, env=skew, check=True, capture_output=True
        )
    wait_for(
        lambda: skewed.count(RUN_STEP_DONE, since=mark) >= 6,
        timeout=30,
        what=lambda: "the skewed worker to handle the doorbells\n" + skewed.tail(),
    )
    later_step.refresh_from_db()
    assert later_step.available_at is not None
    assert db_now() < later_step.available_at, "too slow to tell early from on time"
    assert later_step.status == StepStatus.PENDING

    wait_for_drain([held.pk, not_yet.pk], cluster)
    assert_nothing_lost_or_done_twice([held.pk, not_yet.pk], counting_remotes)
    held_step.refresh_from_db()
    assert (held_step.status, held_step.attempts, held_step.fencing_token) == (
        StepStatus.SUCCEEDED,
        1,
        1,
    )
    assert not Event.objects.filter(task_id=held.pk, kind=EventKind.LEASE_EXPIRED).exists()
    holder = int(held_step.leases.get().worker_id.rsplit(":", 1)[1])
    assert honest.is_pool_child(holder), "the long step changed hands"
    [claimed] = [e for e in timeline.history(not_yet.pk) if e.kind == EventKind.CLAIMED]
    assert claimed.created_at >= later_step.available_at
    record_property(
        "claimed_after_due_s",
        round((claimed.created_at - later_step.available_at).total_seconds(), 1),
    )
