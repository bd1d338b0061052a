"""The approvers' mail (``approvals.notices``, ``approvals.deadlines``): who is told when a
request opens, is about to expire or escalates, the digest, and that each message goes out
once however often its step runs (the effects ledger). Mail goes to Django's locmem
backend; time moves by back-dating the request's rows."""

from __future__ import annotations

import smtplib
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import Any, ClassVar

import pytest
from django.contrib.auth.models import User
from django.core.mail import EmailMessage
from django.core.mail.backends.locmem import EmailBackend
from django.db.models import F

from approvals import deadlines
from approvals import services as approvals
from approvals.models import ApprovalRequest
from tasks_app import services
from tasks_app.engine import runner
from tasks_app.models import Effect, Event, EventKind, Step, StepStatus, Task, TaskStatus
from tests.approval_support import (
    advance,
    article,
    current,
    mailable,
    notice_task,
    pending_request,
    press_release,
    result_of,
    ticket,
)
from tests.conftest import _user, backdate

BASE_URL = "https://console.newsroom.example"
Outbox = list[EmailMessage]


@pytest.fixture
def newsroom(db: None, settings: Any) -> dict[str, User]:
    """Editors with and without an address, the author (an editor who enqueues), two
    superusers (one named by the editors group), an outsider and a senior editor."""
    settings.CONSOLE_BASE_URL = BASE_URL + "/"
    return {
        "edith": mailable(_user("edith-editor", "editors")),
        "eddie": mailable(_user("eddie-editor", "editors")),
        "erin": _user("erin-editor", "editors"),  # no address
        "ava": mailable(_user("ava-author", "editors")),
        "sam": mailable(_user("sam-super", superuser=True)),
        "sal": mailable(_user("sal-super", "editors", superuser=True)),
        "otto": mailable(_user("otto-outsider")),
        "sid": mailable(_user("sid-senior", "senior_editors")),
    }


def _notices() -> list[Task]:
    return list(Task.objects.filter(workflow="approvals.notify").order_by("id"))


def _opened(newsroom: dict[str, User], flow: Any = article) -> tuple[Task, ApprovalRequest]:
    task = advance(flow(newsroom["ava"]))
    assert task.status == TaskStatus.WAITING_APPROVAL
    return task, pending_request(task)


def _sent_to(outbox: Outbox) -> list[str]:
    return sorted(address for message in outbox for address in message.to)


def _address(*users: User) -> list[str]:
    return sorted(user.email for user in users)


# --- opening a request ----------------------------------------------------------------------


def test_an_opened_request_enqueues_one_notice_for_the_approvers_it_names_with_an_address(
    newsroom: dict[str, User], mailoutbox: Outbox
) -> None:
    _, request = _opened(newsroom)

    notice = notice_task(request, "opened")
    assert notice is not None and _notices() == [notice]
    # Not the author (who enqueued it), not erin (no address), not the outsider, not the
    # senior editor (not escalated), not sam (a superuser the request does not name).
    assert notice.payload == {
        "kind": "opened",
        "request": request.pk,
        "to": ["eddie-editor", "edith-editor", "sal-super"],
    }
    assert (notice.created_by, notice.status) == ("system", TaskStatus.PENDING)
    assert mailoutbox == []  # nothing is sent until the notice's step runs


def test_running_the_notice_sends_one_message_per_recipient_linking_to_the_review(
    newsroom: dict[str, User], mailoutbox: Outbox, settings: Any
) -> None:
    _, request = _opened(newsroom)

    notice = advance(notice_task(request, "opened") or pytest.fail("no notice"))

    assert notice.status == TaskStatus.SUCCEEDED
    assert _sent_to(mailoutbox) == _address(newsroom["eddie"], newsroom["edith"], newsroom["sal"])
    link = f"{BASE_URL}/approvals/{request.pk}/"
    for message in mailoutbox:
        assert message.subject == f"Approval #{request.pk} waits for you: {request.summary}"
        assert message.from_email == settings.DEFAULT_FROM_EMAIL
        assert link in message.body
        assert f"Task: #{request.task_id} (publish_article), revision 0" in message.body
        assert "Asked by: ava-author" in message.body
    assert result_of(notice, "send") == {"sent": ["eddie-editor", "edith-editor", "sal-super"]}
    effects = Effect.objects.filter(step=current(notice, "send"))
    step_key = current(notice, "send").idempotency_key
    assert sorted(effect.key for effect in effects) == [
        f"{step_key}:mail:{name}" for name in ("eddie-editor", "edith-editor", "sal-super")
    ]
    assert {effect.status for effect in effects} == {Effect.Status.DONE}


def test_a_notice_whose_worker_died_after_sending_sends_nothing_more_when_it_runs_again(
    newsroom: dict[str, User], mailoutbox: Outbox
) -> None:
    _, request = _opened(newsroom)
    notice = notice_task(request, "opened")
    assert notice is not None
    step = current(notice, "send")
    claim = services.claim_step(step.pk, worker_id="doomed-worker")
    assert claim is not None
    # The step sends its messages, then its worker dies before recording the result.
    runner._run_one(claim, Step.objects.select_related("task").get(pk=step.pk))
    assert len(mailoutbox) == 3
    backdate(step)  # its lease runs out ...
    assert services.sweep().reaped == 1  # ... and the step is due again

    notice = advance(notice)

    assert notice.status == TaskStatus.SUCCEEDED
    step.refresh_from_db()
    assert step.attempts == 2
    assert len(mailoutbox) == 3  # the ledger had each message as sent


class RefusingMailer(EmailBackend):
    """The locmem backend, but the relay refuses the addresses in ``refuse`` once each,
    before taking the message."""

    refuse: ClassVar[set[str]] = set()

    def send_messages(self, email_messages: Sequence[EmailMessage]) -> int:
        for message in email_messages:
            refused = self.refuse.intersection(message.to)
            if refused:
                self.refuse.difference_update(refused)
                raise smtplib.SMTPRecipientsRefused({a: (450, b"try later") for a in refused})
        return super().send_messages(email_messages)


def test_a_message_the_relay_refused_is_sent_by_the_retry_and_the_others_are_not_repeated(
    newsroom: dict[str, User], mailoutbox: Outbox, settings: Any
) -> None:
    settings.MAILERS = {"default": {"BACKEND": f"{__name__}.RefusingMailer"}}
    RefusingMailer.refuse = {newsroom["edith"].email}
    _, request = _opened(newsroom)
    notice = notice_task(request, "opened")
    assert notice is not None

    # Eddie's goes out, edith's is refused: the step will retry. One attempt runs alone:
    # advance() would also run the retry whenever its jittered wait happened to be short.
    assert runner.run_claimed(current(notice, "send").pk)
    step = current(notice, "send")
    assert (step.status, step.attempts) == (StepStatus.PENDING, 1)
    assert _sent_to(mailoutbox) == [newsroom["eddie"].email]

    notice = advance(notice, skip_backoff=True)

    assert notice.status == TaskStatus.SUCCEEDED
    assert _sent_to(mailoutbox) == _address(newsroom["eddie"], newsroom["edith"], newsroom["sal"])


def test_a_request_decided_before_its_notice_runs_sends_nothing(
    newsroom: dict[str, User], mailoutbox: Outbox
) -> None:
    _, request = _opened(newsroom)
    approvals.approve(request, actor=newsroom["edith"], draft_hash=request.draft_hash)

    notice = advance(notice_task(request, "opened") or pytest.fail("no notice"))

    assert notice.status == TaskStatus.SUCCEEDED
    assert mailoutbox == []
    assert result_of(notice, "send")["sent"] == []
    assert not Effect.objects.filter(step__task=notice).exists()


def test_without_approvers_with_an_address_no_notice_is_enqueued(
    db: None, editor: User, other_editor: User, author: User
) -> None:
    mailable(author)  # the author's address is no reason to tell anyone
    task = advance(article(author))

    assert task.status == TaskStatus.WAITING_APPROVAL
    assert _notices() == []
    assert deadlines.digest_due() == 0  # digests are off: nothing either


def test_the_editor_whose_edit_opened_a_request_is_not_told_of_it(
    newsroom: dict[str, User], mailoutbox: Outbox
) -> None:
    _, old = _opened(newsroom)
    new = approvals.edit_draft(
        old,
        actor=newsroom["edith"],
        changes={"title": "Launch day, revised"},
        draft_hash=old.draft_hash,
    )
    assert new is not None and new.draft_author == "edith-editor"

    notice = notice_task(new, "opened")
    assert notice is not None
    advance(notice)

    assert _sent_to(mailoutbox) == _address(newsroom["eddie"], newsroom["sal"])
    assert all("Draft edited by: edith-editor" in message.body for message in mailoutbox)


# --- reminders --------------------------------------------------------------------------------


def test_a_reminder_goes_once_to_the_approvers_who_have_not_approved_yet(
    newsroom: dict[str, User], mailoutbox: Outbox
) -> None:
    task, request = _opened(newsroom, press_release)
    approvals.approve(request, actor=newsroom["edith"], draft_hash=request.draft_hash)
    assert deadlines.remind_due() == 0  # not due yet (20 hours after opening)
    ApprovalRequest.objects.filter(pk=request.pk).update(
        remind_at=F("remind_at") - timedelta(hours=21)
    )

    assert deadlines.remind_due() == 1
    assert deadlines.remind_due() == 0

    request.refresh_from_db()
    assert request.reminded_at is not None
    reminder = notice_task(request, "reminder")
    assert reminder is not None
    assert [notice.idempotency_key for notice in _notices()] == [
        f"approvals:notify:{request.pk}:opened",
        f"approvals:notify:{request.pk}:reminder",
    ]
    assert reminder.payload["to"] == ["eddie-editor", "sal-super"]  # edith approved already
    reminder = advance(reminder)
    assert reminder.status == TaskStatus.SUCCEEDED
    assert _sent_to(mailoutbox) == _address(newsroom["eddie"], newsroom["sal"])
    for message in mailoutbox:
        assert message.subject.startswith(f"Reminder: approval #{request.pk} expires in ")
        assert "Approvals: 1 of 2, each from a different person" in message.body
        assert f"{BASE_URL}/approvals/{request.pk}/" in message.body
    assert pending_request(task) == request


def test_who_approves_after_the_reminder_was_enqueued_is_not_sent_it(
    newsroom: dict[str, User], mailoutbox: Outbox
) -> None:
    _, request = _opened(newsroom, press_release)
    ApprovalRequest.objects.filter(pk=request.pk).update(
        remind_at=F("remind_at") - timedelta(hours=21)
    )
    assert deadlines.remind_due() == 1
    reminder = notice_task(request, "reminder")
    assert reminder is not None
    assert "eddie-editor" in reminder.payload["to"]

    approvals.approve(request, actor=newsroom["eddie"], draft_hash=request.draft_hash)
    reminder = advance(reminder)

    assert reminder.status == TaskStatus.SUCCEEDED
    assert newsroom["eddie"].email not in _sent_to(mailoutbox)
    assert _sent_to(mailoutbox)  # the others still get it


def test_a_decided_request_is_not_reminded(newsroom: dict[str, User]) -> None:
    _, request = _opened(newsroom)
    ApprovalRequest.objects.filter(pk=request.pk).update(
        remind_at=F("remind_at") - timedelta(hours=43)
    )
    approvals.reject(request, actor=newsroom["edith"], comment="No")

    assert deadlines.remind_due() == 0
    assert notice_task(request, "reminder") is None


# --- escalation -----------------------------------------------------------------------------


def test_an_undecided_request_escalates_once_to_the_senior_editors_who_are_told_and_may_decide(
    newsroom: dict[str, User], mailoutbox: Outbox
) -> None:
    task, request = _opened(newsroom, press_release)
    sid = newsroom["sid"]
    assert "group editors" in (approvals.decide_refusal(request, sid) or "")
    assert deadlines.escalate_due() == 0  # 8 hours have not passed
    ApprovalRequest.objects.filter(pk=request.pk).update(
        escalates_at=F("escalates_at") - timedelta(hours=9)
    )

    assert services.sweep().jobs["escalated_approvals"] == 1

    request.refresh_from_db()
    assert request.escalated_at is not None
    assert request.groups == ["editors", "senior_editors"]
    escalated = Event.objects.for_task(task.pk).get(kind=EventKind.APPROVAL_ESCALATED)
    assert (escalated.actor, escalated.step_id) == ("system:sweeper", request.step_id)
    assert (escalated.data["request"], escalated.data["escalate_to"]) == (
        request.pk,
        "senior_editors",
    )
    assert approvals.decide_refusal(request, sid) is None
    notice = notice_task(request, "escalated")
    assert notice is not None and notice.payload["to"] == ["sid-senior"]
    advance(notice)
    assert [message.to for message in mailoutbox] == [[sid.email]]
    assert mailoutbox[0].subject == f"Escalated to senior_editors: approval #{request.pk}"
    assert f"{BASE_URL}/approvals/{request.pk}/" in mailoutbox[0].body

    # Once only: the next sweeps leave it alone.
    assert deadlines.escalate_due() == 0
    assert services.sweep().jobs["escalated_approvals"] == 0
    assert Event.objects.for_task(task.pk).filter(kind=EventKind.APPROVAL_ESCALATED).count() == 1
    assert len([n for n in _notices() if n.payload["kind"] == "escalated"]) == 1

    # The senior editor's approval counts towards the quorum.
    approvals.approve(request, actor=sid, draft_hash=request.draft_hash)
    approvals.approve(request, actor=newsroom["eddie"], draft_hash=request.draft_hash)
    request.refresh_from_db()
    assert request.decided_by == "sid-senior, eddie-editor"
    assert current(task, "publish").status == StepStatus.PENDING


# --- the digest -----------------------------------------------------------------------------


def test_with_digests_requests_open_silently_and_one_digest_per_window_lists_them(
    newsroom: dict[str, User], mailoutbox: Outbox, settings: Any
) -> None:
    settings.APPROVALS_MAIL_DIGEST = True
    _, first = _opened(newsroom)
    _, second = _opened(newsroom, ticket)
    assert _notices() == []

    assert deadlines.digest_due() == 1
    assert deadlines.digest_due() == 0

    [digest] = _notices()
    window = deadlines.digest_window(services.db_now())
    assert digest.idempotency_key == f"approvals:digest:{window}"
    assert digest.payload == {
        "kind": "digest",
        "window": window,
        "to": ["eddie-editor", "edith-editor", "sal-super"],
    }
    digest = advance(digest)
    assert digest.status == TaskStatus.SUCCEEDED
    assert _sent_to(mailoutbox) == _address(newsroom["eddie"], newsroom["edith"], newsroom["sal"])
    for message in mailoutbox:
        assert message.subject == "2 drafts wait for your decision"
        for request in (first, second):
            assert f"- Approval #{request.pk}: {request.summary}" in message.body
            assert f"{BASE_URL}/approvals/{request.pk}/" in message.body


def test_a_digest_window_is_the_same_throughout_and_the_next_one_starts_at_its_end(
    settings: Any,
) -> None:
    settings.APPROVALS_DIGEST_MINUTES = 60
    start = datetime(2026, 12, 1, 10, 0, tzinfo=UTC)

    assert deadlines.digest_window(start) == "2026-12-01T10:00:00+00:00"
    assert deadlines.digest_window(start + timedelta(minutes=59, seconds=59)) == (
        "2026-12-01T10:00:00+00:00"
    )
    assert deadlines.digest_window(start + timedelta(hours=1)) == "2026-12-01T11:00:00+00:00"
