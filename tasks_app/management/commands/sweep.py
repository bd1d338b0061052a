from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand

from tasks_app import services


class Command(BaseCommand):
    help = "Run the sweeper once: reap expired leases and re-dispatch due steps."

    def handle(self, *args: Any, **options: Any) -> None:
        report = services.sweep()
        self.stdout.write(f"reaped {report.reaped}, re-dispatched {report.redispatched}")
