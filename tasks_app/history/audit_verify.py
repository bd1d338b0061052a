"""Verifying the audit chain (``tasks_app.history.audit_chain``): recomputing each
operator event's hash and following each link to the one before, from the latest retention
checkpoint (docs/audit.md); and writing that checkpoint before retention deletes chained
events.

Retention deletes chained events in no particular order (those of pruned tasks, those
past the audit retention): before it does, :func:`seal_before_deleting` verifies the
chain up to the newest of them and writes an :class:`AuditCheckpoint`: the link there,
and ``[id, hash]`` of the chained events up to there that stay. Verification starts from
the latest checkpoint.
"""

from __future__ import annotations

import collections
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from django.db import transaction

from tasks_app.history.audit_chain import (
    CHAINED_KINDS,
    GENESIS,
    Link,
    event_hash,
    latest_checkpoint,
    lock,
)
from tasks_app.models import AuditCheckpoint, Event

# Ids per IN (...) list, well below either database's limit on parameters.
CHUNK = 1000
# How many recent links the walk remembers, to name an inserted run of events.
REMEMBERED = 1000
# The columns the walk reads.
FIELDS = (
    "id",
    "task_id",
    "step_id",
    "kind",
    "actor",
    "actor_user_id",
    "reason",
    "data",
    "created_at",
    "chain_previous",
    "chain_hash",
)


# --- verifying ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Break:
    """The first broken link: the event, what differs, and what that means."""

    event_id: int
    what: str
    detail: str

    def __str__(self) -> str:
        return f"event {self.event_id}: {self.what}: {self.detail}"


@dataclass(frozen=True)
class Verdict:
    # Where the walk started (None: the chain's beginning).
    checkpoint: AuditCheckpoint | None
    # The newest link reached (None: nothing chained yet).
    head: Link | None
    # Chained events whose hash was recomputed.
    checked: int
    broken: Break | None = None
    # The chained links walked after the checkpoint (only when asked for).
    links: list[Link] = field(default_factory=list)
    # Operator events without a hash after the chain began: the chain does not vouch for
    # them (the first, and how many).
    outside: Break | None = None
    outside_count: int = 0

    @property
    def ok(self) -> bool:
        """Every link holds and every operator event since the chain began is in it."""
        return self.broken is None and self.outside is None


class ChainBroken(Exception):
    def __init__(self, broken: Break) -> None:
        super().__init__(str(broken))
        self.broken = broken


def _short(value: str | None) -> str:
    return f"{value[:16]}…" if value else "(none)"


def _edited(event: Event, computed: str) -> Break:
    return Break(
        event.pk,
        "hash mismatch (the row was edited)",
        f"its fields hash to {_short(computed)}, the row holds {_short(event.chain_hash)}",
    )


def _chained_rows(**lookups: Any) -> Iterator[Event]:
    queryset = Event.objects.filter(kind__in=CHAINED_KINDS, **lookups).only(*FIELDS)
    return queryset.order_by("id").iterator(chunk_size=2000)


def _check_kept(checkpoint: AuditCheckpoint) -> tuple[int, Break | None]:
    """The chained events up to the checkpoint that it says stay: each still there,
    unedited, with the hash it recorded, and no other."""
    kept = {int(pk): str(digest) for pk, digest in checkpoint.kept}
    checked = 0
    stored: dict[int, Event] = {
        event.pk: event
        for event in _chained_rows(pk__lte=checkpoint.last_event_id, chain_hash__isnull=False)
    }
    for pk in sorted(kept.keys() | stored.keys()):
        event = stored.get(pk)
        if event is None:
            return checked, Break(
                pk,
                "missing (deleted)",
                f"the checkpoint of {checkpoint.created_at:%Y-%m-%d %H:%M:%S %Z} kept it; "
                "it is gone, deleted outside retention",
            )
        if pk not in kept:
            return checked, Break(
                pk,
                "not in the checkpoint (inserted)",
                f"a chained event up to event {checkpoint.last_event_id}, where the "
                "checkpoint sealed the chain, that the checkpoint does not list",
            )
        checked += 1
        computed = event_hash(event)
        if computed != event.chain_hash:
            return checked, _edited(event, computed)
        if event.chain_hash != kept[pk]:
            return checked, Break(
                pk,
                "hash mismatch (the row was edited and rehashed)",
                f"it holds {_short(event.chain_hash)}, the checkpoint recorded {_short(kept[pk])}",
            )
    return checked, None


def verify(*, upto: int | None = None, collect: bool = False) -> Verdict:
    """Recompute the chain from the latest checkpoint (or its beginning) up to the event
    ``upto`` (or its end); the first broken link stops the walk.

    1. The chained events the checkpoint kept are checked one by one (:func:`_check_kept`).
    2. Walking the operator events after it in id order: each one's fields must hash to
       its stored hash (else it was edited), and its ``chain_previous`` must be the hash
       of the chained event before it (else one was deleted or inserted between them).
    3. An operator event without a hash after the chain began was written around it (by
       SQL, or by a process of the version before the chain during its rolling deploy):
       the chain does not vouch for it. It breaks no link, so it is reported beside them
       (``outside``) and the walk goes on.
    """
    checkpoint = latest_checkpoint()
    checked = 0
    running: Link | None = None
    if checkpoint is not None:
        checked, broken = _check_kept(checkpoint)
        running = Link(checkpoint.last_event_id, checkpoint.last_hash)
        if broken is not None:
            return Verdict(checkpoint, running, checked, broken)
    lookups: dict[str, Any] = {"pk__gt": running.event_id if running else 0}
    if upto is not None:
        lookups["pk__lte"] = upto
    links: list[Link] = []
    recent: collections.OrderedDict[str, int] = collections.OrderedDict()
    outside: Break | None = None
    outside_count = 0
    for event in _chained_rows(**lookups):
        if event.chain_hash is None:
            if running is None:
                continue  # written before the chain began
            outside_count += 1
            outside = outside or Break(
                event.pk,
                "no hash (written around the chain)",
                f"an operator event ({event.kind} by {event.actor} at "
                f"{event.created_at:%Y-%m-%d %H:%M:%S %Z}) without a hash after the chain "
                "began: inserted by SQL, or by a process of the version before the chain",
            )
            continue
        checked += 1
        computed = event_hash(event)
        expected = running.hash if running else GENESIS
        broken = None
        if computed != event.chain_hash:
            broken = _edited(event, computed)
        elif event.chain_previous != expected:
            broken = _unlinked(event, running, recent)
        if broken is not None:
            return Verdict(checkpoint, running, checked, broken, links, outside, outside_count)
        running = Link(event.pk, event.chain_hash)
        recent[event.chain_hash] = event.pk
        if len(recent) > REMEMBERED:
            recent.popitem(last=False)
        if collect:
            links.append(running)
    return Verdict(checkpoint, running, checked, None, links, outside, outside_count)


def _unlinked(event: Event, before: Link | None, recent: dict[str, int]) -> Break:
    what = "previous-hash mismatch (a row deleted or inserted before it)"
    named = event.chain_previous or "(the beginning)"
    if before is None:
        return Break(
            event.pk,
            what,
            f"it is the first chained event and names {_short(named)} as the one before: "
            "the chain's first events were deleted",
        )
    earlier = recent.get(event.chain_previous or "")
    if earlier is not None:
        return Break(
            event.pk,
            what,
            f"it links to event {earlier}, so the chained events after that one up to "
            f"event {before.event_id} were inserted (or it was)",
        )
    return Break(
        event.pk,
        what,
        f"it names {_short(named)} as the one before, but the chain before it ends at "
        f"event {before.event_id} with {_short(before.hash)}: the chained event between "
        "them was deleted (or it was rewritten)",
    )


# --- retention ----------------------------------------------------------------------------------


def _chunks(ids: Sequence[int]) -> Iterator[list[int]]:
    for start in range(0, len(ids), CHUNK):
        yield list(ids[start : start + CHUNK])


def chained_among(event_ids: Sequence[int]) -> dict[int, str]:
    """The chained events among ``event_ids``, with their hashes."""
    found: dict[int, str] = {}
    for chunk in _chunks(event_ids):
        rows = Event.objects.filter(pk__in=chunk, chain_hash__isnull=False).values_list(
            "pk", "chain_hash"
        )
        found.update((pk, str(digest)) for pk, digest in rows)
    return found


def seal_before_deleting(event_ids: Sequence[int]) -> int:
    """Before retention deletes ``event_ids``: when chained events are among them, verify
    the chain up to the newest of them and write the checkpoint verification will start
    from. Returns how many chained events go. Raises :class:`ChainBroken` (writing
    nothing) when a link is broken: a checkpoint would vouch for the break. Operator events
    outside the chain break no link; they are pruned as any other."""
    going = chained_among(event_ids)
    if not going:
        return 0
    with transaction.atomic():
        lock()
        verdict = verify(upto=max(going), collect=True)
        if verdict.broken is not None:
            raise ChainBroken(verdict.broken)
        assert verdict.head is not None
        kept = dict(_kept(verdict.checkpoint))
        kept.update((link.event_id, link.hash) for link in verdict.links)
        for pk in going:
            kept.pop(pk, None)
        AuditCheckpoint.objects.create(
            last_event_id=verdict.head.event_id,
            last_hash=verdict.head.hash,
            kept=[[pk, digest] for pk, digest in sorted(kept.items())],
            pruned_count=len(going),
        )
    return len(going)


def checkpoints_recording(link: Link) -> bool:
    """Whether a checkpoint recorded ``link`` (an event retention has deleted since): as
    the link it sealed the chain at, or as one it kept."""
    return any(
        (checkpoint.last_event_id, checkpoint.last_hash) == (link.event_id, link.hash)
        or (link.event_id, link.hash) in set(_kept(checkpoint))
        for checkpoint in AuditCheckpoint.objects.filter(last_event_id__gte=link.event_id)
    )


def holds(link: Link) -> bool:
    """Whether the chain still vouches for ``link``, a head exported earlier: the event is
    there with that hash, or a checkpoint recorded it before retention deleted it. When
    neither, the chain's newest events were deleted and its head moved back, which a walk
    of what remains cannot see."""
    stored = Event.objects.filter(pk=link.event_id, chain_hash=link.hash).exists()
    return stored or checkpoints_recording(link)


def _kept(checkpoint: AuditCheckpoint | None) -> Iterable[tuple[int, str]]:
    if checkpoint is None:
        return ()
    return ((int(pk), str(digest)) for pk, digest in checkpoint.kept)
