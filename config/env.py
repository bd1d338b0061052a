"""Reading settings from the environment: each helper names the variable and the rule when
a value is wrong, so a bad setting fails loudly at start-up."""

from __future__ import annotations

import ipaddress
import os
from pathlib import Path
from urllib.parse import urlsplit

from django.core.exceptions import ImproperlyConfigured

BASE_DIR = Path(__file__).resolve().parent.parent


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
    raise ImproperlyConfigured(f"{name} must be a boolean (1/0, true/false), not {raw!r}")


def env_int(name: str, default: int, *, minimum: int = 1) -> int:
    raw = env_str(name)
    if not raw:
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ImproperlyConfigured(f"{name} must be an integer, not {raw!r}") from None
    if value < minimum:
        raise ImproperlyConfigured(f"{name} must be at least {minimum}, not {value}")
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
        raise ImproperlyConfigured(
            f"{name} must be comma-separated networks (10.0.0.0/8), not {', '.join(raw)!r}: {exc}"
        ) from None


def env_url(name: str, default: str = "") -> str:
    raw = env_str(name)
    if not raw:
        return default
    parts = urlsplit(raw)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ImproperlyConfigured(f"{name} must be an http(s) URL with a host, not {raw!r}")
    return raw


def is_fake_remote(url: str) -> bool:
    """Whether ``url`` names one of the fakes served under /fake/, on whichever host."""
    path = urlsplit(url).path
    return path == "/fake" or path.startswith("/fake/")
