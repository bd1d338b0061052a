"""``manage.py rewind``: run tasks that succeeded, died or were cancelled again from their
step of a given kind, by id or filter, with a reason. A task with a write in doubt is
skipped: its page asks whether each write happened."""

from __future__ import annotations

from typing import Any

from django.core.management.base import CommandParser

from tasks_app.management.cli import TaskActionCommand, add_param_arguments
from tasks_app.operations.task_actions import Action


class Command(TaskActionCommand):
    help = (
        "Rewind tasks (succeeded, dead or cancelled) from their step of the kind --from-step "
        "names: it, every step that waits for it and every step that has not succeeded run "
        "again with their step keys. By id or by filter, with a reason. Prints what changed "
        "and what was skipped (a task with a write in doubt, or with no such step)."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        add_param_arguments(parser, [Action.REWIND])
        super().add_arguments(parser)

    def action(self, options: dict[str, Any]) -> str:
        return Action.REWIND
