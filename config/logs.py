"""The pieces ``LOGGING`` is built from (settings name them by path): a formatter writing
one JSON object per line (``TASKS_LOG_FORMAT=json``), and a filter that drops beat's line
per scheduled message.

Only the standard library here: logging is configured before the apps are loaded.
"""

from __future__ import annotations

import json
import logging
from datetime import UTC, datetime
from typing import Any

# What every JSON line has; a record's own fields never replace these.
_BASE = ("time", "level", "logger", "message")


class JsonFormatter(logging.Formatter):
    """One JSON object per record: ``time`` (UTC, ISO 8601), ``level``, ``logger`` and
    ``message``, then the ``event`` and ``fields`` of a structured record
    (``tasks_app.oplog``), and a traceback as ``exc_info``. Newlines are escaped, so
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
