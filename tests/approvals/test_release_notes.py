"""The shipped graph workflow, ``release_notes``: a fan-out per language and an editor's
review run side by side; ``publish`` joins them and publishes once, against the publishing
remote (a fake on loopback)."""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib.auth.models import User

from approvals import services as approvals
from tasks_app import services
from tasks_app.exceptions import InvalidPayload
from tasks_app.models import Step, StepStatus, TaskStatus
from tasks_app.observability.invariants import check
from tests.approval_support import advance, pending_request
from tests.remotes import LoopbackRemote

RELEASE = {"version": "2.1", "changes": ["Graphs", "Rewind"], "languages": ["de", "fr", "ja"]}


def test_translations_and_the_review_run_side_by_side_then_publish_joins_them_once(
    db: None, editor: User, remotes: tuple[LoopbackRemote, LoopbackRemote]
) -> None:
    publishing, _ = remotes
    task = advance(services.enqueue("release_notes", RELEASE, actor="cli:test").task)
    kinds = list(
        Step.objects.current()
        .filter(task=task)
        .order_by("position", "item")
        .values_list("kind", "status")
    )
    assert kinds == [
        ("collect", "succeeded"),
        ("translate", "succeeded"),
        ("translate", "succeeded"),
        ("translate", "succeeded"),
        ("draft_post", "succeeded"),
        ("review_post", "waiting_approval"),
        ("publish", "blocked"),
    ]
    assert task.status == TaskStatus.WAITING_APPROVAL
    request = pending_request(task)
    approvals.approve(request, actor=editor, draft_hash=request.draft_hash)
    task = advance(task)
    assert task.status == TaskStatus.SUCCEEDED
    [write] = publishing.applied
    body = write["body"]
    assert body["title"] == "Release 2.1"
    assert [t["language"] for t in body["translations"]] == ["de", "fr", "ja"]
    assert body["approved_by"] == editor.username
    assert check(since=None).findings == []


@pytest.mark.parametrize(
    ("payload", "field"),
    [
        ({**RELEASE, "languages": ["de", "de"]}, "payload.languages"),
        ({**RELEASE, "languages": ["german"]}, "payload.languages"),
        ({**RELEASE, "changes": []}, "payload.changes"),
        ({**RELEASE, "version": ""}, "payload.version"),
        ({**RELEASE, "extra": 1}, "payload.extra"),
    ],
)
def test_a_bad_release_is_refused_naming_the_field(
    db: None, payload: dict[str, Any], field: str
) -> None:
    with pytest.raises(InvalidPayload) as refused:
        services.enqueue("release_notes", payload)
    assert field in str(refused.value)
    assert not Step.objects.filter(status=StepStatus.PENDING).exists()
