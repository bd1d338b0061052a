"""Drill 30: the claim records' directory taken away while a worker runs
(``tasks_app.engine.claims_directory``).

First it cannot be made (a plain file where ``TASKS_CLAIMS_DIR`` should be): the worker
says once that crash isolation is off, and ``/readyz`` says so while it lasts. Then the
way is clear again, and it comes back on. Then a cleaner of old files removes the
directory, as one pruning the temporary directory would, and a step that kills its process
is claimed in a batch with healthy ones: the worker has made the directory again (one
warning), its pool processes record into it, and the crash costs only the crashing step.
"""

from __future__ import annotations

import json
import shutil
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tasks_app import services
from tasks_app.exceptions import LEASE_EXPIRED
from tasks_app.models import Event, EventKind, Lease, Step, StepStatus, TaskStatus
from tests.chaos.harness import (
    Cluster,
    Record,
    Remotes,
    assert_nothing_lost_or_done_twice,
    wait_for_drain,
)
from tests.e2e_support import wait_for
from tests.web_server_support import web_process

pytestmark = [pytest.mark.chaos, pytest.mark.timeout(300)]

LEASE_SECONDS = 30
HEALTHY = 40
BOTH_OFF = "off on 2 worker(s)"


@pytest.fixture
def claims_parent(cluster: Cluster, tmp_path: Path) -> Path:
    parent = tmp_path / "claims"
    cluster.env.update(TASKS_CLAIMS_DIR=str(parent), TASKS_LEASE_SECONDS=str(LEASE_SECONDS))
    return parent


@pytest.fixture
def web(cluster: Cluster, claims_parent: Path, tmp_path: Path) -> Iterator[str]:
    with web_process(cluster.env, tmp_path / "web.log", threads=2) as url:
        yield url


def crash_isolation(web: str) -> dict[str, Any]:
    """``/readyz``'s check of the workers' crash isolation."""
    try:
        with urllib.request.urlopen(f"{web}/readyz", timeout=10) as response:
            body = json.load(response)
    except urllib.error.HTTPError as error:
        body = json.load(error)
    return dict(body["checks"]["crash_isolation"])


def _items() -> list[dict[str, Any]]:
    def flaky(n: int, payload: dict[str, Any], priority: int) -> dict[str, Any]:
        return {
            "workflow": "demo.flaky",
            "payload": payload,
            "priority": priority,
            "idempotency_key": f"claims-dir-{n}",
        }

    # Quick steps first, so the drain's batches have grown when it reaches the poison step.
    warm_up = [flaky(n, {}, 10) for n in range(HEALTHY // 2)]
    poison = flaky(HEALTHY, {"error": "crash", "fail_first": 99}, 5)
    after = [flaky(HEALTHY // 2 + n, {}, 0) for n in range(HEALTHY // 2)]
    return [*warm_up, poison, *after]


def test_row_30_a_removed_claims_directory_is_made_again_and_a_crash_costs_only_its_step(
    cluster: Cluster,
    counting_remotes: Remotes,
    claims_parent: Path,
    web: str,
    record_property: Record,
) -> None:
    cluster.start(workers=1, concurrency=2)
    worker = cluster.workers[0]
    # The step worker's (the maintenance worker has one too): named after its main process.
    [directory] = wait_for(
        lambda: list(claims_parent.glob(f"task-console-claims-{worker.pid}-*")),
        timeout=30,
        what="the worker's claims directory",
    )
    assert crash_isolation(web)["ok"] is True

    # 1. It cannot be made: a plain file where the directories go.
    shutil.rmtree(claims_parent)
    claims_parent.write_text("not a directory")
    # Each worker (the step worker and the maintenance worker) says so on its own.
    wait_for(
        lambda: (check := crash_isolation(web))["ok"] is False and check["detail"] == BOTH_OFF,
        timeout=30,
        what="/readyz to say crash isolation is off on both workers",
    )

    # 2. The way is clear again: back on.
    claims_parent.unlink()
    wait_for(lambda: directory.is_dir(), timeout=10, what="the directory made again")
    wait_for(lambda: crash_isolation(web)["ok"] is True, timeout=30, what="crash isolation on")

    # 3. A cleaner removes it; then a crash in a batch.
    mark = worker.mark()
    shutil.rmtree(directory)
    wait_for(lambda: directory.is_dir(), timeout=10, what="the directory made again")
    results = services.enqueue_many(_items(), actor="test:chaos")
    ids = [result.task.pk for result in results]
    poison_task = ids[HEALTHY // 2]
    healthy = [pk for pk in ids if pk != poison_task]
    wait_for_drain(ids, cluster, timeout=150)

    poison = Step.objects.get(task_id=poison_task)
    crash = poison.leases.order_by("token").first()
    assert crash is not None
    mates = set(
        Lease.objects.filter(worker_id=crash.worker_id, acquired_at=crash.acquired_at)
        .exclude(step=poison)
        .values_list("step_id", flat=True)
    )
    released = set(
        Event.objects.filter(kind=EventKind.CLAIM_RELEASED, step_id__in=mates).values_list(
            "step_id", flat=True
        )
    )
    charged = Lease.objects.filter(step__task_id__in=healthy, outcome=Lease.Outcome.EXPIRED)
    log = worker.output()
    record_property("batch", len(mates) + 1)
    record_property("released", len(released))
    record_property("charged", charged.count())
    record_property("isolation_off_lines", log.count("crash isolation is off"))
    record_property("removed_lines", worker.count("was removed", since=mark))

    assert len(mates) >= 2, f"the poison step shared its batch with {len(mates)} step(s)"
    assert released == mates
    assert not charged.exists()
    statuses = assert_nothing_lost_or_done_twice(healthy, counting_remotes)
    assert statuses == {TaskStatus.SUCCEEDED: len(healthy)}
    assert (poison.status, poison.error_class) == (StepStatus.DEAD, LEASE_EXPIRED)
    # One line each, not a stream: off, on again, removed and made again.
    assert log.count("crash isolation is off") == 1
    assert log.count("crash isolation is on again") == 1
    assert worker.count("was removed", since=mark) == 1
    assert "could not look for pool processes" not in log
