"""``manage.py task_action ACTION``: any operator action of the table
(``task_actions.ACTIONS``) by its name, on tasks named by id or selected by filter, with a
reason and the action's parameters (``--delay`` for ``redrive_later``). ``redrive``,
``resolve`` and ``cancel`` are its shorter spellings for their actions."""

from __future__ import annotations

from typing import Any

from django.core.management.base import CommandParser

from tasks_app.management.cli import TaskActionCommand, add_param_arguments
from tasks_app.operations.task_actions import ACTIONS


class Command(TaskActionCommand):
    help = (
        "Take an operator action (one of: "
        + ", ".join(ACTIONS)
        + ") on tasks named by id or selected by filter, with a reason. Prints what "
        "changed and what was skipped."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "action",
            choices=list(ACTIONS),
            help="; ".join(f"{name}: {spec.label}" for name, spec in ACTIONS.items()),
        )
        add_param_arguments(parser, ACTIONS)
        super().add_arguments(parser)

    def action(self, options: dict[str, Any]) -> str:
        action: str = options["action"]
        return action
