"""DTDB: django-tasks-db, the database backend of Django's tasks framework, in a Django
project of its own (``bench/dtdb_settings.py``). This is its no-op task."""

from __future__ import annotations

from django.tasks import task

QUEUE = "bench"


@task(queue_name=QUEUE)
def noop() -> None:
    return None
