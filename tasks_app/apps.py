"""The core's app: when Django starts, the shipped workflows and every installed app's
``workflows`` module register, the doorbell backstop hooks into the worker, each
PostgreSQL session is named for its process, and the system check reads ``TASKS_LIMITS``."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

from django.apps import AppConfig
from django.conf import settings
from django.core import checks
from django.db.backends.signals import connection_created
from django.utils.module_loading import autodiscover_modules


def _name_the_session(sender: Any, connection: Any, **kwargs: Any) -> None:
    """Each PostgreSQL session says which process opened it (``application_name``, e.g.
    ``celery:4242``), so ``pg_stat_activity`` tells on-call whose connections they see."""
    if connection.vendor == "postgresql":
        name = f"{Path(sys.argv[0]).name or 'python'}:{os.getpid()}"
        with connection.cursor() as cursor:
            cursor.execute("SELECT set_config('application_name', %s, false)", [name[:63]])


def _register_sweep_jobs() -> None:
    """The core's own periodic work, run by the sweeper after it reaps and rings again
    (the engine knows none of it): retention prunes one batch of finished tasks and one of
    operator events past the audit retention and one of schedule runs past the retention per
    sweep (``tasks_app.operations.retention``);
    about once a minute, each workflow's counters go into the workflow figures' roll-up
    (``tasks_app.observability.workflow_samples``), always reported as 0, sampling being
    upkeep; and every schedule whose slot has come is ticked
    (``tasks_app.engine.schedule_ticks``), reported as the slots it enqueued."""
    from tasks_app.engine import schedule_ticks
    from tasks_app.engine.sweeper import register_sweep_job
    from tasks_app.observability import workflow_samples
    from tasks_app.operations import retention

    register_sweep_job("pruned", retention.sweep_tasks)
    register_sweep_job("pruned_audit_events", retention.sweep_audit_events)
    register_sweep_job("pruned_schedule_runs", retention.sweep_schedule_runs)
    register_sweep_job("workflow_samples", workflow_samples.sample)
    register_sweep_job("schedules", schedule_ticks.sweep_job)


def check_limits_setting(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """``TASKS_LIMITS`` as the system check reads it (``tasks_app.engine.limits``): a value
    the claims cannot read, or a name no workflow declares, would otherwise be found only
    by a worker in the middle of a claim, or never (an override of a misspelt name is
    silently no override at all). Run after every workflow registered, so each declared
    limit is known."""
    from tasks_app.engine.limits import check_settings, declared

    return [
        checks.Error(
            problem,
            hint="TASKS_LIMITS maps the name of a limit a workflow declares to "
            "{'concurrency': <whole number>, 'rate': '<count>/<period>'}, such as "
            "{'llm': {'rate': '300/m'}}.",
            id="tasks_app.E002",
        )
        for problem in check_settings(declared())
    ]


def _listen_to_events() -> None:
    """The operational log and the traces hear of every event recorded
    (``tasks_app.history.events``), which knows nothing of them; the traces' listener
    returns at once while tracing is off."""
    from tasks_app.history import events
    from tasks_app.observability import event_spans, oplog

    events.listen(oplog.log_event)
    events.listen(event_spans.on_event)


def _start_tracing() -> None:
    """Traces of every task, with ``TASKS_TRACING`` on (``tasks_app.observability.tracing``):
    the provider made and installed for this process, web and worker alike."""
    from tasks_app.observability import tracing

    tracing.setup(make_global=True)


class TasksAppConfig(AppConfig):
    name = "tasks_app"
    verbose_name = "Tasks"

    def ready(self) -> None:
        # Workflows shipped with the app register themselves on import; a worker node's
        # doorbell backstop starts and stops with the node (tasks_app.engine.backstop's signals).
        from tasks_app import backends  # noqa: F401
        from tasks_app.demo import workflows as demo_workflows  # noqa: F401
        from tasks_app.engine import backstop  # noqa: F401

        if settings.TASKS_DEMO_SCHEDULES:
            from tasks_app.demo import schedules as demo_schedules

            demo_schedules.declare()

        _register_sweep_jobs()
        _listen_to_events()
        _start_tracing()

        # A workflow of your own lives in the ``workflows`` module of an installed app (as
        # an admin lives in ``admin``): every process, web and worker alike, imports it
        # here, so a task a producer enqueues is one every worker can run.
        autodiscover_modules("workflows")

        connection_created.connect(_name_the_session, dispatch_uid="tasks_app.session_name")
        checks.register(check_limits_setting)
