"""What a worker logs at the Procfile's level (INFO) with the production defaults: one line
per drain that ran steps, none per message or per sweep, one line per retry, dead letter
and expired review (tasks_app.observability.oplog), one per pool process that dies, and one for the
expired messages it discards after being away."""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import cast

import pytest
import redis
from django.db.models import F

from approvals.models import ApprovalRequest, ApprovalStatus
from tasks_app import services
from tasks_app.models import Lease, Task, TaskStatus
from tasks_app.tasks import sweep
from tests.approval_support import ARTICLE
from tests.conftest import BROKER_PREFIX, BrokerView
from tests.e2e_support import Worker, beat_process, database_url, wait_for, worker_on_test_database
from tests.remotes import LoopbackRemote

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.timeout(120),
    pytest.mark.django_db(transaction=True),
]

DRAINED = re.compile(
    r"INFO tasks_app\.engine\.runner: drained (\d+) step\(s\) from queue default in \d+ ms:"
    r" (\d+) returned, (\d+) failed"
)


def test_a_worker_at_info_logs_one_line_per_drain_and_none_per_message(
    tmp_path_factory: pytest.TempPathFactory,
    module_remotes: tuple[LoopbackRemote, LoopbackRemote],
) -> None:
    with worker_on_test_database(
        tmp_path_factory.mktemp("worker-log"),
        module_remotes,
        what="the worker log test",
        TASKS_LOG_MESSAGES="0",
    ) as worker:
        mark = worker.mark()
        ok = [
            services.enqueue("demo.noop", {}, idempotency_key=f"log-{i}", actor="test:e2e").task
            for i in range(20)
        ]
        failing = services.enqueue(
            "demo.flaky", {"fail_first": 1}, idempotency_key="log-flaky", actor="test:e2e"
        ).task
        dying = services.enqueue(
            "demo.flaky",
            {"fail_first": 1, "error": "permanent"},
            idempotency_key="log-dead",
            actor="test:e2e",
        ).task
        ids = [task.pk for task in [*ok, failing]]

        def settled() -> bool:
            dead = Task.objects.filter(pk=dying.pk, status=TaskStatus.DEAD).exists()
            done = Task.objects.filter(pk__in=ids, status=TaskStatus.SUCCEEDED).count()
            return dead and done == 21

        wait_for(settled, timeout=60, what=lambda: "the tasks to settle\n" + worker.tail())

        def drained() -> str | None:
            # A drain writes its line after its last commit: the tasks may settle first.
            text = worker.output(mark)
            return text if sum(int(ran) for ran, _, _ in DRAINED.findall(text)) >= 23 else None

        logged = wait_for(drained, timeout=30, what=lambda: "the drain lines\n" + worker.tail())

        # Beat sends the sweep every second to this worker; a review that expires shows
        # that one ran since ``swept``.
        swept = worker.mark()
        review = services.enqueue(
            "publish_article", ARTICLE, idempotency_key="log-review", actor="test:e2e"
        ).task
        requests = ApprovalRequest.objects.filter(task=review, status=ApprovalStatus.PENDING)
        wait_for(requests.exists, timeout=60, what=lambda: "the review\n" + worker.tail())
        requests.update(expires_at=F("created_at"))
        wait_for(
            lambda: f"approval_expired task={review.pk} " in worker.output(swept),
            timeout=30,
            what=lambda: "the sweeper to expire the review\n" + worker.tail(),
        )
        sweeping = worker.output(swept)

    drains = [tuple(map(int, found)) for found in DRAINED.findall(logged)]
    # 22 tasks of one step each: the flaky one's first attempt failed, the dying one's only.
    assert sum(ran for ran, _, _ in drains) == 23, logged
    assert sum(returned for _, returned, _ in drains) == 21, logged
    assert sum(failed for _, _, failed in drains) == 2, logged
    assert all(ran == returned + failed for ran, returned, failed in drains)
    assert "run_step" not in logged, "Celery's per-message lines are off by default"
    # A sweep that expired in the queue while the pool was busy is told in the one summary
    # line of what was discarded unrun (the next test checks it), not a line of its own.
    heard = "\n".join(
        line for line in (logged + sweeping).splitlines() if " message(s) unrun: " not in line
    )
    for line in ("Sending due task", "tasks_app.tasks.sweep"):
        assert line not in heard, "beat and the sweeper log nothing per sweep"
    assert re.search(
        rf"INFO tasks_app\.events: approval_expired task={review.pk} step=\d+ token=0 "
        r"workflow=publish_article queue=default actor=system:sweeper ",
        sweeping,
    ), sweeping
    worker_actor = r"worker:\S+:\d+"
    retried, died = failing.steps.get(), dying.steps.get()
    assert re.search(
        rf"INFO tasks_app\.events: retry_scheduled task={failing.pk} step={retried.pk} token=1 "
        rf"workflow=demo\.flaky queue=default actor={worker_actor} attempts=1 "
        r"error_class=tasks_app\.exceptions\.RetryableError .*retry_in=[0-9.]+s",
        logged,
    ), logged
    assert re.search(
        rf"WARNING tasks_app\.events: dead_lettered task={dying.pk} step={died.pk} token=1 "
        rf"workflow=demo\.flaky queue=default actor={worker_actor} attempts=1 "
        r"error_class=tasks_app\.exceptions\.PermanentError .*reason=permanent_error",
        logged,
    ), logged
    assert logged.count("tasks_app.events:") == 2, logged


def test_a_pool_process_that_dies_is_one_line_naming_the_step_it_took_down(
    tmp_path_factory: pytest.TempPathFactory,
    module_remotes: tuple[LoopbackRemote, LoopbackRemote],
) -> None:
    """A step that kills its process: the worker says so once, naming the process and the
    step, and neither Celery's WorkerLostError traceback nor billiard's exit line follow."""
    with worker_on_test_database(
        tmp_path_factory.mktemp("crash-log"),
        module_remotes,
        what="the worker log test",
        TASKS_LOG_MESSAGES="0",
    ) as worker:
        mark = worker.mark()
        task = services.enqueue(
            "demo.flaky",
            {"error": "crash", "fail_first": 1},
            idempotency_key="log-crash",
            actor="test:e2e",
        ).task
        step = task.steps.get()
        first = wait_for(
            lambda: Lease.objects.filter(step=step, token=1).first(),
            timeout=60,
            what=lambda: "the first claim\n" + worker.tail(),
        )
        pid = int(first.worker_id.rsplit(":", 1)[1])
        wait_for(
            lambda: Task.objects.filter(pk=task.pk, status=TaskStatus.SUCCEEDED).exists(),
            timeout=60,
            what=lambda: "the step to run again and succeed\n" + worker.tail(),
        )
        # The pool reaps the dead process when it next looks (up to 5 s on) and writes its
        # own lines then, in the same pass: once the pid is gone they are in the log.
        wait_for(
            lambda: not Path(f"/proc/{pid}").exists(),
            timeout=30,
            what=lambda: f"the pool to reap process {pid}\n" + worker.tail(),
        )
    logged = worker.output(mark)

    told = [line for line in logged.splitlines() if str(pid) in line]
    assert len(told) == 1, logged
    assert re.search(
        rf"WARNING tasks_app\.engine\.crashes: pool process {pid} died running step {step.pk}; ",
        told[0],
    ), logged
    for noise in ("WorkerLostError", "Traceback", "exited with", "ERROR"):
        assert noise not in logged, logged


def test_sweeps_that_expired_while_no_maintenance_worker_ran_are_one_line(
    tmp_path: Path, broker: BrokerView
) -> None:
    """Beat keeps sending the sweep while no maintenance worker consumes it; each expires
    after TASKS_SWEEP_SECONDS. The worker that comes back discards them all unrun and says
    so once, when it takes a message again, not once per message."""
    from django.conf import settings
    from django.db import connection

    client = redis.Redis.from_url(settings.REDIS_URL)
    queue = f"{BROKER_PREFIX}{settings.TASKS_MAINTENANCE_QUEUE}"
    env = {
        **os.environ,
        "DATABASE_URL": database_url(connection.settings_dict),
        "REDIS_URL": settings.REDIS_URL,
        "TASKS_BROKER_PREFIX": BROKER_PREFIX,
        "TASKS_SWEEP_SECONDS": "1",
        "TASKS_VAR_DIR": str(tmp_path / "var"),
        "TASKS_LOG_MESSAGES": "0",
    }
    beat = beat_process(env, tmp_path)
    try:
        beat.wait_ready(timeout=60)
        wait_for(
            lambda: cast(int, client.llen(queue)) >= 5,
            timeout=60,
            what=lambda: "beat to send five sweeps\n" + beat.tail(),
        )
    finally:
        beat.stop()
    waiting = cast(int, client.llen(queue))

    maintenance = Worker(
        ["--queues", "maintenance", "--concurrency", "1", "--loglevel", "INFO"],
        env=env,
        log_path=tmp_path / "maintenance.log",
    )
    try:
        maintenance.wait_ready(timeout=60)
        wait_for(
            lambda: client.llen(queue) == 0,
            timeout=60,
            what=lambda: "the worker to take the waiting sweeps\n" + maintenance.tail(),
        )
        # A sweep that has not expired: the worker takes it, and tells what it discarded.
        sweep.apply_async(queue=settings.TASKS_MAINTENANCE_QUEUE)
        wait_for(
            lambda: "discarded" in maintenance.output(),
            timeout=30,
            what=lambda: "the line on the discarded sweeps\n" + maintenance.tail(),
        )
    finally:
        maintenance.stop()
    logged = maintenance.output()

    assert "Discarding revoked task" not in logged, logged
    summaries = re.findall(r"INFO config\.celery: discarded (\d+) message\(s\) unrun: (.*)", logged)
    assert summaries == [(str(waiting), f"tasks_app.tasks.sweep {waiting} expired")], logged
    maintenance.assert_quiet()
