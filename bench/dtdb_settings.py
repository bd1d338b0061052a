"""DTDB's Django settings: django-tasks-db as the tasks backend of a project of its own,
nothing else installed, on the bench database with persistent connections
(``CONN_MAX_AGE=None``), as a ``db_worker`` deployment keeps them. The project's own
settings are not involved."""

from __future__ import annotations

import os

import dj_database_url

SECRET_KEY = "bench-dtdb-" + "x" * 50  # nothing here is secret
DEBUG = False
USE_TZ = True
INSTALLED_APPS = ["django_tasks_db"]
DATABASES = {
    "default": dj_database_url.parse(os.environ["BENCH_DSN"], conn_max_age=None),
}
TASKS = {
    "default": {
        "BACKEND": "django_tasks_db.DatabaseBackend",
        "QUEUES": ["bench"],
    }
}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
LOGGING_CONFIG = None
