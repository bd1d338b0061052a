"""The queues, the approval requests and the audit log as the API reads them: what the
console's pages show, drafts and reasons redacted, the log with the page's filters."""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib.auth.models import User

from approvals import services as approval_services
from approvals.models import ApprovalRequest
from tasks_app import services
from tasks_app.models import EventKind
from tests.api_support import call, conforms, token_for
from tests.factories import dead_task, noop, pending_article_request

pytestmark = pytest.mark.django_db

QUEUES = "/api/v1/queues/"
APPROVALS = "/api/v1/approvals/"
APPROVAL = "/api/v1/approvals/{approval_id}"
AUDIT = "/api/v1/audit/"


def read(secret: str, path: str, template: str) -> Any:
    answer = call("GET", path, secret)
    assert answer.status_code == 200, answer.content
    return conforms(answer, "GET", template)


# --- queues -----------------------------------------------------------------------------------


def test_each_queue_says_whether_it_runs_and_how_deep_it_is(oncall: User, settings: Any) -> None:
    settings.TASKS_QUEUES = ["default", "bulk"]
    noop()
    services.pause_queue("bulk", actor=oncall, reason="deploy; password=hunter2")
    answer = call("GET", QUEUES, token_for(oncall, "oncall"))
    assert answer.status_code == 200
    assert "hunter2" not in answer.content.decode()
    default, bulk = conforms(answer, "GET", QUEUES)["items"]
    assert (default["name"], default["paused"], default["due"]) == ("default", False, 1)
    assert default["paused_by"] is default["paused_reason"] is default["paused_at"] is None
    assert default["oldest_due_age_seconds"] >= 0
    assert (bulk["name"], bulk["paused"], bulk["due"]) == ("bulk", True, 0)
    assert bulk["paused_by"] == oncall.username
    assert bulk["paused_reason"].startswith("deploy; password=")
    assert bulk["paused_at"] is not None
    assert bulk["oldest_due_age_seconds"] is None


def test_a_resumed_queue_shows_no_pause(oncall: User, settings: Any) -> None:
    settings.TASKS_QUEUES = ["default", "bulk"]
    services.pause_queue("bulk", actor=oncall, reason="deploy")
    services.resume_queue("bulk", actor=oncall, reason="deployed")
    bulk = read(token_for(oncall, "oncall"), QUEUES, QUEUES)["items"][1]
    assert (bulk["paused"], bulk["paused_by"], bulk["paused_reason"]) == (False, None, None)


# --- approvals --------------------------------------------------------------------------------


def test_a_waiting_request_is_listed_with_who_may_decide_and_its_draft_redacted(
    editor: User,
) -> None:
    request = pending_article_request()
    ApprovalRequest.objects.filter(pk=request.pk).update(
        draft={"title": "Launch day", "api_token": "tok-5ecret"}
    )
    answer = call("GET", APPROVALS, token_for(editor, "editors"))
    assert answer.status_code == 200
    assert "tok-5ecret" not in answer.content.decode()
    (listed,) = conforms(answer, "GET", APPROVALS)["items"]
    assert listed["id"] == request.pk
    assert listed["task_id"] == request.task_id
    assert listed["step_kind"] == "editor_review"
    assert listed["status"] == "pending"
    assert listed["groups"] == ["editors"]
    assert (listed["quorum"], listed["approvals"]) == (1, 0)
    assert listed["draft"] == {"title": "Launch day", "api_token": "•••redacted•••"}
    assert listed["draft_hash"] == request.draft_hash
    assert listed["expires_at"] > listed["requested_at"]
    assert listed["url"].endswith(f"/approvals/{request.pk}/")


def test_a_decided_request_leaves_the_list_and_reads_whole_with_its_decision(
    editor: User,
) -> None:
    request = pending_article_request()
    approval_services.approve(
        request, actor=editor, comment="Fine; token=abc-5ecret", draft_hash=request.draft_hash
    )
    secret = token_for(editor, "editors")
    assert read(secret, APPROVALS, APPROVALS)["items"] == []
    answer = call("GET", f"{APPROVALS}{request.pk}", secret)
    assert "abc-5ecret" not in answer.content.decode()
    decided = conforms(answer, "GET", APPROVAL)
    assert (decided["id"], decided["status"]) == (request.pk, "approved")
    assert decided["decided_by"] == editor.username
    assert decided["decided_at"] is not None
    assert decided["comment"].startswith("Fine; token=")
    assert decided["approvals"] == 1


def test_a_waiting_request_has_no_decision_yet(editor: User) -> None:
    request = pending_article_request()
    waiting = read(token_for(editor, "editors"), f"{APPROVALS}{request.pk}", APPROVAL)
    assert (waiting["decided_by"], waiting["decided_at"], waiting["comment"]) == (None, None, "")


# --- audit log --------------------------------------------------------------------------------


def test_the_log_lists_actions_newest_first_with_reasons_redacted(
    oncall: User, auditor: User
) -> None:
    first, second = dead_task(), dead_task()
    services.cancel(first, actor=oncall, reason="duplicate")
    services.cancel(second, actor=oncall, reason="leaked session_id=sess-5ecret, giving up")
    secret = token_for(auditor, "auditors")
    answer = call("GET", f"{AUDIT}?kind={EventKind.CANCELLED}", secret)
    assert answer.status_code == 200
    assert "sess-5ecret" not in answer.content.decode()
    entries = conforms(answer, "GET", AUDIT)["items"]
    assert [e["task_id"] for e in entries] == [second.pk, first.pk]
    assert entries[0]["reason"] == "leaked session_id=•••redacted•••, giving up"
    assert entries[0]["actor"] == oncall.username
    assert entries[0]["label"] and entries[0]["chain_hash"]


def test_the_logs_filters_are_the_pages(oncall: User, auditor: User) -> None:
    task = dead_task()
    services.cancel(task, actor=oncall, reason="duplicate")
    secret = token_for(auditor, "auditors")
    by_actor = read(secret, f"{AUDIT}?actor=OLIVIA", AUDIT)["items"]
    assert [(e["kind"], e["task_id"]) for e in by_actor] == [("cancelled", task.pk)]
    assert read(secret, f"{AUDIT}?actor=nobody", AUDIT)["items"] == []
    history = read(secret, f"{AUDIT}?task={task.pk}", AUDIT)["items"]
    kinds = [e["kind"] for e in history]
    assert kinds[0] == "cancelled" and kinds[-1] == "enqueued"
    # The enqueue is read from the task's row: named by its export id, outside the chain.
    enqueued = history[-1]
    assert (enqueued["id"], enqueued["chain_hash"]) == (f"enqueued:{task.pk}", None)


def test_the_log_pages_by_after(oncall: User, auditor: User, settings: Any) -> None:
    settings.CONSOLE_PAGE_SIZE = 1
    first, second = dead_task(), dead_task()
    services.cancel(first, actor=oncall, reason="one")
    services.cancel(second, actor=oncall, reason="two")
    secret = token_for(auditor, "auditors")
    page = read(secret, f"{AUDIT}?kind=cancelled", AUDIT)
    assert [e["task_id"] for e in page["items"]] == [second.pk]
    rest = read(secret, f"{AUDIT}?kind=cancelled&after={page['next_after']}", AUDIT)
    assert [e["task_id"] for e in rest["items"]] == [first.pk]
    assert rest["next_after"] is None
