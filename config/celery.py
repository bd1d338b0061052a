from __future__ import annotations

import os
from typing import Any

from celery import Celery
from celery.signals import task_prerun

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")

app = Celery("config")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()


@task_prerun.connect
def _fresh_enough_connections(**kwargs: Any) -> None:
    """Before each task, as Django does before each request: drop connections that broke
    or outlived CONN_MAX_AGE, keep the rest (and their prepared statements)."""
    from django.db import close_old_connections

    close_old_connections()
