"""What the approvers' notice hands to the mailer (``approvals.notices``): a subject of one
line whatever the draft's title holds, and a message that cannot be built counted as not
sent (the step dead-lettered as refused, nothing left in doubt), never as an outcome
unknown. Mail goes to Django's locmem backend."""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib.auth.models import User
from django.core.mail import EmailMessage

from tasks_app import services
from tasks_app.models import Effect, StepStatus, TaskStatus
from tests.approval_support import ARTICLE, advance, current, mailable, notice_task, pending_request

Outbox = list[EmailMessage]


@pytest.mark.parametrize(
    "title", ["Launch\nBcc: eve@evil.example", "Launch\r\nday", "Launch\u2028day"]
)
def test_a_line_break_in_the_title_is_folded_out_of_the_subject_and_the_mail_is_sent(
    editor: User, other_editor: User, mailoutbox: Outbox, title: str
) -> None:
    mailable(editor)
    mailable(other_editor)
    article = {**ARTICLE, "title": title}
    task = advance(services.enqueue("publish_article", article, idempotency_key="p:1").task)
    request = pending_request(task)
    assert "\n" in request.summary or "\u2028" in request.summary

    notice = advance(notice_task(request, "opened") or pytest.fail("no notice"))

    assert notice.status == TaskStatus.SUCCEEDED
    assert len(mailoutbox) == 2
    folded = " ".join(request.summary.splitlines())
    for message in mailoutbox:
        assert message.subject == f"Approval #{request.pk} waits for you: {folded}"
        built = message.message()
        assert "\n" not in str(built["Subject"]) and built["Bcc"] is None


def test_a_message_that_cannot_be_built_is_not_sent_and_waits_for_on_call_as_refused(
    editor: User, other_editor: User, mailoutbox: Outbox, settings: Any
) -> None:
    mailable(editor)
    mailable(other_editor)
    # An address no form would take, written straight to the table.
    User.objects.filter(pk=other_editor.pk).update(email="eddie@newsroom.example\nBcc: x@y.z")
    task = advance(services.enqueue("publish_article", ARTICLE, idempotency_key="p:2").task)
    request = pending_request(task)

    notice = advance(notice_task(request, "opened") or pytest.fail("no notice"))

    step = current(notice, "send")
    assert step.status == StepStatus.DEAD
    assert step.error_class == "tasks_app.exceptions.RemoteRefused"
    assert "could not be built" in step.last_error
    # Eddie's (first by name) was never handed over: nothing of it is left in doubt.
    assert mailoutbox == []
    assert not Effect.objects.filter(step=step).exists()
    # On-call mends the address and redrives: both messages go out.
    User.objects.filter(pk=other_editor.pk).update(email="eddie@newsroom.example")
    notice = advance(services.redrive(notice, actor="cli:oncall", reason="address mended"))
    assert notice.status == TaskStatus.SUCCEEDED
    assert sorted(message.to[0] for message in mailoutbox) == [
        "eddie@newsroom.example",
        editor.email,
    ]
