"""Secrets kept out of everything that leaves the database: the console's pages, the admin,
the audit CSV and the operational log.

What is a secret is one rule, :func:`is_secret_key`: a key whose name contains one of the
patterns of ``settings.REDACT_KEY_PATTERNS`` (``token``, ``secret``, ``password``,
``api_key``, ``authorization``, ``cookie``, ``session``…), compared case-insensitively with
``-``, ``_`` and spaces ignored, so ``api_token``, ``Client-Secret``, ``privateKey`` and
``X-Api-Key`` are all secrets. :func:`redact` replaces the value of every such key at any
depth, in lists too; :func:`redact_text` replaces the value written after such a key in free
text (``key=value`` or ``key: value``, quoted or not, escaped or URL-encoded, as in a repr,
JSON inside a string, a query string or a header), since an error message may quote what
its handler was given.

Whose data is redacted: what producers and people wrote (payloads, results, drafts, error
text, reasons), never the system's own bookkeeping. An event's data holds both: the lease
token a claim or a completion records (``token``, ``current_token``) is a counter auditors
need, not a secret, while a redrive with changes keeps the producer's ``old_payload`` and
``new_payload`` and a failure its ``error`` text. So :func:`redact_event_data` shows the keys
the system writes (:data:`SYSTEM_EVENT_KEYS`) as they are and treats every other key as
producer data: redacted like a payload, or like free text when it is a string. A key added
to event data later is redacted until it is named there, which errs on the safe side. A
step's result is producer data however it was made: ``demo.flaky``'s ``{"token": <its fencing
token>}`` is redacted like an API token a handler returned (the README says so).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from functools import lru_cache
from typing import Any
from urllib.parse import unquote

from django.conf import settings

REDACTED = "•••redacted•••"

# The keys of Event.data the system writes itself, shown as they are: where a transition
# records them (``history.events.record_event`` and ``settle_and_record``'s callers in leases,
# sweeper, operator_actions and waiting; ``approvals``' request facts; enqueueing;
# and the SQL twins in ``sql.py``). Every other key is producer data.
SYSTEM_EVENT_KEYS = frozenset(
    {
        # state: the steps a transition changed, and the task's status after it
        "steps",
        "task_status",
        # claims, completions, failures and stale writes
        "token",
        "attempt",
        "lease_seconds",
        "operation",
        "current_token",
        "current_status",
        "error_class",
        "retry_in",
        "outcome",
        # the id every event of one bulk action carries
        "plan",
        # enqueue and the queue switches
        "workflow",
        "version",
        "queue",
        "payload_hash",
        # approvals
        "request",
        "revision",
        "draft_hash",
        "expires_at",
        "back_to",
        "policy",
    }
)

_SEPARATORS = re.compile(r"[\s_-]+")
# Free text quotes keys and values plainly (``'token': 'x'``), escaped, as JSON inside a
# string does (``{\"token\": \"x\"}``), or URL-encoded (``%22``, ``api%5Fkey%3Dx``).
_QUOTE = r"""(?:\\?["']|%2[27])"""
_SPACE = r"(?:\s|%20)*"
# A key in free text, then ``:`` or ``=`` (or ``%3A``, ``%3D``): ``api_key=…``,
# ``'token': …``, ``Authorization: …``. It starts a word, or follows an encoded character
# (``…%26token%3D…``).
_TEXT_KEY = re.compile(
    rf"""(?:(?<![\w%-])|(?<=%[0-9A-F]{{2}})){_QUOTE}?"""
    rf"""(?P<key>[^\W\d](?:[\w-]|%5F|%2D)*){_QUOTE}?{_SPACE}(?:[:=]|%3[AD]){_SPACE}""",
    re.IGNORECASE,
)
# The value after it, quoted (escapes inside kept in) or bare up to a delimiter (``&`` or
# ``%26`` too); a bare value that starts with a delimiter (``password=,x``) runs to the
# next space or ``&``. An
# authorization's scheme goes with its credentials.
_TEXT_VALUE = re.compile(
    r"""(?:(?:Bearer|Basic|Token)\s+)?(?:"""
    r""""(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*'"""
    r"""|\\"(?:[^\\]|\\[^"])*\\"|\\'(?:[^\\]|\\[^'])*\\'"""
    r"""|%22.*?%22|%27.*?%27"""
    r"""|(?:(?!%26)[^\s,;&)}\]])+|(?:(?!%26)[^\s&])+)""",
    re.IGNORECASE,
)


def normalise_key(key: str) -> str:
    """``key`` as the rule compares it: URL-decoded, lower case, without ``-``, ``_`` or
    spaces."""
    return _SEPARATORS.sub("", unquote(key)).lower()


def is_secret_key(key: object, patterns: Iterable[str] | None = None) -> bool:
    """Whether the value of ``key`` is a secret: its name contains one of ``patterns``
    (``settings.REDACT_KEY_PATTERNS`` unless given)."""
    return _matches(key, _patterns(patterns))


def secret_key_in(path: Iterable[str], value: Any = None) -> str | None:
    """The first secret key a comparison of ``value`` at ``path`` would read, or None: a
    key of the path, or a key at any depth of ``value`` (a filter by JSON containment
    compares those too). A filter that reads one would tell a guessed secret from a wrong
    one, so none may."""
    found = _patterns(None)
    for key in path:
        if _matches(key, found):
            return str(key)

    def walk(node: Any) -> str | None:
        if isinstance(node, Mapping):
            for key, item in node.items():
                if _matches(key, found):
                    return str(key)
                if (inner := walk(item)) is not None:
                    return inner
        elif isinstance(node, list | tuple):
            for item in node:
                if (inner := walk(item)) is not None:
                    return inner
        return None

    return walk(value)


def redact(value: Any, patterns: Iterable[str] | None = None) -> Any:
    """A copy of ``value`` with the value of every secret key replaced, at any depth."""
    found = _patterns(patterns)

    def walk(node: Any) -> Any:
        if isinstance(node, Mapping):
            return {
                key: REDACTED if _matches(key, found) else walk(item) for key, item in node.items()
            }
        if isinstance(node, list | tuple):
            return [walk(item) for item in node]
        return node

    return walk(value)


def redact_text(text: str, patterns: Iterable[str] | None = None) -> str:
    """``text`` with the value after each secret key (``key=value`` or ``key: value``,
    quoted or not) replaced."""
    found = _patterns(patterns)
    if not found or not text:
        return text
    parts: list[str] = []
    done = start = 0
    while (pair := _TEXT_KEY.search(text, start)) is not None:
        # The next key may sit in this one's value (``url=https://x/?token=…``).
        start = pair.end("key")
        if not _matches(pair["key"], found):
            continue
        value = _TEXT_VALUE.match(text, pair.end())
        if value is None:
            continue
        parts += [text[done : pair.end()], REDACTED]
        done = start = value.end()
    parts.append(text[done:])
    return "".join(parts)


def redacted_json(value: Any) -> str:
    """``value`` redacted, as indented JSON for a page to show."""
    return json.dumps(redact(value), indent=2, ensure_ascii=False, sort_keys=True, default=str)


def redact_event_data(
    data: Mapping[str, Any] | None, patterns: Iterable[str] | None = None
) -> dict[str, Any]:
    """An event's data as it may leave: the system's keys (:data:`SYSTEM_EVENT_KEYS`) as
    they are, every other key's value redacted as producer data (a secret key's whole
    value, secret keys within structures, secret values within text)."""
    found = _patterns(patterns)
    shown: dict[str, Any] = {}
    for key, value in (data or {}).items():
        if key in SYSTEM_EVENT_KEYS:
            shown[key] = value
        elif _matches(key, found):
            shown[key] = REDACTED
        elif isinstance(value, str):
            shown[key] = redact_text(value, found)
        else:
            shown[key] = redact(value, found)
    return shown


def _matches(key: object, patterns: tuple[str, ...]) -> bool:
    name = normalise_key(str(key))
    return any(pattern in name for pattern in patterns)


def _patterns(patterns: Iterable[str] | None) -> tuple[str, ...]:
    raw = settings.REDACT_KEY_PATTERNS if patterns is None else patterns
    return _normalised(tuple(raw))


@lru_cache(maxsize=16)
def _normalised(patterns: tuple[str, ...]) -> tuple[str, ...]:
    return tuple(sorted({normalise_key(pattern) for pattern in patterns} - {""}))
