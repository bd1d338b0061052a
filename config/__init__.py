"""The project's configuration: the settings, the URLs, the entry points and the Celery app
(loaded here so that `@shared_task` binds to it)."""

from __future__ import annotations

from config.celery import app as celery_app

__all__ = ["celery_app"]
