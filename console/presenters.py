"""How the console shows values: secrets redacted, JSON pretty-printed, durations short,
CSV cells that no spreadsheet reads as a formula.

The templates escape everything they print; these only decide what text is shown.
"""

from __future__ import annotations

import csv
import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.utils import timezone

from tasks_app import exceptions, redaction
from tasks_app.models.json_columns import is_undecodable
from tasks_app.operations.durations import short_duration as short_duration
from tasks_app.redaction import REDACTED as REDACTED


def redact(value: Any, patterns: Iterable[str] | None = None) -> Any:
    """A copy of ``value`` with the value of every secret key replaced, at any depth
    (:func:`tasks_app.redaction.is_secret_key`)."""
    return redaction.redact(value, patterns)


def redact_text(text: str) -> str:
    """Free text (an error, a reason) with the value after each secret key replaced."""
    return redaction.redact_text(text)


def error_summary(text: str) -> str:
    """A stored error's last line (a traceback's says what went wrong), redacted."""
    return redaction.redact_text(exceptions.error_summary(text))


def restore_redacted(edited: Any, original: Any) -> Any:
    """``edited`` with each redaction placeholder put back to the value it hid in
    ``original`` at the same place, so an edit made on a redacted copy keeps the secrets
    nobody saw (a placeholder with nothing behind it stays as typed)."""
    if edited == REDACTED:
        return original if original is not None else edited
    if isinstance(edited, dict):
        known: dict[str, Any] = original if isinstance(original, dict) else {}
        return {key: restore_redacted(item, known.get(key)) for key, item in edited.items()}
    if isinstance(edited, list):
        items: list[Any] = original if isinstance(original, list) else []
        return [
            restore_redacted(item, items[i] if i < len(items) else None)
            for i, item in enumerate(edited)
        ]
    return edited


def pretty_json(value: Any) -> str:
    """Redacted, indented JSON for a ``<pre>`` block; for a stored value Python cannot decode
    (``tasks_app.models.json_columns``), a note saying so instead of the value."""
    if is_undecodable(value):
        return f"(this value {value})"
    return redaction.redacted_json(value)


# A cell starting with one of these is a formula to a spreadsheet (OWASP, "CSV Injection").
FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")


def csv_cell(value: Any) -> str:
    """``value`` as a CSV cell a spreadsheet shows as text: one that would start a formula
    gets a leading single quote, as OWASP advises (the csv writer does the quoting)."""
    text = "" if value is None else str(value)
    return "'" + text if text.startswith(FORMULA_STARTS) else text


class _Echo:
    def write(self, value: str) -> str:
        return value


def csv_lines(rows: Iterable[Iterable[Any]]) -> Iterator[str]:
    """Each row as one CSV line, every cell through :func:`csv_cell`: how every CSV export
    writes, so none can forget it."""
    writer = csv.writer(_Echo())
    for row in rows:
        yield writer.writerow([csv_cell(cell) for cell in row])


def moment(value: datetime, now: datetime | None = None) -> tuple[str, str]:
    """A moment as the console shows it: the absolute time with its zone (the site's
    ``TIME_ZONE``), and how long ago or ahead it is ("3 min ago", "in 2 h")."""
    now = now or timezone.now()
    local = timezone.localtime(value)
    absolute = f"{local:%Y-%m-%d %H:%M:%S} {local.tzname() or ''}".strip()
    delta = now - value
    if abs(delta) < timedelta(seconds=1):
        relative = "just now"
    elif delta > timedelta(0):
        relative = f"{short_duration(delta)} ago"
    else:
        relative = f"in {short_duration(-delta)}"
    return absolute, relative


@dataclass(frozen=True)
class Change:
    """One field a payload edit changed: its dotted path, and the values before and after
    as compact JSON ("" where the field was absent), secrets redacted."""

    path: str
    before: str
    after: str


def payload_changes(old: Any, new: Any) -> list[Change]:
    """What a redrive's edit changed in the payload, field by field; a field under a
    secret key shows as changed, never with its values."""
    before, after = _leaves(old), _leaves(new)
    changes = []
    for path in sorted(before.keys() | after.keys(), key=_dotted):
        if path in before and path in after and before[path] == after[path]:
            continue
        secret = any(isinstance(part, str) and redaction.is_secret_key(part) for part in path)
        changes.append(
            Change(
                _dotted(path),
                REDACTED if secret and path in before else before.get(path, ""),
                REDACTED if secret and path in after else after.get(path, ""),
            )
        )
    return changes


type Path = tuple[str | int, ...]


def _leaves(value: Any, path: Path = ()) -> dict[Path, str]:
    """``value``'s scalars and empty containers by path, as compact JSON."""
    if isinstance(value, dict) and value:
        items: Iterable[tuple[str | int, Any]] = value.items()
    elif isinstance(value, list) and value:
        items = enumerate(value)
    else:
        return {path: json.dumps(value, ensure_ascii=False, sort_keys=True)}
    leaves: dict[Path, str] = {}
    for key, item in items:
        leaves.update(_leaves(item, (*path, key)))
    return leaves


def _dotted(path: Path) -> str:
    """``("customer", "tags", 0)`` as ``customer.tags[0]``."""
    text = ""
    for part in path:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else part)
    return text or "(payload)"


def seconds(value: float | None) -> str:
    """A run time as people read it: ``8 ms``, ``1.4 s``, ``42 s``, ``3.5 min``; past the
    histogram's last bound (infinite), ``over 5 min``; "—" for none."""
    if value is None:
        return "—"
    if value == float("inf"):
        return "over 5 min"
    if value < 1:
        return f"{value * 1000:.3g} ms"
    if value < 100:
        return f"{value:.3g} s"
    return f"{value / 60:.1f} min"
