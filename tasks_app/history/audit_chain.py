"""The audit chain: every operator event carries a hash over its own content and the hash
of the operator event before it, so an event edited, deleted or inserted afterwards shows
(docs/audit.md).

What is chained: the events whose kind is an operator action (``OPERATOR_EVENT_KINDS``),
whoever wrote them (a person, a command, the system ending a cancel), all through
:func:`events.record_event`. Worker events (claimed, succeeded, ...) are not: chaining
serialises every writer on one lock; measured, 8 connections wrote 1,604 plain events/s
but 203 chained ones, no more than one connection did (docs/audit.md). Operator actions
are written at the pace of people.

The canonical form of an event is the canonical JSON (sorted keys, ``separators=(",",
":")``, ``ensure_ascii=False``, no NaN) of the object with ``id``, ``task_id``,
``step_id``, ``kind``, ``actor``, ``actor_user_id``, ``reason``, ``data``, ``created_at``
(UTC, ISO 8601 with microseconds: ``2026-12-01T16:46:00.123456+00:00``) and
``previous``, the hash of the chained event before (``""`` for the first). ``data`` is
taken as the database gives it back: a number without a fractional part is written as an
integer (PostgreSQL's jsonb reads ``1.0`` back as a float but ``1e+16`` as an integer).
``chain_hash`` is the SHA-256 of its UTF-8 bytes, in hex.

Appending (:func:`append`) happens in the writer's transaction:

1. take a transaction-level advisory lock on PostgreSQL (SQLite has one writer at a time),
   held until the transaction ends, so concurrent operator actions form one chain;
2. read the head: the newest chained event, or the latest checkpoint when retention
   deleted that;
3. take the event's id from its sequence under the lock, so chained events' ids follow
   the chain's order (``chain_previous`` is stored anyway: verification follows it);
4. hash and insert.

The lock is the last one an operator transaction takes (after its task's), and nothing
waits for a task or step row while holding it, so it adds no deadlock.

Verifying the chain, and the checkpoint retention writes before it deletes chained events,
are in ``tasks_app.history.audit_verify``.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from datetime import UTC
from decimal import Decimal
from typing import Any

from django.db import connection, transaction

from tasks_app.db.clock import db_now
from tasks_app.models import OPERATOR_EVENT_KINDS, AuditCheckpoint, Event

# Sorted, as the partial indexes' condition spells it, so PostgreSQL can use them.
CHAINED_KINDS = sorted(OPERATOR_EVENT_KINDS)
# The ``previous`` of the first chained event.
GENESIS = ""
# pg_advisory_xact_lock's key: b"auditchn" as a big-endian integer.
LOCK_KEY = int.from_bytes(b"auditchn", "big")


def is_chained(kind: str) -> bool:
    return kind in OPERATOR_EVENT_KINDS


# --- the canonical form -------------------------------------------------------------------------


def _as_stored(value: Any) -> Any:
    """``value`` (plain JSON) with each whole float as the integer PostgreSQL reads back."""
    if isinstance(value, float) and value.is_integer():
        return int(Decimal(repr(value)))
    if isinstance(value, dict):
        return {key: _as_stored(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_as_stored(item) for item in value]
    return value


def canonical(event: Event) -> bytes:
    """The event's canonical form, its stored ``chain_previous`` included."""
    data = _as_stored(json.loads(json.dumps(event.data, allow_nan=False)))
    document = {
        "id": event.pk,
        "task_id": event.task_id,
        "step_id": event.step_id,
        "kind": str(event.kind),
        "actor": event.actor,
        "actor_user_id": event.actor_user_id,
        "reason": event.reason,
        "data": data,
        "created_at": event.created_at.astimezone(UTC).isoformat(timespec="microseconds"),
        "previous": event.chain_previous or GENESIS,
    }
    text = json.dumps(
        document, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
    )
    return text.encode()


def event_hash(event: Event) -> str:
    return hashlib.sha256(canonical(event)).hexdigest()


# --- appending ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Link:
    """A place in the chain: an event's id and its hash."""

    event_id: int
    hash: str

    def __str__(self) -> str:
        return f"event {self.event_id} {self.hash}"


def lock() -> None:
    """Serialise the chain's writers until the transaction ends (PostgreSQL; SQLite's
    immediate transactions already let one writer at a time)."""
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_advisory_xact_lock(%s)", [LOCK_KEY])


def latest_checkpoint() -> AuditCheckpoint | None:
    return AuditCheckpoint.objects.order_by("-id").first()


def head() -> Link | None:
    """The newest link: the newest chained event, or the latest checkpoint's when
    retention deleted every chained event after it."""
    newest = (
        Event.objects.filter(kind__in=CHAINED_KINDS, chain_hash__isnull=False)
        .order_by("-id")
        .values_list("id", "chain_hash")
        .first()
    )
    checkpoint = latest_checkpoint()
    links = [Link(newest[0], str(newest[1]))] if newest else []
    if checkpoint is not None:
        links.append(Link(checkpoint.last_event_id, checkpoint.last_hash))
    return max(links, key=lambda link: link.event_id, default=None)


def _next_event_id() -> int:
    table = Event._meta.db_table
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute("SELECT nextval(pg_get_serial_sequence(%s, 'id'))", [table])
        else:
            # AUTOINCREMENT: past every id ever used, even one deleted since.
            cursor.execute(
                "SELECT max(COALESCE((SELECT seq FROM sqlite_sequence WHERE name = %s), 0),"
                " COALESCE((SELECT max(id) FROM tasks_app_event), 0)) + 1",
                [table],
            )
        value: int = cursor.fetchone()[0]
        return value


def append(event: Event) -> Event:
    """Insert ``event`` (unsaved, an operator action) as the chain's new head, in the
    caller's transaction (steps in the module's docstring)."""
    assert is_chained(event.kind) and event._state.adding
    # No savepoint of its own: a failure here fails the caller's transaction anyway.
    with transaction.atomic(savepoint=False):
        lock()
        previous = head()
        event.pk = _next_event_id()
        # Stamped after the lock, by the database's clock: the chain's times follow its ids.
        event.created_at = db_now()
        event.chain_previous = previous.hash if previous else GENESIS
        event.chain_hash = event_hash(event)
        event.save()
    return event
