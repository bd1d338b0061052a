"""One procrastinate worker process (concurrency 1, or ``BENCH_PROC_CONCURRENCY``), as
``procrastinate worker --concurrency N`` runs it, plus the harness's barrier: open the app
(its pool connects), say ready, wait for the go signal, then run the worker until SIGTERM.
``python -m bench.proc_worker``."""

from __future__ import annotations

import asyncio
import os

from bench.common import ENV_PROC_CONCURRENCY, PROC_QUEUE, mark_ready, wait_for_go
from bench.proc_app import make_app


async def main() -> None:
    app = make_app().app
    async with app.open_async():
        mark_ready()
        await asyncio.to_thread(wait_for_go)
        await app.run_worker_async(
            queues=[PROC_QUEUE],
            concurrency=int(os.environ.get(ENV_PROC_CONCURRENCY, "1")),
            wait=True,
            name=f"bench-{os.getpid()}",
            install_signal_handlers=True,
        )


if __name__ == "__main__":
    asyncio.run(main())
