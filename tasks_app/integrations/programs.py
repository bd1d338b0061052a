"""The long-running programs as they start: Celery's worker and beat (``config.celery``
makes the app build them from here) and gunicorn's logger (the Procfile's
``--logger-class``). With ``TASKS_LOG_FORMAT=json`` every line they write is one JSON
object; with ``text`` they write what Celery and gunicorn always did.

What Celery and gunicorn write outside logging, and how each is kept to JSON:

- the worker's banner (about twenty lines of configuration, queues and tasks) and beat's
  ("celery beat v5 is starting." and its settings): printed unless quiet, so they are quiet;
- the worker's "worker: Warm shutdown (MainProcess)" on SIGTERM (and the cold one on
  SIGQUIT): written straight to the terminal, so the handlers are installed without it and
  the worker logs the shutdown itself;
- Python warnings (Celery's about running as root, from the worker's first steps, before
  Django is set up): logging is set up first, and captures warnings into it
  (``tasks_app.observability.logs.configure``, logger ``py.warnings``);
- gunicorn's own lines and its access log: its handlers are given the JSON formatter.

Ctrl-C's hints ("Hitting Ctrl+C again …") stay Celery's: they are for a person at a
terminal, not for a collector.

gunicorn's logger is made in its master process before any worker starts, so it reads the
settings there first: a deployment whose settings are refused stops with one list of them
(``config.env.stop_if_refused``) instead of each worker failing with a traceback.
"""

from __future__ import annotations

import logging
import os
from typing import Any

from celery import beat as celery_beat
from celery import platforms
from celery.apps import worker as celery_worker
from celery.apps.beat import Beat as CeleryBeat
from celery.signals import worker_shutting_down
from gunicorn.glogging import Logger as GunicornLogger  # type: ignore[import-untyped]

logger = logging.getLogger(__name__)


def json_log() -> bool:
    from django.conf import settings

    return bool(settings.TASKS_LOG_FORMAT == "json")


def set_up_logging() -> None:
    """Django's logging set-up, as ``django.setup`` does it (which Celery runs later): the
    settings' handlers, and Python's warnings captured into them."""
    from django.conf import settings
    from django.utils.log import configure_logging

    configure_logging(settings.LOGGING_CONFIG, settings.LOGGING)


def _say_shutting_down(sig: str = "", how: str = "", **kwargs: Any) -> None:
    logger.info("worker: %s shutdown (%s)", how.lower(), sig)


class Worker(celery_worker.Worker):
    def on_before_init(self, quiet: bool = False, **kwargs: Any) -> None:
        self.json_log = json_log()
        if self.json_log:
            # Before Celery's first checks, whose warnings would otherwise be plain text.
            set_up_logging()
            worker_shutting_down.connect(_say_shutting_down, weak=False)
        super().on_before_init(quiet=quiet or self.json_log, **kwargs)

    def install_platform_tweaks(self, worker: Any) -> None:
        super().install_platform_tweaks(worker)
        if self.json_log:
            # The same handlers, without their line written past logging.
            # (Celery's types do not name them: they are made with functools.partial.)
            for name in ("install_worker_term_handler", "install_worker_term_hard_handler"):
                getattr(celery_worker, name)(worker, verbose=False)


class Beat(CeleryBeat):
    def __init__(self, *, quiet: bool = False, **kwargs: Any) -> None:
        json = json_log()
        if json:
            set_up_logging()
        super().__init__(quiet=quiet or json, **kwargs)

    def install_sync_handler(self, service: celery_beat.Service) -> None:
        """SIGTERM and SIGINT: save and close the scheduler if it is made, then exit.

        Celery's handler asks the service for its scheduler, which builds one if none is
        made yet: a signal while beat is still opening its schedule file built a second
        scheduler inside the first's import of the file's database module, which failed,
        and beat exited with status 1 and a traceback instead of stopping."""

        def stop(signum: int, frame: Any) -> None:
            if "scheduler" in service.__dict__:  # a cached property, once made
                service.sync()  # closing the scheduler says it stopped (integrations.beat)
            else:
                logger.info(
                    "beat: stopped; messages sent since it started: none "
                    "(stopped while opening its schedule)"
                )
            raise SystemExit()

        platforms.signals.update(SIGTERM=stop, SIGINT=stop)


class Logger(GunicornLogger):  # type: ignore[misc]  # gunicorn has no types
    """gunicorn's logger: reads the settings first (refused ones stop the master), and
    formats its lines as JSON in a JSON log."""

    def setup(self, cfg: Any) -> None:
        super().setup(cfg)
        os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
        if json_log():
            from tasks_app.observability.logs import JsonFormatter

            formatter = JsonFormatter()
            for log in (self.error_log, self.access_log):
                for handler in log.handlers:
                    handler.setFormatter(formatter)
