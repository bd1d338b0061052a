"""The ORM code the embedded SQLite mode runs, exercised in-process on PostgreSQL by
switching the SQL fast path off (``TASKS_SQL_FAST_PATH``): the same outcomes, and none
of the batch statements sent."""

from __future__ import annotations

from typing import Any

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from tasks_app import services
from tasks_app.engine import fastpath, runner
from tasks_app.engine.transitions import fast_path_enabled
from tasks_app.history import timeline
from tasks_app.models import Event, Step, StepStatus, Task, TaskStatus
from tests.conftest import backdate

pytestmark = pytest.mark.django_db


@pytest.fixture
def orm_path(settings: Any) -> None:
    settings.TASKS_SQL_FAST_PATH = False


def _sent_batch_sql(queries: CaptureQueriesContext) -> list[str]:
    return [q["sql"] for q in queries.captured_queries if "unnest(" in q["sql"]]


def test_the_switch_is_the_one_place_that_chooses_the_path(settings: Any) -> None:
    assert fast_path_enabled() is (connection.vendor == "postgresql")
    settings.TASKS_SQL_FAST_PATH = False
    assert fast_path_enabled() is False


def test_bulk_enqueue_batch_claims_and_completions_run_through_the_orm(orm_path: None) -> None:
    with CaptureQueriesContext(connection) as queries:
        results = services.enqueue_many(
            [{"workflow": "demo.noop", "payload": {"n": n}} for n in range(3)]
        )
        claims = fastpath.claim_batch(worker_id="w", limit=10, queue="default")
        runner.run_batch(claims)
    assert _sent_batch_sql(queries) == []
    assert [result.created for result in results] == [True, True, True]
    assert len(claims) == 3
    tasks = Task.objects.filter(pk__in=[result.task.pk for result in results])
    assert {task.status for task in tasks} == {TaskStatus.SUCCEEDED}
    histories = timeline.histories([t.pk for t in tasks]).values()
    assert {entry.kind for history in histories for entry in history} == {
        "claimed",
        "enqueued",
        "succeeded",
    }


def test_a_stale_completion_is_refused_on_the_orm_path_too(orm_path: None) -> None:
    task = services.enqueue("demo.noop", {}).task
    [stale] = fastpath.claim_batch(worker_id="slow", limit=1, queue="default")
    backdate(Step.objects.get(pk=stale.step_id))  # its lease ran out: reaped, claimed again
    assert services.reap_expired_leases() == 1
    [current] = fastpath.claim_batch(worker_id="fast", limit=1, step_id=stale.step_id)
    assert fastpath.complete_many([(stale, {})]) == set()
    assert Step.objects.get(task=task).status == StepStatus.RUNNING
    assert fastpath.complete_many([(current, {})]) == {current.step_id}
    assert Event.objects.filter(task_id=task.pk, kind="stale_write_rejected").exists()
