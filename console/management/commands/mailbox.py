"""Print the demo's mail: the messages written to files where no mail server is set."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from console import mailbox


class Command(BaseCommand):
    help = "Print the newest mail the console wrote to files (the demo's mail), newest first."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--to", help="Only mail to this address.")
        parser.add_argument("--last", type=int, default=10, help="How many (default 10).")

    def handle(self, *args: Any, **options: Any) -> None:
        where = mailbox.folder()
        if where is None:
            raise CommandError("mail is sent by SMTP here (EMAIL_HOST): read it in a mail client")
        if options["last"] < 1:
            raise CommandError("--last: at least 1")
        found = mailbox.messages(to=options["to"], limit=options["last"])
        if not found:
            self.stdout.write(f"No mail in {where}.")
        for mail in found:
            when = f"{mail.sent_at:%Y-%m-%d %H:%M:%S %Z}" if mail.sent_at else "?"
            self.stdout.write(f"Date: {when}\nFrom: {mail.sender}\nTo: {', '.join(mail.to)}")
            self.stdout.write(f"Subject: {mail.subject}\n\n{mail.body.rstrip()}\n{'-' * 72}")
