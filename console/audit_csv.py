"""The audit log as CSV (``/audit/export.csv``), and the check of such a file against the
database (``manage.py verify_audit --export FILE``): one home for the columns, so the file
and its check cannot drift.

The columns outside code reads come first and stay as they were (``id`` … ``data``);
later ones are only ever added at the end: ``label`` (the action as the console names
it), ``workflow`` (of the event's task while it is stored), ``bulk_plan_id`` (the bulk
action the event was part of) and ``chain_hash`` (operator events' link in the audit
chain, ``tasks_app.history.audit_chain``).

The file ends with the chain's head as one more row: its first cell reads
``# chain head: event <id> <sha-256>`` and the others are empty, so every row has the
header's number of cells and any CSV reader or spreadsheet opens the file as it is (a
line of another shape breaks strict readers; a ``#`` comment line is not CSV, and the
head in a header of the response would not travel with a saved file). A reader of rows
skips it by its first cell, as pandas does with ``comment="#"``.
"""

from __future__ import annotations

import csv
import json
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from itertools import batched
from typing import Any

from console.presenters import csv_cell
from tasks_app import redaction
from tasks_app.history import audit_chain, audit_verify
from tasks_app.history.audit_chain import Link
from tasks_app.history.timeline import HistoryEntry
from tasks_app.models import Event, EventKind
from tasks_app.operations import audit_log

COLUMNS = [
    "id",
    "created_at",
    "kind",
    "actor",
    "task_id",
    "step_id",
    "reason",
    "data",
    # Added at the end, after the columns outside code depended on.
    "label",
    "workflow",
    "bulk_plan_id",
    "chain_hash",
]
# Derived from today's code and tables rather than recorded with the event: not compared
# by the check (a task pruned since leaves its workflow empty).
DERIVED = frozenset({"label", "workflow"})
HEAD_PREFIX = "# chain head: "
HEAD_LINE = re.compile(r"^# chain head: (?:event (\d+) ([0-9a-f]{64})|none)$")
CHUNK = 2000


def label(kind: str) -> str:
    """The action as the console names it (``EventKind``'s label)."""
    try:
        return str(EventKind(kind).label)
    except ValueError:
        return kind


def plan_of(event: HistoryEntry) -> str:
    data = event.data
    return str(data.get("plan", "")) if isinstance(data, dict) else ""


def event_row(event: HistoryEntry, workflow: str) -> list[Any]:
    """One event as its row: what producers and people wrote redacted, as everywhere. A
    transition a task's or an attempt's row records has no event id: its row names it by
    kind and task, or kind, step and token (``audit_log.export_id``)."""
    return [
        event.pk if isinstance(event, Event) else audit_log.export_id(event),
        event.created_at.isoformat(),
        event.kind,
        event.actor,
        event.task_id or "",
        event.step_id or "",
        redaction.redact_text(event.reason),
        json.dumps(redaction.redact_event_data(event.data), ensure_ascii=False, sort_keys=True),
        label(event.kind),
        workflow,
        plan_of(event),
        event.chain_hash or "",
    ]


def head_row(head: Link | None) -> list[str]:
    text = f"{HEAD_PREFIX}event {head.event_id} {head.hash}" if head else f"{HEAD_PREFIX}none"
    return [text] + [""] * (len(COLUMNS) - 1)


def rows(events: Iterable[HistoryEntry]) -> Iterator[list[Any]]:
    """The header, each event's row (workflows read a chunk at a time), then the chain's
    head as it is once the last row was read: it covers every chained row listed."""
    yield COLUMNS
    for chunk in batched(events, CHUNK):
        workflows = audit_log.task_workflows([e.task_id for e in chunk if e.task_id])
        for event in chunk:
            yield event_row(event, workflows.get(event.task_id or 0, ""))
    yield head_row(audit_chain.head())


# --- checking a file ----------------------------------------------------------------------------


@dataclass
class ExportCheck:
    rows: int = 0
    # Operator rows whose link was compared.
    chained: int = 0
    # Rows whose event retention has pruned since the export.
    pruned: int = 0
    head: Link | None = None
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems


def check_export(lines: Iterable[str]) -> ExportCheck:
    """Compare an exported file with the database: each row with the event it names (the
    recorded columns, cell by cell, the chain hash among them), and its final chain-head
    line with the chain. Events pruned since are counted, not faulted, where a checkpoint
    accounts for them (an operator event) or retention may have taken them (any other)."""
    check = ExportCheck()
    reader = csv.reader(lines)
    header = next(reader, None)
    if header is None or header[: len(COLUMNS)] != COLUMNS:
        check.problems.append(f"not an audit export: the header is not {','.join(COLUMNS)}")
        return check
    body = list(reader)
    if not body or not HEAD_LINE.match(body[-1][0] if body[-1] else ""):
        check.problems.append("no chain-head line at the end: the file was cut short or edited")
    else:
        match = HEAD_LINE.match(body.pop()[0])
        assert match is not None
        if match.group(1):
            check.head = Link(int(match.group(1)), match.group(2))
    rows: dict[int, list[str]] = {}
    attempts: list[list[str]] = []
    for number, row in enumerate(body, start=2):
        if len(row) == len(COLUMNS) and row[0].isdigit():
            rows[int(row[0])] = row
        elif len(row) == len(COLUMNS) and audit_log.is_export_id(row[0]):
            attempts.append(row)
        else:
            check.problems.append(f"line {number}: not an event row of the export")
    check.rows = len(rows) + len(attempts)
    for row in attempts:
        _compare_attempt(check, row)
    checkpoint = audit_chain.latest_checkpoint()
    sealed = checkpoint.last_event_id if checkpoint else 0
    for ids in batched(sorted(rows), CHUNK):
        stored = Event.objects.in_bulk(list(ids))
        for pk in ids:
            _compare(check, rows[pk], stored.get(pk), sealed)
    _check_head(check, rows)
    return check


def _compare(check: ExportCheck, row: list[str], event: Event | None, sealed: int) -> None:
    pk, chain_hash = int(row[0]), row[COLUMNS.index("chain_hash")]
    if event is None:
        if chain_hash and pk > sealed:
            check.problems.append(
                f"event {pk}: in the file, not in the database, and no checkpoint "
                "accounts for it: deleted outside retention"
            )
        else:
            check.pruned += 1
        return
    if chain_hash:
        check.chained += 1
    _compare_cells(check, str(pk), row, event)


def _compare_attempt(check: ExportCheck, row: list[str]) -> None:
    """A row of an enqueue, claim or success, against the row that records it (retention
    deletes it with its task)."""
    entry = audit_log.derived_record(row[0])
    if entry is None:
        check.pruned += 1
        return
    _compare_cells(check, row[0], row, entry)


def _compare_cells(check: ExportCheck, name: str, row: list[str], entry: HistoryEntry) -> None:
    expected = [csv_cell(cell) for cell in event_row(entry, "")]
    for column, found, wanted in zip(COLUMNS, row, expected, strict=True):
        if column not in DERIVED and found != wanted:
            check.problems.append(
                f"event {name}: {column} differs: the file has {_quoted(found)}, the "
                f"database {_quoted(wanted)}"
            )


def _quoted(text: str) -> str:
    return repr(text if len(text) <= 80 else text[:79] + "…")


def _check_head(check: ExportCheck, rows: dict[int, list[str]]) -> None:
    head = check.head
    if head is None:
        return
    newest = max((pk for pk, row in rows.items() if row[-1]), default=0)
    if newest > head.event_id:
        check.problems.append(
            f"chain head: event {head.event_id} is older than event {newest}, a chained row "
            "of the file"
        )
    stored = list(Event.objects.filter(pk=head.event_id).values_list("chain_hash", flat=True))
    if stored:
        if stored[0] != head.hash:
            check.problems.append(
                f"chain head: event {head.event_id} holds {stored[0] or 'no hash'}, the file "
                f"names {head.hash}: not in the chain"
            )
        return
    if audit_verify.checkpoints_recording(head):
        return
    check.problems.append(
        f"chain head: event {head.event_id} is not in the database and no checkpoint "
        "records its link: it cannot be shown to be in the chain"
    )
