"""What a worker logs at the Procfile's level (INFO) with the production defaults: one line
per drain that ran steps, none per message."""

from __future__ import annotations

import re

import pytest

from tasks_app import services
from tasks_app.models import Task, TaskStatus

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
        ids = [task.pk for task in [*ok, failing]]

        def settled() -> bool:
            return Task.objects.filter(pk__in=ids, status=TaskStatus.SUCCEEDED).count() == 21

        wait_for(settled, timeout=60, what=lambda: "the tasks to succeed\n" + worker.tail())
        logged = worker.output(mark)

    drains = [tuple(map(int, found)) for found in DRAINED.findall(logged)]
    # 21 tasks of one step each, and the flaky one's first attempt failed.
    assert sum(ran for ran, _, _ in drains) == 22, logged
    assert sum(returned for _, returned, _ in drains) == 21, logged
    assert sum(failed for _, _, failed in drains) == 1, logged
    assert all(ran == returned + failed for ran, returned, failed in drains)
    assert "run_step" not in logged, "Celery's per-message lines are off by default"
