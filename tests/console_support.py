"""Helpers for the tests of the console and the commands: logged-in clients and tasks in
the states pages and commands act on, reached by running their steps in this process."""

from __future__ import annotations

from typing import Any

from django.contrib.auth.models import User
from django.test import Client

from tasks_app import runner, services
from tasks_app.models import Task, TaskStatus

HTMX = {"HX-Request": "true"}


def login(user: User, **client_options: Any) -> Client:
    client = Client(**client_options)
    client.force_login(user)
    return client


def dead_task(
    payload: dict[str, Any] | None = None, *, key: str | None = None, actor: Any = "cli:producer"
) -> Task:
    """A ``demo.flaky`` task that died at its first claim (a permanent error unless the
    payload says otherwise)."""
    task = services.enqueue(
        "demo.flaky",
        payload if payload is not None else {"error": "permanent", "fail_first": 1},
        idempotency_key=key,
        actor=actor,
    ).task
    runner.run_task_steps(task)
    task.refresh_from_db()
    assert task.status == TaskStatus.DEAD, task.status
    return task


def noop(key: str | None = None) -> Task:
    return services.enqueue("demo.noop", {}, idempotency_key=key, actor="cli:producer").task


def succeeded(key: str | None = None) -> Task:
    task = noop(key)
    runner.run_task_steps(task)
    task.refresh_from_db()
    assert task.status == TaskStatus.SUCCEEDED
    return task
