"""Beat's scheduler: Celery's own, keeping its schedule in a file, that first makes the
file's folder, and says when it stops.

The settings make ``var/`` only for the embedded database and broker, while beat keeps its
schedule under it in every mode unless told otherwise (``--schedule``, as ``Procfile``
does); so the folder is made here, by the one process that writes there.

Celery's beat says "beat: Starting..." and, stopped by a signal, nothing: a beat that is
gone and one that never logs look alike. The scheduler is closed on every way out (a
signal, an error, the end of an embedded beat), so that is where it says it stopped, with
what it sent meanwhile.
"""

from __future__ import annotations

import logging
from collections import Counter
from pathlib import Path
from typing import Any

from celery.beat import PersistentScheduler, ScheduleEntry

logger = logging.getLogger(__name__)


class Scheduler(PersistentScheduler):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self._sent: Counter[str] = Counter()
        self._stopped = False
        super().__init__(*args, **kwargs)

    def setup_schedule(self) -> None:
        filename = getattr(self, "schedule_filename", None)
        if filename:
            Path(filename).parent.mkdir(parents=True, exist_ok=True)
        super().setup_schedule()

    def apply_async(self, entry: ScheduleEntry, *args: Any, **kwargs: Any) -> Any:
        result = super().apply_async(entry, *args, **kwargs)
        self._sent[str(entry.name)] += 1
        return result

    def close(self) -> None:
        # Called twice on a signal (by beat's handler, then on the way out): one line.
        if not self._stopped:
            self._stopped = True
            sent = ", ".join(f"{name} {n}" for name, n in sorted(self._sent.items()))
            logger.info("beat: stopped; messages sent since it started: %s", sent or "none")
        super().close()
