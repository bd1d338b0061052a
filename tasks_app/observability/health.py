"""What the probes report: ``/healthz`` (the process answers) and ``/readyz`` (it can do
its work: the database and the broker answer, the broker takes writes, the migrations
are applied, the sweeper ran recently, no worker runs with its crash isolation off). Each
check says what it found in a few words, never a setting's value."""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from django.conf import settings
from django.db import DEFAULT_DB_ALIAS, connections
from django.db.migrations.executor import MigrationExecutor

from tasks_app.db import deadlines
from tasks_app.engine import claims_directory, presence

Check = Callable[[], tuple[bool, str]]

# Once a process saw every migration applied it stays so until the next deployment, which
# starts new processes.
_migrated = False


def database() -> tuple[bool, str]:
    with connections[DEFAULT_DB_ALIAS].cursor() as cursor:
        cursor.execute("SELECT 1")
    return True, "answers"


def migrations() -> tuple[bool, str]:
    global _migrated
    if not _migrated:
        executor = MigrationExecutor(connections[DEFAULT_DB_ALIAS])
        plan = executor.migration_plan(executor.loader.graph.leaf_nodes())
        if plan:
            return False, f"{len(plan)} migration(s) not applied"
        _migrated = True
    return True, "applied"


def broker() -> tuple[bool, str]:
    if settings.REDIS_URL:
        import redis

        client = redis.Redis.from_url(
            settings.REDIS_URL, socket_connect_timeout=2, socket_timeout=2
        )
        try:
            client.ping()
        finally:
            client.close()
        return True, "answers"
    folder = Path(str(settings.CELERY_BROKER_TRANSPORT_OPTIONS["data_folder_in"]))
    return folder.is_dir(), "folder present" if folder.is_dir() else "folder missing"


def broker_writes() -> tuple[bool, str]:
    """Whether the broker takes a write. Redis out of memory (``noeviction``) or read-only
    (the old primary after a failover) still answers ``PING``, yet refuses every doorbell
    and every worker's read of its queues: the work waits, so the system is not ready. The
    detail names the refusal's class (``failed: OutOfMemoryError``, ``ReadOnlyError``)."""
    if settings.REDIS_URL:
        import redis

        client = redis.Redis.from_url(
            settings.REDIS_URL, socket_connect_timeout=2, socket_timeout=2
        )
        prefix = settings.CELERY_BROKER_TRANSPORT_OPTIONS.get("global_keyprefix", "")
        try:
            client.set(f"{prefix}readyz", "1", ex=60)
        finally:
            client.close()
        return True, "accepted"
    folder = Path(str(settings.CELERY_BROKER_TRANSPORT_OPTIONS["data_folder_in"]))
    writable = os.access(folder, os.W_OK)
    return writable, "folder writable" if writable else "folder not writable"


def sweeper() -> tuple[bool, str]:
    age = presence.last_sweep_age()
    if age is None:
        return False, "never ran"
    seconds = round(age.total_seconds())
    if seconds > settings.TASKS_SWEEPER_SILENT_SECONDS:
        return False, f"last ran {seconds} s ago"
    return True, f"ran {seconds} s ago"


def crash_isolation() -> tuple[bool, str]:
    """Whether every worker can hand back a crashed pool process's batch: one whose claim
    records' directory cannot be made says so while it lasts (``claims_directory``)."""
    off = claims_directory.nodes_off()
    if off:
        return False, f"off on {len(off)} worker(s)"
    return True, "on" if settings.REDIS_URL else "not reported without Redis"


# Checks not tried once the check they build on failed: each would only wait for the same
# server again.
BUILDS_ON = {
    "migrations": "database",
    "sweeper": "database",
    "broker_writes": "broker",
    "crash_isolation": "broker",
}
READINESS: dict[str, Check] = {
    "database": database,
    "migrations": migrations,
    "broker": broker,
    "broker_writes": broker_writes,
    "sweeper": sweeper,
    "crash_isolation": crash_isolation,
}


def alive() -> tuple[dict[str, Any], int]:
    return {"status": "ok"}, 200


def ready() -> tuple[dict[str, Any], int]:
    """Every check, answered within about ``TASKS_READY_TIMEOUT_SECONDS`` even when the
    database hangs: its statements are cut at that bound (``tasks_app.db.deadlines``), and
    once the database or the broker fails, the checks that need it are not tried
    (``BUILDS_ON``)."""
    checks: dict[str, dict[str, Any]] = {}
    for name, check in READINESS.items():
        base = BUILDS_ON.get(name)
        if base is not None and not checks[base]["ok"]:
            checks[name] = {"ok": False, "detail": f"not checked: no {base}", "ms": 0}
            continue
        started = time.monotonic()
        bound = (
            deadlines.within(settings.TASKS_READY_TIMEOUT_SECONDS)
            if "database" in (name, base)
            else contextlib.nullcontext()
        )
        try:
            with bound:
                ok, detail = check()
        except Exception as exc:  # any failure is the answer
            # The class only: messages can carry addresses or settings.
            ok, detail = False, f"failed: {type(exc).__name__}"
            if name == "database":
                connections[DEFAULT_DB_ALIAS].close_if_unusable_or_obsolete()
        checks[name] = {
            "ok": ok,
            "detail": detail,
            "ms": round(1000 * (time.monotonic() - started)),
        }
    ready = all(check["ok"] for check in checks.values())
    return {"status": "ready" if ready else "not ready", "checks": checks}, 200 if ready else 503
