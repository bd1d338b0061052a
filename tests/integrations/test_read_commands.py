"""The commands that read: ``queue_stats`` (the overview and the queues, as a table or as
JSON) and ``task_status`` (one task as aligned lines or as JSON, its failing step's error
and its last events, secrets redacted)."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
from django.contrib.auth.models import User

from tasks_app import services
from tasks_app.engine import runner
from tasks_app.history import timeline
from tasks_app.models import Step, Task, TaskStatus
from tasks_app.operations import selectors
from tasks_app.redaction import REDACTED, redact
from tests.command_support import OS_USER, lines, refused, run, status_of
from tests.conftest import backdate, only_step
from tests.factories import dead_task, noop

SECRETS = {"password": "hunter2", "api_token": "abc", "nested": [{"Client-Secret": "x"}]}

# --- queue_stats ----------------------------------------------------------------------------------


def test_queue_stats_prints_the_overview_and_an_aligned_queue_table(db: None) -> None:
    noop(), noop(), dead_task()
    run("pause_queue", "default", "--reason", "incident 42")

    out = lines(run("queue_stats"))

    figures = {line.strip().split("  ")[0]: line.split()[-1] for line in out[1:14]}
    assert (figures["pending"], figures["dead"], figures["paused queues"]) == ("2", "1", "default")
    header, row = out[-2:]
    assert header.split() == [
        "queue", "due", "scheduled", "running", "oldest", "due", "state", "by", "reason",
    ]  # fmt: skip
    assert row.split()[:4] == ["default", "2", "0", "0"]
    assert row.endswith(f"paused  {OS_USER}  incident 42")
    # Aligned: every column starts where its header does.
    assert row.index("paused") == header.index("state")


def test_queue_stats_as_json_carries_the_selectors_figures(db: None) -> None:
    noop(), dead_task()

    printed = json.loads(run("queue_stats", "--json"))

    overview = selectors.overview()
    assert printed["overview"]["pending"] == overview.pending == 1
    assert printed["overview"]["dead"] == overview.dead == 1
    assert len(printed["overview"]["throughput"]) == 60
    [queue] = printed["queues"]
    assert (queue["name"], queue["due"], queue["paused"]) == ("default", 1, False)


# --- task_status ----------------------------------------------------------------------------------


def status_json(*args: str) -> dict[str, Any]:
    printed: dict[str, Any] = json.loads(run("task_status", "--json", *args))
    return printed


def test_task_status_shows_the_error_of_a_dead_step(db: None) -> None:
    task = dead_task(key="cmd:dead")

    printed = status_json("--key", "cmd:dead")

    [step] = printed["steps"]
    assert (printed["id"], printed["status"], step["status"]) == (task.pk, "dead", "dead")
    assert step["error_class"] == "tasks_app.exceptions.PermanentError"
    assert "failing on claim 1" in step["error"]
    # Its cause, as the actions' --cause and /dead/groups/ take it.
    assert step["cause"] == only_step(task).error_fingerprint
    assert re.fullmatch("[0-9a-f]{16}", step["cause"])
    assert [(e["kind"], e["actor"], e["reason"]) for e in printed["events"]][-1] == (
        "dead_lettered",
        f"worker:{only_step(task).leases.get().worker_id}",
        "permanent_error",
    )


def claim_and_run(task: Task) -> None:
    """One claim of the task's step, its time come (a retry's backoff included)."""
    step = only_step(task)
    backdate(step)
    assert runner.run_claimed(step.pk)


def test_task_status_shows_the_error_of_a_step_waiting_for_a_retry(db: None) -> None:
    task = services.enqueue("demo.flaky", {"fail_first": 1}).task
    claim_and_run(task)

    [step] = status_json("--id", str(task.pk))["steps"]

    assert (step["status"], step["attempts"]) == ("pending", 1)
    assert step["error_class"] == "tasks_app.exceptions.RetryableError"
    assert "failing on claim 1" in step["error"]
    assert step["cause"] == ""  # a cause is a dead step's


def test_task_status_shows_no_stale_error_once_the_step_succeeded(db: None) -> None:
    task = services.enqueue("demo.flaky", {"fail_first": 1}).task
    claim_and_run(task)
    claim_and_run(task)
    assert only_step(task).error_class  # still on the row, as history

    [step] = status_json("--id", str(task.pk))["steps"]

    assert (step["status"], step["error_class"], step["error"]) == ("succeeded", "", "")


def test_task_status_shows_the_last_ten_events_oldest_first(db: None) -> None:
    task = services.enqueue("demo.flaky", {"fail_first": 9}).task
    for _ in range(2):
        for _ in range(3):
            claim_and_run(task)
        assert status_of(task) == TaskStatus.DEAD
        services.redrive(task, actor="cli:ann", reason="once more")
    kinds = [entry.kind for entry in timeline.history(task.pk)]
    assert len(kinds) == 15

    printed = status_json("--id", str(task.pk))

    assert [event["kind"] for event in printed["events"]] == kinds[-10:]
    redriven = next(e for e in printed["events"] if e["kind"] == "redriven")
    assert (redriven["actor"], redriven["reason"]) == ("cli:ann", "once more")
    assert [e["kind"] for e in status_json("--id", str(task.pk), "--events", "2")["events"]] == (
        kinds[-2:]
    )


@pytest.mark.parametrize(
    ("args", "field"),
    [
        (["--id", "99999"], "id: no task with id 99999"),
        (["--key", "nobody:has-this"], "key: no task has the idempotency key"),
        (["--id", "x"], "--id"),
        ([], "--id"),
        (["--id", "1", "--events", "many"], "events:"),
    ],
)
def test_task_status_refuses_bad_input(db: None, args: list[str], field: str) -> None:
    assert field in refused("task_status", *args)


def test_task_status_prints_what_producers_and_people_wrote_redacted(
    db: None, oncall: User
) -> None:
    task = dead_task({"error": "permanent", "fail_first": 2}, key="redaction:status")
    services.redrive(task, actor=oncall, reason="rotated the key, was token=abc")
    claim_and_run(task)
    assert status_of(task) == TaskStatus.DEAD  # died again
    # What a handler's result and a remote's error may carry.
    Step.objects.filter(task=task).update(
        result={"remote_id": "r-1", **SECRETS},
        last_error="PermanentError: refused with api_token=abc and password: 'hunter2'",
    )

    out = run("task_status", "--key", "redaction:status", "--events", "20", "--json")

    printed = json.loads(out)
    [step] = printed["steps"]
    assert step["result"] == {"remote_id": "r-1", **redact(SECRETS)}
    assert (
        step["error"]
        == f"PermanentError: refused with api_token={REDACTED} and password: {REDACTED}"
    )
    [redrive] = [event for event in printed["events"] if event["kind"] == "redriven"]
    assert redrive["reason"] == f"rotated the key, was token={REDACTED}"
    assert "hunter2" not in out
    assert '"abc"' not in out and "=abc" not in out


def test_task_status_prints_aligned_lines_with_the_error_in_one_line(db: None) -> None:
    task = dead_task(key="cmd:lines")
    step = only_step(task)
    assert step.last_error.startswith("Traceback (most recent call last):")

    out = lines(run("task_status", "--key", "cmd:lines"))

    assert out[0] == f"Task #{task.pk} demo.flaky: dead"
    assert out[1].split() == ["key", "cmd:lines"]
    header, row = out[out.index("Steps") + 1 : out.index("Steps") + 3]
    assert header.split() == [
        "step", "pos", "rev", "kind", "status", "attempts", "token", "cause", "error",
    ]  # fmt: skip
    assert row.split()[:8] == [
        str(step.pk), "0", "0", "flaky", "dead", "1", "of", "3",
    ]  # fmt: skip
    # The error is the traceback's last line, under its header; no traceback is printed.
    assert row[header.index("error") :] == (
        "tasks_app.exceptions.PermanentError: failing on claim 1 of 1 (fail_first)"
    )
    assert row[header.index("cause") :].startswith(step.error_fingerprint)
    assert "Traceback" not in "\n".join(out) and 'File "' not in "\n".join(out)
    events = out[out.index("Last 10 events, oldest first") + 1 :]
    assert events[0].split() == ["at", "event", "step", "actor", "reason"]
    assert [row.split()[3] for row in events[1:]] == ["enqueued", "claimed", "dead_lettered"]


def test_task_status_as_json_is_indented_and_keeps_the_whole_traceback(db: None) -> None:
    task = dead_task(key="cmd:json")

    out = run("task_status", "--key", "cmd:json", "--json")

    assert out.startswith("{\n  ")
    [step] = json.loads(out)["steps"]
    assert (
        step["error"] == "tasks_app.exceptions.PermanentError: failing on claim 1 of 1 (fail_first)"
    )
    assert step["traceback"] == only_step(task).last_error


def test_task_status_refuses_an_unknown_task_in_one_line(db: None) -> None:
    assert refused("task_status", "--id", "424242") == "id: no task with id 424242"
