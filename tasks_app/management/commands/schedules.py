"""``manage.py schedules``: each stored schedule with its state, timing, next run, last
run and missed slots, as the Schedules page shows them (``operations.schedule_use``)."""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

from django.core.management.base import CommandParser

from tasks_app.engine.schedules import slot_text
from tasks_app.management.cli import OperatorCommand
from tasks_app.management.output import table
from tasks_app.operations.durations import short_duration
from tasks_app.operations.schedule_use import Standing, all_standing


def _row(standing: Standing) -> dict[str, Any]:
    row = standing.schedule
    last = standing.last_runs[0] if standing.last_runs else None
    return {
        "name": row.name,
        "state": standing.state,
        "workflow": row.workflow,
        "timing": standing.timing,
        "missed_policy": standing.spec.get("missed"),
        "next_run": slot_text(standing.next_runs[0]) if standing.next_runs else None,
        "last_run": None
        if last is None
        else {
            "slot": slot_text(last.run.slot),
            "outcome": last.run.outcome,
            "task": last.run.task_id,
            "status": last.status or None,
        },
        "missed_total": row.missed_total,
        "overdue_seconds": standing.overdue.total_seconds(),
        "paused_by": row.paused_by or None,
        "paused_reason": row.paused_reason or None,
    }


class Command(OperatorCommand):
    help = (
        "Print each stored schedule: state (active, late, paused, removed), timing, next "
        "run and last run in UTC, and how many slots it missed; as a table or as JSON."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--json", action="store_true", help="print JSON instead")

    def handle(self, *args: Any, **options: Any) -> None:
        rows = [_row(standing) for standing in all_standing()]
        if options["json"]:
            self.stdout.write(json.dumps(rows, ensure_ascii=False))
            return
        if not rows:
            self.stdout.write("No schedule is stored: manage.py sync_schedules stores code's.")
            return
        cells = [
            (
                row["name"],
                _state(row),
                row["timing"],
                row["next_run"] or "-",
                _last(row["last_run"]),
                str(row["missed_total"]),
            )
            for row in rows
        ]
        header = ("schedule", "state", "timing", "next run (UTC)", "last run", "missed")
        for line in table(header, cells):
            self.stdout.write(line)


def _state(row: dict[str, Any]) -> str:
    if row["overdue_seconds"]:
        return f"late by {short_duration(timedelta(seconds=row['overdue_seconds']))}"
    return str(row["state"])


def _last(run: dict[str, Any] | None) -> str:
    if run is None:
        return "-"
    task = f" task #{run['task']} {run['status'] or 'pruned'}" if run["task"] else ""
    return f"{run['slot']} {run['outcome']}{task}"
