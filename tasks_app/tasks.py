"""Celery tasks: thin adapters that take ids and call services."""

from __future__ import annotations

from celery import shared_task

from tasks_app import services
from tasks_app.engine import runner


@shared_task(name="tasks_app.tasks.run_step", ignore_result=True)
def run_step(step_id: int) -> None:
    """Run the step if it can be claimed, then drain its queue's other due steps; a
    duplicate or late message finds nothing to claim and does nothing."""
    runner.drain(step_id)


@shared_task(name="tasks_app.tasks.sweep", ignore_result=True)
def sweep() -> dict[str, int]:
    return services.sweep().as_dict()
