"""What changed between two points of a task's history (``as_of.Snapshot``), in words a
person reads: ``step b: pending → succeeded``, ``payload.title: 'Old' → 'New'``,
``effect k:1:a:write_a: started → done``. A value under a secret key is said to have
changed, never shown.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from tasks_app.history.as_of import ApprovalAsOf, Snapshot, StepAsOf
from tasks_app.redaction import is_secret_key

# How a part absent at one of two points reads.
NONE = "(none)"
# A value longer than this is cut in a line (the state shows it whole).
LONGEST_VALUE = 80


def difference(before: Snapshot, after: Snapshot) -> list[str]:
    """What changed from ``before`` to ``after``, a line each, in words: the task's status,
    each step row, the payload and the draft field by field, each approval request, attempt
    and external write. A value under a secret key is said to have changed, never shown."""
    lines = []
    if before.status != after.status:
        lines.append(f"task: {_word(before.status)} → {_word(after.status)}")
    lines += _step_lines(before.steps, after.steps)
    lines += value_lines("payload", before.payload, after.payload)
    lines += value_lines("draft", before.draft, after.draft)
    lines += _approval_lines(before.approvals, after.approvals)
    lines += _keyed_lines(
        {(a.step_id, a.token): a for a in before.attempts},
        {(a.step_id, a.token): a for a in after.attempts},
        lambda a: (f"attempt of {a.step} (token {a.token})", a.shown),
    )
    lines += _keyed_lines(
        {e.key: e for e in before.effects},
        {e.key: e for e in after.effects},
        lambda e: (f"effect {e.key}", e.status),
    )
    return lines


def _word(status: str) -> str:
    return status.replace("_", " ")


def _step_lines(before: Sequence[StepAsOf], after: Sequence[StepAsOf]) -> list[str]:
    was = {step.pk: step for step in before}
    lines = []
    for step in after:
        old = was.get(step.pk)
        if old is None:
            lines.append(f"step {step.label}: {NONE} → {_word(step.status)}")
            continue
        parts = [f"{_word(old.status)} → {_word(step.status)}"] if old.status != step.status else []
        if old.attempts != step.attempts:
            parts.append(f"attempts {old.attempts} → {step.attempts}")
        if old.token != step.token:
            parts.append(f"token {old.token} → {step.token}")
        if parts:
            lines.append(f"step {step.label}: {', '.join(parts)}")
    kept = {step.pk for step in after}
    gone = [step for step in before if step.pk not in kept]
    lines += [f"step {step.label}: {_word(step.status)} → {NONE}" for step in gone]
    return lines


def _approval_lines(before: Sequence[ApprovalAsOf], after: Sequence[ApprovalAsOf]) -> list[str]:
    """A request's status where it changed, and who had approved it where that changed."""
    was = {request.pk: request for request in before}
    lines = []
    for request in after:
        old = was.get(request.pk)
        if old is None or old.status != request.status:
            status = _word(old.status) if old is not None else NONE
            lines.append(f"approval #{request.pk}: {status} → {_word(request.status)}")
        voters = old.voters if old is not None else ()
        if voters != request.voters:
            lines.append(
                f"approval #{request.pk} approved by: {', '.join(voters) or NONE} → "
                f"{', '.join(request.voters) or NONE}"
            )
    return lines


def _keyed_lines[K, V](
    before: dict[K, V], after: dict[K, V], say: Callable[[V], tuple[str, str]]
) -> list[str]:
    """A line for each key whose thing reads differently at the two points (``say`` gives
    its name and how it reads), in the order the later point lists them; one gone by the
    later point reads as none."""
    lines = []
    for key in [*after, *(key for key in before if key not in after)]:
        old = say(before[key]) if key in before else None
        new = say(after[key]) if key in after else None
        name = new[0] if new is not None else old[0] if old is not None else ""
        was = old[1] if old is not None else NONE
        now = new[1] if new is not None else NONE
        if was != now:
            lines.append(f"{name}: {was} → {now}")
    return lines


def value_lines(name: str, before: Any, after: Any) -> list[str]:
    """How a JSON value changed, a line per changed leaf (``payload.title: 'Old' → 'New'``);
    a value that was or became something other than an object or a list, in one line."""
    if before == after:
        return []
    if not (isinstance(before, dict | list) and isinstance(after, dict | list)):
        was = NONE if before is None else _shown(before)
        now = NONE if after is None else _shown(after)
        return [f"{name}: {was} → {now}"]
    old, new = _leaves(before), _leaves(after)
    lines = []
    for path in [*new, *(path for path in old if path not in new)]:
        if path in old and path in new and old[path] == new[path]:
            continue
        where = _dotted(name, path)
        if any(isinstance(part, str) and is_secret_key(part) for part in path):
            lines.append(f"{where}: changed (a secret, not shown)")
            continue
        was = _shown(old[path]) if path in old else NONE
        now = _shown(new[path]) if path in new else NONE
        lines.append(f"{where}: {was} → {now}")
    return lines


type _Path = tuple[str | int, ...]


def _leaves(value: Any, path: _Path = ()) -> dict[_Path, Any]:
    """``value``'s scalars and empty containers by their path."""
    if isinstance(value, dict) and value:
        items: Iterable[tuple[str | int, Any]] = value.items()
    elif isinstance(value, list) and value:
        items = enumerate(value)
    else:
        return {path: value}
    leaves: dict[_Path, Any] = {}
    for key, item in items:
        leaves.update(_leaves(item, (*path, key)))
    return leaves


def _dotted(name: str, path: _Path) -> str:
    """``("customer", "tags", 0)`` under ``payload`` as ``payload.customer.tags[0]``."""
    return name + "".join(f"[{part}]" if isinstance(part, int) else f".{part}" for part in path)


def _shown(value: Any) -> str:
    """A value as a line shows it: text quoted, anything else as JSON, cut when long (a
    container holding a secret shows as hidden)."""
    if isinstance(value, dict | list) and any(
        isinstance(part, str) and is_secret_key(part) for path in _leaves(value) for part in path
    ):
        return "(a value holding a secret, not shown)"
    text = repr(value) if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
    return text if len(text) <= LONGEST_VALUE else text[: LONGEST_VALUE - 1] + "…"
