"""The directory where a worker's pool processes record the claims they hold
(``tasks_app.engine.crashes``), kept usable for the worker's whole life, and whether crash
isolation is on.

The directory lives under ``TASKS_CLAIMS_DIR`` (default: the temporary directory), where a
cleaner of old files (systemd-tmpfiles, tmpreaper, a container's tmpfs) may remove it
while the worker runs. So it is checked before each use: the main process's watcher looks
every fraction of a second and makes it again when it is missing (one warning each time),
and a pool process whose file went with it opens a new one before its next batch.

A directory that cannot be made (a full or read-only disk, a ``TASKS_CLAIMS_DIR`` that is
not a directory) or that is not this user's alone (another user could forge records and
have claims released) turns crash isolation off: a crash then costs its batch-mates an
attempt, as their leases run out. The worker says so in one warning, and again once it is
back on, and reports it through Redis while it lasts (an entry per worker node, refreshed
and expiring as a heartbeat does) so that ``/readyz`` says so too
(``tasks_app.observability.health``).
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import socket
import stat
import tempfile
import time
from pathlib import Path
from typing import Any

from django.conf import settings

logger = logging.getLogger(__name__)

# The Redis sorted set of the worker nodes (host:pid) whose crash isolation is off, each
# scored with when its report expires (by Redis's clock, which every process shares).
OFF_KEY = "crash-isolation-off"


def parent() -> Path:
    """Where the workers make their directories."""
    return Path(settings.TASKS_CLAIMS_DIR or tempfile.gettempdir())


def make_private(path: Path) -> bool:
    """Make ``path`` (and its missing parents) a directory only this user may use, unless
    it is one already; returns whether it was made. Raises ``OSError`` when it cannot be
    made, or is there but not a directory of this user's alone."""
    try:
        found = os.lstat(path)
    except FileNotFoundError:
        path.parent.mkdir(parents=True, exist_ok=True)
        try:
            os.mkdir(path, 0o700)
            return True
        except FileExistsError:  # made meanwhile, by a pool process or by someone else
            found = os.lstat(path)
    if not stat.S_ISDIR(found.st_mode) or found.st_uid != os.getuid() or found.st_mode & 0o077:
        raise OSError(errno.EPERM, "not a directory of this user's alone", str(path))
    return False


class ClaimsDirectory:
    """One worker's directory, as its main process keeps it (see the module)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        # Why crash isolation is off; None while it is on.
        self.off: str | None = None
        self._reported_at = 0.0

    def usable(self) -> bool:
        """Whether the directory is there (made again if missing), without a word: a pool
        process asks this; its main process tells."""
        try:
            make_private(self.path)
        except OSError:
            return False
        return True

    def ensure(self) -> bool:
        """Whether the directory is there, made again when missing; says once when it had
        to be made again, when crash isolation goes off and when it is on again."""
        try:
            made = make_private(self.path)
        except OSError as exc:
            self._turned_off(exc.strerror or type(exc).__name__)
            return False
        if made and self.off is None:
            logger.warning(
                "the directory of this worker's claim records (%s) was removed, by a cleaner "
                "of old files perhaps; made it again (set TASKS_CLAIMS_DIR to a directory "
                "nothing prunes)",
                self.path,
            )
        if self.off is not None:
            logger.info("crash isolation is on again: the claim records' directory is back")
            self.off = None
            report_off(None)
        return True

    def _turned_off(self, reason: str) -> None:
        if self.off is None:
            logger.warning(
                "crash isolation is off: the directory of this worker's claim records (%s) "
                "cannot be made (%s); a pool process that dies now costs its batch-mates an "
                "attempt; trying again",
                self.path,
                reason,
            )
        self.off = reason
        now = time.monotonic()
        if now - self._reported_at >= refresh_seconds():
            self._reported_at = now
            report_off(reason)


def node() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


def refresh_seconds() -> float:
    """How often a node whose isolation is off says so again (its key lasts three times
    this, so it goes with the node)."""
    return max(1.0, settings.TASKS_WORKER_SILENT_SECONDS / 3)


def _redis() -> Any:
    import redis

    return redis.Redis.from_url(settings.REDIS_URL, socket_connect_timeout=2, socket_timeout=2)


def _key() -> str:
    return str(settings.CELERY_BROKER_TRANSPORT_OPTIONS.get("global_keyprefix", "")) + OFF_KEY


def _now(client: Any) -> float:
    seconds, micros = client.time()
    return float(seconds) + float(micros) / 1_000_000


def report_off(reason: str | None) -> None:
    """Tell the probes this node's crash isolation is off (why), or on (None). Without
    Redis (the embedded mode) there is nobody to tell; a Redis that does not answer is
    told at the next refresh."""
    if not settings.REDIS_URL:
        return
    client = _redis()
    try:
        with contextlib.suppress(Exception):
            now = _now(client)
            # Reports of nodes gone without a word (killed) expire.
            client.zremrangebyscore(_key(), "-inf", now)
            if reason is None:
                client.zrem(_key(), node())
            else:
                client.zadd(_key(), {node(): now + 3 * refresh_seconds()})
    finally:
        client.close()


def nodes_off() -> list[str]:
    """The worker nodes (``host:pid``) that reported their crash isolation off lately."""
    if not settings.REDIS_URL:
        return []
    client = _redis()
    try:
        return sorted(
            member.decode() for member in client.zrangebyscore(_key(), _now(client), "+inf")
        )
    finally:
        client.close()
