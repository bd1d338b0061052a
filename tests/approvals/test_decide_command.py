"""``manage.py decide`` as people and programs read it: aligned lines by default, JSON
Lines with ``--json``, and a refusal as one line (exit status 2) with nothing changed."""

from __future__ import annotations

import json

from django.contrib.auth.models import User

from approvals.models import ApprovalStatus
from tests.approval_support import advance, article, pending_request
from tests.command_support import lines, refused, run


def test_decide_list_prints_an_aligned_table_of_the_pending_requests(
    db: None, editor: User
) -> None:
    request = pending_request(advance(article()))

    header, row = lines(run("decide", "list"))

    assert header.split() == [
        "id", "task", "workflow", "rev", "status", "approvals", "expires", "decided", "by",
        "summary",
    ]  # fmt: skip
    assert row.split()[:8] == [
        str(request.pk), str(request.task_id), "publish_article", "0", "pending", "0", "of", "1",
    ]  # fmt: skip
    assert row[header.index("summary") :] == " ".join(request.summary.split())
    assert row[header.index("decided by") :].startswith("-  ")
    assert "{" not in row


def test_decide_list_says_so_when_nothing_waits(db: None) -> None:
    assert lines(run("decide", "list")) == ["No pending approval requests."]


def test_decide_list_as_json_is_one_object_per_line(db: None) -> None:
    first = pending_request(advance(article(key="publish:a:v1")))
    second = pending_request(advance(article(key="publish:b:v1")))

    printed = [json.loads(text) for text in lines(run("decide", "list", "--json"))]

    assert sorted(row["id"] for row in printed) == sorted([first.pk, second.pk])
    assert {row["status"] for row in printed} == {"pending"}


def test_a_decision_prints_the_request_as_a_line(db: None, editor: User) -> None:
    request = pending_request(advance(article()))

    out = lines(run("decide", "approve", str(request.pk), "--user", editor.username))

    assert out[1].split()[4] == ApprovalStatus.APPROVED
    assert editor.username in out[1]


def test_decide_refuses_in_one_line_and_changes_nothing(db: None, editor: User) -> None:
    request = pending_request(advance(article()))

    assert refused("decide", "reject", str(request.pk), "--user", editor.username) == (
        "comment: is required and may not be empty"
    )
    assert refused("decide", "approve", "999999", "--user", editor.username) == (
        "request: no approval request #999999"
    )
    assert refused("decide", "approve", "x", "--user", editor.username).startswith(
        "argument ID: 'x' is not"
    )
    assert refused("decide", "list", "--user", "nobody") == "user: no user named 'nobody'"
    request.refresh_from_db()
    assert request.status == ApprovalStatus.PENDING
