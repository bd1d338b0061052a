"""Fan-outs: a step that runs once per item of a list known only at run time, each item a
step of its own (lease, attempts, step key, ledger entries), joined by a later step that
gets their results as one list. Bounded; a refused fan-out waits for on-call; a failed item
is redriven alone.

Everything runs for real; the remote is an in-process fake that counts its writes.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tasks_app import services
from tasks_app.engine import runner
from tasks_app.exceptions import InvalidTransition
from tasks_app.models import Event, EventKind, Step, StepStatus, Task, TaskStatus
from tasks_app.observability.invariants import check
from tasks_app.workflows import StepSpec, registry
from tests.conftest import backdate
from tests.graph_support import Remote, registered, run, step_of, translations

FLOW = "test.graph.translations_fan_out"


@pytest.fixture(params=[True, False], ids=["sql", "orm"])
def remote(request: pytest.FixtureRequest, db: None, settings: Any) -> Iterator[Remote]:
    settings.TASKS_SQL_FAST_PATH = request.param
    made = Remote()
    with registered(translations(FLOW, made)):
        yield made


def _enqueue(*languages: str, key: str | None = None) -> Task:
    return services.enqueue(FLOW, {"languages": list(languages)}, idempotency_key=key).task


def _items(task: Task) -> list[Step]:
    return list(Step.objects.current().filter(task=task, kind="translate").order_by("item"))


def _run_items(task: Task) -> None:
    for row in _items(task):
        if row.status == StepStatus.PENDING:
            backdate(row)
            assert runner.run_claimed(row.pk)


def _clean() -> None:
    report = check(since=None)
    assert report.findings == [], [str(finding) for finding in report.findings]


def test_a_fan_out_runs_once_per_item_and_the_join_gets_their_results_in_order(
    remote: Remote,
) -> None:
    task = _enqueue("de", "fr", "ja", key="article-9")
    run(task, "plan")
    rows = _items(task)
    assert [(row.item, row.status) for row in rows] == [
        (0, "pending"),
        (1, "pending"),
        (2, "pending"),
    ]
    assert [row.idempotency_key for row in rows] == [
        "article-9:1:translate",
        "article-9:1:translate:i1",
        "article-9:1:translate:i2",
    ]
    # N is recorded with the success that fanned out.
    fanned = Event.objects.get(
        task_id=task.pk, kind=EventKind.SUCCEEDED, step_id=step_of(task, "plan").pk
    )
    assert fanned.data["fanned_out"] == {"translate": 3}
    assert step_of(task, "publish").status == StepStatus.BLOCKED
    _run_items(task)
    run(task, "publish")
    task.refresh_from_db()
    assert task.status == TaskStatus.SUCCEEDED
    assert [remote.seen[f"translate:{lang}"]["index"] for lang in ("de", "fr", "ja")] == [0, 1, 2]
    joined = remote.seen["publish"]["translate"]
    assert [result["language"] for result in joined] == ["de", "fr", "ja"]
    assert sorted(remote.writes) == ["publish", "translate:de", "translate:fr", "translate:ja"]
    _clean()


def test_a_fan_out_of_no_items_lets_the_join_run_with_an_empty_list(remote: Remote) -> None:
    task = _enqueue()
    run(task, "plan")
    [row] = _items(task)
    assert (row.status, row.attempts, row.result) == (StepStatus.SUCCEEDED, 0, [])
    assert step_of(task, "publish").status == StepStatus.PENDING
    run(task, "publish")
    assert remote.seen["publish"]["translate"] == []
    task.refresh_from_db()
    assert task.status == TaskStatus.SUCCEEDED
    _clean()


def test_more_items_than_the_bound_is_refused_and_waits_for_on_call(remote: Remote) -> None:
    task = _enqueue("a", "b", "c", "d", "e", "f")
    run(task, "plan")
    [row] = _items(task)
    assert row.status == StepStatus.DEAD
    assert row.error_class == "fan_out_refused"
    assert row.last_error == "translate: fan_out gave 6 items, more than max_items 5"
    task.refresh_from_db()
    assert task.status == TaskStatus.DEAD
    lettered = Event.objects.get(task_id=task.pk, kind=EventKind.DEAD_LETTERED)
    assert (lettered.step_id, lettered.reason) == (row.pk, "fan_out_refused")
    # Nothing was run, nothing called; a redrive that would be refused again changes nothing.
    with pytest.raises(InvalidTransition, match="the fan-out is still refused"):
        services.redrive(task, actor="cli:oncall", reason="try again")
    assert _items(task)[0].status == StepStatus.DEAD
    assert remote.writes == []
    _clean()


def test_a_redrive_asks_a_refused_fan_out_for_its_items_again(remote: Remote) -> None:
    remote.broken = True
    task = _enqueue("de", "fr")
    run(task, "plan")
    assert (
        "fan_out raised RuntimeError: the language list is unreadable" in _items(task)[0].last_error
    )
    remote.broken = False
    services.redrive(task, actor="cli:oncall", reason="list mended")
    rows = _items(task)
    assert [(row.item, row.status) for row in rows] == [(0, "pending"), (1, "pending")]
    redriven = Event.objects.get(task_id=task.pk, kind=EventKind.REDRIVEN)
    assert redriven.data["fanned_out"] == {"translate": 2}
    _run_items(task)
    run(task, "publish")
    task.refresh_from_db()
    assert task.status == TaskStatus.SUCCEEDED
    _clean()


def test_a_failed_item_is_redriven_alone_and_no_other_item_writes_again(remote: Remote) -> None:
    remote.failing.add("fr")
    task = _enqueue("de", "fr", "ja")
    run(task, "plan")
    _run_items(task)
    assert [row.status for row in _items(task)] == ["succeeded", "dead", "succeeded"]
    task.refresh_from_db()
    assert task.status == TaskStatus.DEAD
    remote.failing.clear()
    services.redrive(task, actor="cli:oncall", reason="translator back")
    assert [row.status for row in _items(task)] == ["succeeded", "pending", "succeeded"]
    _run_items(task)
    run(task, "publish")
    task.refresh_from_db()
    assert task.status == TaskStatus.SUCCEEDED
    assert sorted(remote.writes) == ["publish", "translate:de", "translate:fr", "translate:ja"]
    _clean()


def test_a_worker_drain_runs_a_fan_out_to_the_end(remote: Remote) -> None:
    task = _enqueue("de", "fr", "ja", "pt")
    ran = 0
    for _ in range(10):
        due = Step.objects.filter(task=task, status=StepStatus.PENDING).first()
        if due is None:
            break
        backdate(due)
        ran += runner.drain(due.pk)
    task.refresh_from_db()
    assert task.status == TaskStatus.SUCCEEDED
    assert ran == 6
    assert len(remote.seen["publish"]["translate"]) == 4
    _clean()


def _noop(ctx: Any) -> None:
    return None


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"approval": True}, "an approval step cannot fan out"),
        ({"max_items": 0}, "max_items must be from 1 to 10000"),
        ({"max_items": 10_001}, "max_items must be from 1 to 10000"),
    ],
)
def test_a_fan_out_that_cannot_run_is_refused_when_declared(
    options: dict[str, Any], message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        StepSpec("x", _noop, fan_out=lambda results: [], **options)


def test_a_workflow_with_a_fan_out_is_not_a_line(remote: Remote) -> None:
    assert not registry.latest(FLOW).is_line
