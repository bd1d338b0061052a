"""Rewind: a finished, dead or cancelled task runs again from a chosen step, after a plan
that lists the steps that will run again and every external write they own (applied and
skipped by its key, or in doubt for a person to decide); confirming supersedes the rewound
rows, keeps their step keys, and records who, why and the input's difference.

The mail service is an in-process fake that counts what it sends; everything of ours runs
for real.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from django.contrib.auth.models import User

from tasks_app import services
from tasks_app.exceptions import InvalidInput, InvalidTransition, NotPermitted
from tasks_app.models import Effect, Event, EventKind, Step, StepStatus, Task, TaskStatus
from tasks_app.observability.invariants import check
from tests.graph_support import Remote, diamond, enqueue, registered, run, statuses, step_of
from tests.rewind_support import Mailer, newsletter, sent_task


@pytest.fixture
def mailer(db: None) -> Iterator[Mailer]:
    made = Mailer()
    with registered(newsletter(made)):
        yield made


def _clean() -> None:
    report = check(since=None)
    assert report.findings == [], [str(finding) for finding in report.findings]


def _finish(task: Task, *kinds: str) -> None:
    for kind in kinds:
        run(task, kind)
    task.refresh_from_db()


# --- the done-when case: step 3 sent mail without idempotency -------------------------------


def test_a_rewind_shows_the_mail_in_doubt_and_sends_nothing_twice(mailer: Mailer) -> None:
    task = sent_task(mailer, lose_answer=True)
    assert task.status == TaskStatus.DEAD
    assert mailer.sent == ["News: spring"]

    plan = services.plan_rewind(task, step_of(task, "draft").pk)
    assert [(s.kind, s.status) for s in plan.steps] == [
        ("draft", "succeeded"),
        ("mail", "dead"),
        ("archive", "blocked"),
    ]
    [write] = plan.writes
    assert (write.kind, write.state) == ("mail", "in_doubt")
    assert plan.in_doubt == (write,)

    # Confirming without saying whether the mail went out is refused, naming the field.
    with pytest.raises(InvalidInput, match="decisions: say whether each write in doubt"):
        services.rewind(
            task, step_id=plan.step_id, actor="cli:oncall", reason="wrong subject",
            fingerprint=plan.fingerprint,
        )  # fmt: skip
    assert step_of(task, "draft").revision == 0

    services.rewind(
        task,
        step_id=plan.step_id,
        actor="cli:oncall",
        reason="wrong subject",
        fingerprint=plan.fingerprint,
        decisions={write.key: "happened"},
    )
    task.refresh_from_db()
    assert task.status == TaskStatus.PENDING
    assert statuses(task) == {
        "fetch": "succeeded",
        "draft": "pending",
        "mail": "blocked",
        "archive": "blocked",
    }
    _finish(task, "draft", "mail", "archive")
    assert task.status == TaskStatus.SUCCEEDED
    assert mailer.sent == ["News: spring"]  # nothing sent twice
    assert mailer.drafts == ["News: spring", "News: spring"]
    _clean()


def test_a_write_that_did_not_happen_is_made_again(mailer: Mailer) -> None:
    task = sent_task(mailer, lose_answer=True)
    plan = services.plan_rewind(task, step_of(task, "mail").pk)
    services.rewind(
        task,
        step_id=plan.step_id,
        actor="cli:oncall",
        reason="the mail server lost it",
        fingerprint=plan.fingerprint,
        decisions={plan.writes[0].key: "not_happened"},
    )
    _finish(task, "mail", "archive")
    assert task.status == TaskStatus.SUCCEEDED
    assert mailer.sent == ["News: spring", "News: spring"]
    _clean()


# --- a finished task, an edited input --------------------------------------------------------


def test_a_rewind_with_an_edited_payload_reruns_the_steps_and_skips_applied_writes(
    mailer: Mailer,
) -> None:
    task = sent_task(mailer)
    assert task.status == TaskStatus.SUCCEEDED
    old_rows = set(Step.objects.filter(task=task).values_list("pk", flat=True))

    plan = services.plan_rewind(task, step_of(task, "draft").pk, payload={"topic": "summer"})
    [write] = plan.writes
    assert write.state == "applied"
    assert plan.unrecorded == ("archive", "draft")
    assert plan.payload_changed
    services.rewind(
        task,
        step_id=plan.step_id,
        actor="cli:oncall",
        reason="topic was wrong",
        fingerprint=plan.fingerprint,
        payload={"topic": "summer"},
    )
    _finish(task, "draft", "mail", "archive")
    assert task.status == TaskStatus.SUCCEEDED
    assert mailer.drafts == ["News: spring", "News: summer"]
    # The mail was applied: its key finds the recorded answer, and nothing is sent again.
    assert mailer.sent == ["News: spring"]
    # The rewound rows are kept as history; the new ones keep their step keys.
    kept = Step.objects.filter(pk__in=old_rows)
    assert sorted(kept.values_list("kind", "status")) == [
        ("archive", "superseded"),
        ("draft", "superseded"),
        ("fetch", "succeeded"),
        ("mail", "superseded"),
    ]
    assert step_of(task, "mail").idempotency_key == kept.get(kind="mail").idempotency_key
    event = Event.objects.get(task_id=task.pk, kind=EventKind.REWOUND)
    assert (event.actor, event.reason) == ("cli:oncall", "topic was wrong")
    assert event.data["old_payload"] == {"topic": "spring"}
    assert event.data["new_payload"] == {"topic": "summer"}
    assert event.data["rerun"] == ["draft", "mail", "archive"]
    assert event.chain_hash  # an operator action: in the audit chain
    _clean()


def test_a_plan_that_no_longer_matches_the_task_is_refused(mailer: Mailer) -> None:
    task = sent_task(mailer, lose_answer=True)
    plan = services.plan_rewind(task, step_of(task, "draft").pk)
    services.resolve(task, actor="cli:oncall", reason="it went out", outcome="done")
    run(task, "archive")
    with pytest.raises(InvalidTransition, match="changed since the rewind was previewed"):
        services.rewind(
            task, step_id=plan.step_id, actor="cli:oncall", reason="late",
            fingerprint=plan.fingerprint, decisions={plan.writes[0].key: "happened"},
        )  # fmt: skip
    assert not Event.objects.filter(task_id=task.pk, kind=EventKind.REWOUND).exists()


# --- who and when ----------------------------------------------------------------------------


def test_only_a_finished_dead_or_cancelled_task_with_nothing_running_is_rewound(
    mailer: Mailer,
) -> None:
    task = services.enqueue("test.rewind.newsletter", {"topic": "x"}).task
    with pytest.raises(InvalidTransition, match="is pending: a rewind starts again a task that"):
        services.plan_rewind(task, step_of(task, "fetch").pk)
    services.cancel(task, actor="cli:oncall", reason="not now")
    task.refresh_from_db()
    plan = services.plan_rewind(task, step_of(task, "fetch").pk)
    assert [s.kind for s in plan.steps] == ["fetch", "draft", "mail", "archive"]
    services.rewind(
        task, step_id=plan.step_id, actor="cli:oncall", reason="after all",
        fingerprint=plan.fingerprint,
    )  # fmt: skip
    task.refresh_from_db()
    assert (task.status, task.cancel_requested_at) == (TaskStatus.PENDING, None)
    _finish(task, "fetch", "draft", "mail", "archive")
    assert task.status == TaskStatus.SUCCEEDED
    with pytest.raises(InvalidTransition, match="has no current step 0 to rewind from"):
        services.plan_rewind(task, 0)
    _clean()


def test_a_person_without_the_redrive_permission_cannot_rewind(
    mailer: Mailer, outsider: User
) -> None:
    task = sent_task(mailer)
    plan = services.plan_rewind(task, step_of(task, "draft").pk)
    with pytest.raises(NotPermitted):
        services.rewind(
            task, step_id=plan.step_id, actor=outsider, reason="x", fingerprint=plan.fingerprint
        )


# --- graphs ----------------------------------------------------------------------------------


def test_a_rewound_branch_reruns_with_what_waits_for_it_and_no_other_branch(db: None) -> None:
    remote = Remote()
    with registered(diamond("test.rewind.diamond", remote)):
        task = enqueue(diamond("test.rewind.diamond", remote))
        _finish(task, "start", "a", "b", "c", "join", "finish")
        plan = services.plan_rewind(task, step_of(task, "b").pk)
        assert [s.kind for s in plan.steps] == ["b", "join", "finish"]
        assert {w.kind for w in plan.writes} == {"b", "join", "finish"}
        services.rewind(
            task, step_id=plan.step_id, actor="cli:oncall", reason="b read stale data",
            fingerprint=plan.fingerprint,
        )  # fmt: skip
        assert statuses(task)["b"] == StepStatus.PENDING
        assert statuses(task)["a"] == statuses(task)["c"] == StepStatus.SUCCEEDED
        _finish(task, "b", "join", "finish")
        assert task.status == TaskStatus.SUCCEEDED
        # Every write was applied before: each rerun found its key; none wrote again.
        assert sorted(remote.writes) == ["a", "b", "c", "finish", "join", "start"]
        _clean()


# --- what the checker says of writes that could be made twice ------------------------------


def test_the_checker_finds_a_write_that_a_rerun_would_make_again(mailer: Mailer) -> None:
    task = sent_task(mailer)
    plan = services.plan_rewind(task, step_of(task, "draft").pk)
    services.rewind(
        task, step_id=plan.step_id, actor="cli:oncall", reason="again",
        fingerprint=plan.fingerprint,
    )  # fmt: skip
    _clean()  # the rewound rows keep their keys, and the rows they replace stand no more
    mail, archive = step_of(task, "mail"), step_of(task, "archive")
    # Behind the services' back: a rerun row given another's key, a write moved off its key.
    Step.objects.filter(pk=archive.pk).update(idempotency_key=mail.idempotency_key)
    Effect.objects.filter(step__task=task).update(key="elsewhere:mail")
    found = sorted(f.detail for f in check(since=None).findings if f.check == "effect_key")
    assert len(found) == 2, found
    assert found[0].startswith("effect elsewhere:mail of step ")
    assert "is not under its step key" in found[0]
    assert found[1] == (
        f"steps {mail.pk}, {archive.pk} both stand with the step key "
        f"{mail.idempotency_key!r}: each would make its writes"
    )
