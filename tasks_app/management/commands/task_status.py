from __future__ import annotations

import json
from argparse import ArgumentParser
from typing import Any

from django.core.management.base import BaseCommand, CommandError

from tasks_app import services
from tasks_app.models import Task


class Command(BaseCommand):
    help = "Print a task's status, steps and results as JSON, by id or idempotency key."

    def add_arguments(self, parser: ArgumentParser) -> None:
        group = parser.add_mutually_exclusive_group(required=True)
        group.add_argument("--id", type=int)
        group.add_argument("--key")

    def handle(self, *args: Any, **options: Any) -> None:
        if options["key"]:
            task = services.get_task(idempotency_key=options["key"])
        else:
            task = Task.objects.filter(pk=options["id"]).first()
        if task is None:
            raise CommandError("no such task")
        steps = [
            {
                "id": step.pk,
                "kind": step.kind,
                "revision": step.revision,
                "status": step.status,
                "attempts": step.attempts,
                "fencing_token": step.fencing_token,
                "result": step.result,
                "error_class": step.error_class,
            }
            for step in task.steps.order_by("position", "revision")
        ]
        self.stdout.write(
            json.dumps(
                {"id": task.pk, "workflow": task.workflow, "status": task.status, "steps": steps}
            )
        )
