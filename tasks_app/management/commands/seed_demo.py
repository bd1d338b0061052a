from __future__ import annotations

import secrets
from typing import Any

from django.contrib.auth.models import Group, User
from django.core.management.base import BaseCommand
from django.db import transaction

from tasks_app import services

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
]


class Command(BaseCommand):
    help = "Create the demo users (passwords printed once, on creation) and a few demo tasks."

    def handle(self, *args: Any, **options: Any) -> None:
        with transaction.atomic():
            for username, (groups, superuser) in DEMO_USERS.items():
                self._user(username, groups, superuser)
        results = services.enqueue_many(DEMO_TASKS, actor="cli:seed_demo")
        created = sum(result.created for result in results)
        self.stdout.write(f"Demo tasks: {created} new, {len(results) - created} already there.")

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
