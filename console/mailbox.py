"""The demo's mail, read back: the messages the file mail backend wrote (``MAILERS``'
default mailer when no SMTP server is set), for the console's Mail page and
``manage.py mailbox``. In production mail goes out by SMTP and there is nothing here.

Whose a message is: the approvals' notices name their recipient's username in their
``X-Task-Console-Notice`` header (the effects ledger's key ``…:mail:<username>``), so the
Mail page shows a person the notices addressed to them, not every message whose address
merely reads like theirs."""

from __future__ import annotations

import email
import email.policy
from dataclasses import dataclass
from datetime import datetime
from email.utils import getaddresses, parsedate_to_datetime
from pathlib import Path

from django.core.mail import mailers
from django.core.mail.backends.filebased import EmailBackend as FileBackend
from django.core.mail.handler import DEFAULT_MAILER_ALIAS

FILE_BACKEND = "django.core.mail.backends.filebased.EmailBackend"
# What the file backend writes after each message.
SEPARATOR = b"\n" + b"-" * 79 + b"\n"


@dataclass(frozen=True)
class Mail:
    sent_at: datetime | None
    sender: str
    to: list[str]
    subject: str
    body: str
    # The username a notice was sent to ("" for other mail).
    recipient: str = ""


def folder() -> Path | None:
    """Where the default mailer writes its files, or None when it sends for real (the
    mailer as Django builds it from ``MAILERS``, its path resolved). Another backend is
    not built: an SMTP mailer would check its server's settings to say no more than that."""
    if mailers.settings.get(DEFAULT_MAILER_ALIAS, {}).get("BACKEND") != FILE_BACKEND:
        return None
    mailer = mailers.default
    assert isinstance(mailer, FileBackend)
    return Path(mailer.file_path)


# The effect name of a notice to a user (``approvals.notices``), at the end of the header.
NOTICE_HEADER = "X-Task-Console-Notice"
NOTICE_RECIPIENT = ":mail:"


def messages(*, to: str | None = None, recipient: str | None = None, limit: int = 50) -> list[Mail]:
    """The newest messages first (``to``: only those addressed to that address;
    ``recipient``: only the notices sent to that username)."""
    where = folder()
    if where is None or not where.is_dir():
        return []
    # Newest first: by the Date header (to the second), then by when each file was last
    # written and the message's place in it.
    keyed: list[tuple[float, int, int, Mail]] = []
    for path in where.glob("*.log"):
        written = path.stat().st_mtime_ns
        for place, chunk in enumerate(path.read_bytes().split(SEPARATOR)):
            if chunk.strip():
                mail = _parse(chunk)
                sent = mail.sent_at.timestamp() if mail.sent_at else 0.0
                keyed.append((sent, written, place, mail))
    keyed.sort(key=lambda entry: entry[:3], reverse=True)
    found = [entry[3] for entry in keyed]
    if to is not None:
        wanted = to.lower()
        found = [mail for mail in found if wanted in (address.lower() for address in mail.to)]
    if recipient is not None:
        found = [mail for mail in found if mail.recipient == recipient]
    return found[:limit]


def _parse(raw: bytes) -> Mail:
    # Bytes, not text: an 8bit body is then decoded by its own charset.
    message = email.message_from_bytes(raw, policy=email.policy.default)
    body = message.get_body(preferencelist=("plain",)) if message.is_multipart() else message
    content = body.get_content() if body is not None else ""
    date = message.get("Date")
    notice = str(message.get(NOTICE_HEADER, ""))
    return Mail(
        sent_at=parsedate_to_datetime(str(date)) if date else None,
        sender=str(message.get("From", "")),
        to=[address for _, address in getaddresses([str(message.get("To", ""))]) if address],
        subject=str(message.get("Subject", "")),
        body=str(content),
        recipient=notice.rpartition(NOTICE_RECIPIENT)[2] if NOTICE_RECIPIENT in notice else "",
    )
