"""``manage.py sync_schedules``: store the schedules code declares (the release runs it
after migrating); each added, changed or removed schedule is one audited change."""

from __future__ import annotations

from typing import Any

from django.core.management.base import CommandParser

from tasks_app.management.cli import OperatorCommand, actor_from, add_actor_argument
from tasks_app.operations import schedule_sync


class Command(OperatorCommand):
    help = (
        "Store the schedules code declares: add new ones, change changed ones, mark removed "
        "ones (their history stays). Each change is an event in the audit chain."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        add_actor_argument(parser)
        parser.add_argument("--reason", default="deploy", help="recorded on each change")
        parser.add_argument(
            "--check",
            action="store_true",
            help="change nothing; list what a sync would change, exit 1 if anything",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        if options["check"]:
            pending = schedule_sync.pending_changes()
            for change in pending:
                self.stdout.write(str(change))
            if pending:
                raise SystemExit(1)
            self.stdout.write("schedules: stored as code declares them")
            return
        made = schedule_sync.sync(actor=actor_from(options["actor"]), reason=options["reason"])
        for change in made:
            self.stdout.write(str(change))
        self.stdout.write(f"schedules: {len(made)} change(s)")
