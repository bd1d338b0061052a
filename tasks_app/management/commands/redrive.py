"""``manage.py redrive``: redrive dead tasks by id or filter, with a reason; with
``--delay`` they run again only after it (``redrive_later``)."""

from __future__ import annotations

from typing import Any

from django.core.management.base import CommandParser

from tasks_app.management.cli import TaskActionCommand, add_param_arguments
from tasks_app.operations.task_actions import Action


class Command(TaskActionCommand):
    help = (
        "Redrive dead tasks (a fresh attempt budget, the same step keys), named by id or "
        "selected by filter, with a reason; with --delay, due only once it has passed. "
        "Prints what changed and what was skipped."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        add_param_arguments(parser, [Action.REDRIVE_LATER])
        super().add_arguments(parser)

    def action(self, options: dict[str, Any]) -> str:
        return Action.REDRIVE_LATER if options.get("delay") is not None else Action.REDRIVE
