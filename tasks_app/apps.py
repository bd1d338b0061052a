from __future__ import annotations

from django.apps import AppConfig


class TasksAppConfig(AppConfig):
    name = "tasks_app"
    verbose_name = "Tasks"

    def ready(self) -> None:
        # Workflows shipped with the app register themselves on import.
        from . import backends, demo_workflows  # noqa: F401
