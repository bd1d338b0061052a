"""End to end on PostgreSQL and Redis: a real prefork Celery worker (with beat, so the
sweeper runs on its maintenance queue) executes what the tests enqueue.

The tests commit their rows (transactional database) so the worker, connected to the same
test database, sees them; it consumes this run's Redis keys (``TASKS_BROKER_PREFIX``).
Outcomes are read from the database with a deadline, never after a fixed sleep.
"""

from __future__ import annotations

import itertools
import os
import signal
from collections.abc import Iterator

import pytest
from django.contrib.auth.models import User

from approvals import services as approvals
from tasks_app import services
from tasks_app.engine.dispatch import Doorbell, publish
from tasks_app.history import timeline
from tasks_app.models import Counter, Event, Lease, Step, Task, TaskStatus
from tests.approval_support import ARTICLE, pending_request
from tests.conftest import event_kinds
from tests.e2e_support import Worker, wait_for, worker_on_test_database
from tests.lease_support import attempts_of
from tests.remotes import LoopbackRemote

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.timeout(120),
    pytest.mark.django_db(transaction=True),
]

LEASE_SECONDS = 5
SETTLED = {TaskStatus.SUCCEEDED, TaskStatus.DEAD, TaskStatus.CANCELLED}
# One line per doorbell the worker has handled (a claim, or nothing to claim).
RUN_STEP_DONE = r"Task tasks_app\.tasks\.run_step\[[^\]]+\] succeeded in"


@pytest.fixture(scope="module")
def worker(
    django_db_setup: None,
    tmp_path_factory: pytest.TempPathFactory,
    module_remotes: tuple[LoopbackRemote, LoopbackRemote],
) -> Iterator[Worker]:
    """One worker for the module, on the test database and this run's broker keys."""
    # Short leases: a lost worker's step comes back in seconds.
    with worker_on_test_database(
        tmp_path_factory.mktemp("e2e-celery"),
        module_remotes,
        what="the Celery end-to-end tests",
        TASKS_LEASE_SECONDS=str(LEASE_SECONDS),
    ) as process:
        yield process


def settle(task: Task, worker: Worker, timeout: float = 60) -> Task:
    """Wait until the task has succeeded, died or been cancelled; return it fresh."""

    def settled() -> bool:
        return Task.objects.filter(pk=task.pk, status__in=SETTLED).exists()

    wait_for(settled, timeout=timeout, what=lambda: f"task #{task.pk} to settle\n{worker.tail()}")
    return Task.objects.get(pk=task.pk)


def leases(step: Step) -> list[tuple[int, str]]:
    return list(step.leases.order_by("token").values_list("token", "outcome"))


def test_a_flaky_task_retries_with_backoff_until_it_succeeds(worker: Worker) -> None:
    mark = worker.mark()

    task = services.enqueue(
        "demo.flaky", {"fail_first": 2}, idempotency_key="e2e-flaky-ok", actor="test:e2e"
    ).task

    task = settle(task, worker)
    step = task.steps.get()
    assert task.status == TaskStatus.SUCCEEDED
    assert task.finished_at is not None
    assert (step.status, step.attempts, step.fencing_token) == ("succeeded", 3, 3)
    assert step.result == {"token": 3, "attempt": 3}
    assert step.error_class == "tasks_app.exceptions.RetryableError"
    assert event_kinds(task) == [
        "enqueued",
        "claimed",
        "retry_scheduled",
        "claimed",
        "retry_scheduled",
        "claimed",
        "succeeded",
    ]
    assert leases(step) == [(1, "failed"), (2, "failed"), (3, "succeeded")]
    rows = list(step.leases.order_by("token"))
    assert all(lease.released_at is not None for lease in rows)
    # Each retry waited for its backoff: no claim before the previous attempt failed.
    for earlier, later in itertools.pairwise(rows):
        assert earlier.released_at is not None
        assert later.acquired_at >= earlier.released_at
    worker.assert_quiet(since=mark)


def test_a_task_that_keeps_failing_is_dead_lettered_after_three_attempts(
    worker: Worker,
) -> None:
    mark = worker.mark()

    task = services.enqueue(
        "demo.flaky", {"fail_first": 5}, idempotency_key="e2e-flaky-dead", actor="test:e2e"
    ).task

    task = settle(task, worker)
    step = task.steps.get()
    assert task.status == TaskStatus.DEAD
    assert (step.status, step.attempts, step.fencing_token) == ("dead", 3, 3)
    assert step.error_class == "tasks_app.exceptions.RetryableError"
    assert "failing on claim 3 of 5" in step.last_error
    assert event_kinds(task) == [
        "enqueued",
        "claimed",
        "retry_scheduled",
        "claimed",
        "retry_scheduled",
        "claimed",
        "dead_lettered",
    ]
    dead = Event.objects.for_task(task.pk).get(kind="dead_lettered")
    assert dead.reason == "max_attempts"
    assert leases(step) == [(1, "failed"), (2, "failed"), (3, "failed")]
    worker.assert_quiet(since=mark)


def test_a_batch_runs_each_step_once_although_every_doorbell_rings_twice(
    worker: Worker,
) -> None:
    mark = worker.mark()

    results = services.enqueue_many(
        [
            {"workflow": "demo.noop", "payload": {"n": n}, "idempotency_key": f"e2e-batch-{n}"}
            for n in range(20)
        ],
        actor="test:e2e",
    )
    steps = list(Step.objects.filter(task__in=[r.task for r in results]))
    # A second doorbell for every step, as a sweeper that thought them lost would ring.
    publish([Doorbell(step.pk, step.queue) for step in steps])

    for result in results:
        assert settle(result.task, worker).status == TaskStatus.SUCCEEDED
    # Every doorbell has been handled: the enqueue's one for the queue, a duplicate for
    # every step, and any the sweeper or a recruiting drain added.
    wait_for(
        lambda: worker.count(RUN_STEP_DONE, since=mark) >= len(steps) + 1,
        timeout=30,
        what=lambda: "the worker to handle both doorbells of every step\n" + worker.tail(),
    )
    assert len(steps) == 20
    for step in Step.objects.filter(pk__in=[s.pk for s in steps]):
        assert (step.status, step.attempts, step.fencing_token) == ("succeeded", 1, 1)
        assert leases(step) == [(1, "succeeded")]
    tasks = [r.task.pk for r in results]
    assert Lease.objects.filter(step__task__in=tasks).count() == 20
    claims = [e for h in timeline.histories(tasks).values() for e in h if e.kind == "claimed"]
    assert len(claims) == 20
    assert not Event.objects.filter(task_id__in=tasks, kind="stale_write_rejected").exists()
    worker.assert_quiet(since=mark)


def test_a_step_whose_worker_process_dies_is_reaped_and_run_again(worker: Worker) -> None:
    task = services.enqueue(
        "demo.flaky", {"sleep": 3}, idempotency_key="e2e-killed", actor="test:e2e"
    ).task
    step = task.steps.get()

    def first_claim() -> Lease | None:
        live = attempts_of(step).get(1)  # the live lease, on the step while it runs
        return live if live is not None and live.released_at is None else None

    first = wait_for(first_claim, timeout=30, what=lambda: "the first claim\n" + worker.tail())
    pid = int(first.worker_id.rsplit(":", 1)[1])
    assert worker.is_pool_child(pid), f"{first.worker_id} is not a child of our worker"
    os.kill(pid, signal.SIGKILL)

    # The worker's main process ends the dead child's lease (tasks_app.engine.crashes), the
    # sweeper reaps it, and a second claim by another pool process runs the step to the end.
    task = settle(task, worker, timeout=60)
    step.refresh_from_db()
    assert task.status == TaskStatus.SUCCEEDED
    assert (step.status, step.attempts, step.fencing_token) == ("succeeded", 2, 2)
    assert event_kinds(task) == ["enqueued", "claimed", "lease_expired", "claimed", "succeeded"]
    expired = Event.objects.for_task(task.pk).get(kind="lease_expired")
    assert (expired.actor, expired.data["step_status"]) == ("system:sweeper", "pending")
    assert leases(step) == [(1, "expired"), (2, "succeeded")]
    second = step.leases.get(token=2)
    assert second.worker_id != first.worker_id
    ended = step.leases.get(token=1)
    assert second.acquired_at >= ended.expires_at
    # Ended when the child died, long before the lease would have run out.
    assert ended.expires_at < first.expires_at


def test_an_article_is_drafted_reviewed_and_published_once_by_a_real_worker(
    worker: Worker, editor: User, module_remotes: tuple[LoopbackRemote, LoopbackRemote]
) -> None:
    publishing, _ = module_remotes
    mark = worker.mark()

    task = services.enqueue(
        "publish_article", ARTICLE, idempotency_key="e2e-publish:article-001", actor="test:e2e"
    ).task

    wait_for(
        lambda: Task.objects.filter(pk=task.pk, status=TaskStatus.WAITING_APPROVAL).exists(),
        timeout=60,
        what=lambda: f"task #{task.pk} to wait for an editor\n{worker.tail()}",
    )
    request = pending_request(task)
    assert publishing.received == []  # nothing goes out before a person decides
    approvals.approve(request, actor=editor, comment="Ship it", draft_hash=request.draft_hash)

    task = settle(task, worker)
    assert task.status == TaskStatus.SUCCEEDED
    assert [write["body"]["body"] for write in publishing.applied] == [request.draft["body"]]
    assert [write["key"] for write in publishing.applied] == [
        "e2e-publish:article-001:2:publish:publish"
    ]
    assert event_kinds(task) == [
        "enqueued",
        "claimed",
        "succeeded",
        "approval_requested",
        "approved",
        "claimed",
        "succeeded",
        "claimed",
        "succeeded",
    ]
    approved = Event.objects.for_task(task.pk).get(kind="approved")
    assert (approved.actor, approved.actor_user_id) == (editor.username, editor.pk)
    worker.assert_quiet(since=mark)


def test_a_worker_writes_what_it_counted_on_its_own_within_a_few_seconds(worker: Worker) -> None:
    """The worker keeps its counts in memory and writes them every second: nobody reads
    through it, yet its claims and run times reach the counter rows."""

    def stored(prefix: str) -> int:
        names = Counter.objects.filter(name__startswith=prefix).values_list("value", flat=True)
        return sum(names)

    claimed_before = stored("claimed:default#")
    runs_before = stored("step_seconds@demo.noop:le=")
    tasks = [services.enqueue("demo.noop", {"count": n}).task for n in range(3)]
    for task in tasks:
        assert settle(task, worker).status == TaskStatus.SUCCEEDED

    wait_for(
        lambda: (
            stored("claimed:default#") >= claimed_before + 3
            and stored("step_seconds@demo.noop:le=") >= runs_before + 3
        ),
        timeout=15,
        what=lambda: f"the worker's counts in the counter rows\n{worker.tail()}",
    )
