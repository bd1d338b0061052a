"""How the commands that read print for a person: aligned tables, times in the site's time
zone, and any free text (an error, a reason) on one line. ``--json`` prints the machine
form instead."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from django.utils import timezone


def table(header: Sequence[str], rows: Sequence[Sequence[str]], *, right: int = 0) -> list[str]:
    """Columns padded to their widest cell; the first ``right`` columns after the first
    (the numbers) are aligned right."""
    widths = [max(len(str(cell)) for cell in column) for column in zip(header, *rows, strict=True)]
    lines = []
    for row in [header, *rows]:
        cells = [
            str(cell).rjust(width) if 0 < index <= right else str(cell).ljust(width)
            for index, (cell, width) in enumerate(zip(row, widths, strict=True))
        ]
        lines.append("  ".join(cells).rstrip())
    return lines


def when(value: datetime | None) -> str:
    """A time as a person reads it, in the site's time zone; ``-`` for none."""
    return "-" if value is None else f"{timezone.localtime(value):%Y-%m-%d %H:%M:%S %Z}"


def line(text: str, *, limit: int = 0) -> str:
    """Free text on one line, ``-`` when empty; at most ``limit`` characters when given."""
    flat = " ".join(text.split()) or "-"
    if limit and len(flat) > limit:
        return flat[: limit - 1] + "…"
    return flat
