"""``manage.py task_status``: one task, by id or idempotency key, as aligned lines for a
person (a failing step's error as its one line) or as indented JSON (``--json``), with what
producers and people wrote redacted as on the console's pages
(``tasks_app.redaction``)."""

from __future__ import annotations

import json
from typing import Any

from django.core.management.base import CommandParser

from tasks_app import services
from tasks_app.exceptions import error_summary
from tasks_app.history import timeline
from tasks_app.history.timeline import HistoryEntry
from tasks_app.management.cli import OperatorCommand, bad_input
from tasks_app.management.output import line, table, when
from tasks_app.models import Step, StepStatus, Task
from tasks_app.redaction import redact, redact_text

MAX_EVENTS = 1000
# How much of an error, a result or a reason one line shows (--json has all of it).
MAX_ERROR_LINE = 200


def _failing(step: Step) -> bool:
    """Whether the step's stored error is its current one: it is dead, or waits for a
    retry. A step that ran again since (and succeeded, or runs now) keeps the text of an
    old failure on its row; that is history, not its state."""
    return step.status == StepStatus.DEAD or (
        step.status == StepStatus.PENDING and step.attempts > 0
    )


def _step(step: Step) -> dict[str, Any]:
    failing = _failing(step)
    traceback = redact_text(step.last_error) if failing else ""
    return {
        "id": step.pk,
        "kind": step.kind,
        "position": step.position,
        "revision": step.revision,
        "status": step.status,
        "attempts": step.attempts,
        "max_attempts": step.max_attempts,
        "fencing_token": step.fencing_token,
        "result": redact(step.result),
        "error_class": step.error_class if failing else "",
        # What went wrong, in one line; the whole stored traceback beside it.
        "error": error_summary(traceback),
        "traceback": traceback,
        # What the commands' --cause and /dead/groups/ group it by.
        "cause": step.error_fingerprint if step.status == StepStatus.DEAD else "",
    }


def _event(event: HistoryEntry) -> dict[str, Any]:
    return {
        "at": event.created_at,
        "kind": event.kind,
        "actor": event.actor,
        "reason": redact_text(event.reason),
        "step": event.step_id,
    }


def _count(text: str) -> int:
    if not text.isdigit() or not 0 <= int(text) <= MAX_EVENTS:
        raise bad_input(f"events: a whole number from 0 to {MAX_EVENTS}")
    return int(text)


class Command(OperatorCommand):
    help = (
        "Print a task, by id or idempotency key: its status, its steps (with the error of a "
        "failing step in one line) and its last events, secrets redacted as on the console; "
        "as aligned lines, or with --json as one indented JSON object."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        group = parser.add_mutually_exclusive_group(required=True)
        group.add_argument("--id", type=int)
        group.add_argument("--key")
        parser.add_argument(
            "--events", default="10", metavar="N", help="how many of the last events (10)"
        )
        parser.add_argument(
            "--json",
            action="store_true",
            help="print one indented JSON object instead, each step's whole traceback included",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        count = _count(options["events"])
        if options["key"]:
            task = services.get_task(idempotency_key=options["key"])
            if task is None:
                raise bad_input(f"key: no task has the idempotency key {options['key']!r}")
        else:
            task = Task.objects.filter(pk=options["id"]).first()
            if task is None:
                raise bad_input(f"id: no task with id {options['id']}")
        steps = [_step(step) for step in task.steps.order_by("position", "revision", "item")]
        events = [_event(event) for event in timeline.history(task.pk)[-count:]] if count else []
        if options["json"]:
            self.stdout.write(
                json.dumps(_as_json(task, steps, events), ensure_ascii=False, indent=2)
            )
            return
        for text in _as_lines(task, steps, events, count):
            self.stdout.write(text)


def _as_json(
    task: Task, steps: list[dict[str, Any]], events: list[dict[str, Any]]
) -> dict[str, Any]:
    return {
        "id": task.pk,
        "workflow": task.workflow,
        "status": task.live_status,
        "key": task.key,
        "queue": task.queue,
        "created_at": task.created_at.isoformat(),
        "finished_at": task.finished_at.isoformat() if task.finished_at else None,
        "steps": steps,
        "events": [{**event, "at": event["at"].isoformat()} for event in events],
    }


def _as_lines(
    task: Task, steps: list[dict[str, Any]], events: list[dict[str, Any]], count: int
) -> list[str]:
    facts = [
        ("key", task.key),
        ("queue", task.queue),
        ("created", when(task.created_at)),
        ("finished", when(task.finished_at)),
    ]
    lines = [f"Task #{task.pk} {task.workflow}: {task.live_status}"]
    lines.extend(f"  {text}" for text in table(("", ""), facts)[1:])
    lines += ["", "Steps"]
    rows = [
        (
            str(step["id"]),
            str(step["position"]),
            str(step["revision"]),
            step["kind"],
            step["status"],
            f"{step['attempts']} of {step['max_attempts']}",
            str(step["fencing_token"]),
            step["cause"] or "-",
            line(step["error"], limit=MAX_ERROR_LINE),
        )
        for step in steps
    ]
    header = ("step", "pos", "rev", "kind", "status", "attempts", "token", "cause", "error")
    lines.extend(f"  {text}" for text in table(header, rows, right=2))
    for step in steps:
        if step["result"] is not None:
            result = json.dumps(step["result"], ensure_ascii=False, sort_keys=True)
            lines.append(f"  result of step {step['id']}: {line(result, limit=MAX_ERROR_LINE)}")
    lines += ["", f"Last {count} events, oldest first" if events else "No events shown"]
    event_rows = [
        (
            when(event["at"]),
            event["kind"],
            str(event["step"] or "-"),
            event["actor"],
            line(event["reason"], limit=MAX_ERROR_LINE),
        )
        for event in events
    ]
    if event_rows:
        event_header = ("at", "event", "step", "actor", "reason")
        lines.extend(f"  {text}" for text in table(event_header, event_rows))
    return lines
