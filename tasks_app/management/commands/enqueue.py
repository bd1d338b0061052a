"""``manage.py enqueue``: a producer's way in from a shell, through the service API."""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

from django.core.management.base import CommandParser

from tasks_app import services, validation
from tasks_app.management.cli import (
    OperatorCommand,
    actor_from,
    add_actor_argument,
    bad_input,
    read_payload,
)


def _integer(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise bad_input(f"priority: must be an integer, not {text!r}") from None


class Command(OperatorCommand):
    help = (
        "Enqueue a task through the service API and print it as JSON. The payload comes "
        "from --payload JSON, --payload-file PATH, or standard input (either given as -)."
    )
    # call_command(..., stdin=stream) stands in for standard input.
    stealth_options = ("stdin",)

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("workflow")
        parser.add_argument("--payload", help="a JSON object; - reads standard input")
        parser.add_argument(
            "--payload-file", metavar="PATH", help="a file holding the JSON object; - for stdin"
        )
        parser.add_argument("--key", dest="idempotency_key", default=None)
        parser.add_argument("--queue", default="default")
        parser.add_argument(
            "--priority",
            default="0",
            help=f"an integer from {validation.MIN_PRIORITY} to {validation.MAX_PRIORITY}",
        )
        parser.add_argument("--run-after", default=None, help="ISO 8601 with a time zone")
        add_actor_argument(parser)

    def handle(self, *args: Any, **options: Any) -> None:
        payload = read_payload(
            options["payload"], options["payload_file"], stdin=options.get("stdin")
        )
        try:
            run_after = (
                datetime.fromisoformat(options["run_after"]) if options["run_after"] else None
            )
        except ValueError:
            raise bad_input("run_after: not an ISO 8601 date and time") from None
        result = services.enqueue(
            options["workflow"],
            payload,
            idempotency_key=options["idempotency_key"],
            queue=options["queue"],
            priority=_integer(options["priority"]),
            run_after=run_after,
            actor=actor_from(options["actor"]),
        )
        task = result.task
        self.stdout.write(
            json.dumps(
                {"id": task.pk, "created": result.created, "status": task.status, "key": task.key}
            )
        )
