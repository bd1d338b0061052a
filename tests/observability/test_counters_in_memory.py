"""The metrics counters are kept in memory and written by the process that counted, in one
statement per interval (DESIGN rule 11): an execution writes no counter row, a rolled-back
change counts nothing, and a reader sees its own process's counts at once."""

from __future__ import annotations

from typing import Any

import pytest
from django.db import transaction

from tasks_app import services
from tasks_app.engine import runner
from tasks_app.history import counting
from tasks_app.models import Counter
from tests.conftest import only_step

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(params=["sql", "orm"])
def path(request: pytest.FixtureRequest, settings: Any) -> str:
    settings.TASKS_SQL_FAST_PATH = request.param == "sql"
    return str(request.param)


def rows() -> dict[str, int]:
    """The counter rows as stored, their shards added up."""
    summed: dict[str, int] = {}
    for name, value in Counter.objects.values_list("name", "value"):
        summed[name.split("#", 1)[0]] = summed.get(name.split("#", 1)[0], 0) + value
    return summed


def test_an_enqueue_and_its_execution_write_no_counter_row_until_the_flush(path: str) -> None:
    for n in range(3):
        task = services.enqueue("demo.noop", {"n": n}).task
        runner.drain(only_step(task).pk)

    assert Counter.objects.count() == 0
    counting.flush()

    stored = rows()
    assert stored["enqueued:demo.noop"] == 3
    assert stored["claimed:default"] == 3
    histogram = counting.by_workflow(stored)["demo.noop"].run_times
    assert histogram.count == 3
    # One statement wrote them all: one row per counter, each on this process's shard.
    assert Counter.objects.count() == len(stored)


def test_a_change_rolled_back_counts_nothing(path: str) -> None:
    with pytest.raises(RuntimeError), transaction.atomic():
        services.enqueue("demo.noop", {"n": "gone"})
        raise RuntimeError("rolled back")
    services.enqueue("demo.noop", {"n": "kept"})

    assert counting.totals()["enqueued:demo.noop"] == 1


def test_counts_flushed_once_are_not_written_again() -> None:
    services.enqueue("demo.noop", {})
    counting.flush()
    counting.flush()
    services.enqueue("demo.noop", {"n": 2})

    assert counting.totals()["enqueued:demo.noop"] == 2
