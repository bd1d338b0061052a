"""The operational log (``tasks_app.observability.oplog``): one line per retry, dead letter, lease
expiry, stale write refused and operator action, with its ids, written after commit, on both the ORM
path and the SQL batch path, never with a payload or a secret; JSON when the settings say so; and
nothing from an idle sweeper.

The tests are transactional: a line is written when its transaction commits. Time moves
by back-dating rows.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Iterator
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.db import connection, transaction
from django.db.models import F

from approvals import services as approvals
from approvals.models import ApprovalRequest
from tasks_app import services, tasks
from tasks_app.engine import fastpath, runner
from tasks_app.exceptions import InvalidTransition, RetryableError
from tasks_app.models import Step, StepStatus, Task, TaskStatus
from tasks_app.observability.logs import JsonFormatter
from tasks_app.services import Claim
from tasks_app.workflows import StepContext, StepSpec, Workflow, register, registry
from tests.approval_support import ARTICLE, advance, pending_request
from tests.conftest import backdate, only_step
from tests.settings_support import load_settings

pytestmark = pytest.mark.django_db(transaction=True)

WORKER = "w1"
ONCALL = "cli:oncall"
FLAKY_ERROR = "tasks_app.exceptions.RetryableError"
PERMANENT_ERROR = "tasks_app.exceptions.PermanentError"
TEXT = logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s")


class Captured(logging.Handler):
    """The records of ``tasks_app.events``, and each as both formats write it."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)

    def lines(self) -> list[tuple[str, dict[str, Any]]]:
        return [(record.event, dict(record.fields)) for record in self.records]  # type: ignore[attr-defined]

    def kinds(self) -> list[str]:
        return [kind for kind, _ in self.lines()]

    def rendered(self) -> list[str]:
        """Every record as the text and the JSON format write it, and all it carries."""
        out = []
        for record in self.records:
            out += [TEXT.format(record), JsonFormatter().format(record), repr(vars(record))]
        return out

    def clear(self) -> None:
        self.records.clear()


@pytest.fixture
def captured() -> Iterator[Captured]:
    handler = Captured()
    log = logging.getLogger("tasks_app.events")
    log.addHandler(handler)
    yield handler
    log.removeHandler(handler)


@pytest.fixture(params=["sql", "orm"])
def path(request: pytest.FixtureRequest, settings: Any) -> str:
    """The SQL batch path (the default on PostgreSQL) or the ORM code it restates."""
    assert connection.vendor == "postgresql", "the SQL batch path runs on PostgreSQL"
    settings.TASKS_SQL_FAST_PATH = request.param == "sql"
    return str(request.param)


def claim(step: Step) -> Claim:
    """Claim one due step through the batch entry point (its SQL or its ORM twin)."""
    [claimed] = fastpath.claim_batch(worker_id=WORKER, limit=1, step_id=step.pk)
    assert claimed.step_id == step.pk
    return claimed


def run(step: Step) -> None:
    runner.run_batch([claim(step)])


def flaky(key: str, **payload: Any) -> Task:
    return services.enqueue("demo.flaky", payload, idempotency_key=key, actor="cli:producer").task


# --- what is logged, on both paths ------------------------------------------------------------


def play(path: str) -> dict[str, Task]:
    """Every kind of line once or more: retries and a dead letter, a redrive and a cancel,
    a permanent error resolved, a lease expiry and the stale completion that follows it,
    a cancel while a step runs, a queue paused and resumed. Steps that simply succeed
    log nothing."""
    retried = flaky(f"{path}-retried", fail_first=5)
    step = only_step(retried)
    run(step)  # attempt 1 fails: retry
    backdate(step)
    run(step)  # attempt 2 fails: retry
    backdate(step)
    run(step)  # attempt 3 fails: dead letter (max_attempts)
    services.redrive(retried, actor=ONCALL, reason="the remote is back")
    services.cancel(retried, actor=ONCALL, reason="not needed after all")

    resolved = flaky(f"{path}-resolved", fail_first=1, error="permanent")
    run(only_step(resolved))  # dead at once
    services.resolve(resolved, actor=ONCALL, reason="done by hand", outcome="done")

    expired = services.enqueue("demo.noop", {}, idempotency_key=f"{path}-expired").task
    step = only_step(expired)
    stale = claim(step)
    backdate(step)  # its lease ran out
    assert services.reap_expired_leases() == 1
    assert fastpath.complete_many([(stale, {})]) == set()  # refused: stale
    run(step)  # claimed again, succeeds: nothing logged

    stopped = services.enqueue("demo.noop", {}, idempotency_key=f"{path}-stopped").task
    running = claim(only_step(stopped))
    services.cancel(stopped, actor=ONCALL, reason="stop it")
    assert fastpath.complete_many([(running, {})]) == {running.step_id}

    services.pause_queue("default", actor=ONCALL, reason="incident")
    services.resume_queue("default", actor=ONCALL, reason="resolved")

    ok = services.enqueue("demo.noop", {}, idempotency_key=f"{path}-ok").task
    run(only_step(ok))
    return {
        "retried": retried,
        "resolved": resolved,
        "expired": expired,
        "stopped": stopped,
        "ok": ok,
    }


def expected(tasks: dict[str, Task]) -> list[tuple[str, dict[str, Any]]]:
    """The lines :func:`play` writes, with the fields each must carry."""

    def ids(name: str, token: int | None, actor: str) -> dict[str, Any]:
        task = tasks[name]
        return {
            "task": task.pk,
            "step": only_step(task).pk,
            "token": token,
            "workflow": task.workflow,
            "queue": "default",
            "actor": actor,
        }

    worker = f"worker:{WORKER}"
    retry = {"error_class": FLAKY_ERROR}
    return [
        ("retry_scheduled", {**ids("retried", 1, worker), **retry, "attempts": 1}),
        ("retry_scheduled", {**ids("retried", 2, worker), **retry, "attempts": 2}),
        (
            "dead_lettered",
            {**ids("retried", 3, worker), **retry, "attempts": 3, "reason": "max_attempts"},
        ),
        ("redriven", {**ids("retried", 3, ONCALL), "reason": "the remote is back"}),
        ("cancelled", {**ids("retried", 3, ONCALL), "reason": "not needed after all"}),
        (
            "dead_lettered",
            {
                **ids("resolved", 1, worker),
                "error_class": PERMANENT_ERROR,
                "attempts": 1,
                "reason": "permanent_error",
                "error": "failing on claim 1 of 1 (fail_first)",
            },
        ),
        ("resolved", {**ids("resolved", 1, ONCALL), "outcome": "done"}),
        (
            "lease_expired",
            {
                **ids("expired", 1, "system:sweeper"),
                "attempts": 1,
                "step_status": "pending",
                "error_class": "lease_expired",
            },
        ),
        (
            "stale_write_rejected",
            {**ids("expired", 1, worker), "operation": "complete", "current_status": "pending"},
        ),
        (
            "cancel_requested",
            {"task": tasks["stopped"].pk, "workflow": "demo.noop", "actor": ONCALL},
        ),
        (
            "cancelled",
            {
                "task": tasks["stopped"].pk,
                "workflow": "demo.noop",
                "queue": "default",
                "actor": "system",
                "reason": "cancel requested while the step ran",
            },
        ),
        ("queue_paused", {"queue": "default", "actor": ONCALL, "reason": "incident"}),
        ("queue_resumed", {"queue": "default", "actor": ONCALL, "reason": "resolved"}),
    ]


def test_each_kind_is_logged_once_per_transition_with_its_ids(
    path: str, captured: Captured
) -> None:
    tasks = play(path)

    want = expected(tasks)
    assert captured.kinds() == [kind for kind, _ in want]
    for (kind, fields), (_, want_fields) in zip(captured.lines(), want, strict=True):
        assert {name: fields.get(name) for name in want_fields} == want_fields, kind
    retries = [fields for kind, fields in captured.lines() if kind == "retry_scheduled"]
    assert all(0 <= fields["retry_in"] <= 1.0 for fields in retries)
    assert "step" not in captured.lines()[-4][1], "a cancel of a running task names no step"
    levels = {record.event: record.levelname for record in captured.records}  # type: ignore[attr-defined]
    assert levels == {
        "retry_scheduled": "INFO",
        "dead_lettered": "WARNING",
        "redriven": "INFO",
        "cancelled": "INFO",
        "resolved": "INFO",
        "lease_expired": "WARNING",
        "stale_write_rejected": "WARNING",
        "cancel_requested": "INFO",
        "queue_paused": "INFO",
        "queue_resumed": "INFO",
    }


def test_both_paths_write_the_same_lines(settings: Any, captured: Captured) -> None:
    played = {}
    for name in ("sql", "orm"):
        settings.TASKS_SQL_FAST_PATH = name == "sql"
        captured.clear()
        tasks = play(name)
        played[name] = [_normalised(kind, fields, tasks) for kind, fields in captured.lines()]
    assert played["sql"] == played["orm"]


def _normalised(kind: str, fields: dict[str, Any], tasks: dict[str, Task]) -> tuple[str, Any]:
    """A line with its task and step named by the scenario's name for them, and a retry's
    jittered delay kept as present."""
    names = {task.pk: name for name, task in tasks.items()}
    steps = {only_step(task).pk: name for name, task in tasks.items()}
    same = dict(fields)
    if "task" in same:
        same["task"] = names[same["task"]]
    if "step" in same:
        same["step"] = steps[same["step"]]
    if "retry_in" in same:
        same["retry_in"] = "jittered"
    return kind, same


def test_approval_decisions_and_an_expiry_are_logged_with_the_approval_step(
    captured: Captured, editor: User
) -> None:
    def waiting(key: str) -> tuple[Task, ApprovalRequest]:
        task = advance(
            services.enqueue("publish_article", ARTICLE, idempotency_key=key, actor="cli:ann").task
        )
        assert task.status == TaskStatus.WAITING_APPROVAL
        return task, pending_request(task)

    approved, first = waiting("oplog:approve")
    rejected, second = waiting("oplog:reject")
    revised, third = waiting("oplog:revise")
    lapsed, fourth = waiting("oplog:expire")
    assert captured.records == [], "reaching an approval step is not logged"

    approvals.approve(first, actor=editor, comment="ship it")
    approvals.reject(second, actor=editor, comment="off brand")
    approvals.request_changes(third, actor=editor, comment="shorter, please")
    ApprovalRequest.objects.filter(pk=fourth.pk).update(expires_at=F("created_at"))
    assert services.sweep().jobs["expired_approvals"] == 1

    def ids(task: Task, request: ApprovalRequest, actor: str) -> dict[str, Any]:
        return {
            "task": task.pk,
            "step": request.step_id,
            "token": 0,
            "workflow": "publish_article",
            "queue": "default",
            "actor": actor,
            "request": request.pk,
        }

    review = {"step": fourth.step_id, "token": 0, "workflow": "publish_article"}
    want = [
        ("approved", {**ids(approved, first, editor.username), "reason": "ship it"}),
        ("rejected", {**ids(rejected, second, editor.username), "reason": "off brand"}),
        (
            "cancelled",
            {"task": rejected.pk, "actor": "system", "reason": "rejected by " + editor.username},
        ),
        (
            "changes_requested",
            {**ids(revised, third, editor.username), "reason": "shorter, please"},
        ),
        ("approval_expired", {**ids(lapsed, fourth, "system:sweeper"), "policy": "dead_letter"}),
        (
            "dead_lettered",
            {"task": lapsed.pk, **review, "actor": "system", "reason": "approval_expired"},
        ),
    ]
    assert captured.kinds() == [kind for kind, _ in want]
    for (kind, fields), (_, want_fields) in zip(captured.lines(), want, strict=True):
        assert {name: fields.get(name) for name in want_fields} == want_fields, kind
    dead = captured.lines()[-1][1]
    assert dead["error"].startswith(f"approval #{fourth.pk} expired at")


# --- after commit --------------------------------------------------------------------------


def test_a_line_is_written_when_its_transaction_commits_and_never_if_it_rolls_back(
    captured: Captured,
) -> None:
    task = flaky("rolled-back", fail_first=5)
    held = claim(only_step(task))

    with pytest.raises(RuntimeError), transaction.atomic():
        services.fail_step(held, error_class="x.Boom", message="boom", retry_in=1.0, reason="")
        raise RuntimeError("the caller's transaction fails after the transition")
    assert captured.records == []
    assert only_step(task).status == StepStatus.RUNNING, "the retry was rolled back"

    with transaction.atomic():
        services.fail_step(held, error_class="x.Boom", message="boom", retry_in=1.0, reason="")
        assert captured.records == [], "nothing is written before the commit"
    assert captured.kinds() == ["retry_scheduled"]
    assert captured.lines()[0][1]["error"] == "boom"


def test_a_refused_operator_action_logs_nothing(captured: Captured) -> None:
    task = services.enqueue("demo.noop", {}).task
    run(only_step(task))
    with pytest.raises(InvalidTransition):
        services.redrive(task, actor=ONCALL, reason="nothing is dead")
    with pytest.raises(InvalidTransition):
        services.cancel(task, actor=ONCALL, reason="it already succeeded")
    assert captured.records == []


# --- payloads and secrets --------------------------------------------------------------------

SECRET = "s3cr3t-UNDER-A-REDACTED-KEY"
MARKER = "PAYLOAD-MARKER-3f9c"


def test_no_payload_value_and_no_secret_is_ever_logged(path: str, captured: Captured) -> None:
    payload = {"fail_first": 3, "api_key": SECRET, "note": MARKER, "nested": {"x": MARKER}}
    task = flaky(f"secrets-{path}", **payload)
    step = only_step(task)
    for _ in range(3):  # two retries, then a dead letter
        backdate(step)
        run(step)
    edited = {
        "fail_first": 3,
        "API-Key": SECRET + "-edited",
        "nested": {"Password": SECRET + "-nested"},
        "note": MARKER + "-edited",
    }
    services.redrive(task, actor=ONCALL, reason="fixed the input", payload=edited)
    run(step)  # claim 4: succeeds
    task.refresh_from_db()
    assert task.status == TaskStatus.SUCCEEDED and task.payload == edited

    assert captured.kinds() == ["retry_scheduled", "retry_scheduled", "dead_lettered", "redriven"]
    rendered = "\n".join(captured.rendered())
    assert SECRET not in rendered
    assert MARKER not in rendered
    assert "payload" not in rendered


LEAKY = "test.oplog.leaky"


def _leaky(ctx: StepContext) -> dict[str, Any]:
    raise RetryableError(
        f"remote refused {{'api_key': '{ctx.payload['key']}'}} with Authorization: Bearer "
        f"{ctx.payload['key']} at /hook?token={ctx.payload['key']}&retry=1"
    )


@pytest.fixture
def leaky() -> Iterator[str]:
    """A handler whose error message quotes a secret it was given, three ways."""
    register(Workflow(LEAKY, 1, steps=(StepSpec("leak", _leaky, max_attempts=3),)))
    yield LEAKY
    registry.unregister(LEAKY, 1)


def test_free_text_has_the_values_of_redacted_keys_removed(leaky: str, captured: Captured) -> None:
    task = services.enqueue(leaky, {"key": SECRET}).task
    run(only_step(task))
    services.pause_queue("default", actor=ONCALL, reason="rotating password=hunter2-" + SECRET)

    [(_, retry), (_, paused)] = captured.lines()
    assert SECRET not in "\n".join(captured.rendered())
    assert retry["error"] == (
        "remote refused {'api_key': •••redacted•••} with Authorization: •••redacted••• "
        "at /hook?token=•••redacted•••&retry=1"
    )
    assert paused["reason"] == "rotating password=•••redacted•••"


QUOTING = "test.oplog.quoting"
SECRETS = {"password": "hunter2", "api_token": "abc-tok", "nested": [{"Client-Secret": "x-cs"}]}


def _quoting(ctx: StepContext) -> dict[str, Any]:
    raise RetryableError(f"remote refused {ctx.payload!r}")


def test_a_task_whose_error_quotes_its_payload_logs_none_of_its_secrets(
    captured: Captured,
) -> None:
    register(Workflow(QUOTING, 1, steps=(StepSpec("quote", _quoting, max_attempts=1),)))
    try:
        task = services.enqueue(QUOTING, SECRETS).task
        run(only_step(task))  # dead at once: one attempt
        services.redrive(task, actor=ONCALL, reason="api_token=abc-tok rotated", payload=SECRETS)
    finally:
        registry.unregister(QUOTING, 1)

    assert captured.kinds() == ["dead_lettered", "redriven"]
    rendered = "\n".join(captured.rendered())
    for secret in ("hunter2", "abc-tok", "x-cs"):
        assert secret not in rendered, secret
    [(_, dead), (_, redriven)] = captured.lines()
    for key in ("'password'", "'api_token'", "'Client-Secret'"):
        assert f"{key}: •••redacted•••" in dead["error"], key
    assert redriven["reason"] == "api_token=•••redacted••• rotated"


def test_the_redacted_keys_are_a_setting(settings: Any, captured: Captured) -> None:
    settings.REDACT_KEY_PATTERNS = ["ticket-id"]
    services.pause_queue("default", actor=ONCALL, reason="ticket_id=T-99 api_key=visible")

    [(_, fields)] = captured.lines()
    assert fields["reason"] == "ticket_id=•••redacted••• api_key=visible"


def test_a_dict_a_line_carries_is_redacted_at_any_depth(settings: Any) -> None:
    from tasks_app.models import Event
    from tasks_app.observability import oplog

    event = Event(
        kind="queue_paused",
        actor=ONCALL,
        data={"queue": "default", "outcome": {"Token": SECRET, "inner": [{"SECRET": SECRET}]}},
    )
    fields = oplog.event_fields(event)
    assert fields["outcome"] == {"Token": "•••redacted•••", "inner": [{"SECRET": "•••redacted•••"}]}
    assert SECRET not in oplog.line("queue_paused", fields)


# --- formats ------------------------------------------------------------------------------------


def test_the_text_line_reads_as_kind_then_name_value_pairs(captured: Captured) -> None:
    task = flaky("text-line", fail_first=5)
    step = only_step(task)
    run(step)

    [record] = captured.records
    message = record.getMessage()
    assert re.fullmatch(
        rf"retry_scheduled task={task.pk} step={step.pk} token=1 workflow=demo\.flaky "
        rf"queue=default actor=worker:{WORKER} attempts=1 error_class={FLAKY_ERROR} "
        r'error="failing on claim 1 of 5 \(fail_first\)" retry_in=[0-9.]+s',
        message,
    ), message


def test_the_json_format_writes_one_object_per_line_with_the_fields(
    captured: Captured,
) -> None:
    task = flaky("json-line", fail_first=1, error="permanent")
    step = only_step(task)
    run(step)

    [record] = captured.records
    written = JsonFormatter().format(record)
    assert "\n" not in written
    entry = json.loads(written)
    assert entry["level"] == "WARNING" and entry["logger"] == "tasks_app.events"
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}\+00:00", entry["time"])
    assert entry["message"].startswith(f"dead_lettered task={task.pk} ")
    assert {name: entry[name] for name in ("event", "task", "step", "token", "attempts")} == {
        "event": "dead_lettered",
        "task": task.pk,
        "step": step.pk,
        "token": 1,
        "attempts": 1,
    }
    assert (entry["workflow"], entry["queue"], entry["actor"]) == (
        "demo.flaky",
        "default",
        f"worker:{WORKER}",
    )


def test_tasks_log_format_json_makes_every_logger_write_json() -> None:
    code = (
        "import logging; from tasks_app.observability import oplog; "
        "oplog.write(logging.WARNING, 'dead_lettered', {'task': 7, 'step': 8, 'token': 2}); "
        "logging.getLogger('django.request').warning('a line\\nof two lines')"
    )
    result = load_settings(code, TASKS_LOG_FORMAT="json")
    assert result.returncode == 0, result.stderr
    first, second = (json.loads(line) for line in result.stderr.strip().splitlines())
    assert first["event"] == "dead_lettered" and (first["task"], first["token"]) == (7, 2)
    assert first["message"] == "dead_lettered task=7 step=8 token=2"
    assert (second["logger"], second["message"]) == ("django.request", "a line\nof two lines")

    text = load_settings(code)
    assert text.returncode == 0, text.stderr
    assert "WARNING tasks_app.events: dead_lettered task=7 step=8 token=2" in text.stderr


def test_an_unknown_log_format_fails_loudly_naming_the_setting() -> None:
    result = load_settings(TASKS_LOG_FORMAT="yaml")
    assert result.returncode != 0
    assert "TASKS_LOG_FORMAT must be one of text, json, not 'yaml'" in result.stderr


# --- the quiet sweeper -----------------------------------------------------------------------


def test_an_idle_sweep_logs_nothing_at_info(caplog: pytest.LogCaptureFixture) -> None:
    done = services.enqueue("demo.noop", {}).task
    run(only_step(done))  # history, but nothing for the sweeper to do
    caplog.clear()
    caplog.set_level(logging.INFO)

    assert not any(services.sweep().as_dict().values()), "the sweep had nothing to do"
    assert not any(tasks.sweep().values())

    assert [record.getMessage() for record in caplog.records] == []
