"""Declaring approval steps, and the paths of a parking step that are not the happy one."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import timedelta
from io import StringIO
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.core.management import CommandError, call_command
from django.test import Client
from django.urls import reverse

from approvals import services as approvals
from approvals.models import ApprovalRequest, ApprovalStatus
from approvals.steps import approval_step, check_workflow
from tasks_app import runner, services
from tasks_app.exceptions import NotPermitted
from tasks_app.models import Event, EventKind, StepStatus, TaskStatus
from tasks_app.workflows import StepContext, StepSpec, Workflow, register, registry
from tests.approval_support import advance, article, current, pending_request
from tests.conftest import backdate


def _draft(ctx: StepContext) -> dict[str, Any]:
    return {"text": ctx.payload.get("text", "draft")}


def _done(ctx: StepContext) -> dict[str, Any]:
    return {"done": True}


@pytest.fixture
def gated(request: pytest.FixtureRequest) -> Iterator[Any]:
    """Register a workflow ``test.gated`` (draft -> review -> done) built from options."""

    def build(**options: Any) -> Workflow:
        review = approval_step(
            "review",
            draft_from="draft",
            action="finish",
            summary=options.pop("summary", "Finishes the test"),
            expires_after=timedelta(hours=1),
            on_expiry="cancel",
            **options,
        )
        flow = Workflow(
            "test.gated",
            1,
            steps=(StepSpec("draft", _draft), review, StepSpec("done", _done)),
        )
        return register(check_workflow(flow))

    yield build
    registry.unregister("test.gated", 1)


def test_an_approval_step_must_name_earlier_steps() -> None:
    review = approval_step(
        "review",
        draft_from="later",
        action="a",
        summary="s",
        expires_after=timedelta(hours=1),
        on_expiry="cancel",
    )
    with pytest.raises(ValueError, match=r"review\.draft_from names 'later'"):
        check_workflow(Workflow("test.bad", 1, steps=(review, StepSpec("later", _draft))))


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"on_expiry": "ignore", "expires_after": timedelta(hours=1)}, "on_expiry"),
        ({"on_expiry": "cancel", "expires_after": timedelta(0)}, "expires_after"),
    ],
)
def test_an_approval_step_refuses_bad_options(options: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        approval_step("review", draft_from="draft", action="a", summary="s", **options)


def test_without_the_decide_permission_even_an_open_approver_list_refuses(
    db: None, gated: Any, outsider: User
) -> None:
    gated()  # no group, no users: anyone with the permission
    task = advance(services.enqueue("test.gated", {}, actor="cli:producer").task)
    request = pending_request(task)

    with pytest.raises(NotPermitted, match="decide permission"):
        approvals.approve(request, actor=outsider)
    assert pending_request(task) == request


def test_an_approval_step_returning_a_plain_result_is_dead_lettered(db: None) -> None:
    register(
        Workflow(
            "test.waved",
            1,
            steps=(
                StepSpec("draft", _draft),
                StepSpec("review", lambda ctx: {"ok": True}, approval=True),
                StepSpec("done", _done),
            ),
        )
    )
    try:
        task = advance(services.enqueue("test.waved", {}).task)
    finally:
        registry.unregister("test.waved", 1)

    review = current(task, "review")
    assert (review.status, review.error_class, review.result) == (
        StepStatus.DEAD,
        "invalid_result",
        None,
    )
    assert current(task, "done").status == StepStatus.BLOCKED
    assert task.status == TaskStatus.DEAD


def test_an_approver_list_of_users_admits_only_them(
    db: None, gated: Any, editor: User, other_editor: User
) -> None:
    gated(users=[other_editor.username])
    task = advance(services.enqueue("test.gated", {}, actor="cli:producer").task)
    request = pending_request(task)
    assert (request.approver_group, request.approver_users) == ("", [other_editor.username])

    with pytest.raises(NotPermitted, match=other_editor.username):
        approvals.approve(request, actor=editor)
    approvals.approve(request, actor=other_editor)

    assert advance(task).status == TaskStatus.SUCCEEDED


def test_a_cancel_while_the_approval_step_runs_opens_no_request(
    db: None, gated: Any, oncall: User
) -> None:
    def cancel_meanwhile(ctx: StepContext) -> str:
        # Runs inside the approval step's handler, as a person cancelling at that moment.
        task = services.get_task(idempotency_key="gated-1")
        assert task is not None
        services.cancel(task, actor=oncall, reason="withdrawn")
        return "Finishes the test"

    gated(group="editors", summary=cancel_meanwhile)
    task = advance(services.enqueue("test.gated", {}, idempotency_key="gated-1").task)

    assert task.status == TaskStatus.CANCELLED
    assert current(task, "review").status == StepStatus.CANCELLED
    assert not ApprovalRequest.objects.exists()
    assert not Event.objects.filter(kind=EventKind.APPROVAL_REQUESTED).exists()


def test_a_stale_approval_claim_opens_no_request(db: None, gated: Any) -> None:
    gated(group="editors")
    task = services.enqueue("test.gated", {}).task
    assert runner.run_claimed(current(task, "draft").pk)
    review = current(task, "review")
    slow = services.claim_step(review.pk, worker_id="slow")
    backdate(review)  # the slow worker's lease runs out ...
    assert services.sweep().reaped == 1
    fast = services.claim_step(review.pk, worker_id="fast")  # ... and another claims it
    assert slow is not None and fast is not None

    runner.run_batch([slow])  # the slow handler finishes late

    assert not ApprovalRequest.objects.exists()
    stale = Event.objects.get(kind=EventKind.STALE_WRITE_REJECTED, step_id=review.pk)
    assert (stale.data["operation"], stale.data["token"]) == ("await_decision", slow.token)

    runner.run_batch([fast])

    assert pending_request(task).step_id == review.pk
    task.refresh_from_db()
    assert task.status == TaskStatus.WAITING_APPROVAL


def test_the_decide_command_lists_and_decides_as_a_user(
    db: None, editor: User, author: User
) -> None:
    task = advance(article(actor=author))
    request = pending_request(task)

    def listed(*args: str) -> list[int]:
        out = StringIO()
        call_command("decide", "list", *args, stdout=out)
        return [json.loads(line)["id"] for line in out.getvalue().splitlines()]

    assert listed() == [request.pk]
    assert listed("--user", editor.username) == [request.pk]
    assert listed("--user", author.username) == []  # their own task
    with pytest.raises(CommandError, match="comment"):
        call_command("decide", "reject", str(request.pk), "--user", editor.username)
    with pytest.raises(CommandError, match="enqueued"):
        call_command("decide", "approve", str(request.pk), "--user", author.username)
    out = StringIO()
    call_command(
        "decide",
        "approve",
        str(request.pk),
        "--user",
        editor.username,
        "--comment",
        "ok",
        stdout=out,
    )
    assert json.loads(out.getvalue())["status"] == ApprovalStatus.APPROVED
    with pytest.raises(CommandError, match="already approved by"):
        call_command(
            "decide", "reject", str(request.pk), "--user", editor.username, "--comment", "x"
        )
    with pytest.raises(CommandError, match="no user named"):
        call_command("decide", "list", "--user", "nobody")


def test_the_admin_shows_requests_and_changes_nothing(db: None, superuser: User) -> None:
    task = advance(article())
    request = pending_request(task)
    client = Client()
    client.force_login(superuser)

    page = client.get(reverse("admin:approvals_approvalrequest_change", args=[request.pk]))

    assert page.status_code == 200
    assert request.draft_hash in page.content.decode()
    assert client.get(reverse("admin:approvals_approvalrequest_add")).status_code == 403
