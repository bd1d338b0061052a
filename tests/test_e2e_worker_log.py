"""What a worker logs at the Procfile's level (INFO) with the production defaults: one line
per drain that ran steps, none per message or per sweep, and one line per retry, dead
letter and expired review (tasks_app.oplog)."""

from __future__ import annotations

import re

import pytest
from django.db.models import F

from approvals.models import ApprovalRequest, ApprovalStatus
from tasks_app import services
from tasks_app.models import Task, TaskStatus

from .approval_support import ARTICLE
from .e2e_support import wait_for, worker_on_test_database
from .remotes import LoopbackRemote

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.timeout(120),
    pytest.mark.django_db(transaction=True),
]

DRAINED = re.compile(
    r"INFO tasks_app\.runner: drained (\d+) step\(s\) from queue default in \d+ ms:"
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
    for line in ("Sending due task", "tasks_app.tasks.sweep"):
        assert line not in logged + sweeping, "beat and the sweeper log nothing per sweep"
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
