"""The reader's time zone on the Schedules pages, and a moment as they show it: in that zone
and in UTC.

The browser names its zone (``Intl.DateTimeFormat().resolvedOptions().timeZone``) in the
``tz`` cookie (``static/console/console.js``); the server takes it only if it is a zone of
its own tz database, and otherwise shows UTC and says why. Slots are stored and keyed in
UTC (``tasks_app.engine.schedules``), so the pages show each next run both ways.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import UTC, datetime
from urllib.parse import unquote
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from django.http import HttpRequest

COOKIE = "tz"
# An IANA zone's name: the cookie is refused before the tz database is asked for a file.
NAME = re.compile(r"[A-Za-z0-9_+-]+(?:/[A-Za-z0-9_+-]+){0,2}")
MOST_LETTERS = 64
# Names of UTC itself: a reader in UTC sees each moment once.
UTC_NAMES = frozenset(
    {"UTC", "Etc/UTC", "Etc/Universal", "Universal", "Etc/Zulu", "Zulu", "UCT", "Etc/UCT"}
)


def zone_named(name: str) -> ZoneInfo | None:
    """The zone of that name in the tz database, or None."""
    if len(name) > MOST_LETTERS or not NAME.fullmatch(name):
        return None
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError):
        return None


@dataclass(frozen=True)
class ViewerZone:
    """The zone a page shows its times in, and why."""

    zone: ZoneInfo
    # What the browser named ("" when it named none).
    asked: str = ""

    @property
    def name(self) -> str:
        return str(self.zone.key)

    @property
    def is_utc(self) -> bool:
        return self.name in UTC_NAMES

    @property
    def words(self) -> str:
        if self.asked and self.asked == self.name:
            if self.is_utc:
                return "Times on this page are in UTC, your browser's time zone."
            return (
                f"Times on this page are in {self.name}, your browser's time zone; "
                "each next run is also shown in UTC."
            )
        if self.asked:
            return (
                f"Times on this page are in UTC: your browser's time zone “{self.asked}” is "
                "not one this server knows."
            )
        return (
            "Times on this page are in UTC: your browser has not said its time zone (it does "
            "when the page's script runs; reload)."
        )


def viewer_zone(request: HttpRequest) -> ViewerZone:
    asked = unquote(request.COOKIES.get(COOKIE, ""))[: MOST_LETTERS + 1]
    return zone_of(asked)


def zone_of(asked: str) -> ViewerZone:
    """The zone ``asked`` names if it is a known one, else UTC (saying what was asked)."""
    zone = zone_named(asked) if asked else None
    return ViewerZone(zone or ZoneInfo("UTC"), asked)


def moment_text(value: datetime) -> str:
    """``Mon 2026-12-07 03:00 CET``; seconds only when a moment has them."""
    shape = "%a %Y-%m-%d %H:%M:%S" if value.second else "%a %Y-%m-%d %H:%M"
    return f"{value.strftime(shape)} {value.tzname() or ''}".strip()


@dataclass(frozen=True)
class Moment:
    """A moment in the reader's zone and in UTC."""

    at: datetime
    local: str
    utc: str

    @property
    def iso(self) -> str:
        return self.at.astimezone(UTC).isoformat()


def moment(value: datetime, zone: ViewerZone) -> Moment:
    return Moment(
        value,
        moment_text(value.astimezone(zone.zone)),
        moment_text(value.astimezone(UTC)),
    )


def local_input(value: datetime, zone: ViewerZone) -> str:
    """A moment as a ``datetime-local`` input holds it, in the reader's zone."""
    local = value.astimezone(zone.zone)
    return local.strftime("%Y-%m-%dT%H:%M:%S" if local.second else "%Y-%m-%dT%H:%M")


def read_local(value: str, zone: ViewerZone) -> datetime | str:
    """What a ``datetime-local`` input sent (``2026-12-07T03:00``, read in the reader's
    zone) as a moment; a time with its zone (``…+01:00``, ``…Z``) as itself. Anything else
    is passed on as typed, for the service to refuse naming its field and rule."""
    text = value.strip()
    try:
        parsed = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return value
    if parsed.tzinfo is None:
        # A local time the clocks skip or repeat reads as the first of its readings.
        return parsed.replace(tzinfo=zone.zone)
    return parsed
