"""Retention (DESIGN rules 4 and 8): finished tasks past RETENTION_DAYS are pruned with
everything that hangs off them, in bounded batches; dead, waiting, pending and running
work stays however old; operator actions stay until AUDIT_RETENTION_DAYS; every pruned
event is tallied per kind; and a pruned task's idempotency key is free again.

Time moves by back-dating ``finished_at`` and, for the audit retention (events cannot be
updated), by asking for the cutoffs as of a later moment; never by sleeping.
"""

from __future__ import annotations

import logging
import threading
from collections import Counter as Tally
from datetime import timedelta
from io import StringIO
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import transaction
from django.db.models import F

from approvals import services as approvals
from approvals.models import ApprovalRequest
from tasks_app import services
from tasks_app.engine import runner
from tasks_app.models import (
    OPERATOR_EVENT_KINDS,
    Counter,
    Effect,
    Event,
    Lease,
    Step,
    Task,
    TaskStatus,
)
from tasks_app.operations import retention
from tests.approval_support import advance, article, pending_request
from tests.conftest import backdate, only_step, worker_thread
from tests.factories import retrying
from tests.remotes import LoopbackRemote
from tests.settings_support import load_settings

DAYS = 30
AUDIT_DAYS = 365
Remotes = tuple[LoopbackRemote, LoopbackRemote]


@pytest.fixture(autouse=True)
def _retention_settings(settings: Any) -> None:
    settings.RETENTION_DAYS = DAYS
    settings.AUDIT_RETENTION_DAYS = AUDIT_DAYS
    settings.RETENTION_BATCH = 500


# --- helpers ----------------------------------------------------------------------------------


def _succeeded(key: str | None = None) -> Task:
    task = services.enqueue("demo.noop", {}, idempotency_key=key, actor="cli:producer").task
    step = only_step(task)
    backdate(step)
    assert runner.run_claimed(step.pk)
    task.refresh_from_db()
    assert task.status == TaskStatus.SUCCEEDED
    return task


def _succeeded_after_a_retry() -> Task:
    """A task whose history holds an Event row that is not an operator's: its first attempt
    failed (``retry_scheduled``), its second succeeded (its enqueue, claims and success
    are recorded by its rows)."""
    task = retrying(retry_in=timedelta(0))
    assert runner.run_claimed(only_step(task).pk)
    task.refresh_from_db()
    assert task.status == TaskStatus.SUCCEEDED
    return task


def _cancelled(oncall: User) -> Task:
    task = services.enqueue("demo.noop", {}, actor="cli:producer").task
    services.cancel(task, actor=oncall, reason="not needed")
    task.refresh_from_db()
    assert task.status == TaskStatus.CANCELLED
    return task


def _published(editor: User) -> Task:
    """A publish_article task run to the end: an approval request, an effect, leases."""
    task = advance(article(key=f"publish:{Task.objects.count()}"))
    request = pending_request(task)
    approvals.approve(request, actor=editor, draft_hash=request.draft_hash)
    task = advance(task)
    assert task.status == TaskStatus.SUCCEEDED
    return task


def _dead(oncall: User) -> Task:
    """A demo.flaky task that died, was redriven by a person, and died again."""
    task = services.enqueue("demo.flaky", {"fail_first": 9}, actor="cli:producer").task
    step = only_step(task)
    for round_ in range(2):
        for _ in range(3):
            backdate(step)
            assert runner.run_claimed(step.pk)
        if round_ == 0:
            services.redrive(task, actor=oncall, reason="try again")
    task.refresh_from_db()
    assert task.status == TaskStatus.DEAD
    return task


def _finished_days_ago(task: Task, days: float) -> None:
    """Back-date a task's finish (and, for a task that never finished, give it one)."""
    finished = F("finished_at") if task.finished_at else F("created_at")
    Task.objects.filter(pk=task.pk).update(finished_at=finished - timedelta(days=days))


def _days_later(days: int) -> retention.Cutoffs:
    """The cutoffs as they will be ``days`` from now."""
    return retention.cutoffs(now=services.db_now() + timedelta(days=days))


def _kinds(task_id: int) -> Tally[str]:
    return Tally(Event.objects.filter(task_id=task_id).values_list("kind", flat=True))


def _counters() -> dict[str, int]:
    return dict(
        Counter.objects.filter(name__startswith="events_pruned:").values_list("name", "value")
    )


def _stored(task: Task) -> dict[str, int]:
    """Every row of a task, by table."""
    steps = Step.objects.filter(task=task)
    return {
        "tasks": Task.objects.filter(pk=task.pk).count(),
        "steps": steps.count(),
        "leases": Lease.objects.filter(step__in=steps).count(),
        "effects": Effect.objects.filter(step__in=steps).count(),
        "approval requests": ApprovalRequest.objects.filter(task=task).count(),
        "events": Event.objects.filter(task_id=task.pk).count(),
    }


# --- what goes and what stays -----------------------------------------------------------------


def test_old_finished_tasks_go_with_their_steps_leases_effects_approvals_and_events(
    db: None, editor: User, oncall: User, remotes: Remotes
) -> None:
    published, cancelled, succeeded = _published(editor), _cancelled(oncall), _succeeded()
    before = {task.pk: _stored(task) for task in (published, cancelled, succeeded)}
    assert before[published.pk]["approval requests"] == 1
    for task in (published, cancelled, succeeded):
        _finished_days_ago(task, DAYS + 1)

    report = retention.prune(retention.cutoffs())

    assert report.tasks == {"succeeded": 2, "cancelled": 1}
    for table, label in [
        ("steps", "tasks_app.Step"),
        ("leases", "tasks_app.Lease"),
        ("effects", "tasks_app.Effect"),
        ("approval requests", "approvals.ApprovalRequest"),
    ]:
        assert report.rows[label] == sum(rows[table] for rows in before.values()) > 0
    for task in (published, cancelled, succeeded):
        stored = _stored(task)
        assert {table: n for table, n in stored.items() if table != "events"} == {
            "tasks": 0,
            "steps": 0,
            "leases": 0,
            "effects": 0,
            "approval requests": 0,
        }
    # Only the operator actions are left: the approval and the cancel.
    assert _kinds(published.pk) == {"approved": 1}
    assert _kinds(cancelled.pk) == {"cancelled": 1}
    assert _kinds(succeeded.pk) == {}
    assert report.kept_for_audit == 2


def test_recently_finished_tasks_stay(db: None, oncall: User) -> None:
    old, recent = _succeeded(), _succeeded()
    recent_cancel = _cancelled(oncall)
    _finished_days_ago(old, DAYS + 0.01)
    _finished_days_ago(recent, DAYS - 0.01)
    _finished_days_ago(recent_cancel, DAYS - 0.01)
    kept = {task.pk: _stored(task) for task in (recent, recent_cancel)}

    report = retention.prune(retention.cutoffs())

    assert report.tasks == {"succeeded": 1}
    assert not Task.objects.filter(pk=old.pk).exists()
    assert {task.pk: _stored(task) for task in (recent, recent_cancel)} == kept


def test_dead_waiting_pending_and_running_tasks_stay_however_old(
    db: None, oncall: User, remotes: Remotes
) -> None:
    dead = _dead(oncall)
    waiting = advance(article())
    assert waiting.status == TaskStatus.WAITING_APPROVAL
    pending = services.enqueue("demo.noop", {"n": 1}).task
    running = services.enqueue("demo.noop", {"n": 2}).task
    backdate(only_step(running))
    assert services.claim_step(only_step(running).pk, worker_id="w1") is not None
    running.refresh_from_db()
    assert running.live_status == TaskStatus.RUNNING
    unfinished = (dead, waiting, pending, running)
    for task in unfinished:
        # Even with a finish time from long ago: the status decides.
        _finished_days_ago(task, 3 * AUDIT_DAYS)
    before = {task.pk: _stored(task) for task in unfinished}
    assert _kinds(dead.pk)["redriven"] == 1

    # Long after both retentions: the dead task's redrive stays with its task too.
    report = retention.prune(_days_later(3 * AUDIT_DAYS))

    assert report.task_count == 0
    assert sum(report.audit_events.values()) == 0
    assert {task.pk: _stored(task) for task in unfinished} == before


def test_operator_events_outlive_their_task_until_the_audit_retention(
    db: None, oncall: User
) -> None:
    cancelled = _cancelled(oncall)
    services.pause_queue("default", actor=oncall, reason="incident")
    services.resume_queue("default", actor=oncall, reason="over")
    switches = list(
        Event.objects.filter(task_id=None).values_list("kind", flat=True).order_by("id")
    )
    assert switches == ["queue_paused", "queue_resumed"]

    report = retention.prune(_days_later(DAYS + 1))

    assert report.tasks == {"cancelled": 1}
    assert report.events == {}  # its enqueue is its row, gone with it
    assert (report.kept_for_audit, report.audit_events) == (1, {})
    assert _kinds(cancelled.pk) == {"cancelled": 1}
    assert Event.objects.filter(task_id=None).count() == 2

    # A day short of the audit retention nothing more goes; past it the rest goes.
    assert retention.prune(_days_later(AUDIT_DAYS - 1)).audit_events == {}
    assert Event.objects.filter(kind__in=OPERATOR_EVENT_KINDS).count() == 3

    report = retention.prune(_days_later(AUDIT_DAYS + 1))

    assert report.audit_events == {"cancelled": 1, "queue_paused": 1, "queue_resumed": 1}
    assert not Event.objects.exists()


def test_operator_events_past_the_audit_retention_go_with_their_task(
    db: None, oncall: User
) -> None:
    cancelled = _cancelled(oncall)

    report = retention.prune(_days_later(AUDIT_DAYS + 1))

    assert report.events == {"cancelled": 1}
    assert (report.kept_for_audit, report.audit_events) == (0, {})
    assert _kinds(cancelled.pk) == {}


# --- batches ----------------------------------------------------------------------------------


def test_a_sweep_prunes_one_batch_and_a_backlog_drains_over_several_sweeps(
    db: None, settings: Any
) -> None:
    settings.RETENTION_BATCH = 2
    tasks = [_succeeded() for _ in range(5)]
    for task in tasks:
        _finished_days_ago(task, DAYS + 1)
    remaining = []

    for _ in range(4):
        assert services.sweep().jobs["pruned"] <= 2
        remaining.append(Task.objects.count())

    assert remaining == [3, 1, 0, 0]


def test_a_batch_prunes_the_oldest_first_and_skips_tasks_locked_elsewhere(
    transactional_db: None,
) -> None:
    tasks = [_succeeded() for _ in range(3)]
    for age, task in zip((3, 2, 1), tasks, strict=True):
        _finished_days_ago(task, DAYS + age)
    oldest, middle, newest = tasks
    locked, release = threading.Event(), threading.Event()

    def hold_lock() -> None:
        with transaction.atomic():
            Task.objects.select_for_update().get(pk=oldest.pk)
            locked.set()
            release.wait(10)

    errors: list[BaseException] = []
    holder = worker_thread(hold_lock, errors)
    holder.start()
    try:
        assert locked.wait(10)
        # Does not wait for the lock: it takes the next oldest instead.
        report = retention.prune_task_batch(retention.cutoffs(), size=1)
        assert report.task_count == 1
        assert not Task.objects.filter(pk=middle.pk).exists()
        assert Task.objects.filter(pk__in=[oldest.pk, newest.pk]).count() == 2
    finally:
        release.set()
        holder.join(10)
    assert not errors

    assert retention.prune_task_batch(retention.cutoffs(), size=5).task_count == 2
    assert not Task.objects.exists()


def test_an_idle_sweep_prunes_nothing_and_logs_nothing_at_info(
    db: None, caplog: pytest.LogCaptureFixture
) -> None:
    _finished_days_ago(_succeeded(), DAYS - 1)

    with caplog.at_level(logging.INFO, logger="tasks_app"):
        report = services.sweep()

    assert (report.jobs["pruned"], report.jobs["pruned_audit_events"]) == (0, 0)
    assert [r for r in caplog.records if r.name == "tasks_app.operations.retention"] == []
    assert Task.objects.count() == 1


def test_a_sweep_that_prunes_says_so_in_one_line(
    db: None, caplog: pytest.LogCaptureFixture
) -> None:
    _finished_days_ago(_succeeded_after_a_retry(), DAYS + 1)

    with caplog.at_level(logging.INFO, logger="tasks_app"):
        assert services.sweep().jobs["pruned"] == 1

    lines = [r.getMessage() for r in caplog.records if r.name == "tasks_app.operations.retention"]
    # Its retry is an event; its enqueue, claims and success are its rows.
    assert lines == ["pruned 1 finished task(s) and 1 event(s); 0 operator event(s) kept for audit"]


def test_the_sweep_prunes_operator_events_past_the_audit_retention(
    db: None, oncall: User, settings: Any
) -> None:
    services.pause_queue("default", actor=oncall, reason="incident")
    assert services.sweep().jobs["pruned_audit_events"] == 0

    # An audit retention of zero days (the setting's minimum is one): due at once.
    settings.RETENTION_DAYS = settings.AUDIT_RETENTION_DAYS = 0

    assert services.sweep().jobs["pruned_audit_events"] == 1
    assert not Event.objects.exists()


# --- the tally of pruned events ---------------------------------------------------------------


def test_pruned_events_are_added_to_their_kinds_counters(db: None, oncall: User) -> None:
    Counter.objects.create(name="events_pruned:enqueued", value=5)
    tasks = [_succeeded_after_a_retry(), _succeeded(), _cancelled(oncall)]
    for task in tasks:
        _finished_days_ago(task, DAYS + 1)
    every_kind = Tally(Event.objects.values_list("kind", flat=True))

    retention.prune(_days_later(AUDIT_DAYS + 1))

    assert not Event.objects.exists()
    assert _counters() == {
        # Enqueues, claims and successes are their tasks' and attempts' rows, not events:
        # none is counted; the tally written before stays.
        "events_pruned:enqueued": 5,
        "events_pruned:retry_scheduled": 1,
        "events_pruned:cancelled": 1,
    }
    # Stored events plus the tally never go down.
    assert every_kind + Tally({"enqueued": 5}) == Tally(
        {name.split(":", 1)[1]: value for name, value in _counters().items()}
    )


def test_every_deletion_of_events_is_tallied(db: None) -> None:
    task = retrying()
    ids = list(Event.objects.for_task(task.pk).values_list("pk", flat=True))
    Task.objects.filter(pk=task.pk).delete()

    assert retention.delete_events(ids) == 1
    assert retention.delete_events(ids) == 0  # gone already: not counted twice

    assert _counters() == {"events_pruned:retry_scheduled": 1}


# --- the freed key ----------------------------------------------------------------------------


def test_a_pruned_tasks_idempotency_key_is_free_again(db: None) -> None:
    first = _succeeded(key="report:2030-01")
    again = services.enqueue("demo.noop", {}, idempotency_key="report:2030-01")
    assert (again.created, again.task.pk) == (False, first.pk)
    _finished_days_ago(first, DAYS + 1)

    retention.prune(retention.cutoffs())

    fresh = services.enqueue("demo.noop", {}, idempotency_key="report:2030-01")
    assert fresh.created
    assert fresh.task.pk != first.pk
    assert services.get_task(idempotency_key="report:2030-01") == fresh.task


# --- the dry run and the command --------------------------------------------------------------


def test_a_dry_run_counts_exactly_what_the_prune_then_removes(
    db: None, editor: User, oncall: User, remotes: Remotes
) -> None:
    published, cancelled, succeeded = _published(editor), _cancelled(oncall), _succeeded()
    recent = _succeeded()
    services.pause_queue("default", actor=oncall, reason="incident")
    # A year on, the three are past both retentions (their operator events go with them),
    # and so is the queue switch; the recent one finishes just inside the retention then.
    later = _days_later(AUDIT_DAYS + 1)
    Task.objects.filter(pk=recent.pk).update(finished_at=later.finished_before + timedelta(hours=1))
    expected_events = _kinds(published.pk) + _kinds(cancelled.pk) + _kinds(succeeded.pk)
    before = {t.pk: _stored(t) for t in (published, cancelled, succeeded, recent)}

    preview = retention.preview(later)

    assert {t.pk: _stored(t) for t in (published, cancelled, succeeded, recent)} == before
    assert Event.objects.filter(task_id=None).count() == 1
    assert _counters() == {}
    assert preview.tasks == {"succeeded": 2, "cancelled": 1}
    assert preview.rows == {"tasks_app.Step": 4 + 1 + 1}
    assert preview.events == expected_events
    assert preview.kept_for_audit == 0
    assert preview.audit_events == {"queue_paused": 1}

    report = retention.prune(later, size=2)

    assert (report.tasks, report.events) == (preview.tasks, preview.events)
    assert report.rows["tasks_app.Step"] == preview.rows["tasks_app.Step"]
    assert (report.kept_for_audit, report.audit_events) == (0, preview.audit_events)
    assert Task.objects.get() == recent


def _command(*args: str) -> str:
    out = StringIO()
    call_command("prune_history", *args, stdout=out)
    return out.getvalue()


def test_prune_history_dry_run_prints_the_counts_and_deletes_nothing(
    db: None, oncall: User
) -> None:
    for task in (_succeeded_after_a_retry(), _succeeded(), _cancelled(oncall)):
        _finished_days_ago(task, DAYS + 1)
    _succeeded()
    events = Event.objects.count()

    output = _command("--dry-run")

    lines = output.splitlines()
    assert lines[0].startswith("would prune (dry run, nothing changed): 3 task(s) finished")
    assert lines[0].endswith("(cancelled 1, succeeded 2)")
    assert lines[1:4] == [
        "  with them: steps 3",
        "  their events: 1 (retry_scheduled 1)",
        "  their operator events kept for audit: 1",
    ]
    assert lines[4].endswith("their task gone: 0 (-)")
    assert (Task.objects.count(), Event.objects.count()) == (4, events)


def test_prune_history_prunes_everything_due_in_batches(db: None, settings: Any) -> None:
    settings.RETENTION_BATCH = 2
    for task in [_succeeded() for _ in range(5)]:
        _finished_days_ago(task, 10)
    kept = _succeeded()

    output = _command("--days", "7")

    assert output.splitlines()[0].startswith("pruned: 5 task(s) finished before")
    assert "  with them: leases 5, steps 5" in output
    assert Task.objects.get() == kept


def test_prune_history_refuses_an_audit_retention_shorter_than_the_retention(db: None) -> None:
    _finished_days_ago(_succeeded(), 10)

    with pytest.raises(CommandError, match="audit_days: must not be shorter than days"):
        _command("--days", "7", "--audit-days", "5")

    assert Task.objects.count() == 1


def test_settings_refuse_an_audit_retention_shorter_than_the_retention() -> None:
    result = load_settings(RETENTION_DAYS="30", AUDIT_RETENTION_DAYS="7")

    assert result.returncode != 0
    assert "AUDIT_RETENTION_DAYS (7) must not be shorter than RETENTION_DAYS (30)" in (
        result.stderr
    )
    assert load_settings(RETENTION_DAYS="30", AUDIT_RETENTION_DAYS="30").returncode == 0
