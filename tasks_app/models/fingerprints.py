"""A dead letter's cause, as a fingerprint that groups the dead steps one fault killed.

Two steps share a cause when they died with the same error class and the same message
once the parts that differ from step to step are masked: numbers, ids, hexadecimal runs
and quoted values. ``HTTP 503 from /articles/871 (request 9f2c…)`` and ``HTTP 503 from
/articles/12 (request 07ab…)`` are one cause; ``HTTP 404 …`` is another (a status code is
a number too, but its digits are kept where a word says it is a status). The fingerprint
is stored on the step when it dies (``Step.save``), so grouping 100,000 dead letters
reads an index, not their tracebacks.
"""

from __future__ import annotations

import hashlib
import re

from tasks_app.exceptions import error_summary

# Quoted values: 'abc', "abc", `abc`.
_QUOTED = re.compile(r"""'[^']*'|"[^"]*"|`[^`]*`""")
# Hexadecimal ids: 0x…, and runs of 8 or more hex digits and dashes holding both a digit
# and a letter (UUIDs, request ids, hashes). All-digit runs are numbers, below.
_HEX = re.compile(
    r"\b0x[0-9a-f]+\b|\b(?=[0-9a-f-]*\d)(?=[0-9a-f-]*[a-f])[0-9a-f][0-9a-f-]{7,}\b", re.I
)
# Numbers, except an HTTP status code after the word that says so: a 503 and a 404 are
# different causes.
_NUMBER = re.compile(r"(?P<status>\b(?:HTTP|status|code)\s*[:=]?\s*\d{3}\b)|\d+(?:\.\d+)?", re.I)
_SPACES = re.compile(r"\s+")

# Longest message kept in the mask (the cause is in its start).
MAX_MESSAGE = 500

# What a cause looks like, for the filters that take one (the console's, the commands').
CAUSE_PATTERN = r"^[0-9a-f]{16}$"
CAUSE_RULE = "the 16 hexadecimal digits of a cause, as /dead/groups/ links to it"


def masked_message(error_class: str, last_error: str) -> str:
    """The error's message with what varies masked: its summary line without the class it
    starts with."""
    summary = error_summary(last_error)
    if error_class and summary.startswith(error_class + ":"):
        summary = summary[len(error_class) + 1 :]
    summary = summary[:MAX_MESSAGE]
    summary = _QUOTED.sub("<value>", summary)
    summary = _HEX.sub("<hex>", summary)
    summary = _NUMBER.sub(lambda match: match.group("status") or "<n>", summary)
    return _SPACES.sub(" ", summary).strip()


def fingerprint(error_class: str, last_error: str) -> str:
    """The cause of a dead step: 16 hexadecimal digits of SHA-256 over its error class and
    masked message."""
    text = f"{error_class}\n{masked_message(error_class, last_error)}"
    return hashlib.sha256(text.encode()).hexdigest()[:16]
