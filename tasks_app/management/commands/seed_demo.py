from __future__ import annotations

import secrets
from typing import Any

from django.contrib.auth.models import Group, User
from django.core.management.base import BaseCommand
from django.db import transaction

from tasks_app import runner, services
from tasks_app.models import Task

# username -> (groups, superuser)
DEMO_USERS: dict[str, tuple[tuple[str, ...], bool]] = {
    "editor": (("editors",), False),
    "oncall": (("oncall",), False),
    "auditor": (("auditors",), False),
    "admin": ((), True),
}

DEMO_TASKS: list[dict[str, Any]] = [
    {"workflow": "demo.noop", "payload": {"hello": "world"}, "idempotency_key": "demo:noop:1"},
    {"workflow": "demo.noop", "payload": {"hello": "again"}, "idempotency_key": "demo:noop:2"},
    {
        "workflow": "demo.flaky",
        "payload": {"fail_first": 2},
        "idempotency_key": "demo:flaky:retries-then-succeeds",
    },
    {
        "workflow": "demo.flaky",
        "payload": {"fail_first": 5},
        "idempotency_key": "demo:flaky:dead-letter",
    },
    {
        "workflow": "publish_article",
        "payload": {
            "article_id": "article-001",
            "title": "Durable tasks, explained",
            "brief": "Why every step is claimed in the database before it runs.",
        },
        "idempotency_key": "demo:publish:article-001:v1",
    },
    {
        "workflow": "ticket_reply",
        "payload": {
            "ticket_id": "T-1001",
            "customer_id": "acme-corp",
            "message": "Our invoice for November lists the wrong plan.",
        },
        "idempotency_key": "demo:reply:T-1001",
    },
]
# Brought to their review here, so an editor finds a draft waiting on first login.
WAIT_FOR_EDITOR = {"demo:publish:article-001:v1"}


class Command(BaseCommand):
    help = "Create the demo users (passwords printed once, on creation) and a few demo tasks."

    def handle(self, *args: Any, **options: Any) -> None:
        with transaction.atomic():
            for username, (groups, superuser) in DEMO_USERS.items():
                self._user(username, groups, superuser)
        results = services.enqueue_many(DEMO_TASKS, actor="cli:seed_demo")
        created = sum(result.created for result in results)
        self.stdout.write(f"Demo tasks: {created} new, {len(results) - created} already there.")
        for result in results:
            if result.created and result.task.idempotency_key in WAIT_FOR_EDITOR:
                self._run_to_review(result.task)

    def _run_to_review(self, task: Task) -> None:
        """Run the task's steps in this process until it waits for a decision."""
        runner.run_task_steps(task)
        task.refresh_from_db()
        self.stdout.write(f"  task #{task.pk} {task.workflow}: {task.status}")

    def _user(self, username: str, groups: tuple[str, ...], superuser: bool) -> None:
        if User.objects.filter(username=username).exists():
            self.stdout.write(f"  {username:8} exists (password unchanged)")
            return
        password = secrets.token_urlsafe(12)
        user = User.objects.create_user(
            username=username,
            password=password,
            is_staff=True,
            is_superuser=superuser,
        )
        user.groups.add(*Group.objects.filter(name__in=groups))
        self.stdout.write(f"  {username:8} password: {password}   (shown once)")
