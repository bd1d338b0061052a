"""``manage.py cancel``: cancel tasks by id or filter, with a reason (the operator
service)."""

from __future__ import annotations

import argparse
from typing import Any

from tasks_app.management.cli import TaskActionCommand
from tasks_app.operations.task_actions import ACTIONS, Action

# Pending, running, waiting for approval or dead: every status a cancel applies to.
CANCELLABLE = ACTIONS[Action.CANCEL].targets


class Command(TaskActionCommand):
    help = (
        "Cancel tasks (pending, waiting and dead steps at once; a running step is asked to "
        "stop), named by id or selected by filter, with a reason."
    )

    def add_status_filters(self, filters: argparse._ArgumentGroup) -> None:
        filters.add_argument(
            "--status",
            action="append",
            choices=CANCELLABLE,
            help="only tasks in this status (repeat for several)",
        )

    def status_filters(self, options: dict[str, Any]) -> dict[str, Any]:
        if not options["status"]:
            return {}
        return {"statuses": tuple(dict.fromkeys(options["status"]))}

    def action(self, options: dict[str, Any]) -> str:
        return "cancel"
