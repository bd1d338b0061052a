"""PGQ: PgQueuer 1.x on asyncpg, its tables installed by ``pgq install`` (its default
durability, "durable": every table logged) in the bench database.

Workers are PgQueuer's own CLI, one process each:
``pgq run bench.pgq_app:create --batch-size 10`` (its default) or ``--batch-size 100``.
1.x wants the factory to be an async context manager (a plain ``async def`` returning the
``PgQueuer``, as older examples write it, is refused at start-up). The factory opens the
worker's one asyncpg connection, registers the no-op entrypoint, tells the harness it is
ready and waits for the go signal before it hands the ``PgQueuer`` to the CLI, so a drain
starts with every worker booted and connected. (``pgq run`` needs typer below 0.29:
``bench/requirements.txt`` says why.)
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import asyncpg
from pgqueuer import PgQueuer
from pgqueuer.db import AsyncpgDriver
from pgqueuer.models import Job

from bench import fake_remote
from bench.common import ENV_DSN, ENV_PGQ_EFFECT, mark_ready, wait_for_go

ENTRYPOINT = "bench_noop"
# The faults cell's job: records its run, applies its effect to the fake remote
# (bench/fake_remote.py) and works a little more, as a PgQueuer user writes one.
EFFECT_ENTRYPOINT = "bench_effect"


@asynccontextmanager
async def create() -> AsyncIterator[PgQueuer]:
    """The factory ``pgq run`` calls: one worker's ``PgQueuer``."""
    connection = await asyncpg.connect(os.environ[ENV_DSN])
    try:
        pgq = PgQueuer(AsyncpgDriver(connection))

        @pgq.entrypoint(ENTRYPOINT)  # type: ignore[untyped-decorator]
        async def noop(job: Job) -> None:
            return None

        if os.environ.get(ENV_PGQ_EFFECT):
            # Only there: another entrypoint would widen every other cell's dequeue.
            @pgq.entrypoint(EFFECT_ENTRYPOINT)  # type: ignore[untyped-decorator]
            async def effect(job: Job) -> None:
                fake_remote.record_run(job.id)
                fake_remote.apply(f"job-{job.id}")
                await asyncio.sleep(fake_remote.WORK_SECONDS)

        mark_ready()
        await asyncio.to_thread(wait_for_go)
        yield pgq
    finally:
        await connection.close()
