"""PROC: procrastinate 3.x on the same PostgreSQL, its schema in the bench database.

The task is an ``async def`` that does nothing: procrastinate's lightest path (a sync
task would run in a thread). The faults cell's task, ``bench.effect``, records its run,
applies its effect to the fake remote (``bench/fake_remote.py``) and works a little more,
as a procrastinate user writes a job with a side effect. Workers are separate processes
with concurrency 1 each, like the prefork children of the Celery-based systems
(``bench.proc_worker``).
"""

from __future__ import annotations

import asyncio
import os
from dataclasses import dataclass
from typing import Any

import procrastinate

from bench import fake_remote
from bench.common import ENV_DSN, PROC_QUEUE


@dataclass(frozen=True)
class ProcApp:
    app: Any  # procrastinate.App
    noop: Any  # its bench.noop task
    effect: Any  # its bench.effect task (the faults cell)


def make_app(dsn: str | None = None, **pool_args: Any) -> ProcApp:
    """A procrastinate App on the bench database (``BENCH_DSN`` unless ``dsn``)."""
    connector = procrastinate.PsycopgConnector(conninfo=dsn or os.environ[ENV_DSN], **pool_args)
    app = procrastinate.App(connector=connector)

    @app.task(name="bench.noop", queue=PROC_QUEUE)  # type: ignore[untyped-decorator]
    async def noop() -> None:
        return None

    @app.task(name="bench.effect", queue=PROC_QUEUE, pass_context=True)  # type: ignore[untyped-decorator]
    async def effect(context: Any) -> None:
        job = context.job.id
        fake_remote.record_run(job)
        fake_remote.apply(f"job-{job}")
        await asyncio.sleep(fake_remote.WORK_SECONDS)

    return ProcApp(app, noop, effect)


def apply_schema(dsn: str) -> None:
    """Install procrastinate's tables, functions and triggers in the bench database."""
    app = make_app(dsn).app
    with app.open():
        app.schema_manager.apply_schema()
