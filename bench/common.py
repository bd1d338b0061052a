"""What the harness, its producers and its workers share: names, environment variables, a
deadline-bounded poll and a one-value query. Imports nothing heavy, so every process can use
it."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import psycopg

ROOT = Path(__file__).resolve().parent.parent
BENCH_DIR = ROOT / "bench"

# Queue names: the plain Celery task has a queue of its own, procrastinate too.
PLAIN_QUEUE = "benchplain"
PROC_QUEUE = "bench"
# The Redis list the plain task appends "<seq> <start time>" to in the latency cell,
# under the run's broker prefix so the cleanup finds it.
PLAIN_STARTS_KEY = "bench:starts"
RAW_CHANNEL = "bench_raw"

# Environment variables the harness sets for its subprocesses.
ENV_DSN = "BENCH_DSN"  # libpq URI of the bench database (procrastinate, raw)
ENV_READY_DIR = "BENCH_READY_DIR"  # workers drop "<pid>.ready" here once they can work
ENV_PROC_CONCURRENCY = "BENCH_PROC_CONCURRENCY"  # a procrastinate worker's concurrency
ENV_GO_FILE = "BENCH_GO_FILE"  # procrastinate/raw workers wait for this file to exist
# The faults cell's workers: PgQueuer registers its job with an effect; procrastinate
# retries the jobs of workers silent this many seconds, looking this often.
ENV_PGQ_EFFECT = "BENCH_PGQ_EFFECT"
ENV_PROC_STALLED = "BENCH_PROC_STALLED_SECONDS"
ENV_PROC_RETRY_EVERY = "BENCH_PROC_RETRY_EVERY"


def wait_for[T](
    probe: Callable[[], T | None],
    *,
    timeout: float,
    interval: float = 0.05,
    what: str = "a condition",
) -> T:
    """Call ``probe`` until it returns something truthy; raise ``TimeoutError`` naming
    ``what`` at the deadline."""
    deadline = time.monotonic() + timeout
    while True:
        value = probe()
        if value:
            return value
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError(f"timed out after {timeout:g}s waiting for {what}")
        time.sleep(min(interval, left))


def scalar(conn: psycopg.Connection[Any], sql: str, *args: Any) -> Any:
    """The first column of the first row, or None when there is no row."""
    row = conn.execute(sql, args or None).fetchone()
    return row[0] if row else None


def mark_ready() -> None:
    """Tell the harness this process can take work (a file named after its pid)."""
    folder = os.environ.get(ENV_READY_DIR)
    if folder:
        Path(folder, f"{os.getpid()}.ready").touch()


def wait_for_go(poll: float = 0.001) -> None:
    """Block until the harness releases the workers (the go file exists), if it set one.

    A drain cell pre-fills the queue and starts every worker process behind this barrier,
    so all of them begin at the same moment, booted and connected.
    """
    go = os.environ.get(ENV_GO_FILE)
    if not go:
        return
    path = Path(go)
    deadline = time.monotonic() + 600
    while not path.exists():
        if time.monotonic() > deadline:
            raise SystemExit("bench worker: no go signal within 600 s")
        time.sleep(poll)
