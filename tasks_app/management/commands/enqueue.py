from __future__ import annotations

import json
from argparse import ArgumentParser
from datetime import datetime
from typing import Any

from django.core.management.base import BaseCommand, CommandError

from tasks_app import services
from tasks_app.exceptions import IdempotencyConflict, InvalidInput


class Command(BaseCommand):
    help = "Enqueue a task through the service API and print it as JSON."

    def add_arguments(self, parser: ArgumentParser) -> None:
        parser.add_argument("workflow")
        parser.add_argument("--payload", default="{}", help="a JSON object")
        parser.add_argument("--key", dest="idempotency_key", default=None)
        parser.add_argument("--queue", default="default")
        parser.add_argument("--priority", type=int, default=0)
        parser.add_argument("--run-after", default=None, help="ISO 8601 with a time zone")
        parser.add_argument("--actor", default="cli", help="recorded as cli:<actor>")

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            payload = json.loads(options["payload"])
        except json.JSONDecodeError as exc:
            raise CommandError(f"payload: not valid JSON ({exc})") from None
        try:
            run_after = (
                datetime.fromisoformat(options["run_after"]) if options["run_after"] else None
            )
        except ValueError:
            raise CommandError("run_after: not an ISO 8601 date and time") from None
        try:
            result = services.enqueue(
                options["workflow"],
                payload,
                idempotency_key=options["idempotency_key"],
                queue=options["queue"],
                priority=options["priority"],
                run_after=run_after,
                actor=f"cli:{options['actor']}",
            )
        except (InvalidInput, IdempotencyConflict) as exc:
            raise CommandError(str(exc)) from None
        task = result.task
        self.stdout.write(
            json.dumps(
                {"id": task.pk, "created": result.created, "status": task.status, "key": task.key}
            )
        )
