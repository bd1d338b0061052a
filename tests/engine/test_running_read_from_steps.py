"""A claim does not rewrite its task's row (DESIGN rule 11): a task reads as running from its
running step, on every page, list, count and API that shows a status, and a success that
makes the next step due leaves the task's row as it was. Row versions are read from
PostgreSQL's ``xmin``: each transaction that writes a row gives it a new one."""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib.auth.models import User
from django.db import connection
from django.test import Client

from tasks_app import services
from tasks_app.backends import STATUS
from tasks_app.engine import fastpath
from tasks_app.models import StepStatus, Task, TaskStatus
from tasks_app.operations import listings, selectors
from tests.batch_support import claim_due
from tests.metrics_support import scrape, value

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(params=["sql", "orm"])
def path(request: pytest.FixtureRequest, settings: Any) -> str:
    settings.TASKS_SQL_FAST_PATH = request.param == "sql"
    return str(request.param)


def row_version(task: Task) -> str:
    with connection.cursor() as cursor:
        cursor.execute("SELECT xmin::text FROM tasks_app_task WHERE id = %s", [task.pk])
        (xmin,) = cursor.fetchone()
    return str(xmin)


def test_a_claim_leaves_its_task_row_as_it_was_and_the_task_reads_as_running(path: str) -> None:
    task = services.enqueue("demo.noop", {}).task
    idle = services.enqueue("demo.noop", {"n": 2}, priority=-1).task
    before = row_version(task)

    [claim] = claim_due(limit=1).values()

    assert claim.task_id == task.pk
    assert row_version(task) == before
    task.refresh_from_db()
    assert (task.status, task.live_status) == (TaskStatus.PENDING, TaskStatus.RUNNING)
    assert Task.objects.get(pk=idle.pk).live_status == TaskStatus.PENDING
    assert list(Task.objects.in_status(TaskStatus.RUNNING)) == [task]
    assert list(Task.objects.in_status(TaskStatus.PENDING)) == [idle]


def test_a_success_making_the_next_step_due_leaves_the_task_row_and_the_last_ends_it(
    path: str, pair: str
) -> None:
    task = services.enqueue(pair, {}).task
    before = row_version(task)

    [draft] = claim_due().values()
    assert fastpath.complete_many([(draft, {"draft": "v1"})]) == {draft.step_id}
    assert row_version(task) == before
    task.refresh_from_db()
    assert task.live_status == TaskStatus.PENDING

    [publish] = claim_due().values()
    assert fastpath.complete_many([(publish, {})]) == {publish.step_id}
    assert row_version(task) != before
    task.refresh_from_db()
    assert (task.status, task.live_status) == (TaskStatus.SUCCEEDED, TaskStatus.SUCCEEDED)
    assert task.finished_at is not None


def test_every_reader_of_a_status_reads_a_running_task_as_running(
    client: Client, superuser: User
) -> None:
    running = services.enqueue("demo.noop", {"n": 1}, priority=1).task
    waiting = services.enqueue("demo.noop", {"n": 2}).task
    [claim] = claim_due(limit=1).values()
    assert claim.task_id == running.pk

    overview = selectors.overview()
    assert (overview.running, overview.pending) == (1, 1)
    listed = listings.tasks(listings.TaskFilter(status=TaskStatus.RUNNING))
    assert [(t.pk, t.live_status) for t in listed] == [(running.pk, TaskStatus.RUNNING)]
    pending = listings.tasks(listings.TaskFilter(status=TaskStatus.PENDING))
    assert [t.pk for t in pending] == [waiting.pk]

    samples = scrape(client)
    assert value(samples, "tasks_tasks", status="running", workflow="demo.noop") == 1
    assert value(samples, "tasks_tasks", status="pending", workflow="demo.noop") == 1

    assert STATUS[TaskStatus(Task.objects.get(pk=running.pk).live_status)].name == "RUNNING"

    client.force_login(superuser)
    page = client.get(f"/tasks/{running.pk}/").content.decode()
    assert 'class="badge status-running"' in page
    admin = client.get("/admin/tasks_app/task/", {"status": "running"}).content.decode()
    assert f"/admin/tasks_app/task/{running.pk}/change/" in admin
    assert f"/admin/tasks_app/task/{waiting.pk}/change/" not in admin
    assert (
        f"/admin/tasks_app/task/{running.pk}/change/"
        in client.get("/admin/tasks_app/task/").content.decode()
    )
    assert Task.objects.get(pk=running.pk).steps.get().status == StepStatus.RUNNING
