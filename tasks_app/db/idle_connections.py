"""A worker process gives its database connection back once idle for ``CONN_MAX_AGE``.

Django closes a connection older than ``CONN_MAX_AGE`` when the next request (for a
worker, the next task: ``config/celery.py``) starts, so a worker that gets no next task
would keep its connection for good. After each task this process's connection is handed
to a thread that closes it once the process has run no task for ``CONN_MAX_AGE``. The
next task finds it closed (and older than ``CONN_MAX_AGE``), and Django opens a new one.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from typing import Any

from django.db import DEFAULT_DB_ALIAS, connections

logger = logging.getLogger(__name__)


def idle_seconds() -> float:
    """How long an idle process keeps a database connection (Django's ``CONN_MAX_AGE``:
    0 closes it after each request or task, ``None`` keeps it for good)."""
    age = connections[DEFAULT_DB_ALIAS].settings_dict.get("CONN_MAX_AGE", 0)
    return float("inf") if age is None else float(age)


class IdleCloser:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._resting: tuple[float, Any] | None = None
        self._pid = 0
        self.closed = 0

    def busy(self) -> None:
        """A task starts: its connection is in use again."""
        with self._lock:
            self._resting = None

    def rest(self) -> None:
        """A task ended: close its connection if no other task starts for a while."""
        wrapper = connections[DEFAULT_DB_ALIAS]
        age = idle_seconds()
        if wrapper.connection is None or age in (0, float("inf")):
            return
        with self._lock:
            self._resting = (time.monotonic() + age, wrapper)
            if self._pid != os.getpid():
                self._pid = os.getpid()
                threading.Thread(
                    target=self._run, args=(age,), name="idle-connections", daemon=True
                ).start()

    def _run(self, age: float) -> None:
        while True:
            time.sleep(min(max(age / 4, 0.25), 5.0))
            with self._lock:
                # Under the lock: a task starting now waits for the close to finish.
                if self._resting is None or time.monotonic() < self._resting[0]:
                    continue
                raw = self._resting[1].connection
                self._resting = None
                if raw is not None and not raw.closed:
                    raw.close()
                    self.closed += 1
                    logger.debug("closed the database connection of an idle worker process")


idle_closer = IdleCloser()
