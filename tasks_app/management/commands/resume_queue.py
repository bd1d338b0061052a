"""``manage.py resume_queue``: let a paused queue's steps be claimed again, with a reason."""

from __future__ import annotations

from tasks_app.management.cli import QueueSwitchCommand


class Command(QueueSwitchCommand):
    help = "Resume a paused queue with a reason; its due steps are dispatched again."
    pause = False
