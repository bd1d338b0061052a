"""``manage.py task_status``: one task as JSON, by id or idempotency key, with what
producers and people wrote redacted as on the console's pages
(``tasks_app.operations.redaction``)."""

from __future__ import annotations

import json
from typing import Any

from django.core.management.base import CommandParser

from tasks_app import services
from tasks_app.management.cli import OperatorCommand, bad_input
from tasks_app.models import Event, Step, StepStatus, Task
from tasks_app.operations.redaction import redact, redact_text

MAX_EVENTS = 1000


def _failing(step: Step) -> bool:
    """Whether the step's stored error is its current one: it is dead, or waits for a
    retry. A step that ran again since (and succeeded, or runs now) keeps the text of an
    old failure on its row; that is history, not its state."""
    return step.status == StepStatus.DEAD or (
        step.status == StepStatus.PENDING and step.attempts > 0
    )


def _step(step: Step) -> dict[str, Any]:
    failing = _failing(step)
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
        "error": redact_text(step.last_error) if failing else "",
        # What the commands' --cause and /dead/groups/ group it by.
        "cause": step.error_fingerprint if step.status == StepStatus.DEAD else "",
    }


def _event(event: Event) -> dict[str, Any]:
    return {
        "at": event.created_at.isoformat(),
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
        "Print a task as JSON, by id or idempotency key: its status, its steps (with the "
        "error of a failing step) and its last events, secrets redacted as on the console."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        group = parser.add_mutually_exclusive_group(required=True)
        group.add_argument("--id", type=int)
        group.add_argument("--key")
        parser.add_argument(
            "--events", default="10", metavar="N", help="how many of the last events (10)"
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
        steps = [_step(step) for step in task.steps.order_by("position", "revision")]
        last = list(Event.objects.for_task(task.pk).order_by("-id")[:count]) if count else []
        self.stdout.write(
            json.dumps(
                {
                    "id": task.pk,
                    "workflow": task.workflow,
                    "status": task.status,
                    "key": task.key,
                    "queue": task.queue,
                    "created_at": task.created_at.isoformat(),
                    "finished_at": task.finished_at.isoformat() if task.finished_at else None,
                    "steps": steps,
                    "events": [_event(event) for event in reversed(last)],
                },
                ensure_ascii=False,
            )
        )
