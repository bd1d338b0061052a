"""``manage.py redrive``: redrive dead tasks by id or filter, with a reason."""

from __future__ import annotations

from typing import Any

from tasks_app.management.cli import TaskActionCommand


class Command(TaskActionCommand):
    help = (
        "Redrive dead tasks (a fresh attempt budget, the same step keys), named by id or "
        "selected by filter, with a reason. Prints what changed and what was skipped."
    )

    def action(self, options: dict[str, Any]) -> str:
        return "redrive"
