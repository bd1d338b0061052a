"""What a run ran on, kept with its results: the machine, the versions of Python, the
packages and the servers, the servers' settings, and the git state of the measured code."""

from __future__ import annotations

import contextlib
import hashlib
import importlib.metadata
import os
import platform
import subprocess
from pathlib import Path
from typing import Any

import redis

from bench.common import ROOT
from bench.server_stats import ServerStats, redis_settings, redis_version

# Distribution -> its name in the results ("redis" alone would read as the server).
PACKAGES = {
    "Django": "Django",
    "celery": "celery",
    "kombu": "kombu",
    "procrastinate": "procrastinate",
    "pgqueuer": "pgqueuer",
    "asyncpg": "asyncpg",
    "typer": "typer",
    "dbos": "dbos",
    "django-tasks-db": "django-tasks-db",
    "psycopg": "psycopg",
    "redis": "redis-py",
}


def environment(stats: ServerStats, rds: redis.Redis) -> dict[str, Any]:
    versions = {"python": platform.python_version()}
    for dist, name in PACKAGES.items():
        try:
            versions[name] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            versions[name] = "missing"
    pg = stats.postgres_settings()
    versions["PostgreSQL"] = pg.pop("server_version", "?")
    versions["Redis"] = redis_version(rds)
    cpu_model = _proc_line("/proc/cpuinfo", "model name")
    memory_gib = 0.0
    with contextlib.suppress(ValueError, IndexError):
        memory_gib = int(_proc_line("/proc/meminfo", "MemTotal:").split()[1]) / 1024 / 1024
    return {
        "versions": versions,
        "postgresql_settings": pg,
        "redis_settings": redis_settings(rds),
        "cpu_model": cpu_model.split(":", 1)[1].strip() if cpu_model else "?",
        "cpus": len(os.sched_getaffinity(0)),
        "memory_gib": memory_gib,
        "platform": platform.platform(),
    }


def _proc_line(path: str, prefix: str) -> str:
    """The first line of a /proc file that starts with ``prefix`` ("" without one)."""
    with contextlib.suppress(OSError):
        for line in Path(path).read_text().splitlines():
            if line.startswith(prefix):
                return line
    return ""


def code_fingerprint() -> str:
    """HEAD and a digest of the uncommitted changes to tracked files: compared at the start
    and the end of a run, it tells whether the measured code changed under the run."""
    try:
        head = _git("rev-parse", "--short", "HEAD").decode().strip()
        diff = _git("diff", "HEAD", "--", ".", ":(exclude)bench", ":(exclude)docs", timeout=30)
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    # HEAD and the digest only: editing the docs or the bench during a run is not a change
    # of the measured code (git_state's "uncommitted changes" counts every tracked file).
    return f"{head} {hashlib.sha256(diff).hexdigest()[:12]}"


def git_state() -> str:
    try:
        head = _git("rev-parse", "--short", "HEAD").decode().strip()
        dirty = _git("status", "--porcelain", "--untracked-files=no").strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return f"{head}{' with uncommitted changes' if dirty else ''}"


def _git(*args: str, timeout: float = 10) -> bytes:
    return subprocess.run(  # noqa: S603
        ["git", *args],  # noqa: S607
        cwd=ROOT,
        capture_output=True,
        timeout=timeout,
        check=True,
    ).stdout
