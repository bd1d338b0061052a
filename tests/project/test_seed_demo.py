"""The demo seed of `make run` and the demo users' passwords: what the seed leaves, read from
one seed per module (tests/seed_support.py's ``seeded``), and a second run on top of it.
The first run on an empty database: tests/project/test_seed_demo_first_run.py."""

from __future__ import annotations

import http.server
import shutil
import socket
import stat
import threading
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.core.management import CommandError
from django.db.models.functions import TruncMinute

from approvals import services as approvals
from approvals.models import ApprovalRequest, ApprovalStatus
from tasks_app import services
from tasks_app.engine import fastpath, limited_claims, runner
from tasks_app.engine.leases import Claim
from tasks_app.engine.limit_standing import AT_CONCURRENCY, AT_RATE
from tasks_app.management.commands import seed_demo
from tasks_app.management.commands.demo_users import read_passwords, wait_for
from tasks_app.models import Event, EventKind, LimitKey, Step, StepStatus, Task, TaskStatus
from tasks_app.operations import limit_use
from tests.seed_support import demo_users, seed
from tests.seed_support import seeded as seeded  # a fixture, for pytest to find
from tests.seed_support import var_dir as var_dir  # a fixture, for pytest to find

pytestmark = pytest.mark.django_db


@pytest.fixture
def demo(seeded: Path, var_dir: Path) -> Path:
    """The demo as a first seed leaves it (seeded once for the module), with the password
    file it wrote copied into this test's ``VAR_DIR``, which the test may change."""
    shutil.copy2(seeded, var_dir / seeded.name)
    return var_dir


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
    demo: Path, error_class: str, reason: str
) -> None:
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


def test_its_dead_letters_recover_the_way_the_console_offers(demo: Path) -> None:
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


def test_it_leaves_an_article_at_revision_1_waiting_for_an_editor(demo: Path) -> None:
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


def test_it_leaves_an_hour_of_finished_work(demo: Path) -> None:
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


def test_it_leaves_tasks_pending_for_the_worker(demo: Path) -> None:
    pending = set(
        Task.objects.filter(status=TaskStatus.PENDING).values_list("idempotency_key", flat=True)
    )
    assert {"demo:noop:1", "demo:noop:2", "demo:reply:T-1001"} <= pending


def test_it_leaves_summaries_waiting_under_each_demo_limit(demo: Path) -> None:
    steps = Step.objects.filter(task__workflow="demo.llm_summary", status=StepStatus.PENDING)
    assert steps.count() == len(seed_demo.SUMMARIES) == 12
    under = {
        (name, key)
        for entries in steps.values_list("limits", flat=True)
        for name, key, _ in entries or ()
    }
    assert under == {("demo_llm", "")} | {
        ("demo_customer", customer) for customer in seed_demo.SUMMARY_CUSTOMERS
    }
    waiting = {use.name: use.waiting for use in limit_use.uses()}
    assert waiting["demo_llm"] == waiting["demo_customer"] == 12


def claim_summaries() -> list[Claim]:
    """What a worker takes of the due steps under limits (the summaries, here)."""
    return limited_claims.claim(
        queue="default", worker_id="w-demo", limit=50, lease_seconds=60
    ).claims


def why_a_summary_waits() -> tuple[str, str] | None:
    """What holds the first waiting summary back, and under which limit."""
    step = Step.objects.filter(task__workflow="demo.llm_summary", status=StepStatus.PENDING).first()
    held = limit_use.holding(step.limits or []) if step is not None else None
    return (held.why, held.limit) if held is not None else None


def test_its_summaries_wait_for_their_customer_then_for_the_rate(demo: Path) -> None:
    first = claim_summaries()
    # One per customer runs; each customer's next waits for it.
    running = Step.objects.filter(pk__in=[c.step_id for c in first])
    customers = [
        key
        for entries in running.values_list("limits", flat=True)
        for name, key, _ in entries or ()
        if name == "demo_customer"
    ]
    assert sorted(customers) == sorted(seed_demo.SUMMARY_CUSTOMERS)
    assert why_a_summary_waits() == (AT_CONCURRENCY, "demo_customer")
    fastpath.complete_many([(c, {}) for c in first])
    second = claim_summaries()
    fastpath.complete_many([(c, {}) for c in second])
    # Six calls made this minute: the other six wait for the model's rate.
    assert (len(second), claim_summaries()) == (3, [])
    assert why_a_summary_waits() == (AT_RATE, "demo_llm")


def test_a_summary_the_model_answers_429_holds_its_limits_keys(demo: Path) -> None:
    task = Task.objects.get(idempotency_key="demo:summary:globex:1")
    step = task.steps.get()
    assert runner.run_claimed(step.pk)
    step.refresh_from_db()
    assert (step.status, step.error_class) == (
        StepStatus.PENDING,
        "tasks_app.exceptions.RateLimited",
    )
    keys = LimitKey.objects.filter(held_until__isnull=False)
    assert set(keys.values_list("limit", "key")) == {("demo_llm", ""), ("demo_customer", "globex")}


def fixed_tasks() -> dict[int, str]:
    fixed = Task.objects.exclude(idempotency_key__startswith=seed_demo.FRESH_PREFIX)
    return dict(fixed.values_list("pk", "status"))


def test_a_second_run_adds_a_fresh_batch_and_nothing_else(demo: Path) -> None:
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


def test_a_second_run_leaves_a_decision_made_in_the_console_alone(demo: Path) -> None:
    request = ApprovalRequest.objects.get(status=ApprovalStatus.PENDING, revision=1)
    approvals.reject(request, actor="cli:someone", comment="not this week")
    seed()
    assert not ApprovalRequest.objects.filter(task=request.task, revision__gte=2).exists()
    assert Task.objects.get(pk=request.task_id).status == TaskStatus.CANCELLED


# --- passwords ----------------------------------------------------------------------------------


def test_demo_users_shows_each_password_or_how_to_reset_it(demo: Path) -> None:
    passwords = read_passwords()
    oncall = User.objects.get(username="oncall")
    oncall.set_password("changed-in-the-admin")
    oncall.save()
    out = demo_users()
    assert f"editor   password: {passwords['editor']}" in out
    assert f"admin    password: {passwords['admin']}" in out
    assert passwords["oncall"] not in out
    assert "oncall   password unknown: reset it with manage.py demo_users --reset oncall" in out


def test_demo_users_reset_gives_a_new_password_and_files_it(demo: Path) -> None:
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
    assert stat.S_IMODE((demo / "demo-users.txt").stat().st_mode) == 0o600


def test_demo_users_reset_refuses_a_name_that_is_not_a_demo_user(var_dir: Path) -> None:
    with pytest.raises(CommandError, match="invalid choice"):
        demo_users("--reset", "mallory")


def test_demo_users_refuses_in_production_mode(demo: Path, settings: Any) -> None:
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
