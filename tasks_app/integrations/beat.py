"""Beat's scheduler: Celery's own, keeping its schedule in a file, that first makes the
file's folder, and says when it stops.

The settings make ``var/`` only for the embedded database and broker, while beat keeps its
schedule under it in every mode unless told otherwise (``TASKS_BEAT_SCHEDULE_FILE``, or
``--schedule``); so the folder is made here, by the one process that writes there.

Celery's beat logs an ERROR with two tracebacks for every send the broker refuses; here a
streak of refused sends is one line when it starts and one when sends work again.

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
# Celery's own line per send (dropped unless TASKS_LOG_MESSAGES:
# tasks_app.observability.logs.DropBeatSends).
celery_beat_logger = logging.getLogger("celery.beat")


class Scheduler(PersistentScheduler):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self._sent: Counter[str] = Counter()
        self._stopped = False
        self._refused = 0
        super().__init__(*args, **kwargs)

    def setup_schedule(self) -> None:
        filename = getattr(self, "schedule_filename", None)
        if filename:
            Path(filename).parent.mkdir(parents=True, exist_ok=True)
        super().setup_schedule()

    def apply_entry(self, entry: ScheduleEntry, producer: Any = None) -> None:
        """Send one due entry. Celery logs an ERROR with two tracebacks for every send the
        broker refuses (down, out of memory, read-only), once a second with the sweep's
        schedule; here a streak of refused sends is one line when it starts and one when
        sends work again."""
        celery_beat_logger.info("Scheduler: Sending due task %s (%s)", entry.name, entry.task)
        try:
            self.apply_async(entry, producer=producer, advance=False)
        except Exception as exc:
            self._refused += 1
            if self._refused == 1:
                # Celery wraps the broker's error in its SchedulingError: name the broker's.
                cause = exc.__cause__ or exc.__context__ or exc
                lines = str(cause).strip().splitlines()
                logger.warning(
                    "beat: cannot send %s (%s: %s); trying again as it falls due, "
                    "one line when sends work again",
                    entry.name,
                    type(cause).__name__,
                    lines[0] if lines else "",
                )
            return
        if self._refused:
            logger.warning("beat: sending again after %d refused send(s)", self._refused)
            self._refused = 0

    def apply_async(self, entry: ScheduleEntry, *args: Any, **kwargs: Any) -> Any:
        # Counted before the send and taken back if it fails: beat's stop signal runs
        # close() wherever the main loop is, and a count made after the send returned
        # missed a message the broker already held when the signal came right after it.
        name = str(entry.name)
        self._sent[name] += 1
        try:
            return super().apply_async(entry, *args, **kwargs)
        except BaseException:
            self._sent[name] -= 1
            raise

    def close(self) -> None:
        # Called twice on a signal (by beat's handler, then on the way out): one line.
        if not self._stopped:
            self._stopped = True
            sent = ", ".join(f"{name} {n}" for name, n in sorted((+self._sent).items()))
            logger.info("beat: stopped; messages sent since it started: %s", sent or "none")
        super().close()
