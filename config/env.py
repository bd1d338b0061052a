"""Reading settings from the environment: each helper names the variable and the rule when
a value is wrong, so a bad setting fails loudly at start-up.

A wrong value is recorded (:func:`refuse`) and the setting carries on with its default, so
that the settings, once read to the end, name every variable to fix at once
(:func:`stop_if_refused`): one short list, not a traceback per attempt.
"""

from __future__ import annotations

import ipaddress
import logging
import os
import sys
from pathlib import Path
from typing import NoReturn
from urllib.parse import urlsplit

BASE_DIR = Path(__file__).resolve().parent.parent

# What the settings refused, in the order they read it.
_refusals: list[str] = []
# The status a process stops with: gunicorn's for a worker that cannot boot, so a web
# process whose workers read settings it refuses stops instead of starting them again
# forever; the others only need it not to be 0.
REFUSED_STATUS = 3


def refuse(message: str) -> None:
    """Record a setting this process cannot start with: ``message`` names the variable and
    what it needs. The settings go on reading, and stop once at their end."""
    _refusals.append(message)


def stop_if_refused(log_format: str) -> None:
    """Stop this process, naming every refused setting at once, if any was: on standard
    error, as one JSON object when the log is JSON (``log_format``), else as a list."""
    if not _refusals:
        return
    _stop(_refusals, log_format)


def _stop(messages: list[str], log_format: str) -> NoReturn:
    count = f"{len(messages)} setting{'s' if len(messages) > 1 else ''}"
    headline = f"not starting: {count} to fix in the environment"
    if log_format == "json":
        # The log formatter's own fields (tasks_app.observability.logs), imported late: it
        # is the settings that name it.
        from tasks_app.observability.logs import JsonFormatter

        record = logging.LogRecord("config", logging.CRITICAL, __file__, 0, headline, (), None)
        record.fields = {"settings": messages}
        text = JsonFormatter().format(record)
    else:
        text = "\n".join([f"{headline}:", *(f"  - {message}" for message in messages)])
    sys.stderr.write(text + "\n")
    sys.stderr.flush()
    raise SystemExit(REFUSED_STATUS)


def env_str(name: str, default: str = "") -> str:
    return os.environ.get(name, default).strip()


def env_bool(name: str, default: bool = False) -> bool:
    raw = env_str(name)
    if not raw:
        return default
    lowered = raw.lower()
    if lowered in {"1", "true", "yes", "on"}:
        return True
    if lowered in {"0", "false", "no", "off"}:
        return False
    refuse(f"{name} must be a boolean (1/0, true/false), not {raw!r}")
    return default


def env_int(name: str, default: int, *, minimum: int = 1) -> int:
    raw = env_str(name)
    if not raw:
        return default
    try:
        value = int(raw)
    except ValueError:
        refuse(f"{name} must be an integer, not {raw!r}")
        return default
    if value < minimum:
        refuse(f"{name} must be at least {minimum}, not {value}")
        return default
    return value


def env_list(name: str, default: list[str]) -> list[str]:
    raw = env_str(name)
    if not raw:
        return default
    return [item.strip() for item in raw.split(",") if item.strip()]


def env_networks(
    name: str, default: list[str]
) -> list[ipaddress.IPv4Network | ipaddress.IPv6Network]:
    """Comma-separated networks (``10.0.0.0/8``); ``none`` for none."""
    raw = env_list(name, default)
    try:
        return [ipaddress.ip_network(network) for network in raw if network != "none"]
    except ValueError as exc:
        refuse(
            f"{name} must be comma-separated networks (10.0.0.0/8), not {', '.join(raw)!r}: {exc}"
        )
        return [ipaddress.ip_network(network) for network in default if network != "none"]


def env_url(name: str, default: str = "") -> str:
    raw = env_str(name)
    if not raw:
        return default
    parts = urlsplit(raw)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        refuse(f"{name} must be an http(s) URL with a host, not {raw!r}")
        return default
    return raw


def is_fake_remote(url: str) -> bool:
    """Whether ``url`` names one of the fakes served under /fake/, on whichever host."""
    path = urlsplit(url).path
    return path == "/fake" or path.startswith("/fake/")
