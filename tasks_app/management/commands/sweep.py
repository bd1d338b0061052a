"""``manage.py sweep``: one sweep by hand (beat sends one every TASKS_SWEEP_SECONDS)."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand

from tasks_app import services


class Command(BaseCommand):
    help = (
        "Run the sweeper once: reap expired leases, re-dispatch due steps, and run the "
        "jobs other apps registered (approval expiry)."
    )

    def handle(self, *args: Any, **options: Any) -> None:
        report = services.sweep()
        self.stdout.write(", ".join(f"{name} {count}" for name, count in report.as_dict().items()))
