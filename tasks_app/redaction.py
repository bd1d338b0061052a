"""Secrets kept out of what is shown or logged: the value of every key named secret is
replaced, at any depth (keys compared case-insensitively, ``-`` and ``_`` alike).

The console redacts what it shows with ``CONSOLE_REDACT_KEYS``; the operational log
(``tasks_app.oplog``) what it writes with ``TASKS_LOG_REDACT_KEYS``.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from functools import lru_cache
from typing import Any

REDACTED = "•••redacted•••"


def redact(value: Any, keys: Iterable[str]) -> Any:
    """A copy of ``value`` with the value of every key in ``keys`` replaced, at any depth."""
    secret = {normalise_key(key) for key in keys}

    def walk(node: Any) -> Any:
        if isinstance(node, dict):
            return {
                key: REDACTED if normalise_key(str(key)) in secret else walk(item)
                for key, item in node.items()
            }
        if isinstance(node, list):
            return [walk(item) for item in node]
        return node

    return walk(value)


def redact_text(text: str, keys: Iterable[str]) -> str:
    """``text`` with the value after each secret key written as ``key=value`` or
    ``key: value`` (quoted or not, as in a dict's repr or a query string) replaced: free
    text such as an error message may quote what a handler was given."""
    pattern = _text_pattern(tuple(sorted({normalise_key(key) for key in keys})))
    if pattern is None:
        return text
    return pattern.sub(lambda found: found.group(1) + REDACTED, text)


def normalise_key(key: str) -> str:
    return key.strip().lower().replace("-", "_")


@lru_cache(maxsize=8)
def _text_pattern(keys: tuple[str, ...]) -> re.Pattern[str] | None:
    names = [re.escape(key).replace("_", "[-_]") for key in keys if key]
    if not names:
        return None
    return re.compile(
        rf"""(["']?\b(?:{"|".join(names)})\b["']?\s*[:=]\s*)"""
        # An authorization's scheme goes with its credentials.
        rf"""((?:(?:Bearer|Basic|Token)\s+)?(?:"[^"]*"|'[^']*'|[^\s,;&)}}\]]+))""",
        re.IGNORECASE,
    )
