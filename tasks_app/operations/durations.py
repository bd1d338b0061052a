"""How long something took or has waited, as people read it (the console and the
commands show ages the same way)."""

from __future__ import annotations

from datetime import timedelta


def short_duration(delta: timedelta | None, *, none: str = "—") -> str:
    """``3 s``, ``4 min``, ``2 h 5 min``, ``3 d 4 h``; ``none`` for no duration."""
    if delta is None:
        return none
    seconds = int(delta.total_seconds())
    if seconds < 60:
        return f"{seconds} s"
    minutes, seconds = divmod(seconds, 60)
    if minutes < 60:
        return f"{minutes} min"
    hours, minutes = divmod(minutes, 60)
    if hours < 24:
        return f"{hours} h {minutes} min" if minutes else f"{hours} h"
    days, hours = divmod(hours, 24)
    return f"{days} d {hours} h" if hours else f"{days} d"
