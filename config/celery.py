"""The Celery app: its settings are Django's (namespace ``CELERY``), its tasks the
installed apps'."""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Iterator, Mapping
from functools import cached_property
from typing import Any

from celery import Celery
from celery.signals import (
    task_postrun,
    task_prerun,
    task_received,
    task_revoked,
    worker_init,
    worker_process_init,
    worker_process_shutdown,
    worker_ready,
    worker_shutdown,
    worker_shutting_down,
)

from tasks_app.observability.logs import DiscardSummary

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")


class App(Celery):
    """Celery, whose worker and beat programs keep a JSON log pure JSON
    (tasks_app.integrations.programs)."""

    @cached_property
    def Worker(self) -> Any:
        return self.subclass_with_self("tasks_app.integrations.programs:Worker")  # type: ignore[arg-type]

    @cached_property
    def Beat(self) -> Any:
        return self.subclass_with_self("tasks_app.integrations.programs:Beat")  # type: ignore[arg-type]


class _CelerySettings(Mapping[str, Any]):
    """Django's ``CELERY_*`` settings as a plain mapping, read once on first use.

    Celery looks each of its settings up under several names on every message it sends; on
    Django's settings object each name it lacks raises and catches an AttributeError, which
    made the lookups a good part of a doorbell's cost. Settings do not change while a
    process runs (``app.conf.update`` still does, above this mapping)."""

    @cached_property
    def _values(self) -> dict[str, Any]:
        from django.conf import settings

        return {
            name: getattr(settings, name) for name in dir(settings) if name.startswith("CELERY_")
        }

    def __getitem__(self, key: str) -> Any:
        return self._values[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._values)

    def __len__(self) -> int:
        return len(self._values)


app = App("config")
app.config_from_object(_CelerySettings(), namespace="CELERY")
app.autodiscover_tasks()


@task_prerun.connect
def _fresh_enough_connections(**kwargs: Any) -> None:
    """Before each task, as Django does before each request: drop connections that broke
    or outlived CONN_MAX_AGE, keep the rest (and their prepared statements)."""
    from django.db import close_old_connections

    from tasks_app.db.idle_connections import idle_closer

    idle_closer.busy()
    close_old_connections()


@task_postrun.connect
def _connections_rest(**kwargs: Any) -> None:
    """After each task: a process that runs no other task for ``CONN_MAX_AGE`` gives its
    connection back (tasks_app.db.idle_connections)."""
    from tasks_app.db.idle_connections import idle_closer

    idle_closer.rest()


_heartbeat: Any = None


@worker_ready.connect
def _report_presence(sender: Any, **kwargs: Any) -> None:
    """A worker node reports itself now and every TASKS_HEARTBEAT_SECONDS after, from a
    thread of its main process (tasks_app.engine.presence)."""
    global _heartbeat
    from django.conf import settings

    from tasks_app.engine import presence

    consumer = sender
    node = presence.describe_consumer(consumer)
    presence.worker_started(node)
    _heartbeat = presence.HeartbeatThread(
        node.name, lambda: presence.describe_consumer(consumer), settings.TASKS_HEARTBEAT_SECONDS
    )
    _heartbeat.start()


@worker_shutting_down.connect
def _heartbeat_leaving(**kwargs: Any) -> None:
    """A warm shutdown stops the consumer before the pool finishes its steps: the node
    asks for no work on purpose, which the heartbeat must not take for a broker it cannot
    read (it would say it no longer reports the node as live)."""
    if _heartbeat is not None:
        _heartbeat.leaving()


@worker_shutdown.connect
def _report_shutdown(sender: Any, **kwargs: Any) -> None:
    from django.db import DatabaseError

    from tasks_app.engine import presence

    if _heartbeat is None:
        return
    _heartbeat.stop()
    # If the database is away the node shows as silent, which is what on-call should see.
    with contextlib.suppress(DatabaseError):
        presence.worker_stopped(_heartbeat.node_name)


@worker_init.connect
def _refuse_a_taken_name(sender: Any, **kwargs: Any) -> None:
    """A node whose name another live node reports under does not start: one heartbeat row
    would stand for both, and a dead one would look live (tasks_app.engine.presence)."""
    import logging
    import os
    import socket

    from django.db import DatabaseError

    from tasks_app.engine import presence

    try:
        taken = presence.name_taken(sender.hostname, socket.gethostname(), os.getpid())
    except DatabaseError:
        return  # without the database the name cannot be checked: the node starts
    if taken is not None:
        logging.getLogger("tasks_app.engine.presence").critical("not starting: %s", taken)
        raise SystemExit(2)


@worker_init.connect
def _prepare_claims_records(**kwargs: Any) -> None:
    """The main process makes the directory where its pool processes record what they
    hold, so it can hand their claims back if one dies (tasks_app.engine.crashes)."""
    from tasks_app.engine import crashes

    crashes.prepare()


@worker_init.connect
def _share_the_stopping_flag(**kwargs: Any) -> None:
    """Before the pool forks: a flag the pool processes read before each claim and each
    step, raised when a warm shutdown begins (tasks_app.engine.stopping)."""
    from tasks_app.engine import stopping

    stopping.prepare()


@worker_shutting_down.connect
def _stop_claiming(**kwargs: Any) -> None:
    """The pool processes claim nothing more, finish the step each runs and hand back the
    steps they hold but have not started."""
    from tasks_app.engine import stopping

    stopping.begin()


@worker_ready.connect
def _watch_pool_processes(**kwargs: Any) -> None:
    from tasks_app.engine import crashes

    crashes.watch()


@worker_process_init.connect
def _record_claims(**kwargs: Any) -> None:
    from tasks_app.engine import crashes

    crashes.start_recording()


@worker_process_shutdown.connect
def _stop_recording_claims(**kwargs: Any) -> None:
    from tasks_app.engine import crashes

    crashes.stop_recording()


@worker_process_shutdown.connect
def _write_counts(**kwargs: Any) -> None:
    """A pool process ends without running exit handlers: what it counted is written now."""
    from tasks_app.history import counting

    counting.flush_at_exit()


@worker_shutdown.connect
def _remove_claims_records(**kwargs: Any) -> None:
    from tasks_app.engine import crashes

    crashes.clean_up()


# Messages a worker discards unrun (a sweep that expired in the queue while no maintenance
# worker consumed it), summed up in one line instead of Celery's line each.
_discards = DiscardSummary(logging.getLogger(__name__))


@task_revoked.connect
def _count_discarded(
    sender: Any, expired: bool = False, terminated: bool = False, **kwargs: Any
) -> None:
    if not terminated:
        _discards.discarded(getattr(sender, "name", str(sender)), expired=bool(expired))


@task_received.connect
def _report_discarded(**kwargs: Any) -> None:
    """A message taken (not discarded): what was discarded before it is told now."""
    _discards.report()


@worker_shutdown.connect
def _report_discarded_at_shutdown(**kwargs: Any) -> None:
    _discards.report()
