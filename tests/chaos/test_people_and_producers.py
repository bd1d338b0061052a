"""Drills 14, 15 and 16 with real processes: operators' commands racing each other, the
sweeper and the workers; editors deciding at once, and against expiry; producers
enqueueing one key at once. Each process waits at a barrier, so they are released
together; one action wins, and each action done is one event."""

from __future__ import annotations

import json
from collections import Counter
from datetime import timedelta

import pytest
from django.contrib.auth.models import User

from approvals.models import ApprovalRequest, ApprovalStatus
from tasks_app import services
from tasks_app.db.clock import db_now
from tasks_app.history import timeline
from tasks_app.models import Event, EventKind, Task, TaskStatus
from tests.approval_support import article, pending_request
from tests.chaos.harness import (
    Cluster,
    Record,
    Remotes,
    assert_nothing_lost_or_done_twice,
    at_once,
    wait_for_drain,
)
from tests.e2e_support import wait_for

pytestmark = [pytest.mark.chaos, pytest.mark.timeout(240)]

ENQUEUE = """
from tasks_app import services
from tasks_app.exceptions import IdempotencyConflict
try:
    result = services.enqueue("demo.noop", {payload}, idempotency_key="row16", actor="test:p")
    print("created" if result.created else "existing", result.task.pk)
except IdempotencyConflict:
    print("conflict")
"""


def test_row_16_producer_processes_enqueueing_one_key_at_once(
    cluster: Cluster, counting_remotes: Remotes, record_property: Record
) -> None:
    cluster.start(workers=1, concurrency=2)
    same, other = {"n": 1}, {"n": 2}
    scripts = [ENQUEUE.format(payload=json.dumps(same))] * 8
    scripts += [ENQUEUE.format(payload=json.dumps(other))] * 4

    outputs = at_once(cluster, scripts)

    [task] = Task.objects.filter(idempotency_key="row16")
    said = Counter(output.split()[0] for output in outputs)
    winners = [n for n, output in enumerate(outputs) if output.startswith("created")]
    assert len(winners) == 1, outputs
    won_with = same if winners[0] < 8 else other
    assert task.payload == won_with
    group = 8 if won_with is same else 4
    assert said == {"created": 1, "existing": group - 1, "conflict": 12 - group}
    assert {int(o.split()[1]) for o in outputs if not o.startswith("conflict")} == {task.pk}
    wait_for_drain([task.pk], cluster)
    # One enqueue in its history (its row's); the duplicates and conflicts wrote nothing.
    assert [entry.kind for entry in timeline.history(task.pk)].count("enqueued") == 1
    assert not Event.objects.filter(task_id=task.pk, kind=EventKind.ENQUEUED).exists()
    assert_nothing_lost_or_done_twice([task.pk], counting_remotes)
    record_property("answers", dict(said))


def _dead_letter(cluster: Cluster, key: str, **payload: object) -> Task:
    task = services.enqueue(
        "demo.flaky", {"fail_first": 3, **payload}, idempotency_key=key, actor="test:chaos"
    ).task
    wait_for_drain([task.pk], cluster)
    task.refresh_from_db()
    assert task.status == TaskStatus.DEAD
    return task


def _command(name: str, task: Task) -> str:
    return (
        "from django.core.management import call_command\n"
        f"call_command({name!r}, {str(task.pk)!r}, reason='drill 14', actor='oncall')\n"
    )


def test_row_14_a_redrive_clicked_six_times_at_once_while_the_sweeper_runs(
    cluster: Cluster, counting_remotes: Remotes, record_property: Record
) -> None:
    cluster.start(workers=1, concurrency=2)
    task = _dead_letter(cluster, "row14-redrive")

    at_once(cluster, [_command("redrive", task)] * 6)

    wait_for_drain([task.pk], cluster)
    task.refresh_from_db()
    assert task.status == TaskStatus.SUCCEEDED
    kinds = [entry.kind for entry in timeline.history(task.pk)]
    assert kinds.count(EventKind.REDRIVEN) == 1
    assert kinds.count(EventKind.CLAIMED) == 4  # three before the redrive, one after
    assert_nothing_lost_or_done_twice([task.pk], counting_remotes)


def test_row_14_cancels_racing_redrives_and_the_claim_that_follows(
    cluster: Cluster, counting_remotes: Remotes, record_property: Record
) -> None:
    cluster.start(workers=1, concurrency=2)
    task = _dead_letter(cluster, "row14-cancel", sleep=2)

    at_once(cluster, [_command("redrive", task), _command("cancel", task)] * 3)

    wait_for_drain([task.pk], cluster)
    task.refresh_from_db()
    # Cancelled whichever came first: a cancel refuses a later redrive, and a redriven
    # step that was claimed is asked to stop; its late result does not revive the task.
    assert task.status == TaskStatus.CANCELLED
    kinds = Counter(Event.objects.for_task(task.pk).values_list("kind", flat=True))
    assert kinds[EventKind.REDRIVEN] <= 1
    assert kinds[EventKind.CANCELLED] == 1
    assert_nothing_lost_or_done_twice([task.pk], counting_remotes)
    record_property("redriven_first", bool(kinds[EventKind.REDRIVEN]))


DECIDE = """
from django.contrib.auth.models import User
from approvals import services as approvals
from approvals.models import ApprovalRequest
request = ApprovalRequest.objects.get(pk={request})
editor = User.objects.get(username={editor!r})
try:
    approvals.{decision}(request, actor=editor, comment="drill 15", draft_hash=request.draft_hash)
    print("{decision}")
except Exception as exc:
    print("refused", type(exc).__name__)
"""


def _waiting_for_review(cluster: Cluster, key: str) -> tuple[Task, ApprovalRequest]:
    cluster.start(workers=1, concurrency=2)
    task = article(key=key)
    wait_for(
        lambda: ApprovalRequest.objects.filter(task=task, status=ApprovalStatus.PENDING).first(),
        timeout=60,
        what=lambda: "the draft to wait for review\n" + cluster.tails(),
    )
    return task, pending_request(task)


def _decision(request: ApprovalRequest, editor: User, decision: str) -> str:
    return DECIDE.format(request=request.pk, editor=editor.username, decision=decision)


def test_row_15_editors_approving_and_rejecting_at_once(
    cluster: Cluster,
    counting_remotes: Remotes,
    record_property: Record,
    editor: User,
    other_editor: User,
) -> None:
    task, request = _waiting_for_review(cluster, "row15-decide")

    answers = at_once(
        cluster,
        [_decision(request, editor, "approve")] * 3
        + [_decision(request, other_editor, "reject")] * 3,
    )

    decided = [answer for answer in answers if not answer.startswith("refused")]
    assert len(decided) == 1, answers
    request.refresh_from_db()
    assert request.status == {"approve": "approved", "reject": "rejected"}[decided[0]]
    wait_for_drain([task.pk], cluster)
    task.refresh_from_db()
    assert task.status == (
        TaskStatus.SUCCEEDED if decided[0] == "approve" else TaskStatus.CANCELLED
    )
    kinds = Counter(Event.objects.for_task(task.pk).values_list("kind", flat=True))
    assert kinds[EventKind.APPROVED] + kinds[EventKind.REJECTED] == 1
    publishing, _ = counting_remotes
    assert len(publishing.applied) == (1 if decided[0] == "approve" else 0)
    assert_nothing_lost_or_done_twice([task.pk], counting_remotes)
    record_property("decided", decided[0])


def test_row_15_a_decision_racing_the_sweepers_expiry(
    cluster: Cluster, counting_remotes: Remotes, record_property: Record, editor: User
) -> None:
    task, request = _waiting_for_review(cluster, "row15-expiry")
    assert cluster.beat is not None
    cluster.beat.stop()  # the sweepers below are the only ones
    ApprovalRequest.objects.filter(pk=request.pk).update(expires_at=db_now() - timedelta(minutes=1))
    sweep = "from django.core.management import call_command\ncall_command('sweep')\n"

    answers = at_once(cluster, [_decision(request, editor, "approve")] * 3 + [sweep] * 3)

    request.refresh_from_db()
    approved = answers.count("approve")
    assert approved <= 1, answers
    expired_by = "a racing sweep"
    if request.status == ApprovalStatus.PENDING and not approved:
        # Each sweep found the task held by a decider and left it for the next sweep, as
        # the sweeper leaves every row someone holds (approvals.deadlines.expire_due):
        # beat's next sweep, stopped here, is this one.
        services.sweep()
        request.refresh_from_db()
        expired_by = "the next sweep"
    assert request.status == (ApprovalStatus.APPROVED if approved else ApprovalStatus.EXPIRED)
    wait_for_drain([task.pk], cluster)
    task.refresh_from_db()
    # publish_article dead-letters an expired review for on-call.
    assert task.status == (TaskStatus.SUCCEEDED if approved else TaskStatus.DEAD)
    kinds = Counter(Event.objects.for_task(task.pk).values_list("kind", flat=True))
    assert kinds[EventKind.APPROVED] + kinds[EventKind.APPROVAL_EXPIRED] == 1
    assert_nothing_lost_or_done_twice(
        [task.pk], counting_remotes, dead_as=[EventKind.APPROVAL_EXPIRED]
    )
    record_property("won", "approval" if approved else f"expiry, by {expired_by}")
