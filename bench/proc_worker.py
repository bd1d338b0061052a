"""One procrastinate worker process (concurrency 1, or ``BENCH_PROC_CONCURRENCY``), as
``procrastinate worker --concurrency N`` runs it, plus the harness's barrier: open the app
(its pool connects), say ready, wait for the go signal, then run the worker until SIGTERM.
``python -m bench.proc_worker``.

With ``BENCH_PROC_STALLED_SECONDS`` (the faults cell) the worker also does what
procrastinate's documentation tells its users to schedule so that jobs of a dead worker run
again: every ``BENCH_PROC_RETRY_EVERY`` seconds, ``get_stalled_jobs`` (jobs ``doing`` on a
worker whose heartbeat is older than that many seconds) and ``retry_job`` for each; its
heartbeat is then sent every third of those seconds.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from typing import Any

from bench.common import (
    ENV_PROC_CONCURRENCY,
    ENV_PROC_RETRY_EVERY,
    ENV_PROC_STALLED,
    PROC_QUEUE,
    mark_ready,
    wait_for_go,
)
from bench.proc_app import make_app


async def retry_stalled(app: Any, stalled: float, every: float) -> None:
    """The documented recipe, as a loop instead of a periodic task."""
    while True:
        await asyncio.sleep(every)
        # A retry another worker made first, or a connection lost meanwhile, waits for
        # the next round.
        with contextlib.suppress(Exception):
            for job in await app.job_manager.get_stalled_jobs(seconds_since_heartbeat=stalled):
                with contextlib.suppress(Exception):
                    await app.job_manager.retry_job(job)


async def main() -> None:
    app = make_app().app
    stalled = float(os.environ.get(ENV_PROC_STALLED) or 0)
    options: dict[str, Any] = {}
    if stalled:
        options = {"update_heartbeat_interval": stalled / 3, "stalled_worker_timeout": stalled}
    async with app.open_async():
        mark_ready()
        await asyncio.to_thread(wait_for_go)
        retrying = None
        if stalled:
            every = float(os.environ.get(ENV_PROC_RETRY_EVERY) or 1)
            retrying = asyncio.create_task(retry_stalled(app, stalled, every))
        try:
            await app.run_worker_async(
                queues=[PROC_QUEUE],
                concurrency=int(os.environ.get(ENV_PROC_CONCURRENCY, "1")),
                wait=True,
                name=f"bench-{os.getpid()}",
                install_signal_handlers=True,
                **options,
            )
        finally:
            if retrying is not None:
                retrying.cancel()


if __name__ == "__main__":
    asyncio.run(main())
