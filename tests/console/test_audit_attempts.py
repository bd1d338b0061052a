"""The audit log's enqueues, claims and successes, read from the task rows and the attempts'
records: listed and paged under their action, filtered as events are, exported with an id
naming the task or the attempt, and checked against the database by ``verify_audit
--export``; one task's whole history."""

from __future__ import annotations

import csv
import io
from typing import Any

import pytest
from django.contrib.auth.models import User

from console import audit_csv
from tasks_app import services
from tasks_app.models import Event, Task
from tasks_app.operations.audit_log import AuditFilter, live_claims
from tests.console_support import body, export_rows, login
from tests.factories import noop, succeeded

pytestmark = pytest.mark.django_db


def _running() -> Task:
    task = noop()
    claim = services.claim_step(task.steps.get().pk, worker_id="w-live")
    assert claim is not None
    return task


def _ids(rows: list[list[str]]) -> list[str]:
    return [row[0] for row in rows[1:]]


def test_the_claims_are_listed_newest_first_the_running_ones_leading(auditor: User) -> None:
    done = [succeeded() for _ in range(3)]
    live = _running()
    steps = [task.steps.get().pk for task in [*done, live]]

    rows = export_rows(login(auditor), kind="claimed")

    assert _ids(rows) == [f"claimed:{step}:1" for step in reversed(steps)]
    # The running claim, whose lease is still on its step, leads.
    assert (rows[1][3], rows[1][4], rows[1][8]) == ("worker:w-live", str(live.pk), "Claimed")
    # Successes: the ended attempts only.
    assert _ids(export_rows(login(auditor), kind="succeeded")) == [
        f"succeeded:{step}:1" for step in reversed(steps[:3])
    ]


def test_the_claims_page_by_their_records_and_filter_as_events_do(
    auditor: User, settings: Any
) -> None:
    settings.CONSOLE_PAGE_SIZE = 2
    tasks = [succeeded() for _ in range(3)]
    client = login(auditor)

    first = client.get("/audit/", {"kind": "succeeded"})
    shown = first.context["page"].rows
    assert [entry.task_id for entry in shown] == [tasks[2].pk, tasks[1].pk]
    after = first.context["page"].next_after
    second = client.get("/audit/", {"kind": "succeeded", "after": str(after)}).context["page"]
    assert [entry.task_id for entry in second.rows] == [tasks[0].pk]
    assert second.next_after is None

    # The actor is the worker: a person's name, or a plan, lists none.
    assert len(export_rows(client, kind="claimed", actor="WORKER:")) == 4
    assert len(export_rows(client, kind="claimed", actor="cli:")) == 1
    assert len(export_rows(client, kind="claimed", task=str(tasks[1].pk))) == 2
    assert len(export_rows(client, kind="claimed", workflow="demo.flaky")) == 1


def test_the_whole_log_leaves_out_events_an_attempt_record_repeats(
    auditor: User, oncall: User
) -> None:
    task = succeeded()
    services.pause_queue("default", actor=oncall, reason="drill")
    client = login(auditor)

    # The whole log: events, not the transitions the task and attempt rows record.
    kinds = [row[2] for row in export_rows(client)[1:]]
    assert kinds == ["queue_paused"]
    # One task chosen alone: its whole history, as its timeline shows it.
    page = body(client.get("/audit/", {"task": str(task.pk)}))
    assert page.count('data-kind="claimed"') == 1 and page.count('data-kind="succeeded"') == 1
    kinds = [row[2] for row in export_rows(client, task=str(task.pk))[1:]]
    assert kinds == ["succeeded", "claimed", "enqueued"]


def _export(auditor: User, **filters: str) -> list[str]:
    response = login(auditor).get("/audit/export.csv", filters)
    content = b"".join(response.streaming_content)  # type: ignore[attr-defined]
    return content.decode().splitlines(keepends=True)


def test_an_export_of_claims_checks_out_and_a_changed_cell_is_named(auditor: User) -> None:
    task = succeeded()
    _running()
    lines = _export(auditor, kind="claimed")

    check = audit_csv.check_export(lines)
    assert (check.ok, check.rows, check.pruned) == (True, 2, 0)

    step, actor = task.steps.get().pk, _actor(task)
    check = _with_actor(lines, f"claimed:{step}:1", "worker:someone-else")
    assert check.problems == [
        f"event claimed:{step}:1: actor differs: the file has 'worker:someone-else', the "
        f"database {actor!r}"
    ]

    # Its task pruned since, its claim is counted as pruned, not faulted.
    Task.objects.filter(pk=task.pk).delete()
    check = audit_csv.check_export(lines)
    assert (check.ok, check.pruned) == (True, 1)
    assert not Event.objects.filter(task_id=task.pk, kind="claimed").exists()


def _with_actor(lines: list[str], row_id: str, actor: str) -> audit_csv.ExportCheck:
    """The check of the export ``lines`` with the actor of row ``row_id`` changed."""
    rows = list(csv.reader(io.StringIO("".join(lines))))
    [row] = [row for row in rows if row[0] == row_id]
    row[3] = actor
    edited = io.StringIO()
    csv.writer(edited).writerows(rows)
    return audit_csv.check_export(edited.getvalue().splitlines(keepends=True))


def _actor(task: Task) -> str:
    return f"worker:{task.steps.get().leases.get().worker_id}"


def test_the_running_claims_are_read_in_the_same_queries_however_many_run(
    django_assert_max_num_queries: Any,
) -> None:
    _running()
    with django_assert_max_num_queries(2) as one:
        assert len(live_claims(AuditFilter(kind="claimed"))) == 1
    for _ in range(4):
        _running()
    with django_assert_max_num_queries(len(one.captured_queries)):
        assert len(live_claims(AuditFilter(kind="claimed"))) == 5


def test_the_enqueues_are_listed_from_the_task_rows_and_filter_as_events_do(
    auditor: User, settings: Any
) -> None:
    settings.CONSOLE_PAGE_SIZE = 2
    first = noop()
    alice = services.enqueue("demo.flaky", {"fail_first": 0}, actor="cli:alice").task
    last = noop()
    client = login(auditor)

    assert [row[0] for row in export_rows(client, kind="enqueued")[1:]] == [
        f"enqueued:{task.pk}" for task in (last, alice, first)
    ]
    page = client.get("/audit/", {"kind": "enqueued"}).context["page"]
    assert [(entry.task_id, entry.actor) for entry in page.rows] == [
        (last.pk, "cli:producer"),
        (alice.pk, "cli:alice"),
    ]
    after = {"kind": "enqueued", "after": str(page.next_after)}
    older = client.get("/audit/", after).context["page"]
    assert ([entry.task_id for entry in older.rows], older.next_after) == ([first.pk], None)

    # The producer's name started in another case, the workflow, the task; a bulk action's
    # plan holds none.
    assert _ids(export_rows(client, kind="enqueued", actor="CLI:AL")) == [f"enqueued:{alice.pk}"]
    assert _ids(export_rows(client, kind="enqueued", workflow="demo.flaky")) == [
        f"enqueued:{alice.pk}"
    ]
    assert _ids(export_rows(client, kind="enqueued", task=str(first.pk))) == [
        f"enqueued:{first.pk}"
    ]
    assert _ids(export_rows(client, kind="enqueued", plan="0" * 32)) == []


def test_an_export_of_enqueues_checks_out_and_a_changed_cell_is_named(auditor: User) -> None:
    task = noop()
    lines = _export(auditor, kind="enqueued")
    assert audit_csv.check_export(lines).ok

    check = _with_actor(lines, f"enqueued:{task.pk}", "cli:mallory")
    assert check.problems == [
        f"event enqueued:{task.pk}: actor differs: the file has 'cli:mallory', the "
        "database 'cli:producer'"
    ]

    Task.objects.filter(pk=task.pk).delete()
    check = audit_csv.check_export(lines)
    assert (check.ok, check.pruned) == (True, 1)
