"""``manage.py queue_stats``: the overview's figures and each queue's depth, lag and
switch."""

from __future__ import annotations

import json
from datetime import datetime, timedelta
from typing import Any

from django.core.management.base import CommandParser

from tasks_app.management.cli import OperatorCommand
from tasks_app.management.output import table
from tasks_app.operations import selectors
from tasks_app.operations.durations import short_duration


def _rate(value: float | None) -> str:
    return "-" if value is None else f"{value:.1%}"


def _seconds(value: timedelta | None) -> float | None:
    return None if value is None else round(value.total_seconds(), 3)


def _iso(value: datetime | None) -> str | None:
    return None if value is None else value.isoformat()


class Command(OperatorCommand):
    help = (
        "Print the overview's figures and each queue's depth, lag and switch, as an "
        "aligned table or as JSON."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--json", action="store_true", help="print JSON instead")

    def handle(self, *args: Any, **options: Any) -> None:
        overview, queues = selectors.overview(), selectors.queues()
        if options["json"]:
            self.stdout.write(json.dumps(_as_json(overview, queues), ensure_ascii=False))
            return
        figures = [
            ("pending", str(overview.pending)),
            ("running", str(overview.running)),
            ("retry scheduled", str(overview.retry_scheduled)),
            ("waiting approval", str(overview.waiting_approval)),
            ("dead", str(overview.dead)),
            ("succeeded, last hour", str(overview.succeeded_last_hour)),
            ("succeeded, last day", str(overview.succeeded_last_day)),
            ("oldest due", short_duration(overview.oldest_due_age, none="-")),
            ("retries, last hour", str(overview.retries_last_hour)),
            ("retry rate", _rate(overview.retry_rate)),
            ("dead letters, last hour", str(overview.dead_lettered_last_hour)),
            ("dead-letter rate", _rate(overview.dead_letter_rate)),
            ("paused queues", ", ".join(state.name for state in overview.paused) or "-"),
        ]
        self.stdout.write(f"Overview at {overview.now:%Y-%m-%d %H:%M:%S %Z}")
        for line in table(("figure", "value"), figures, right=1)[1:]:
            self.stdout.write(f"  {line}")
        self.stdout.write("")
        rows = [
            (
                row.name,
                str(row.due),
                str(row.scheduled),
                str(row.running),
                short_duration(row.oldest_due_age, none="-"),
                "paused" if row.paused else "running",
                (row.state.changed_by if row.state else "") or "-",
                " ".join((row.state.reason if row.state else "").split()) or "-",
            )
            for row in queues
        ]
        header = ("queue", "due", "scheduled", "running", "oldest due", "state", "by", "reason")
        for line in table(header, rows, right=4):
            self.stdout.write(line)


def _as_json(overview: selectors.Overview, queues: list[selectors.QueueRow]) -> dict[str, Any]:
    return {
        "now": overview.now.isoformat(),
        "overview": {
            "pending": overview.pending,
            "running": overview.running,
            "retry_scheduled": overview.retry_scheduled,
            "waiting_approval": overview.waiting_approval,
            "dead": overview.dead,
            "succeeded_last_hour": overview.succeeded_last_hour,
            "succeeded_last_day": overview.succeeded_last_day,
            "oldest_due_at": _iso(overview.oldest_due_at),
            "oldest_due_age_seconds": _seconds(overview.oldest_due_age),
            "retries_last_hour": overview.retries_last_hour,
            "dead_lettered_last_hour": overview.dead_lettered_last_hour,
            "retry_rate": overview.retry_rate,
            "dead_letter_rate": overview.dead_letter_rate,
            "throughput": [
                {"minute": point.minute.isoformat(), "count": point.count}
                for point in overview.throughput
            ],
            "paused": [state.name for state in overview.paused],
        },
        "queues": [
            {
                "name": row.name,
                "due": row.due,
                "scheduled": row.scheduled,
                "running": row.running,
                "oldest_due_at": _iso(row.oldest_due_at),
                "oldest_due_age_seconds": _seconds(row.oldest_due_age),
                "paused": row.paused,
                "changed_by": row.state.changed_by if row.state else "",
                "reason": row.state.reason if row.state else "",
                "changed_at": _iso(row.state.changed_at) if row.state else None,
            }
            for row in queues
        ],
    }
