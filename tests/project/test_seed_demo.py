"""The demo seed of `make run` and the demo users' passwords."""

from __future__ import annotations

import http.server
import socket
import stat
import threading
from collections.abc import Iterator
from datetime import timedelta
from io import StringIO
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.core.management import CommandError, call_command
from django.db.models.functions import TruncMinute
from django.http import HttpRequest
from django.test import Client

from approvals import services as approvals
from approvals.models import ApprovalRequest, ApprovalStatus
from tasks_app import services
from tasks_app.engine import runner
from tasks_app.management.commands import seed_demo
from tasks_app.management.commands.demo_users import (
    DEMO_USERS,
    demo_address,
    read_passwords,
    wait_for,
)
from tasks_app.models import Event, EventKind, Step, StepStatus, Task, TaskStatus
from tests.conftest import ensure_groups

pytestmark = pytest.mark.django_db


@pytest.fixture
def var_dir(settings: Any, tmp_path: Path) -> Path:
    settings.VAR_DIR = tmp_path
    settings.PRODUCTION = False
    # A transactional test before this one may have flushed the migration-made groups.
    ensure_groups()
    return tmp_path


def seed() -> str:
    out = StringIO()
    call_command("seed_demo", stdout=out)
    return out.getvalue()


def demo_users(*args: str) -> str:
    out = StringIO()
    call_command("demo_users", *args, stdout=out, stderr=StringIO())
    return out.getvalue()


# --- what the seed leaves ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("error_class", "reason"),
    [
        ("tasks_app.exceptions.RetryableError", "max_attempts"),
        ("tasks_app.exceptions.PermanentError", "permanent_error"),
        ("tasks_app.exceptions.OutcomeUnknown", "outcome_unknown"),
    ],
)
def test_it_leaves_a_dead_letter_of_each_error_class(
    var_dir: Path, error_class: str, reason: str
) -> None:
    seed()
    fixed = Step.objects.exclude(task__idempotency_key__startswith=seed_demo.FRESH_PREFIX)
    step = fixed.select_related("task").get(
        status=StepStatus.DEAD, error_class=error_class, task__workflow="demo.flaky"
    )
    assert step.task.status == TaskStatus.DEAD
    assert step.last_error
    assert Event.objects.filter(
        task_id=step.task_id, kind=EventKind.DEAD_LETTERED, reason=reason
    ).exists()
    if reason == "max_attempts":
        assert step.attempts == step.max_attempts == 3


def test_its_dead_letters_recover_the_way_the_console_offers(var_dir: Path) -> None:
    seed()
    for key in ("demo:dead:retryable", "demo:dead:permanent"):
        task = services.redrive(Task.objects.get(idempotency_key=key), actor="cli:t", reason="r")
        runner.run_task_steps(task)
        task.refresh_from_db()
        assert task.status == TaskStatus.SUCCEEDED, key
    unknown = Task.objects.get(idempotency_key="demo:dead:outcome-unknown")
    services.resolve(unknown, actor="cli:t", reason="it did not happen", outcome="retry")
    runner.run_task_steps(unknown)
    unknown.refresh_from_db()
    assert unknown.status == TaskStatus.SUCCEEDED


def test_it_leaves_an_article_at_revision_1_waiting_for_an_editor(var_dir: Path) -> None:
    seed()
    request = ApprovalRequest.objects.get(status=ApprovalStatus.PENDING, revision=1)
    task = request.task
    assert (task.workflow, task.status) == ("publish_article", TaskStatus.WAITING_APPROVAL)
    assert task.steps.filter(
        kind="generate_draft", revision=0, status=StepStatus.SUPERSEDED
    ).exists()
    earlier = ApprovalRequest.objects.get(task=task, status=ApprovalStatus.CHANGES_REQUESTED)
    assert (earlier.revision, earlier.decided_by) == (0, "cli:demo-editor")
    assert earlier.comment and earlier.comment in request.draft["body"]
    assert earlier.draft != request.draft
    # The demo editor may decide on it.
    editor = User.objects.get(username="editor")
    approvals.approve(request, actor=editor, draft_hash=request.draft_hash)
    assert task.steps.get(kind="publish").status == StepStatus.PENDING


def test_it_leaves_an_hour_of_finished_work(var_dir: Path) -> None:
    seed()
    now = services.db_now()
    succeeded = Task.objects.filter(
        status=TaskStatus.SUCCEEDED, idempotency_key__startswith="demo:history:"
    )
    finished = [moment for moment in succeeded.values_list("finished_at", flat=True) if moment]
    assert len(finished) == succeeded.count() >= 100
    assert all(now - timedelta(minutes=61) <= moment <= now for moment in finished)
    minutes = set(
        succeeded.annotate(minute=TruncMinute("finished_at")).values_list("minute", flat=True)
    )
    assert len(minutes) >= 30
    # Each task's step ran inside its task's lifetime, on the same moved clock.
    for task in succeeded.prefetch_related("steps"):
        [step] = task.steps.all()
        assert step.started_at is not None and step.finished_at is not None
        assert task.created_at <= step.started_at <= step.finished_at == task.finished_at


def test_it_leaves_tasks_pending_for_the_worker(var_dir: Path) -> None:
    seed()
    pending = set(
        Task.objects.filter(status=TaskStatus.PENDING).values_list("idempotency_key", flat=True)
    )
    assert {"demo:noop:1", "demo:noop:2", "demo:reply:T-1001"} <= pending


def fixed_tasks() -> dict[int, str]:
    fixed = Task.objects.exclude(idempotency_key__startswith=seed_demo.FRESH_PREFIX)
    return dict(fixed.values_list("pk", "status"))


def test_a_second_run_adds_a_fresh_batch_and_nothing_else(var_dir: Path) -> None:
    seed()
    users = User.objects.count()
    statuses = fixed_tasks()
    approvals_made = ApprovalRequest.objects.count()
    first = set(Task.objects.values_list("pk", flat=True))
    second = seed()
    assert fixed_tasks() == statuses
    assert ApprovalRequest.objects.count() == approvals_made
    assert User.objects.count() == users
    assert "0 new" in second and "password:" not in second
    new = Task.objects.exclude(pk__in=first)
    assert new.count() == len(seed_demo.FRESH_BATCH)
    keys = new.values_list("idempotency_key", flat=True)
    assert all((key or "").startswith(seed_demo.FRESH_PREFIX) for key in keys)
    # Something finished, something dead and something waiting for the worker, each run.
    assert {TaskStatus.SUCCEEDED, TaskStatus.DEAD, TaskStatus.PENDING} <= set(
        new.values_list("status", flat=True)
    )


def test_a_second_run_leaves_a_decision_made_in_the_console_alone(var_dir: Path) -> None:
    seed()
    request = ApprovalRequest.objects.get(status=ApprovalStatus.PENDING, revision=1)
    approvals.reject(request, actor="cli:someone", comment="not this week")
    seed()
    assert not ApprovalRequest.objects.filter(task=request.task, revision__gte=2).exists()
    assert Task.objects.get(pk=request.task_id).status == TaskStatus.CANCELLED


# --- passwords ----------------------------------------------------------------------------------


def test_it_keeps_each_new_password_in_a_file_only_its_owner_reads(var_dir: Path) -> None:
    out = seed()
    path = var_dir / "demo-users.txt"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    passwords = read_passwords()
    assert set(passwords) == set(DEMO_USERS)
    for username, password in passwords.items():
        assert User.objects.get(username=username).check_password(password)
        assert f"password: {password}" in out


def test_it_keeps_no_password_file_in_production_mode(var_dir: Path, settings: Any) -> None:
    settings.PRODUCTION = True
    out = seed()
    assert out.count("password:") == len(DEMO_USERS)
    assert not (var_dir / "demo-users.txt").exists()


def test_demo_users_shows_each_password_or_how_to_reset_it(var_dir: Path) -> None:
    seed()
    passwords = read_passwords()
    oncall = User.objects.get(username="oncall")
    oncall.set_password("changed-in-the-admin")
    oncall.save()
    out = demo_users()
    assert f"editor   password: {passwords['editor']}" in out
    assert f"admin    password: {passwords['admin']}" in out
    assert passwords["oncall"] not in out
    assert "oncall   password unknown: reset it with manage.py demo_users --reset oncall" in out


def test_demo_users_reset_gives_a_new_password_and_files_it(var_dir: Path) -> None:
    seed()
    before = read_passwords()
    out = demo_users("--reset", "oncall")
    after = read_passwords()
    oncall = User.objects.get(username="oncall")
    assert after["oncall"] != before["oncall"]
    assert oncall.check_password(after["oncall"])
    assert not oncall.check_password(before["oncall"])
    assert f"password: {after['oncall']}" in out
    assert {k: v for k, v in after.items() if k != "oncall"} == {
        k: v for k, v in before.items() if k != "oncall"
    }
    assert stat.S_IMODE((var_dir / "demo-users.txt").stat().st_mode) == 0o600


def test_demo_users_reset_refuses_a_name_that_is_not_a_demo_user(var_dir: Path) -> None:
    with pytest.raises(CommandError, match="invalid choice"):
        demo_users("--reset", "mallory")


def test_demo_users_refuses_in_production_mode(var_dir: Path, settings: Any) -> None:
    seed()
    settings.PRODUCTION = True
    with pytest.raises(CommandError, match="production"):
        demo_users()
    with pytest.raises(CommandError, match="production"):
        demo_users("--reset", "admin")
    assert User.objects.get(username="admin").check_password(read_passwords()["admin"])


# --- waiting for the web server -------------------------------------------------------------


@pytest.fixture
def answering_url() -> Iterator[str]:
    """A server that answers every request with 501 (no handler): an answer all the same."""
    server = http.server.HTTPServer(("127.0.0.1", 0), http.server.BaseHTTPRequestHandler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/accounts/login/"
    finally:
        server.shutdown()
        server.server_close()


def test_waiting_ends_when_the_server_answers_with_any_status(answering_url: str) -> None:
    assert wait_for(answering_url, timeout=5)


def test_waiting_gives_up_at_its_deadline() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    # Nothing listens on the port now: the first refusal is past a deadline of zero.
    assert not wait_for(f"http://127.0.0.1:{port}/", timeout=0)


def test_the_demo_seed_creates_users_in_their_groups_and_tasks_once(
    capsys: pytest.CaptureFixture[str],
) -> None:
    ensure_groups()  # a transactional test before this one may have flushed them
    call_command("seed_demo")
    first = capsys.readouterr().out
    call_command("seed_demo")
    second = capsys.readouterr().out
    assert first.count("password:") == len(DEMO_USERS)
    assert "password:" not in second
    assert User.objects.get(username="oncall").groups.filter(name="oncall").exists()
    assert User.objects.get(username="auditor").groups.filter(name="auditors").exists()
    assert User.objects.get(username="admin").is_superuser
    # Two editors for a press release's quorum, a senior one for its escalation, each with
    # an address for the demo's mail.
    senior = User.objects.get(username="senior")
    assert senior.groups.filter(name="senior_editors").exists()
    assert User.objects.get(username="editor2").groups.filter(name="editors").exists()
    assert senior.email == demo_address("senior")
    seeded = len(seed_demo.DEMO_TASKS) + len(seed_demo.DEAD_LETTERS) + len(seed_demo.HISTORY)
    demo = Task.objects.filter(idempotency_key__startswith="demo:")
    fixed = demo.exclude(idempotency_key__startswith=seed_demo.FRESH_PREFIX)
    assert fixed.count() == seeded
    assert demo.count() == seeded + 2 * len(seed_demo.FRESH_BATCH)
    # An article waits for the demo editor, who is allowed to decide on it.
    editor = User.objects.get(username="editor")
    assert editor.groups.filter(name="editors").exists()
    waiting = Task.objects.get(idempotency_key="demo:publish:article-001:v1")
    assert waiting.status == TaskStatus.WAITING_APPROVAL
    request = ApprovalRequest.objects.get(task=waiting, status=ApprovalStatus.PENDING)
    approvals.approve(request, actor=editor, draft_hash=request.draft_hash)
    assert waiting.steps.get(kind="publish").status == StepStatus.PENDING
    client = Client()
    password = first.split("admin")[1].split("password:")[1].split()[0]
    assert client.login(request=HttpRequest(), username="admin", password=password)
