"""How "Why isn't this running?" (``tasks_app.operations.why``) writes what it finds: moments
as a person reads them, names set off in quotes, free text on one line with secrets
redacted, and links to the console's pages.

Links are reversed by name when asked for, and a page the console does not serve (not yet
installed, or another deployment's URLs) yields its plain path or no link: the answer is
still said in words.
"""

from __future__ import annotations

from datetime import datetime
from urllib.parse import urlencode

from django.urls import NoReverseMatch, reverse
from django.utils import timezone
from django.utils.timesince import timesince, timeuntil

from tasks_app.redaction import redact_text

type Pair = tuple[str, str]

# Where the Limits page is served when its URL name is not (yet) known here.
LIMITS_PATH = "/limits/"


def at(moment: datetime | None, now: datetime) -> str:
    """``at 14:05:03 UTC (in 4 minutes)``: the site's time zone, the date when it is not
    today's, and how far from ``now`` (the database's clock)."""
    return "at an unknown time" if moment is None else f"at {when(moment, now)}"


def when(moment: datetime | None, now: datetime) -> str:
    """``14:05:03 UTC (in 4 minutes)``, for after "since" and "until"."""
    if moment is None:
        return "an unknown time"
    local, today = timezone.localtime(moment), timezone.localtime(now)
    shown = f"{local:%H:%M:%S %Z}" if local.date() == today.date() else f"{local:%Y-%m-%d %H:%M %Z}"
    if abs((moment - now).total_seconds()) < 60:
        return f"{shown} ({'in under a minute' if moment > now else 'just now'})"
    if moment > now:
        return f"{shown} (in {_plain(timeuntil(moment, now))})"
    return f"{shown} ({_plain(timesince(moment, now))} ago)"


def _plain(text: str) -> str:
    # timesince joins its parts with no-break spaces; plain text reads the same everywhere.
    return text.replace("\xa0", " ")


def quoted(name: str) -> str:
    return f"“{name}”"


def one_line(text: str) -> str:
    """Free text (a reason, an error) on one line, with the values of secret keys removed."""
    return " ".join(redact_text(text or "").split())


def because(text: str) -> str:
    """``: “the reason”``, or nothing when none was given."""
    reason = one_line(text)
    return f": “{reason}”" if reason else ""


def link(name: str, *args: object, anchor: str = "", query: dict[str, str] | None = None) -> str:
    """The path of the console's page ``name`` ("" when the console does not serve it)."""
    try:
        path = reverse(name, args=args)
    except NoReverseMatch:
        return ""
    given = {key: value for key, value in (query or {}).items() if value}
    if given:
        path += "?" + urlencode(given)
    return f"{path}#{anchor}" if anchor else path


def limit_link(limit: str) -> str:
    """The Limits page at ``limit``'s entry (its plain path while its URL name is unknown)."""
    try:
        path = reverse("console:limits")
    except NoReverseMatch:
        path = LIMITS_PATH
    return f"{path}#limit-{limit}"


def sentence(text: str) -> str:
    """``text`` as a sentence's start: its first letter capital, the rest as written (a
    name keeps its case)."""
    return text[:1].upper() + text[1:]


def plural(count: int, word: str) -> str:
    """``1 step``, ``2 steps``."""
    return f"{count} {word}{'' if count == 1 else 's'}"
