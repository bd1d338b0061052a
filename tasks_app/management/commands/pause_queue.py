"""``manage.py pause_queue``: stop claims from a queue, with a reason."""

from __future__ import annotations

from tasks_app.management.cli import QueueSwitchCommand


class Command(QueueSwitchCommand):
    help = "Pause a queue with a reason: running steps finish, nothing new is claimed."
    pause = True
