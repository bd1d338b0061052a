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
from django.db.models.functions import Now
from django.test import Client
from django.urls import reverse

from approvals import services as approvals
from approvals.models import ApprovalRequest, ApprovalStatus
from approvals.steps import approval_step, check_workflow
from tasks_app import services
from tasks_app.engine import runner
from tasks_app.exceptions import NotPermitted
from tasks_app.models import Event, EventKind, StepStatus, TaskStatus
from tasks_app.workflows import StepContext, StepSpec, Workflow, register, registry
from tests.approval_support import advance, article, current, pending_request


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


def test_an_approval_step_that_cannot_open_is_dead_lettered_and_the_draft_stands(
    db: None, gated: Any, oncall: User
) -> None:
    broken = {"yes": True}

    def summary(ctx: StepContext) -> str:
        if broken["yes"]:
            raise KeyError("title")
        return "Finishes the test"

    gated(group="editors", summary=summary)
    task = advance(services.enqueue("test.gated", {}, idempotency_key="gated-1").task)

    review = current(task, "review")
    assert current(task, "draft").status == StepStatus.SUCCEEDED
    assert (review.status, review.error_class) == (StepStatus.DEAD, "builtins.KeyError")
    assert task.status == TaskStatus.DEAD
    assert not ApprovalRequest.objects.exists()
    dead = Event.objects.get(kind=EventKind.DEAD_LETTERED)
    assert (dead.step_id, dead.reason) == (review.pk, "permanent_error")

    # Once the cause is fixed, a redrive opens the request.
    broken["yes"] = False
    services.redrive(task, actor=oncall, reason="summary fixed")
    task.refresh_from_db()
    assert task.status == TaskStatus.WAITING_APPROVAL
    assert pending_request(task).step_id == review.pk
    assert [e.kind for e in Event.objects.for_task(task.pk)][-2:] == [
        EventKind.REDRIVEN,
        EventKind.APPROVAL_REQUESTED,
    ]


def test_an_approval_step_is_never_claimed_by_a_worker(db: None, gated: Any) -> None:
    gated(group="editors")
    task = advance(services.enqueue("test.gated", {}).task)
    review = current(task, "review")

    # A doorbell naming it (a stray or forged message) finds nothing to claim.
    assert not runner.run_claimed(review.pk)

    review.refresh_from_db()
    assert (review.status, review.fencing_token) == (StepStatus.WAITING_APPROVAL, 0)


@pytest.mark.no_fold_check  # the step is made pending by hand, without an event
def test_an_approval_step_claimed_all_the_same_is_dead_lettered_not_run(
    db: None, gated: Any
) -> None:
    gated(group="editors")
    task = advance(services.enqueue("test.gated", {}).task)
    review = current(task, "review")
    ApprovalRequest.objects.all().delete()
    type(review).objects.filter(pk=review.pk).update(status=StepStatus.PENDING, available_at=Now())

    assert runner.run_claimed(review.pk)

    review.refresh_from_db()
    assert (review.status, review.error_class) == (StepStatus.DEAD, "unexpected_claim")
    assert not ApprovalRequest.objects.exists()


def test_the_decide_command_lists_and_decides_as_a_user(
    db: None, editor: User, author: User
) -> None:
    task = advance(article(actor=author))
    request = pending_request(task)

    def listed(*args: str) -> list[int]:
        out = StringIO()
        call_command("decide", "list", "--json", *args, stdout=out)
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
        "--json",
        stdout=out,
    )
    assert json.loads(out.getvalue())["status"] == ApprovalStatus.APPROVED
    with pytest.raises(CommandError, match="is already decided: Approved by"):
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
