from __future__ import annotations

import contextlib
import os
from typing import Any

from celery import Celery
from celery.signals import (
    task_postrun,
    task_prerun,
    worker_init,
    worker_process_init,
    worker_process_shutdown,
    worker_ready,
    worker_shutdown,
)

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")

app = Celery("config")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()


@task_prerun.connect
def _fresh_enough_connections(**kwargs: Any) -> None:
    """Before each task, as Django does before each request: drop connections that broke
    or outlived CONN_MAX_AGE, keep the rest (and their prepared statements)."""
    from django.db import close_old_connections

    from tasks_app.idle_connections import idle_closer

    idle_closer.busy()
    close_old_connections()


@task_postrun.connect
def _connections_rest(**kwargs: Any) -> None:
    """After each task: a process that runs no other task for ``CONN_MAX_AGE`` gives its
    connection back (tasks_app.idle_connections)."""
    from tasks_app.idle_connections import idle_closer

    idle_closer.rest()


_heartbeat: Any = None


@worker_ready.connect
def _report_presence(sender: Any, **kwargs: Any) -> None:
    """A worker node reports itself now and every TASKS_HEARTBEAT_SECONDS after, from a
    thread of its main process (tasks_app.presence)."""
    global _heartbeat
    from django.conf import settings

    from tasks_app import presence

    consumer = sender
    node = presence.describe_consumer(consumer)
    presence.worker_started(node)
    _heartbeat = presence.HeartbeatThread(
        node.name, lambda: presence.describe_consumer(consumer), settings.TASKS_HEARTBEAT_SECONDS
    )
    _heartbeat.start()


@worker_shutdown.connect
def _report_shutdown(sender: Any, **kwargs: Any) -> None:
    from django.db import DatabaseError

    from tasks_app import presence

    if _heartbeat is None:
        return
    _heartbeat.stop()
    # If the database is away the node shows as silent, which is what on-call should see.
    with contextlib.suppress(DatabaseError):
        presence.worker_stopped(_heartbeat.node_name)


@worker_init.connect
def _prepare_claims_records(**kwargs: Any) -> None:
    """The main process makes the directory where its pool processes record what they
    hold, so it can hand their claims back if one dies (tasks_app.crashes)."""
    from tasks_app import crashes

    crashes.prepare()


@worker_ready.connect
def _watch_pool_processes(**kwargs: Any) -> None:
    from tasks_app import crashes

    crashes.watch()


@worker_process_init.connect
def _record_claims(**kwargs: Any) -> None:
    from tasks_app import crashes

    crashes.start_recording()


@worker_process_shutdown.connect
def _stop_recording_claims(**kwargs: Any) -> None:
    from tasks_app import crashes

    crashes.stop_recording()


@worker_shutdown.connect
def _remove_claims_records(**kwargs: Any) -> None:
    from tasks_app import crashes

    crashes.clean_up()
