"""``manage.py resolve``: answer for a dead step whose outcome nobody knows (done or retry)."""

from __future__ import annotations

from typing import Any

from django.core.management.base import CommandParser

from tasks_app.management.cli import TaskActionCommand


class Command(TaskActionCommand):
    help = (
        "Settle the dead step of tasks whose outcome nobody knows: --outcome done (it "
        "happened: mark it done) or retry (it did not: run it again). By id or by filter, "
        "with a reason."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--outcome",
            required=True,
            choices=["done", "retry"],
            help="done: the step's work happened; retry: it did not, run it again",
        )
        super().add_arguments(parser)

    def action(self, options: dict[str, Any]) -> str:
        return f"resolve_{options['outcome']}"
