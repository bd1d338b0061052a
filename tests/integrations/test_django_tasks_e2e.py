"""``django.tasks`` end to end: ``@task`` functions enqueued here run on a real prefork
Celery worker (with beat) on the test database, and their results are read back here.

The worker imports the functions from ``tests.django_task_functions`` (the project is put
on its ``PYTHONPATH``). The signals it sends are heard by receivers in that module, which
write them to a file this module reads: a worker is another process, so a receiver
connected here would hear nothing. Outcomes are polled with a deadline, never a sleep.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from datetime import timedelta
from itertools import pairwise
from pathlib import Path
from typing import Any

import pytest
from django.db.models import F
from django.tasks import TaskResult, TaskResultStatus
from django.utils import timezone

from tasks_app.models import Lease, Step
from tests.django_task_functions import SIGNAL_LOG, add, fail, label, read_signal_log, send_digest
from tests.e2e_support import ROOT, Worker, wait_for, worker_on_test_database
from tests.remotes import loopback_remotes

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.timeout(120),
    pytest.mark.django_db(transaction=True),
]


@pytest.fixture(scope="module")
def signal_log(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """Where this process and the worker log the django.tasks signals they send."""
    path = tmp_path_factory.mktemp("django-tasks-signals") / "signals.jsonl"
    os.environ[SIGNAL_LOG] = str(path)
    yield path
    os.environ.pop(SIGNAL_LOG, None)


@pytest.fixture(scope="module")
def worker(
    django_db_setup: None, tmp_path_factory: pytest.TempPathFactory, signal_log: Path
) -> Iterator[Worker]:
    """One worker for the module, on the test database and this run's broker keys."""
    python_path = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    with (
        loopback_remotes() as remotes,
        worker_on_test_database(
            tmp_path_factory.mktemp("django-tasks-e2e"),
            remotes,
            what="the django.tasks end-to-end tests",
            PYTHONPATH=python_path,
            DJANGO_TASKS_SIGNAL_LOG=str(signal_log),
        ) as process,
    ):
        yield process


def finish(result: TaskResult[..., Any], worker: Worker, timeout: float = 30) -> Any:
    """Wait until the task succeeded or failed; return its result read afresh."""

    def finished() -> Any:
        again = result.task.get_result(result.id)
        return again if again.is_finished else None

    return wait_for(finished, timeout=timeout, what=lambda: f"task #{result.id}\n{worker.tail()}")


def signals(log: Path, result: TaskResult[..., Any], worker: Worker) -> list[dict[str, Any]]:
    """The task's signals, once its ``task_finished`` is logged (it is sent after commit,
    so it may land just after the result reads as finished)."""

    def logged() -> list[dict[str, Any]]:
        lines = read_signal_log(log, result.id)
        return lines if any(line["signal"] == "finished" for line in lines) else []

    return wait_for(
        logged, timeout=10, what=lambda: f"task_finished of #{result.id}\n{worker.tail()}"
    )


def test_the_readme_example_runs_on_a_worker_and_each_signal_is_sent_once(
    worker: Worker, signal_log: Path
) -> None:
    mark = worker.mark()

    result = send_digest.enqueue(42)
    assert result.status == TaskResultStatus.READY

    done = finish(result, worker)
    assert done.status == TaskResultStatus.SUCCESSFUL
    assert done.return_value == 84
    assert done.attempts == 1
    assert done.worker_ids == [Lease.objects.get(step__task_id=int(result.id)).worker_id]
    assert done.enqueued_at <= done.started_at <= done.finished_at
    # By name: the worker may log ``started`` before this process logs ``task_enqueued``
    # (see below).
    lines = signals(signal_log, result, worker)
    assert sorted(line["signal"] for line in lines) == ["enqueued", "finished", "started"]
    logged = {line["signal"]: line for line in lines}
    enqueued, started, finished = logged["enqueued"], logged["started"], logged["finished"]
    sender = "tasks_app.backends.DurableBackend"
    assert (enqueued["signal"], enqueued["sender"], enqueued["status"]) == (
        "enqueued",
        sender,
        "READY",
    )
    assert enqueued["pid"] == os.getpid()
    assert (started["signal"], started["status"], started["attempts"]) == ("started", "RUNNING", 1)
    assert worker.is_pool_child(started["pid"])
    assert (finished["signal"], finished["status"], finished["return_value"]) == (
        "finished",
        "SUCCESSFUL",
        84,
    )
    assert finished["pid"] == started["pid"]
    assert finished["worker_ids"] == done.worker_ids
    worker.assert_quiet(since=mark)


def test_a_task_that_keeps_failing_is_failed_with_its_error_after_the_last_attempt(
    worker: Worker, signal_log: Path
) -> None:
    result = fail.enqueue("the remote said no")

    failed = finish(result, worker)
    assert failed.status == TaskResultStatus.FAILED
    assert failed.attempts == 3
    assert [error.exception_class for error in failed.errors] == [RuntimeError] * 3
    assert failed.errors[-1].traceback.endswith("RuntimeError: the remote said no\n")
    lines = signals(signal_log, result, worker)
    # Each process's signals in its order; between the two, none is promised: the enqueue's
    # commit rings the doorbell, and the worker may start before this process sends
    # ``task_enqueued`` just after that commit.
    here = [(line["signal"], line["attempts"]) for line in lines if line["pid"] == os.getpid()]
    there = [(line["signal"], line["attempts"]) for line in lines if line["pid"] != os.getpid()]
    assert here == [("enqueued", 0)]
    assert there == [("started", 1), ("started", 2), ("started", 3), ("finished", 3)]
    assert lines[-1]["status"] == "FAILED"
    assert lines[-1]["errors"] == ["builtins.RuntimeError"] * 3


def test_a_deferred_task_runs_no_earlier_than_its_run_after(worker: Worker) -> None:
    run_after = timezone.now() + timedelta(seconds=1.5)

    result = add.using(run_after=run_after).enqueue(1, 2)

    done = finish(result, worker)
    assert done.status == TaskResultStatus.SUCCESSFUL
    assert done.started_at >= run_after
    assert done.return_value == 3


def test_one_worker_runs_a_prefilled_queue_by_priority(worker: Worker, signal_log: Path) -> None:
    # Due in ten minutes, too far out for a doorbell: the queue fills up with no message
    # naming any of them. Back-dated together in one statement, they are due at once, and
    # the sweeper rings once for the queue (a doorbell naming one step would run it first).
    results = [
        label.using(priority=priority, run_after=timezone.now() + timedelta(minutes=10)).enqueue(
            name
        )
        for name, priority in [("low", -50), ("middle", 0), ("highest", 90), ("high", 10)]
    ]
    hour = timedelta(hours=1)
    Step.objects.filter(task_id__in=[int(result.id) for result in results]).update(
        available_at=F("available_at") - hour, dispatched_at=F("dispatched_at") - hour
    )

    for result in results:
        assert finish(result, worker).status == TaskResultStatus.SUCCESSFUL
    ids = {result.id for result in results}
    logged = read_signal_log(signal_log)
    started = [line for line in logged if line["id"] in ids and line["signal"] == "started"]
    assert len(started) == len(results)
    # A worker process claims the highest priority due at the time of each claim: what one
    # process runs goes from the highest priority down, the highest first. With two pool
    # processes woken together (the sweeper's doorbell and the node's backstop both name
    # the highest), the other may claim the next one while the highest is held and log its
    # start a moment earlier, so the order across processes is not the claims' order.
    firsts = []
    for pid in {line["pid"] for line in started}:
        priorities = [line["priority"] for line in started if line["pid"] == pid]
        assert all(a >= b for a, b in pairwise(priorities)), priorities
        firsts.append(priorities[0])
    assert 90 in firsts
