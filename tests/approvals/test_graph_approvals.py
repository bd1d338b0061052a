"""An approval step in one branch of a graph: the other branches run on while it waits; the
decision lets the join go on; a request for changes sends back that branch alone."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from django.contrib.auth.models import User

from approvals import services as approvals
from approvals.models import ApprovalRequest, ApprovalStatus
from tasks_app.models import Step, StepStatus, TaskStatus
from tasks_app.observability.invariants import check
from tasks_app.workflows import Workflow
from tests.graph_support import (
    Remote,
    enqueue,
    registered,
    reviewed_translations,
    run,
    statuses,
    step_of,
)


@pytest.fixture
def remote(db: None) -> Iterator[Remote]:
    made = Remote()
    with registered(reviewed_translations("test.graph.translations", made)):
        yield made


def _request(task_id: int) -> ApprovalRequest:
    return ApprovalRequest.objects.get(task_id=task_id, status=ApprovalStatus.PENDING)


def _clean() -> None:
    report = check(since=None)
    assert report.findings == [], [str(finding) for finding in report.findings]


def test_an_approval_in_one_branch_lets_the_other_run_and_the_join_waits_for_it(
    remote: Remote, editor: User
) -> None:
    task = enqueue(registered_flow())
    run(task, "start")
    run(task, "draft_fr")
    assert statuses(task)["review_fr"] == StepStatus.WAITING_APPROVAL
    task.refresh_from_db()
    assert task.status == TaskStatus.WAITING_APPROVAL
    # The other branch runs while the editor has not decided.
    run(task, "draft_en")
    assert statuses(task)["publish"] == StepStatus.BLOCKED

    approvals.approve(_request(task.pk), actor=editor)
    assert statuses(task)["publish"] == StepStatus.PENDING
    run(task, "publish")
    task.refresh_from_db()
    assert task.status == TaskStatus.SUCCEEDED
    assert set(remote.seen["publish"]) == {"start", "draft_en", "draft_fr", "review_fr"}
    _clean()


def test_changes_requested_send_back_the_branch_alone(remote: Remote, editor: User) -> None:
    task = enqueue(registered_flow())
    run(task, "start")
    run(task, "draft_en")
    run(task, "draft_fr")
    english = step_of(task, "draft_en")

    approvals.request_changes(_request(task.pk), actor=editor, comment="Too formal")
    superseded = set(
        Step.objects.filter(task=task, status=StepStatus.SUPERSEDED).values_list("kind", flat=True)
    )
    assert superseded == {"draft_fr", "review_fr"}
    assert step_of(task, "draft_en").pk == english.pk
    assert step_of(task, "draft_fr").revision == 1
    run(task, "draft_fr")
    approvals.approve(_request(task.pk), actor=editor)
    run(task, "publish")
    task.refresh_from_db()
    assert task.status == TaskStatus.SUCCEEDED
    assert (remote.writes_of("draft_en"), remote.writes_of("draft_fr")) == (1, 2)
    _clean()


def registered_flow() -> Workflow:
    from tasks_app.workflows import registry

    return registry.latest("test.graph.translations")
