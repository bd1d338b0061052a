"""Schedules: periodic work declared in code (``tasks_app.schedules``), and the times its
slots fall on.

A schedule enqueues one task of its workflow per *slot*: each time its cron expression
(five fields, read in its time zone) or its interval names. Its declaration is stored in
the database by ``manage.py sync_schedules`` (``tasks_app.operations.schedule_sync``),
which the release runs; from then on the stored copy is what runs, so a worker still on
older code during a deploy ticks the same schedules as one on newer code.

Time zones follow Debian's cron, as ``cronsim`` does: a slot at a fixed local time that a
spring clock change skips (02:30 in ``Europe/Berlin`` on the last Sunday of March) runs
once, at the first minute that exists after it (03:00 local); a slot at a local time that
the autumn change repeats runs once, at its first occurrence. An interval counts from the
Unix epoch in UTC, so every slot is a multiple of it and clocks changing do not move it.

Slots are stored and keyed in UTC: a slot's task has the idempotency key
``schedule:<name>:<slot as 2026-03-29T01:00:00Z>``, so a slot is enqueued once however
many ticks decide it.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from cronsim import CronSim, CronSimError

from tasks_app.exceptions import InvalidInput


class Missed:
    """What a tick does with slots it finds older than the schedule's tolerance (the beat
    or the maintenance worker was down, or the schedule paused)."""

    SKIP = "skip"  # record them as missed; enqueue none
    LATEST = "latest"  # enqueue the newest of them once, unless a slot on time covers it
    EACH = "each"  # enqueue each, the newest ``max_missed`` of them; record the rest missed
    CHOICES = (SKIP, LATEST, EACH)


NAME = re.compile(r"[a-z0-9][a-z0-9._-]{0,63}")
NAME_RULE = "1 to 64 of a-z, 0-9, '.', '_' and '-', starting with a letter or digit"
# The most slots one decision looks at in a gap; older ones are counted, not listed.
SCAN_LIMIT = 100_000
MAX_MISSED = 1_000
KEY_PREFIX = "schedule"


def slot_text(slot: datetime) -> str:
    """A slot as its key and payload carry it: UTC, to the second, ``Z``."""
    return slot.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def slot_key(name: str, slot: datetime) -> str:
    return f"{KEY_PREFIX}:{name}:{slot_text(slot)}"


def run_now_key(name: str, request_id: str) -> str:
    """The key of a run outside the slots, one per request (``operations.schedules``)."""
    return f"{KEY_PREFIX}:{name}:now:{request_id}"


def tolerance_of(spec: Mapping[str, Any]) -> timedelta:
    """How late past its time a slot may be decided and still run as on time."""
    return timedelta(seconds=float(spec.get("tolerance") or 0))


def parse_slot(value: str) -> datetime:
    return datetime.strptime(value, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC)


@dataclass(frozen=True)
class Schedule:
    """One schedule of a workflow. Give ``cron`` (five fields, read in ``timezone``) or
    ``every`` (an interval from the Unix epoch), not both.

    ``payload`` is the task's payload; with ``slot_field`` the slot's time in UTC
    (``2026-03-29T01:00:00Z``) is put in it under that name. ``missed`` says what happens
    to slots older than ``tolerance`` when a tick finds them (:class:`Missed`);
    ``max_missed`` caps how many of them ``each`` enqueues.
    """

    name: str
    workflow: str
    cron: str = ""
    timezone: str = "UTC"
    every: timedelta | None = None
    payload: Mapping[str, Any] = field(default_factory=dict)
    slot_field: str = ""
    queue: str = "default"
    priority: int = 0
    missed: str = Missed.SKIP
    max_missed: int = 10
    tolerance: timedelta = timedelta(minutes=5)
    description: str = ""

    def __post_init__(self) -> None:
        check_spec(self.spec())

    def spec(self) -> dict[str, Any]:
        """The declaration as the database stores it (``StoredSchedule.spec``)."""
        return {
            "workflow": self.workflow,
            "cron": self.cron,
            "timezone": self.timezone,
            "every": self.every.total_seconds() if self.every is not None else None,
            "payload": dict(self.payload),
            "slot_field": self.slot_field,
            "queue": self.queue,
            "priority": self.priority,
            "missed": self.missed,
            "max_missed": self.max_missed,
            "tolerance": self.tolerance.total_seconds(),
            "description": self.description,
            "name": self.name,
        }


def check_spec(spec: Mapping[str, Any]) -> None:
    """Refuse a declaration that cannot run, naming the field and the rule."""
    name = spec.get("name")
    if not isinstance(name, str) or not NAME.fullmatch(name):
        raise InvalidInput("name", "format", f"name: {NAME_RULE}")
    cron, every = spec.get("cron") or "", spec.get("every")
    if bool(cron) == (every is not None):
        raise InvalidInput("cron", "one_of", f"schedule {name}: give cron or every, not both")
    try:
        zone = ZoneInfo(str(spec.get("timezone") or ""))
    except (ZoneInfoNotFoundError, ValueError):
        raise InvalidInput(
            "timezone", "known", f"timezone: {spec.get('timezone')!r} is not a known time zone"
        ) from None
    if cron:
        if len(str(cron).split()) != 5:
            raise InvalidInput(
                "cron", "format", "cron: five fields (minute hour day month weekday)"
            )
        try:
            next(CronSim(str(cron), datetime(2000, 1, 1, tzinfo=zone)))
        except (CronSimError, StopIteration) as exc:
            raise InvalidInput("cron", "format", f"cron: {exc or 'never matches'}") from None
    elif not isinstance(every, int | float) or every < 1 or every != int(every):
        raise InvalidInput("every", "range", "every: a whole number of seconds, at least 1")
    if spec.get("missed") not in Missed.CHOICES:
        raise InvalidInput("missed", "choice", f"missed: one of {', '.join(Missed.CHOICES)}")
    if not 1 <= int(spec.get("max_missed") or 0) <= MAX_MISSED:
        raise InvalidInput("max_missed", "range", f"max_missed: from 1 to {MAX_MISSED}")
    if not 0 <= float(spec.get("tolerance") or 0) <= 7 * 86400:
        raise InvalidInput("tolerance", "range", "tolerance: from 0 to 7 days")
    if not isinstance(spec.get("payload"), dict):
        raise InvalidInput("payload", "object", "payload: must be a JSON object")
    slot_field = spec.get("slot_field") or ""
    if slot_field and slot_field in spec["payload"]:
        raise InvalidInput(
            "slot_field", "free", f"slot_field: the payload already has {slot_field!r}"
        )


@dataclass(frozen=True)
class Timing:
    """When a stored schedule's slots fall."""

    cron: str
    zone: ZoneInfo
    every: timedelta | None

    @classmethod
    def of(cls, spec: Mapping[str, Any]) -> Timing:
        every = spec.get("every")
        return cls(
            cron=spec.get("cron") or "",
            zone=ZoneInfo(spec.get("timezone") or "UTC"),
            every=timedelta(seconds=every) if every is not None else None,
        )

    def after(self, moment: datetime) -> Iterator[datetime]:
        """The slots strictly after ``moment``, in UTC, oldest first."""
        if self.every is not None:
            step = int(self.every.total_seconds())
            epoch = int(moment.timestamp())
            start = (epoch // step + 1) * step
            while True:
                yield datetime.fromtimestamp(start, UTC)
                start += step
        local = moment.astimezone(self.zone)
        # cronsim reads a fixed-time expression by the wall clock, from the start's local
        # time; a start in a repeated hour's second pass must not find its first pass again.
        last = moment.astimezone(UTC)
        for slot in CronSim(self.cron, local.replace(microsecond=0)):
            slot = slot.astimezone(UTC)
            if slot > last:
                last = slot
                yield slot

    def from_(self, moment: datetime) -> Iterator[datetime]:
        """The slots at or after ``moment``."""
        return self.after(moment - timedelta(seconds=1) if moment.microsecond == 0 else moment)

    def between(self, start: datetime, end: datetime, limit: int = SCAN_LIMIT) -> list[datetime]:
        """The slots in ``[start, end]``, at most ``limit`` of the oldest."""
        found: list[datetime] = []
        for slot in self.from_(start):
            if slot > end or len(found) >= limit:
                break
            found.append(slot)
        return found

    def next(self, moment: datetime, count: int) -> list[datetime]:
        slots = self.after(moment)
        return [next(slots) for _ in range(count)]


@dataclass(frozen=True)
class Decision:
    """What one tick does with the slots from a schedule's next undecided one up to now."""

    enqueue: tuple[datetime, ...]
    missed: tuple[datetime, ...]
    # Missed slots beyond what a decision lists (a gap longer than SCAN_LIMIT slots).
    uncounted: bool
    next_slot: datetime


def decide(spec: Mapping[str, Any], start: datetime, now: datetime) -> Decision:
    """Split the slots in ``[start, now]`` into those to enqueue and those missed, by the
    schedule's tolerance and missed-run policy."""
    timing = Timing.of(spec)
    slots = timing.between(start, now)
    uncounted = len(slots) >= SCAN_LIMIT
    tolerance = tolerance_of(spec)
    on_time = [slot for slot in slots if now - slot <= tolerance]
    late = [slot for slot in slots if now - slot > tolerance]
    policy = spec.get("missed")
    caught: list[datetime] = []
    if policy == Missed.LATEST and late and not on_time:
        caught = late[-1:]
    elif policy == Missed.EACH:
        caught = late[-int(spec.get("max_missed") or 1) :]
    missed = [slot for slot in late if slot not in caught]
    following = slots[-1] if slots else start - timedelta(seconds=1)
    if uncounted:
        following = max(following, now)
    return Decision(
        enqueue=tuple(caught + on_time),
        missed=tuple(missed),
        uncounted=uncounted,
        next_slot=next(timing.after(following)),
    )


class ScheduleRegistry:
    """The schedules code declares, by name; ``sync_schedules`` stores them."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._schedules: dict[str, Schedule] = {}

    def register(self, schedule: Schedule) -> Schedule:
        with self._lock:
            known = self._schedules.get(schedule.name)
            if known is not None and known != schedule:
                raise ValueError(f"schedule {schedule.name} is already declared otherwise")
            self._schedules[schedule.name] = schedule
        return schedule

    def unregister(self, name: str) -> None:
        with self._lock:
            self._schedules.pop(name, None)

    def all(self) -> dict[str, Schedule]:
        return dict(sorted(self._schedules.items()))


schedules = ScheduleRegistry()
register_schedule = schedules.register
