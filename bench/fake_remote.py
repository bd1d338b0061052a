"""The faults cell's fake remote: a Redis list that records every application of a job's
external effect, and another that records every run of a job's handler, under the run's
Redis prefix (``TASKS_BROKER_PREFIX``, so the harness's cleanup finds them).

The remote applies every call it gets (it honours no idempotency key): a key found twice in
its list is an effect applied twice, whoever made the second call. Each system's handler in
the faults cell records its run, applies its effect, then works ``WORK_SECONDS`` more before
it returns: US through the effects ledger (``bench/effect_workflow.py``), procrastinate and
PgQueuer directly (``bench/proc_app.py``, ``bench/pgq_app.py``), as their users write it.
Imports nothing heavy, so every worker can load it.
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Iterable
from typing import Any

import redis

REMOTE_LIST = "bench:remote"  # one item per application: the effect's key
RUNS_LIST = "bench:runs"  # one item per run of a handler: the job's id
# What the handler does after its effect (writing a result, say), so a kill can land
# between the effect and the job's completion, as it does in real work.
WORK_SECONDS = 0.005

_client: tuple[int, redis.Redis] | None = None


def _redis() -> redis.Redis:
    """One client per process (a prefork child makes its own after the fork)."""
    global _client
    if _client is None or _client[0] != os.getpid():
        url = os.environ.get("REDIS_URL") or "redis://127.0.0.1:6379/0"
        _client = (os.getpid(), redis.Redis.from_url(url, socket_timeout=5))
    return _client[1]


def _key(name: str) -> str:
    return os.environ.get("TASKS_BROKER_PREFIX", "") + name


def record_run(job: object) -> None:
    _redis().rpush(_key(RUNS_LIST), str(job))


def apply(key: str) -> dict[str, Any]:
    """The remote call: applied, whatever came before."""
    _redis().rpush(_key(REMOTE_LIST), key)
    return {"applied": key}


def read(rds: redis.Redis, prefix: str, name: str) -> list[str]:
    """Every item of one of the lists (the harness reads them after a cell)."""
    items = rds.lrange(prefix + name, 0, -1)
    return [item.decode() if isinstance(item, bytes) else str(item) for item in items]  # type: ignore[union-attr]


def more_than_once(items: Iterable[str]) -> int:
    """How many distinct items appear more than once."""
    return sum(1 for count in Counter(items).values() if count > 1)
