"""The operator commands: the same services, input rules and events as the console, from a
shell. Bad input ends a command with one line naming the field and exit status 2, and
nothing is stored; the actor is cli:<the OS user> unless --actor says otherwise."""

from __future__ import annotations

import json
import os
import subprocess
from datetime import timedelta
from io import StringIO
from pathlib import Path
from typing import Any

import pytest
from django.core.management import call_command
from django.db import connection
from django.utils import timezone

from tasks_app import services
from tasks_app.models import (
    Counter,
    Event,
    EventKind,
    StepStatus,
    Task,
    TaskStatus,
)
from tests.cause_support import causes, dead, dead_step
from tests.command_support import OS_USER, last_event, lines, refused, run, status_of
from tests.conftest import only_step
from tests.e2e_support import PYTHON, ROOT, database_url
from tests.factories import dead_task, noop, succeeded, unknown_outcome
from tests.rows import action_rows

__all__ = ["causes"]  # the fixture, used by name

UNKNOWN = "tasks_app.exceptions.OutcomeUnknown"
PERMANENT = "tasks_app.exceptions.PermanentError"


# --- enqueue --------------------------------------------------------------------------------------


def test_enqueue_takes_the_payload_as_an_argument_and_records_the_os_user(db: None) -> None:
    printed = json.loads(run("enqueue", "demo.noop", "--payload", '{"n": 1}', "--key", "cmd:1"))

    task = Task.objects.get()
    assert printed == {"id": task.pk, "created": True, "status": "pending", "key": "cmd:1"}
    assert (task.payload, task.created_by) == ({"n": 1}, OS_USER)
    assert last_event(task).actor == OS_USER


def test_enqueue_reads_the_payload_from_a_file(db: None, tmp_path: Path) -> None:
    path = tmp_path / "payload.json"
    path.write_text('{\n  "article": "ünïcode"\n}\n', encoding="utf-8")

    run("enqueue", "demo.noop", "--payload-file", str(path))

    assert Task.objects.get().payload == {"article": "ünïcode"}


@pytest.mark.parametrize("option", ["--payload", "--payload-file"])
def test_enqueue_reads_the_payload_from_standard_input(db: None, option: str) -> None:
    run("enqueue", "demo.noop", option, "-", stdin=StringIO('{"from": "stdin"}'))

    assert Task.objects.get().payload == {"from": "stdin"}


@pytest.mark.parametrize(("given", "recorded"), [("alice", "cli:alice"), ("ops:bob", "ops:bob")])
def test_enqueue_records_the_actor_given(db: None, given: str, recorded: str) -> None:
    run("enqueue", "demo.noop", "--actor", given)

    task = Task.objects.get()
    assert task.created_by == last_event(task).actor == recorded


def test_enqueue_with_a_taken_key_and_the_same_payload_returns_the_task(db: None) -> None:
    first = json.loads(run("enqueue", "demo.noop", "--payload", '{"n": 1}', "--key", "cmd:1"))
    again = json.loads(run("enqueue", "demo.noop", "--payload", '{"n":1}', "--key", "cmd:1"))

    assert (again["id"], again["created"]) == (first["id"], False)
    assert Task.objects.count() == 1


@pytest.mark.parametrize(
    ("args", "field"),
    [
        (["demo.noop", "--payload", "{nope"], "payload: not valid JSON"),
        (["demo.noop", "--payload", "[1]"], "payload: must be a JSON object"),
        (["demo.noop", "--payload", "[" * 100_000 + "]" * 100_000], "payload: nesting"),
        (["demo.noop", "--payload", '{"a": NaN}'], "payload: $.a is NaN or Infinity"),
        (["demo.noop", "--payload", "{}", "--payload-file", "-"], "not both"),
        (["demo.noop", "--payload-file", "/nonexistent/payload.json"], "payload_file:"),
        (["demo.nope"], "workflow"),
        (["demo.flaky", "--payload", '{"fail_first": -1}'], "payload.fail_first"),
        (["demo.flaky", "--payload", '{"error": []}'], "payload.error: must be one of"),
        (["demo.noop", "--payload", '{"x": ' + "1" * 1200 + "}"], "more than 1000 digits"),
        (["demo.noop", "--payload", '{"x": ' + "1" * 5000 + "}"], "payload: not valid JSON"),
        (["demo.noop", "--priority", "high"], "priority: must be an integer"),
        (["demo.noop", "--priority", "101"], "priority: must be from -100 to 100"),
        (["demo.noop", "--queue", "elsewhere"], "queue: must be one of default"),
        (["demo.noop", "--key", "task-7"], "idempotency_key"),
        (["demo.noop", "--key", "has space"], "idempotency_key"),
        (["demo.noop", "--run-after", "next tuesday"], "run_after"),
        (["demo.noop", "--run-after", "2030-01-01T09:00:00"], "run_after: must be timezone"),
        (["demo.noop", "--actor", " "], "actor:"),
        (["demo.noop", "--actor", "x" * 151], "actor: at most 150"),
        (["demo.noop", "--no-such-option"], "unrecognized arguments"),
        ([], "workflow"),
    ],
)
def test_enqueue_refuses_bad_input_naming_the_field(db: None, args: list[str], field: str) -> None:
    assert field in refused("enqueue", *args)


def test_enqueue_refuses_a_taken_key_with_another_payload_and_only_counts_it(db: None) -> None:
    run("enqueue", "demo.noop", "--payload", '{"n": 1}', "--key", "cmd:1")

    message = refused("enqueue", "demo.noop", "--payload", '{"n": 2}', "--key", "cmd:1")

    assert "idempotency key 'cmd:1' is taken" in message
    assert Counter.objects.get(name="idempotency_conflict").value == 1


# --- redrive, resolve, cancel: by id --------------------------------------------------------------


def test_redrive_by_id_makes_the_task_runnable_with_the_reason_and_the_os_user(db: None) -> None:
    task = dead_task()

    out = run("redrive", str(task.pk), "--reason", "the fix is deployed")

    assert lines(out) == ["redrive: 1 changed, 0 skipped", f"changed: {task.pk}"]
    assert status_of(task) == TaskStatus.PENDING
    event = last_event(task)
    assert (event.kind, event.actor, event.reason) == (
        EventKind.REDRIVEN,
        OS_USER,
        "the fix is deployed",
    )


def test_an_action_by_id_reports_the_tasks_it_does_not_apply_to(db: None) -> None:
    dead, done = dead_task(), succeeded()

    out = run("redrive", str(done.pk), str(dead.pk), "--reason", "again", "--actor", "ops:ann")

    assert lines(out) == [
        "redrive: 1 changed, 1 skipped",
        f"changed: {dead.pk}",
        f"skipped {done.pk}: task #{done.pk} has no dead step to redrive",
    ]
    assert last_event(dead).actor == "ops:ann"
    assert status_of(done) == TaskStatus.SUCCEEDED


def test_resolve_done_marks_the_dead_step_done(db: None) -> None:
    task = unknown_outcome()

    run("resolve", str(task.pk), "--outcome", "done", "--reason", "the mail went out")

    assert status_of(task) == TaskStatus.SUCCEEDED
    assert only_step(task).result == {
        "resolved": "done",
        "by": OS_USER,
        "note": "the mail went out",
    }
    event = last_event(task)
    assert (event.kind, event.data["outcome"], event.actor) == (EventKind.RESOLVED, "done", OS_USER)


def test_resolve_retry_runs_the_dead_step_again(db: None) -> None:
    task = unknown_outcome()

    run("resolve", str(task.pk), "--outcome", "retry", "--reason", "it never left")

    assert status_of(task) == TaskStatus.PENDING
    assert (only_step(task).status, only_step(task).attempts) == (StepStatus.PENDING, 0)
    assert last_event(task).data["outcome"] == "retry"


def test_cancel_by_id_cancels_pending_and_dead_tasks(db: None) -> None:
    pending, dead = noop(), dead_task()

    out = run("cancel", str(pending.pk), str(dead.pk), "--reason", "not needed")

    assert lines(out)[0] == "cancel: 2 changed, 0 skipped"
    assert status_of(pending) == status_of(dead) == TaskStatus.CANCELLED
    assert last_event(pending).actor == OS_USER


# --- by filter ------------------------------------------------------------------------------------


def test_redrive_by_filter_acts_on_the_matching_dead_tasks_only(db: None) -> None:
    permanent, unknown, done, pending = dead_task(), unknown_outcome(), succeeded(), noop()

    out = run("redrive", "--error-class", PERMANENT, "--reason", "remote is back")

    assert lines(out) == ["redrive: 1 changed, 0 skipped", f"changed: {permanent.pk}"]
    assert status_of(permanent) == TaskStatus.PENDING
    assert status_of(unknown) == TaskStatus.DEAD
    assert (status_of(done), status_of(pending)) == (TaskStatus.SUCCEEDED, TaskStatus.PENDING)


def test_redrive_by_cause_acts_on_the_dead_tasks_of_that_cause_only(db: None, causes: None) -> None:
    first = dead("test.causes.a", "HTTP 503 from /articles/1")
    second = dead("test.causes.b", "HTTP 503 from /articles/2")
    other = dead("test.causes.a", "connection refused by 10.0.0.7")
    cause = dead_step(first).error_fingerprint
    assert dead_step(second).error_fingerprint == cause != dead_step(other).error_fingerprint

    dry = run("redrive", "--cause", cause, "--dry-run", "--reason", "the remote is back")
    out = run("redrive", "--cause", cause, "--reason", "the remote is back")

    assert lines(dry) == [
        "redrive (dry run, nothing changed): 2 task(s) match",
        f"first ids: {first.pk}, {second.pk}",
    ]
    assert lines(out) == ["redrive: 2 changed, 0 skipped", f"changed: {first.pk}, {second.pk}"]
    assert status_of(first) == status_of(second) == TaskStatus.PENDING
    assert status_of(other) == TaskStatus.DEAD


def test_resolve_by_workflow_and_queue(db: None) -> None:
    first, second, done = unknown_outcome(), unknown_outcome(), succeeded()

    out = run(
        "resolve", "--workflow", "demo.flaky", "--queue", "default", "--outcome", "done",
        "--reason", "checked the remote by hand",
    )  # fmt: skip

    assert lines(out) == ["resolve_done: 2 changed, 0 skipped", f"changed: {first.pk}, {second.pk}"]
    assert status_of(first) == status_of(second) == TaskStatus.SUCCEEDED
    assert Event.objects.filter(kind=EventKind.RESOLVED).count() == 2
    assert status_of(done) == TaskStatus.SUCCEEDED


def test_cancel_by_status_cancels_only_tasks_in_that_status(db: None) -> None:
    pending, dead, done = noop(), dead_task(), succeeded()

    run("cancel", "--status", "dead", "--reason", "giving up on these")

    assert status_of(dead) == TaskStatus.CANCELLED
    assert (status_of(pending), status_of(done)) == (TaskStatus.PENDING, TaskStatus.SUCCEEDED)


def test_older_than_selects_tasks_created_before_now_minus_that(db: None) -> None:
    old, new = dead_task(), dead_task()
    Task.objects.filter(pk=old.pk).update(created_at=timezone.now() - timedelta(hours=3))

    out = run("redrive", "--older-than", "2h", "--reason", "stale ones first")

    assert lines(out)[1] == f"changed: {old.pk}"
    assert (status_of(old), status_of(new)) == (TaskStatus.PENDING, TaskStatus.DEAD)


def test_the_limit_leaves_the_rest_alone_and_says_so(db: None) -> None:
    tasks = [dead_task() for _ in range(3)]

    out = run("cancel", "--workflow", "demo.flaky", "--limit", "2", "--reason", "two for now")

    assert lines(out) == [
        "cancel: 2 changed, 0 skipped; more matched than the limit of 2 and were left alone",
        f"changed: {tasks[0].pk}, {tasks[1].pk}",
    ]
    assert [status_of(task) for task in tasks] == ["cancelled", "cancelled", "dead"]


@pytest.mark.parametrize(
    "args",
    [
        ["redrive", "--workflow", "demo.flaky"],
        ["resolve", "--workflow", "demo.flaky", "--outcome", "retry"],
        ["cancel", "--status", "dead"],
    ],
)
def test_a_dry_run_prints_the_count_and_the_first_ids_and_changes_nothing(
    db: None, args: list[str]
) -> None:
    tasks = [unknown_outcome() for _ in range(22)]
    ids = [task.pk for task in tasks]
    before = action_rows()

    action = {"redrive": "redrive", "resolve": "resolve_retry", "cancel": "cancel"}[args[0]]

    out = run(*args, "--dry-run", "--reason", "how many?")

    assert lines(out) == [
        f"{action} (dry run, nothing changed): 22 task(s) match",
        f"first ids: {', '.join(map(str, ids[:20]))} (and 2 more)",
    ]
    assert action_rows() == before


def test_a_dry_run_by_id_says_which_tasks_would_be_skipped(db: None) -> None:
    dead, done = dead_task(), succeeded()
    before = action_rows()

    out = run("redrive", str(dead.pk), str(done.pk), "--dry-run", "--reason", "which?")

    assert lines(out) == [
        "redrive (dry run, nothing changed): 1 of 2 task(s) apply",
        f"first ids: {dead.pk}",
        f"would skip (not dead): {done.pk}",
    ]
    assert action_rows() == before


def test_a_dry_run_beyond_the_limit_says_how_many_would_be_acted_on(db: None) -> None:
    for _ in range(3):
        dead_task()

    out = run("redrive", "--workflow", "demo.flaky", "--limit", "2", "--dry-run", "--reason", "?")

    assert lines(out)[0] == (
        "redrive (dry run, nothing changed): 3 task(s) match; "
        "the first 2 would be acted on (--limit)"
    )


# --- refusals -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "args",
    [
        ["redrive", "--reason", "everything"],
        ["resolve", "--outcome", "done", "--reason", "everything"],
        ["cancel", "--reason", "everything"],
        ["cancel", "--reason", "everything", "--dry-run"],
    ],
)
def test_an_action_without_ids_or_a_filter_is_refused(db: None, args: list[str]) -> None:
    dead_task()

    assert refused(*args).startswith("filters: give task ids or at least one filter")


def test_an_action_refuses_ids_and_filters_together(db: None) -> None:
    task = dead_task()

    message = refused("redrive", str(task.pk), "--workflow", "demo.flaky", "--reason", "both")

    assert message == "ids: give task ids or filters, not both"


@pytest.mark.parametrize(
    ("args", "field"),
    [
        (["redrive", "{id}"], "reason: is required"),
        (["redrive", "{id}", "--reason", "   "], "reason: is required"),
        (["redrive", "{id}", "--reason", "x", "--dry-run", "--actor", ""], "actor:"),
        (["cancel", "{id}", "--reason", "x", "--limit", "0"], "--limit"),
        (["cancel", "{id}", "--reason", "x", "--limit", "1001"], "limit: from 1 to 1000"),
        (["redrive", "--older-than", "soon", "--reason", "x"], "older_than: a duration"),
        (["redrive", "--older-than", "0h", "--reason", "x"], "older_than: more than 0"),
        (["redrive", "--workflow", "nope", "--reason", "x"], "workflow: must be one of"),
        (["redrive", "--workflow", "", "--reason", "x"], "workflow: must be one of"),
        (["redrive", "--queue", "elsewhere", "--reason", "x"], "queue: must be one of"),
        (["redrive", "--error-class", " ", "--reason", "x"], "error_class: 1 to 200"),
        (["redrive", "--cause", "503", "--reason", "x"], "cause: the 16 hexadecimal digits"),
        (["cancel", "--cause", "0123456789ABCDEF", "--reason", "x"], "cause: the 16"),
        (["redrive", "99999", "--reason", "x"], "ids: no task with id 99999"),
        (["redrive", "abc", "--reason", "x"], "not a task id"),
        (["redrive", "-1", "--reason", "x"], "TASK_ID"),
        (["resolve", "{id}", "--reason", "x"], "--outcome"),
        (["resolve", "{id}", "--reason", "x", "--outcome", "maybe"], "--outcome"),
        (["cancel", "--status", "succeeded", "--reason", "x"], "--status"),
    ],
)
def test_an_action_refuses_bad_input_naming_the_field(
    db: None, settings: Any, args: list[str], field: str
) -> None:
    settings.TASKS_BULK_LIMIT = 1000
    task = dead_task()

    message = refused(*[arg.replace("{id}", str(task.pk)) for arg in args])

    assert field in message
    assert status_of(task) == TaskStatus.DEAD


# --- queues ---------------------------------------------------------------------------------------


def test_pause_and_resume_a_queue_with_the_actor_and_reason(db: None) -> None:
    assert run("pause_queue", "default", "--reason", "incident 42") == (
        f"queue default paused by {OS_USER}\n"
    )
    assert services.paused_queues() == ["default"]
    paused = Event.objects.get(kind=EventKind.QUEUE_PAUSED)
    assert (paused.actor, paused.reason, paused.data["queue"]) == (
        OS_USER,
        "incident 42",
        "default",
    )

    run("resume_queue", "default", "--reason", "fixed", "--actor", "alice")

    assert services.paused_queues() == []
    resumed = Event.objects.get(kind=EventKind.QUEUE_RESUMED)
    assert (resumed.actor, resumed.reason) == ("cli:alice", "fixed")


def test_pausing_a_paused_queue_changes_nothing(db: None) -> None:
    run("pause_queue", "default", "--reason", "incident 42")
    before = action_rows()

    out = run("pause_queue", "default", "--reason", "again")

    assert out == "queue default is already paused; nothing changed\n"
    assert action_rows() == before


@pytest.mark.parametrize(
    ("args", "field"),
    [
        (["pause_queue", "elsewhere", "--reason", "x"], "name: must be one of default"),
        (["pause_queue", "default"], "reason: is required"),
        (["resume_queue", "default", "--reason", ""], "reason: is required"),
        (["pause_queue", "--reason", "x"], "name"),
    ],
)
def test_the_queue_commands_refuse_bad_input(db: None, args: list[str], field: str) -> None:
    assert field in refused(*args)


# --- from a shell ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "args",
    [
        ["resolve", "1", "--reason", "x"],
        ["redrive", "--reason", "x"],
        ["enqueue", "demo.noop", "--payload", "[1]"],
    ],
)
def test_from_a_shell_bad_input_exits_2_with_one_line_and_no_traceback(
    db: None, args: list[str]
) -> None:
    env = {**os.environ, "DATABASE_URL": database_url(connection.settings_dict)}

    done = subprocess.run(
        [PYTHON, "manage.py", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )

    assert done.returncode == 2, done.stderr
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert "Traceback" not in done.stderr
    assert done.stdout == ""


@pytest.mark.django_db
def test_the_migrations_describe_the_models_as_they_are() -> None:
    """Indexes and constraints are part of the guarantees (the unique idempotency key, the
    due-step index): a model change without its migration fails here, not in production."""
    out = StringIO()
    try:
        call_command("makemigrations", "--check", "--dry-run", stdout=out, stderr=out)
    except SystemExit as exc:
        raise AssertionError("models changed without a migration:\n" + out.getvalue()) from exc
