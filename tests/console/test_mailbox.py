"""The demo's mail, read back: where no mail server is set, messages are written to files,
and the console's Mail page and ``manage.py mailbox`` show them (each reader their own)."""

from __future__ import annotations

from io import StringIO
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.core.mail import EmailMessage
from django.core.management import CommandError, call_command
from django.urls import reverse

from console import mailbox
from tests.approval_support import mailable
from tests.console_support import login


@pytest.fixture
def files(settings: Any, tmp_path: Path) -> Path:
    """The demo's mailer: messages written under ``tmp_path``."""
    settings.MAILERS = {
        "default": {
            "BACKEND": mailbox.FILE_BACKEND,
            "OPTIONS": {"file_path": str(tmp_path)},
        }
    }
    return tmp_path


def send(to: str, subject: str, body: str, *, notice_to: User | None = None) -> None:
    """A message to ``to``; with ``notice_to``, an approvals notice to that user, its
    header naming them as ``approvals.notices`` does."""
    headers = {}
    if notice_to is not None:
        key = f"approvals:notify:1:opened:0:send:mail:{notice_to.get_username()}"
        headers["X-Task-Console-Notice"] = key
    EmailMessage(subject, body, "console@example.com", [to], headers=headers).send()


@pytest.mark.django_db
def test_the_mail_page_shows_the_reader_their_own_mail_and_a_superuser_everyone_s(
    files: Path, editor: User, other_editor: User, superuser: User
) -> None:
    mailable(editor)
    mailable(other_editor)
    # Non-ASCII and a non-breaking space: the body is written 8bit and read back as sent.
    send(
        editor.email,
        "Approval #1 waits for you",
        "“Launch day” expires in 1\xa0day\nhttp://x/approvals/1/",
        notice_to=editor,
    )
    send(
        other_editor.email,
        "Approval #2 waits for you",
        "for the other editor",
        notice_to=other_editor,
    )

    mine = login(editor).get(reverse("console:mail"))
    page = mine.content.decode()
    assert mine.status_code == 200
    assert "Approval #1 waits for you" in page and "“Launch day” expires in 1\xa0day" in page
    assert '<a href="http://x/approvals/1/"' in page
    assert "Approval #2" not in page
    everyone = login(superuser).get(reverse("console:mail")).content.decode()
    assert "Approval #1 waits for you" in everyone and "Approval #2 waits for you" in everyone
    # The nav offers the page only where mail is written to files.
    assert 'href="/mail/"' in page


@pytest.mark.django_db
def test_the_mail_page_shows_the_notices_addressed_to_the_reader_not_to_a_lookalike_address(
    files: Path, editor: User, other_editor: User
) -> None:
    # Two accounts whose addresses differ only in case: each reads only their own notices.
    User.objects.filter(pk=editor.pk).update(email="Desk@newsroom.example")
    User.objects.filter(pk=other_editor.pk).update(email="desk@newsroom.example")
    send("Desk@newsroom.example", "Approval #1 for edith", "one", notice_to=editor)
    send("desk@newsroom.example", "Approval #2 for eddie", "two", notice_to=other_editor)
    send("desk@newsroom.example", "Not a notice", "three")

    edith = login(editor).get(reverse("console:mail")).content.decode()
    eddie = login(other_editor).get(reverse("console:mail")).content.decode()

    assert "Approval #1 for edith" in edith and "Approval #2" not in edith
    assert "Approval #2 for eddie" in eddie and "Approval #1" not in eddie
    assert "Not a notice" not in edith and "Not a notice" not in eddie


@pytest.mark.django_db
def test_where_mail_goes_out_by_smtp_there_is_no_mail_page(settings: Any, editor: User) -> None:
    settings.MAILERS = {"default": {"BACKEND": "django.core.mail.backends.smtp.EmailBackend"}}
    client = login(editor)
    assert client.get(reverse("console:mail")).status_code == 404
    assert 'href="/mail/"' not in client.get(reverse("console:approvals")).content.decode()
    with pytest.raises(CommandError, match="sent by SMTP"):
        call_command("mailbox")


@pytest.mark.django_db
def test_the_mailbox_command_prints_the_newest_mail_first(files: Path) -> None:
    send("a@example.com", "first", "one")
    send("b@example.com", "second", "two")
    out = StringIO()

    call_command("mailbox", "--last", "1", stdout=out)
    assert "Subject: second" in out.getvalue() and "Subject: first" not in out.getvalue()

    out = StringIO()
    call_command("mailbox", "--to", "A@example.com", stdout=out)
    assert "Subject: first\n\none" in out.getvalue() and "second" not in out.getvalue()
    with pytest.raises(CommandError, match="--last: at least 1"):
        call_command("mailbox", "--last", "0")
