"""DBOS: DBOS Transact, a one-step workflow on a DBOS queue, its system tables (schema
``dbos``, all logged) in the bench database, so its commits and WAL are counted like every
other system's.

A worker process is a DBOS application as its users start one: ``DBOS(config=...)`` with
an executor id of its own, ``DBOS.launch()``, the queue registered with
``worker_concurrency`` and ``polling_interval_sec`` (below), then it runs until SIGTERM.
``python -m bench.dbos_app``; ``python -m bench.dbos_app migrate`` creates the system
tables (DBOS's own migrations).

For a drain the harness holds the queue: between cells its row says a worker concurrency
of 0, and the workers register it so (``BENCH_DBOS_HELD``), so they boot, connect and poll
but dequeue nothing; the release sets it to ``WORKER_CONCURRENCY`` in the queue's row,
which every worker re-reads at each poll (DBOS's own way of changing a queue's limits at
run time).
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from typing import Any

from dbos import DBOS, DBOSConfig

from bench.common import ENV_DSN, mark_ready

APP_NAME = "bench"
QUEUE = "bench"
WORKFLOW = "noop_workflow"
SCHEMA = "dbos"
# Workflows one process runs at once (each in a thread of DBOS's executor) and how often
# it polls its queue. Without a per-worker limit one poll claims every queued workflow.
# With 2 processes on the bench machine 20 and 50 drained slower and 100, 200 and 400
# alike (CPU-bound from 100 on): 100 is the smallest of those, with the least memory.
# 0.1 s is a tenth of DBOS's default interval, for latency's sake.
WORKER_CONCURRENCY = 100
POLLING_INTERVAL_S = 0.1
ENV_HELD = "BENCH_DBOS_HELD"


def system_database_url(dsn: str) -> str:
    """DBOS's SQLAlchemy URL for the bench database (psycopg 3 driver)."""
    scheme, rest = dsn.split("://", 1)
    return f"postgresql+psycopg://{rest}" if scheme.startswith("postgres") else dsn


@DBOS.step()  # type: ignore[untyped-decorator]
def noop_step() -> None:
    return None


@DBOS.workflow(name=WORKFLOW)  # type: ignore[untyped-decorator]
def noop_workflow() -> None:
    noop_step()


def migrate(dsn: str) -> None:
    DBOS.migrate(system_database_url(dsn), schema=SCHEMA)


def main() -> None:
    config: DBOSConfig = {
        "name": APP_NAME,
        "system_database_url": system_database_url(os.environ[ENV_DSN]),
        "executor_id": f"bench-{os.getpid()}",
        "dbos_system_schema": SCHEMA,
        "log_level": "WARNING",
    }
    DBOS(config=config)
    DBOS.launch()
    held = bool(os.environ.get(ENV_HELD))
    DBOS.register_queue(
        QUEUE,
        worker_concurrency=0 if held else WORKER_CONCURRENCY,
        polling_interval_sec=POLLING_INTERVAL_S,
        on_conflict="always_update",
    )
    stop = threading.Event()

    def _stop(*_: Any) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    # Ready once this process polls the queue: DBOS's queue manager starts a polling
    # thread per queue it finds in the database, looking once a second.
    deadline = time.monotonic() + 30
    while not any(t.name == f"queue-worker-{QUEUE}" for t in threading.enumerate()):
        if time.monotonic() > deadline:
            raise SystemExit(f"bench.dbos_app: no worker thread for queue {QUEUE}")
        time.sleep(0.01)
    mark_ready()
    stop.wait()
    DBOS.destroy()


if __name__ == "__main__":
    if sys.argv[1:] == ["migrate"]:
        migrate(os.environ[ENV_DSN])
    else:
        main()
