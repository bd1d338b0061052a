"""A task as it stood after any point of its history (``tasks_app.history.as_of``, with the
draft and approvals of ``approvals.as_of``), and the difference of two points in words."""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib.auth.models import User

from approvals import as_of
from approvals import services as approvals
from approvals.models import ApprovalRequest, ApprovalStatus
from tasks_app.history import TaskState, fold_events
from tasks_app.history.as_of import ApprovalAsOf, Snapshot
from tasks_app.history.as_of_changes import value_lines
from tasks_app.models import Step, Task
from tests.approval_support import advance, article, pending_request, press_release
from tests.as_of_support import NEW, OLD, point_of, redriven_diamond, resolved_in_doubt

pytestmark = pytest.mark.django_db


@pytest.fixture
def diamond() -> Any:
    with redriven_diamond() as task:
        yield task


def after(task: Task, index: int) -> Snapshot:
    return as_of.state_after(as_of.read(task), index)


def step_pk(task: Task, kind: str, revision: int = 0) -> int:
    return Step.objects.get(task=task, kind=kind, revision=revision).pk


def statuses(snapshot: Snapshot) -> dict[str, str]:
    return {step.label: step.status for step in snapshot.steps}


# --- the payload --------------------------------------------------------------------------------


def test_the_payload_is_the_old_one_until_the_redrive_that_edited_it(diamond: Task) -> None:
    redriven = point_of(diamond, "redriven")
    record = as_of.read(diamond)
    assert as_of.state_after(record, 0).payload == OLD
    assert as_of.state_after(record, redriven - 1).payload == OLD
    assert as_of.state_after(record, redriven).payload == NEW
    assert as_of.state_after(record, len(record.entries) - 1).payload == NEW == diamond.payload


# --- statuses: the fold of the history up to the point ------------------------------------------


def test_each_points_steps_are_the_fold_of_the_history_up_to_it(diamond: Task) -> None:
    record = as_of.read(diamond)
    for index in range(len(record.entries)):
        folded = fold_events((entry.kind, entry.data) for entry in record.entries[: index + 1])
        snapshot = as_of.state_after(record, index)
        assert snapshot.status == folded.status, index
        assert {step.pk: (step.status, step.attempts, step.token) for step in snapshot.steps} == {
            pk: (state.status, state.attempts, state.fencing_token)
            for pk, state in folded.steps.items()
        }, index
    last = as_of.state_after(record, len(record.entries) - 1)
    assert TaskState(last.status, fold_events((e.kind, e.data) for e in record.entries).steps) == (
        TaskState.from_db(diamond)
    )


def test_a_point_shows_the_steps_as_the_task_went(diamond: Task) -> None:
    dead = point_of(diamond, "dead_lettered")
    assert after(diamond, 0).status == "pending"
    assert statuses(after(diamond, 0)) == {
        "start": "pending",
        "a": "blocked",
        "b": "blocked",
        "c": "blocked",
        "join": "blocked",
        "finish": "blocked",
    }
    at_death = after(diamond, dead)
    assert at_death.status == "dead"
    assert statuses(at_death) == {
        "start": "succeeded",
        "a": "succeeded",
        "b": "dead",
        "c": "succeeded",
        "join": "blocked",
        "finish": "blocked",
    }
    assert at_death.point.kind == "dead_lettered" and at_death.point.index == dead


def test_a_point_outside_the_history_is_refused(diamond: Task) -> None:
    record = as_of.read(diamond)
    with pytest.raises(IndexError):
        as_of.state_after(record, len(record.entries))
    with pytest.raises(IndexError):
        as_of.state_after(record, -1)


# --- attempts and external writes ---------------------------------------------------------------


def test_an_attempt_shows_from_its_claim_and_its_outcome_from_its_end(diamond: Task) -> None:
    b = step_pk(diamond, "b")
    claimed = point_of(diamond, "claimed", step=b)
    dead = point_of(diamond, "dead_lettered")

    def of_b(index: int) -> list[tuple[int, str]]:
        return [(a.token, a.shown) for a in after(diamond, index).attempts if a.step_id == b]

    assert of_b(claimed - 1) == []
    assert of_b(claimed) == [(1, "held")]
    assert of_b(dead) == [(1, "failed")]
    assert of_b(point_of(diamond, "claimed", step=b, nth=1)) == [(1, "failed"), (2, "held")]
    assert of_b(point_of(diamond, "succeeded", step=b)) == [(1, "failed"), (2, "succeeded")]


def test_an_external_write_shows_once_its_step_has_made_it(diamond: Task) -> None:
    a_done = point_of(diamond, "succeeded", step=step_pk(diamond, "a"))

    def effects(index: int) -> dict[str, str]:
        return {effect.key: effect.status for effect in after(diamond, index).effects}

    assert effects(0) == {}
    assert effects(a_done - 1) == {"k:0:start:write_start": "done"}
    assert effects(a_done) == {"k:0:start:write_start": "done", "k:1:a:write_a": "done"}
    # The dead branch's remote refused before writing; its write comes with the rerun.
    assert "k:2:b:write_b" not in effects(point_of(diamond, "redriven"))
    assert effects(-1 + len(as_of.read(diamond).entries))["k:2:b:write_b"] == "done"


def test_a_write_in_doubt_reads_started_until_on_call_marks_it_done() -> None:
    with resolved_in_doubt() as task:
        dead, resolved = point_of(task, "dead_lettered"), point_of(task, "resolved")
        record = as_of.read(task)
        at_death = as_of.state_after(record, dead)
        at_resolve = as_of.state_after(record, resolved)
        assert [(e.key, e.status) for e in at_death.effects] == [("mail:1:0:send:send", "started")]
        assert as_of.difference(at_death, at_resolve) == [
            "task: dead → succeeded",
            "step send: dead → succeeded",
            "effect mail:1:0:send:send: started → done",
        ]


# --- the difference in words --------------------------------------------------------------------


def test_the_difference_of_two_points_says_what_changed(diamond: Task) -> None:
    redriven = point_of(diamond, "redriven")
    record = as_of.read(diamond)
    before, then = as_of.state_after(record, redriven - 1), as_of.state_after(record, redriven)
    assert as_of.difference(before, then) == [
        "task: dead → pending",
        "step b: dead → pending, attempts 1 → 0",
        "payload.title: 'Old' → 'New'",
    ]
    rerun = as_of.state_after(record, point_of(diamond, "succeeded", step=step_pk(diamond, "b")))
    assert as_of.difference(then, rerun) == [
        "step b: pending → succeeded, attempts 0 → 1, token 1 → 2",
        "step join: blocked → pending",
        "attempt of b (token 2): (none) → succeeded",
        "effect k:2:b:write_b: (none) → done",
    ]
    assert as_of.difference(then, then) == []


def test_a_secret_is_said_to_have_changed_and_never_shown() -> None:
    old = {"api_token": "s3cr3t-one", "title": "A", "tags": ["x"]}
    new = {"api_token": "s3cr3t-two", "title": "A", "tags": ["x", "y"], "note": None}
    assert value_lines("payload", old, new) == [
        "payload.api_token: changed (a secret, not shown)",
        "payload.tags[1]: (none) → 'y'",
        "payload.note: (none) → null",
    ]
    lines = value_lines("draft", None, {"body": "x" * 200, "headers": {"authorization": "t"}})
    assert lines == ["draft: (none) → (a value holding a secret, not shown)"]
    assert "s3cr3t" not in " ".join(value_lines("payload", old, new))


# --- the draft and the approval requests ---------------------------------------------------------


def test_the_draft_and_requests_are_those_of_the_point(editor: User) -> None:
    task = advance(article())
    first = pending_request(task)
    approvals.request_changes(first, actor=editor, comment="Shorter, please")
    task = advance(task)
    second = pending_request(task)
    first.refresh_from_db()
    record = as_of.read(task)
    opened, sent_back = point_of(task, "approval_requested"), point_of(task, "changes_requested")
    reopened = point_of(task, "approval_requested", nth=1)

    assert as_of.state_after(record, opened - 1).approvals == ()
    assert as_of.state_after(record, opened - 1).draft == first.draft  # the draft came first
    assert as_of.state_after(record, opened).approvals == (
        ApprovalAsOf(first.pk, 0, ApprovalStatus.PENDING),
    )
    at_send_back = as_of.state_after(record, sent_back)
    assert at_send_back.approvals == (
        ApprovalAsOf(first.pk, 0, ApprovalStatus.CHANGES_REQUESTED, (), editor.username),
    )
    # The revision's rows exist from the change that made them.
    assert {step.label for step in at_send_back.steps} >= {"generate_draft r1", "editor_review r1"}
    assert "generate_draft r1" not in statuses(as_of.state_after(record, sent_back - 1))
    at_reopen = as_of.state_after(record, reopened)
    assert at_reopen.draft == second.draft != first.draft
    assert [request.pk for request in at_reopen.approvals] == [first.pk, second.pk]

    lines = as_of.difference(as_of.state_after(record, opened), at_reopen)
    assert f"approval #{first.pk}: pending → changes requested" in lines
    assert f"approval #{second.pk}: (none) → pending" in lines
    assert "step generate_draft: succeeded → superseded" in lines
    assert any(line.startswith("draft.body: ") for line in lines), lines


def test_a_quorums_approvals_count_from_the_point_each_was_recorded(editor: User) -> None:
    task = advance(press_release())
    request = pending_request(task)
    approvals.approve(request, actor=editor, comment="Fine by me")
    recorded = point_of(task, "approval_recorded")
    record = as_of.read(task)
    assert as_of.state_after(record, recorded - 1).approvals[0].voters == ()
    assert as_of.state_after(record, recorded).approvals[0] == ApprovalAsOf(
        request.pk, 0, ApprovalStatus.PENDING, (editor.username,)
    )
    assert as_of.difference(
        as_of.state_after(record, recorded - 1), as_of.state_after(record, recorded)
    ) == [f"approval #{request.pk} approved by: (none) → {editor.username}"]
    assert ApprovalRequest.objects.get(pk=request.pk).status == ApprovalStatus.PENDING


# --- cost ----------------------------------------------------------------------------------------


def test_reading_every_point_costs_the_same_few_queries_however_long_the_history(
    diamond: Task, django_assert_max_num_queries: Any
) -> None:
    short = advance(article(key="publish:short"))
    for task in (short, diamond):
        task = Task.objects.get(pk=task.pk)
        with django_assert_max_num_queries(9):
            record = as_of.read(task)
            snapshots = [as_of.state_after(record, i) for i in range(len(record.entries))]
        assert len(snapshots) == len(record.entries)
