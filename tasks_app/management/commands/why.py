"""``manage.py why <task id>``: what holds a task back, in plain lines: each blocker's
sentence and where on the console to see or act on it (``tasks_app.operations.why``, the
same answer the task page's "Why isn't this running?" gives)."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core.management.base import CommandParser

from tasks_app.management.cli import OperatorCommand, bad_input
from tasks_app.models import Task
from tasks_app.operations.why import why


class Command(OperatorCommand):
    help = (
        "Say what holds a task back: a paused queue, a limit, a running step's lease, an "
        "approval, a missing worker, a scheduled start or retry, an earlier step; each in "
        "words with a link to the console."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("task_id", type=int, help="the task's id")

    def handle(self, *args: Any, **options: Any) -> None:
        task = Task.objects.filter(pk=options["task_id"]).first()
        if task is None:
            raise bad_input(f"task_id: no task with id {options['task_id']}")
        self.stdout.write(f"Task #{task.pk} {task.workflow}: {task.live_status}")
        blockers = why(task)
        if not blockers:
            self.stdout.write("It has ended: nothing holds it back.")
            return
        # Links are the console's paths; the site's address makes them whole.
        base = settings.CONSOLE_BASE_URL.rstrip("/")
        for blocker in blockers:
            self.stdout.write(f"- {blocker.words}")
            if blocker.link:
                self.stdout.write(f"  {blocker.link_text}: {base}{blocker.link}")
