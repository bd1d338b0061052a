"""The tamper-evident audit history (docs/audit.md): every operator event is hash-chained
over the one before, ``manage.py verify_audit`` names the first broken link, retention
seals the chain with a checkpoint before it deletes chained events, TRUNCATE of the
history is refused, and an exported CSV is checked against the database."""

from __future__ import annotations

import csv
import functools
import io
import itertools
import json
import re
import threading
from datetime import UTC, datetime, timedelta
from io import StringIO
from pathlib import Path
from typing import Any

import psycopg.errors
import pytest
from django.contrib.auth.models import User
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import DatabaseError, connection, transaction

from tasks_app import services
from tasks_app.engine import fastpath
from tasks_app.history import audit_chain, audit_verify, timeline
from tasks_app.history.audit_chain import Link
from tasks_app.models import (
    OPERATOR_EVENT_KINDS,
    AppendOnlyError,
    AuditCheckpoint,
    Event,
    EventKind,
)
from tasks_app.operations import retention
from tests.conftest import worker_thread
from tests.console_support import login
from tests.factories import dead_task, noop

EVENTS = Event._meta.db_table
CHECKPOINTS = AuditCheckpoint._meta.db_table
AUDIT_DAYS = 365

postgresql_only = pytest.mark.skipif(
    "connection.vendor != 'postgresql'", reason="the triggers are PostgreSQL's"
)


@pytest.fixture(autouse=True)
def _retention_settings(settings: Any) -> None:
    settings.RETENTION_DAYS = 30
    settings.AUDIT_RETENTION_DAYS = AUDIT_DAYS


def chained() -> list[Event]:
    return list(Event.objects.filter(chain_hash__isnull=False).order_by("id"))


def verify_audit(*args: str) -> str:
    """``manage.py verify_audit``'s output; a break raises ``CommandError``."""
    out = StringIO()
    call_command("verify_audit", *args, stdout=out)
    return out.getvalue()


def broken(*args: str) -> str:
    """The error ``manage.py verify_audit`` ends with, checking its exit status."""
    with pytest.raises(CommandError) as excinfo:
        verify_audit(*args)
    assert excinfo.value.returncode == 1
    return str(excinfo.value)


def three_operator_actions(oncall: User) -> list[Event]:
    """A redrive, a pause and a cancel: three chained events, in this order."""
    task = dead_task()
    services.redrive(task, actor=oncall, reason="remote fixed")
    services.pause_queue("default", actor=oncall, reason="incident 7")
    services.cancel(noop(), actor=oncall, reason="not needed")
    events = chained()
    assert [e.kind for e in events] == ["redriven", "queue_paused", "cancelled"]
    return events


def raw(sql: str, params: list[Any] | None = None) -> None:
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(sql, params or [])


# --- the chain ------------------------------------------------------------------------------


def test_operator_events_form_one_chain_and_worker_events_stay_out_of_it(
    db: None, oncall: User
) -> None:
    first, second, third = three_operator_actions(oncall)

    assert first.chain_previous == audit_chain.GENESIS
    assert second.chain_previous == first.chain_hash
    assert third.chain_previous == second.chain_hash
    assert all(audit_chain.event_hash(e) == e.chain_hash for e in (first, second, third))
    assert not Event.objects.exclude(kind__in=OPERATOR_EVENT_KINDS).filter(chain_hash__isnull=False)
    assert audit_chain.head() == Link(third.pk, str(third.chain_hash))
    assert f"head: event {third.pk} {third.chain_hash}" in verify_audit()


def test_the_canonical_form_is_sorted_compact_json_with_utc_time_and_whole_numbers(
    db: None,
) -> None:
    event = Event(
        pk=7,
        task_id=3,
        kind=EventKind.RESOLVED,
        actor="olivia",
        actor_user_id=2,
        reason="ça marche",
        data={"outcome": "done", "n": 1.0, "big": 1e16, "half": 0.5},
        created_at=datetime(2026, 12, 1, 16, 46, tzinfo=UTC) + timedelta(microseconds=5),
        chain_previous="ab" * 32,
    )

    assert audit_chain.canonical(event).decode() == (
        '{"actor":"olivia","actor_user_id":2,"created_at":"2026-12-01T16:46:00.000005+00:00",'
        '"data":{"big":10000000000000000,"half":0.5,"n":1,"outcome":"done"},"id":7,'
        '"kind":"resolved","previous":"' + "ab" * 32 + '","reason":"ça marche",'
        '"step_id":null,"task_id":3}'
    )


def test_a_chained_event_reads_back_to_the_hash_it_was_written_with(db: None, oncall: User) -> None:
    """What PostgreSQL's jsonb gives back (whole floats as integers, keys reordered) hashes
    as what was written."""
    task = dead_task({"error": "permanent", "fail_first": 1, "ratio": 2.0, "z": {"b": 1, "a": 2}})
    services.redrive(
        task, actor=oncall, reason="fixed", payload={"fail_first": 0, "ratio": 1e15, "y": 0.25}
    )
    stored = Event.objects.get(task_id=task.pk, kind="redriven")
    assert audit_chain.event_hash(stored) == stored.chain_hash


def test_the_batch_completion_chains_the_cancel_it_settles(db: None) -> None:
    """The SQL fast path writes the `cancelled` of a task cancelled while its step ran
    through the chain, as complete_step does."""
    task = noop()
    [claim] = fastpath.claim_batch(worker_id="w1", limit=1, queue="default")
    services.cancel(task, actor="cli:alice", reason="withdrawn")

    assert fastpath.complete_many([(claim, {})]) == {claim.step_id}

    kinds = [(entry.kind, entry.chain_hash) for entry in timeline.history(task.pk)]
    assert [kind for kind, _ in kinds][-3:] == ["cancel_requested", "succeeded", "cancelled"]
    assert kinds[-1][1] is not None and kinds[-2][1] is None
    assert audit_verify.verify().ok


# --- verify_audit names the first broken link ----------------------------------------------------


@postgresql_only
def test_an_event_edited_with_the_triggers_disabled_is_named_as_the_first_broken_link(
    db: None, oncall: User
) -> None:
    _first, second, _third = three_operator_actions(oncall)
    raw(f"ALTER TABLE {EVENTS} DISABLE TRIGGER tasks_app_event_append_only")
    raw(f"UPDATE {EVENTS} SET reason = 'routine maintenance' WHERE id = %s", [second.pk])
    raw(f"ALTER TABLE {EVENTS} ENABLE TRIGGER tasks_app_event_append_only")

    error = broken()

    assert f"audit chain broken at event {second.pk}: hash mismatch (the row was edited)" in error


@postgresql_only
def test_an_edited_event_given_a_new_hash_breaks_the_next_link(db: None, oncall: User) -> None:
    _first, second, third = three_operator_actions(oncall)
    second.reason = "routine maintenance"
    rehashed = audit_chain.event_hash(second)
    raw(f"ALTER TABLE {EVENTS} DISABLE TRIGGER tasks_app_event_append_only")
    raw(
        f"UPDATE {EVENTS} SET reason = %s, chain_hash = %s WHERE id = %s",
        [second.reason, rehashed, second.pk],
    )
    raw(f"ALTER TABLE {EVENTS} ENABLE TRIGGER tasks_app_event_append_only")

    error = broken()

    assert f"event {third.pk}: previous-hash mismatch (a row deleted or inserted" in error
    assert f"ends at event {second.pk}" in error


@postgresql_only
def test_an_event_deleted_from_the_middle_is_found_at_the_link_after_it(
    db: None, oncall: User
) -> None:
    first, second, third = three_operator_actions(oncall)
    # Deleted by the tables' owner, who alone can set the trigger aside.
    raw(f"ALTER TABLE {EVENTS} DISABLE TRIGGER tasks_app_event_append_only")
    raw(f"DELETE FROM {EVENTS} WHERE id = %s", [second.pk])
    raw(f"ALTER TABLE {EVENTS} ENABLE TRIGGER tasks_app_event_append_only")

    error = broken()

    assert f"event {third.pk}: previous-hash mismatch (a row deleted or inserted" in error
    assert f"the chain before it ends at event {first.pk}" in error


@postgresql_only
@pytest.mark.no_fold_check
def test_deleting_the_newest_events_is_found_against_an_exported_head(
    db: None, oncall: User
) -> None:
    _first, second, third = three_operator_actions(oncall)
    exported = f"{third.pk}:{third.chain_hash}"
    assert f"head: event {third.pk} {third.chain_hash}" in verify_audit()
    assert "ok: the chain holds the exported head" in verify_audit("--head", exported)
    # The newest event deleted by the tables' owner: what remains still links up.
    raw(f"ALTER TABLE {EVENTS} DISABLE TRIGGER tasks_app_event_append_only")
    raw(f"DELETE FROM {EVENTS} WHERE id = %s", [third.pk])
    raw(f"ALTER TABLE {EVENTS} ENABLE TRIGGER tasks_app_event_append_only")
    assert f"head: event {second.pk}" in verify_audit()

    error = broken("--head", exported)

    assert f"no longer holds the head event {third.pk} {third.chain_hash}" in error
    assert f"(now event {second.pk} {second.chain_hash})" in error


def test_an_exported_head_that_retention_pruned_since_still_holds(db: None, oncall: User) -> None:
    services.pause_queue("default", actor=oncall, reason="incident")
    services.resume_queue("default", actor=oncall, reason="over")
    newest = chained()[-1]
    retention.prune(_days_later(AUDIT_DAYS + 1))
    assert not chained()

    assert "ok: the chain holds the exported head" in verify_audit(
        "--head", f"event {newest.pk} {newest.chain_hash}"
    )


def test_a_head_that_is_not_id_and_hash_is_refused(db: None) -> None:
    with pytest.raises(CommandError) as excinfo:
        verify_audit("--head", "12:not-a-hash")

    assert excinfo.value.returncode == 2
    assert "head: '12:not-a-hash' is not ID:HASH" in str(excinfo.value)


def test_an_operator_event_written_around_the_chain_is_found(db: None, oncall: User) -> None:
    _first, _, _ = three_operator_actions(oncall)
    forged = Event.objects.create(kind=EventKind.QUEUE_RESUMED, actor="mallory", reason="x")

    error = broken()

    assert "audit chain intact" in error
    assert f"1 operator event(s) are outside it, the first event {forged.pk}: no hash" in error
    assert "queue_resumed by mallory" in error


def test_an_inserted_event_with_a_forged_link_is_found_at_the_next_one(
    db: None, oncall: User
) -> None:
    first, _second, _ = three_operator_actions(oncall)
    forged = Event(
        kind=EventKind.QUEUE_RESUMED, actor="mallory", reason="x", chain_previous=first.chain_hash
    )
    forged.pk = first.pk + 100_000  # after every event, linking to the first
    forged.created_at = datetime.now(UTC)
    forged.chain_hash = audit_chain.event_hash(forged)
    forged.save()

    error = broken()

    assert f"event {forged.pk}: previous-hash mismatch" in error
    assert f"it links to event {first.pk}" in error


def test_an_empty_history_verifies_with_no_head(db: None) -> None:
    assert "ok: audit chain verified, 0 event(s) from its beginning; head: none" in verify_audit()


# --- retention and checkpoints -------------------------------------------------------------------


def _days_later(days: int) -> retention.Cutoffs:
    return retention.cutoffs(now=services.db_now() + timedelta(days=days))


def test_retention_seals_the_chain_with_a_checkpoint_and_it_still_verifies(
    db: None, oncall: User
) -> None:
    cancelled = noop()
    services.cancel(cancelled, actor=oncall, reason="not needed")
    # Redriven, the task is pending again: retention keeps it, and its event.
    kept = dead_task()
    services.redrive(kept, actor=oncall, reason="try again")
    services.pause_queue("default", actor=oncall, reason="incident")
    services.resume_queue("default", actor=oncall, reason="over")
    before = chained()

    report = retention.prune(_days_later(AUDIT_DAYS + 1))

    # The cancelled task's event went with it, then the queue switches; one checkpoint
    # each time, the latest sealing the chain at its newest event and keeping the redrive.
    assert report.events["cancelled"] == 1
    assert report.audit_events == {"queue_paused": 1, "queue_resumed": 1}
    assert AuditCheckpoint.objects.count() == 2
    checkpoint = audit_chain.latest_checkpoint()
    assert checkpoint is not None
    assert (checkpoint.last_event_id, checkpoint.last_hash) == (
        before[-1].pk,
        before[-1].chain_hash,
    )
    [redriven] = [e for e in before if e.task_id == kept.pk]
    assert checkpoint.kept == [[redriven.pk, redriven.chain_hash]]
    assert sum(AuditCheckpoint.objects.values_list("pruned_count", flat=True)) == 3
    assert chained() == [redriven]
    out = verify_audit()
    assert f"from the checkpoint at event {checkpoint.last_event_id}" in out

    # The next operator action links to the sealed head, and the chain still verifies.
    services.pause_queue("default", actor=oncall, reason="again")
    newest = chained()[-1]
    assert newest.chain_previous == checkpoint.last_hash
    assert f"head: event {newest.pk} {newest.chain_hash}" in verify_audit()


@postgresql_only
@pytest.mark.no_fold_check
def test_a_kept_event_deleted_behind_the_checkpoint_is_found(db: None, oncall: User) -> None:
    kept = dead_task()
    services.redrive(kept, actor=oncall, reason="try again")
    services.pause_queue("default", actor=oncall, reason="incident")
    retention.prune(_days_later(AUDIT_DAYS + 1))
    [[kept_id, _]] = AuditCheckpoint.objects.get().kept
    raw(f"ALTER TABLE {EVENTS} DISABLE TRIGGER tasks_app_event_append_only")
    raw(f"DELETE FROM {EVENTS} WHERE id = %s", [kept_id])
    raw(f"ALTER TABLE {EVENTS} ENABLE TRIGGER tasks_app_event_append_only")

    assert f"event {kept_id}: missing (deleted)" in broken()


def test_retention_keeps_the_chained_events_of_a_broken_chain(
    db: None, oncall: User, caplog: pytest.LogCaptureFixture
) -> None:
    services.pause_queue("default", actor=oncall, reason="incident")
    forged = Event(kind=EventKind.QUEUE_RESUMED, actor="mallory", chain_previous="0" * 64)
    forged.chain_hash = audit_chain.event_hash(forged)
    forged.save()
    services.resume_queue("default", actor=oncall, reason="over")

    report = retention.prune(_days_later(AUDIT_DAYS + 1))

    # No checkpoint vouches for the break: the chained events stay.
    assert report.audit_events == {}
    assert not AuditCheckpoint.objects.exists()
    assert len(chained()) == 3
    assert f"the audit chain is broken at event {forged.pk}: " in caplog.text


def test_retention_prunes_an_event_outside_the_chain_and_seals_the_rest(
    db: None, oncall: User
) -> None:
    """An operator event without a hash breaks no link (a process of the version before
    the chain wrote it during the rolling deploy): retention seals and prunes as usual."""
    services.pause_queue("default", actor=oncall, reason="incident")
    Event.objects.create(kind=EventKind.QUEUE_PAUSED, actor="old-release", reason="x")
    services.resume_queue("default", actor=oncall, reason="over")

    report = retention.prune(_days_later(AUDIT_DAYS + 1))

    assert report.audit_events == {"queue_paused": 2, "queue_resumed": 1}
    assert AuditCheckpoint.objects.get().pruned_count == 2
    assert "ok: audit chain verified" in verify_audit()


def test_checkpoints_are_append_only(db: None) -> None:
    checkpoint = AuditCheckpoint.objects.create(last_event_id=1, last_hash="a" * 64, pruned_count=1)
    with pytest.raises(AppendOnlyError):
        checkpoint.save()
    with pytest.raises(AppendOnlyError):
        AuditCheckpoint.objects.all().delete()
    with pytest.raises(AppendOnlyError):
        AuditCheckpoint.objects.update(pruned_count=2)


# --- TRUNCATE, UPDATE and DELETE refused ---------------------------------------------------------


@postgresql_only
@pytest.mark.parametrize("table", [EVENTS, CHECKPOINTS])
def test_postgresql_refuses_to_truncate_the_history(db: None, oncall: User, table: str) -> None:
    three_operator_actions(oncall)
    # The test database allows it for its flushes (tests/conftest.py); production sets
    # nothing. Withdrawn here inside the test's transaction, which rolls it back; the
    # session's own setting, still on, counts for nothing.
    with pytest.raises(DatabaseError) as excinfo, transaction.atomic(), connection.cursor() as c:
        c.execute(
            f"ALTER DATABASE {connection.settings_dict['NAME']} RESET tasks_app.allow_truncate"
        )
        c.execute("SET LOCAL tasks_app.allow_truncate = 'on'")
        c.execute(f"TRUNCATE {table}")

    assert isinstance(excinfo.value.__cause__, psycopg.errors.InsufficientPrivilege)
    assert f"{table} is append-only: TRUNCATE refused" in str(excinfo.value)
    assert len(chained()) == 3


@postgresql_only
@pytest.mark.parametrize("statement", ["UPDATE {t} SET pruned_count = 0", "DELETE FROM {t}"])
def test_postgresql_refuses_to_change_a_checkpoint(db: None, statement: str) -> None:
    AuditCheckpoint.objects.create(last_event_id=1, last_hash="a" * 64, pruned_count=1)
    with pytest.raises(DatabaseError) as excinfo, transaction.atomic(), connection.cursor() as c:
        c.execute("SET LOCAL tasks_app.operations.retention = 'on'")
        c.execute(statement.format(t=CHECKPOINTS))

    assert "tasks_app_auditcheckpoint is append-only" in str(excinfo.value)
    assert AuditCheckpoint.objects.get().pruned_count == 1


# --- the export and its check ------------------------------------------------------------------


def export(auditor: User, tmp_path: Path, **filters: str) -> Path:
    response = login(auditor).get("/audit/export.csv", filters)
    assert response.status_code == 200
    path = tmp_path / "audit-log.csv"
    path.write_bytes(b"".join(response.streaming_content))  # type: ignore[attr-defined]
    return path


def rewrite(path: Path, change: Any) -> None:
    rows = list(csv.reader(io.StringIO(path.read_text(encoding="utf-8"), newline="")))
    change(rows)
    out = io.StringIO()
    csv.writer(out).writerows(rows)
    path.write_text(out.getvalue(), encoding="utf-8")


def test_the_export_ends_with_the_chain_head_and_carries_each_link(
    db: None, oncall: User, auditor: User, tmp_path: Path
) -> None:
    *_, last = three_operator_actions(oncall)
    rows = list(csv.reader(io.StringIO(export(auditor, tmp_path).read_text(), newline="")))

    header, *events, head = rows
    assert header[-4:] == ["label", "workflow", "bulk_plan_id", "chain_hash"]
    assert head == [f"# chain head: event {last.pk} {last.chain_hash}"] + [""] * 11
    by_id = {int(row[0]): row for row in events}
    assert by_id[last.pk][header.index("chain_hash")] == last.chain_hash
    assert by_id[last.pk][header.index("label")] == "Cancelled"
    assert all(len(row) == len(header) for row in rows)


def test_the_export_check_passes_for_an_untouched_export_and_fails_for_an_edited_one(
    db: None, oncall: User, auditor: User, tmp_path: Path
) -> None:
    _first, second, _third = three_operator_actions(oncall)
    path = export(auditor, tmp_path)

    assert f"ok: export {path} matches the database" in verify_audit("--export", str(path))

    def edit_reason(rows: list[list[str]]) -> None:
        [row] = [row for row in rows if row[0] == str(second.pk)]
        row[6] = "routine maintenance"

    rewrite(path, edit_reason)
    error = broken("--export", str(path))
    assert "differs from the database in 1 place(s)" in error


def test_the_export_check_names_an_edited_row_and_a_head_not_in_the_chain(
    db: None, oncall: User, auditor: User, tmp_path: Path
) -> None:
    first, _second, third = three_operator_actions(oncall)
    path = export(auditor, tmp_path, actor=oncall.username)

    def edit(rows: list[list[str]]) -> None:
        [row] = [row for row in rows if row[0] == str(first.pk)]
        row[3] = "someone-else"
        rows[-1][0] = f"# chain head: event {third.pk} {'0' * 64}"

    rewrite(path, edit)
    out = StringIO()
    with pytest.raises(CommandError):
        call_command("verify_audit", "--export", str(path), stdout=out)

    assert f"event {first.pk}: actor differs: the file has 'someone-else'" in out.getvalue()
    assert f"chain head: event {third.pk} holds {third.chain_hash}" in out.getvalue()


def test_the_export_check_accepts_rows_pruned_since_under_a_checkpoint(
    db: None, oncall: User, auditor: User, tmp_path: Path
) -> None:
    first, _second, third = three_operator_actions(oncall)
    path = export(auditor, tmp_path)
    retention.prune(_days_later(AUDIT_DAYS + 1))
    assert chained() == [first]  # its task, redriven, is pending again

    out = verify_audit("--export", str(path))

    assert "ok: export" in out
    pruned = len(list(csv.reader(io.StringIO(path.read_text())))) - 2 - Event.objects.count()
    assert f"{pruned} pruned since; chain head: event {third.pk}" in out


def test_a_file_cut_short_fails_the_check(
    db: None, oncall: User, auditor: User, tmp_path: Path
) -> None:
    three_operator_actions(oncall)
    path = export(auditor, tmp_path)
    rewrite(path, lambda rows: rows.pop())

    assert "differs from the database" in broken("--export", str(path))


def test_a_missing_export_file_is_bad_input(db: None) -> None:
    with pytest.raises(CommandError) as excinfo:
        verify_audit("--export", "/nonexistent/audit.csv")
    assert excinfo.value.returncode == 2


# --- concurrency ---------------------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_concurrent_operator_actions_form_one_unbroken_chain() -> None:
    """Threads on their own connections cancel tasks and switch queues at once: the
    advisory lock makes them one chain, whose ids follow its order."""
    per_thread, threads = 6, 6
    tasks = [noop() for _ in range(per_thread * threads)]
    errors: list[BaseException] = []
    start = threading.Barrier(threads)

    def act(n: int) -> None:
        start.wait()
        for task in tasks[n * per_thread : (n + 1) * per_thread]:
            services.cancel(task, actor=f"cli:operator-{n}", reason=f"batch {n}")
            if n % 2:
                services.pause_queue("default", actor=f"cli:operator-{n}", reason="drill")
                services.resume_queue("default", actor=f"cli:operator-{n}", reason="drill")

    workers = [worker_thread(functools.partial(act, n), errors) for n in range(threads)]
    for thread in workers:
        thread.start()
    for thread in workers:
        thread.join(timeout=120)

    assert not errors
    events = chained()
    # Every cancel, and the queue switches that changed something (a thread finding the
    # queue already paused by another writes nothing).
    assert len(events) >= per_thread * threads + 2
    assert len({e.chain_previous for e in events}) == len(events)  # no fork
    for before, after in itertools.pairwise(events):
        assert after.chain_previous == before.chain_hash
    verdict = audit_verify.verify()
    assert verdict.ok and verdict.checked == len(events)


def test_the_chain_head_is_shown_on_the_audit_page(db: None, oncall: User, auditor: User) -> None:
    *_, last = three_operator_actions(oncall)
    page = login(auditor).get("/audit/").content.decode()
    assert f"Audit chain head: event {last.pk}" in page
    assert f'title="{last.chain_hash}"' in page


def test_events_of_kinds_outside_the_chain_keep_no_hash(db: None) -> None:
    task = dead_task()
    assert Event.objects.get(task_id=task.pk, kind="dead_lettered").chain_hash is None
    assert json.loads(json.dumps(audit_chain.CHAINED_KINDS)) == sorted(OPERATOR_EVENT_KINDS)


def test_the_actor_prefix_index_holds_the_operator_kinds_the_model_names(db: None) -> None:
    """``event_audit_actor_prefix_idx`` is raw SQL of the migrations (0016, rebuilt by 0018),
    not declared on the model: its kind list is the twin of ``OPERATOR_EVENT_KINDS``, and an
    operator kind missing from it would send the audit log's actor filter past the index."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT indexdef FROM pg_indexes WHERE indexname = 'event_audit_actor_prefix_idx'"
        )
        [(definition,)] = cursor.fetchall()
    assert set(re.findall(r"'([a-z_]+)'", definition)) == set(OPERATOR_EVENT_KINDS)
