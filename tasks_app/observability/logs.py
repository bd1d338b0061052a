"""The pieces ``LOGGING`` is built from (settings name them by path): a formatter writing
one JSON object per line (``TASKS_LOG_FORMAT=json``), and the filters that keep the log to
a line per thing worth hearing of: none per message beat schedules or a worker discards,
none per probe answered, one per pool process that dies.

Only the standard library is imported here: logging is configured before the apps are
loaded (the crash filter asks ``tasks_app.engine.crashes`` at log time, once they are).
"""

from __future__ import annotations

import json
import logging
import logging.config
import threading
from collections import Counter, deque
from datetime import UTC, datetime
from typing import Any

# What every JSON line has; a record's own fields never replace these.
_BASE = ("time", "level", "logger", "message")


def configure(config: dict[str, Any]) -> None:
    """``LOGGING_CONFIG``: ``LOGGING`` as ``dictConfig`` takes it, and Python's warnings
    captured into it (logger ``py.warnings``), so that a warning is a line of the log in its
    format, a JSON object in a JSON log, rather than text written past it."""
    logging.config.dictConfig(config)
    logging.captureWarnings(True)


class JsonFormatter(logging.Formatter):
    """One JSON object per record: ``time`` (UTC, ISO 8601), ``level``, ``logger`` and
    ``message``, then the ``event`` and ``fields`` of a structured record
    (``tasks_app.observability.oplog``), and a traceback as ``exc_info``. Newlines are escaped, so
    each record stays one line."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        event = getattr(record, "event", None)
        if event is not None:
            entry["event"] = event
        fields = getattr(record, "fields", None)
        if isinstance(fields, dict):
            entry.update((key, value) for key, value in fields.items() if key not in _BASE)
        if record.exc_info:
            entry["exc_info"] = self.formatException(record.exc_info)
        if record.stack_info:
            entry["stack_info"] = self.formatStack(record.stack_info)
        return json.dumps(entry, ensure_ascii=False, default=str)


class DropBeatSends(logging.Filter):
    """Drops beat's "Scheduler: Sending due task …" line, written at INFO for every message
    it schedules (every ``TASKS_SWEEP_SECONDS`` for the sweep), and keeps the rest of the
    ``celery.beat`` logger's lines: "beat: Starting...", errors."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith("Scheduler: Sending due task")


class DropDiscards(logging.Filter):
    """Drops a worker's "Discarding revoked task: …" line, written at INFO for every message
    it throws away unrun: a sweep that expired in the queue, one per ``TASKS_SWEEP_SECONDS``
    while no maintenance worker consumed them. The worker sums them up in one line once it
    takes a message again (``config.celery``); the rest of the logger's lines stay."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith("Discarding revoked task")


class DiscardSummary:
    """What a worker threw away unrun since it last took a message, told in one line when
    it takes one again or stops: "discarded 30 message(s) unrun: tasks_app.tasks.sweep
    30 expired", where Celery's line per message (dropped by :class:`DropDiscards`) made
    thirty lines for a maintenance worker that was away for two and a half minutes."""

    def __init__(self, logger: logging.Logger) -> None:
        self._logger = logger
        self._counts: Counter[tuple[str, str]] = Counter()
        self._lock = threading.Lock()

    def discarded(self, name: str, *, expired: bool) -> None:
        with self._lock:
            self._counts[(name, "expired" if expired else "revoked")] += 1

    def report(self) -> None:
        with self._lock:
            counts, self._counts = self._counts, Counter()
        if counts:
            self._logger.info(
                "discarded %d message(s) unrun: %s",
                counts.total(),
                ", ".join(f"{name} {n} {why}" for (name, why), n in sorted(counts.items())),
            )


# The key ``tasks_app.observability.probes`` sets in a probe request's environ, so that the
# request's log line can be told apart here without naming the probes' paths twice.
PROBE_ANSWER = "task_console.probe"


class DropProbeAnswers(logging.Filter):
    """Drops ``django.request``'s line for a probe's answer: an ERROR for every 503 of
    ``/readyz``, as often as a prober asks. The prober hears the answer; the web process
    logs a change of its readiness once (``tasks_app.observability.probes``)."""

    def filter(self, record: logging.LogRecord) -> bool:
        request = getattr(record, "request", None)
        return not getattr(request, "META", {}).get(PROBE_ANSWER)


def _is_worker_lost(record: logging.LogRecord) -> bool:
    """Celery's "Task handler raised error: WorkerLostError(…)" (billiard's error class,
    named here rather than imported: nothing but the standard library in this module)."""
    args = record.args if isinstance(record.args, tuple) else ()
    return (
        record.name == "celery.worker.request"
        and bool(args)
        and type(args[0]).__name__ == "WorkerLostError"
    )


class OneLinePerCrash(logging.Filter):
    """A pool process that dies is told once, by the line that names the step it took down.

    A worker's main process hears of one death three times: ``tasks_app.engine.crashes`` says
    which pool process died running which step and what it handed back, within a fraction
    of a second; then, when the pool next looks (up to five seconds later), billiard says
    "Process 'ForkPoolWorker-2' pid:4711 exited with 'signal 9 (SIGKILL)'" and Celery
    "Task handler raised error: WorkerLostError(…)" with sixteen lines of billiard's own
    frames. This keeps the first, drops Celery's always (it says nothing the others do not),
    and drops billiard's for a process the first tells of, whichever comes first
    (``tasks_app.engine.crashes.will_tell``: the process held a batch); a process that held no
    step (``tasks_app.engine.crashes`` then says nothing) is still told, by billiard's line.
    """

    # The pids told of lately: a pid is not reused within a few seconds.
    REMEMBERED = 256

    def __init__(self) -> None:
        super().__init__()
        self._told: deque[object] = deque(maxlen=self.REMEMBERED)

    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args if isinstance(record.args, tuple) else ()
        if record.name == "tasks_app.engine.crashes" and str(record.msg).startswith(
            "pool process %d"
        ):
            if args:
                self._told.append(args[0])
            return True
        if _is_worker_lost(record):
            return False
        if record.name == "multiprocessing" and str(record.msg).startswith("Process %r pid:%r"):
            return not (len(args) > 1 and (args[1] in self._told or _crashes_tell(args[1])))
        return True


def _crashes_tell(pid: object) -> bool:
    """Whether ``tasks_app.engine.crashes`` tells of pool process ``pid`` (imported late: this
    module is loaded with the settings, before the apps)."""
    if not isinstance(pid, int):
        return False
    try:
        from tasks_app.engine import crashes
    except Exception:  # the apps are not loaded: nothing records claims here
        return False
    return crashes.will_tell(pid)
