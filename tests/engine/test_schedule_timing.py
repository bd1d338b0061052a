"""When a schedule's slots fall (``tasks_app.engine.schedules``), the time zone changes
included, and which declarations are refused. The ticks through a clock change, with the
clock injected: ``tests/operations/test_schedule_ticks.py``."""

from __future__ import annotations

from datetime import timedelta

import pytest

from tasks_app.engine.schedules import Missed, Schedule, Timing, decide, slot_key
from tasks_app.exceptions import InvalidInput
from tests.schedule_support import at

BERLIN = "Europe/Berlin"


def slots(cron: str, start: str, end: str, zone: str = BERLIN) -> list[str]:
    timing = Timing.of({"cron": cron, "timezone": zone})
    return [f"{slot:%m-%d %H:%M}" for slot in timing.between(at(start), at(end))]


def test_a_daily_slot_in_berlin_is_0230_local_time_in_utc() -> None:
    # Winter: 02:30 CET is 01:30 UTC; summer: 02:30 CEST is 00:30 UTC.
    assert slots("30 2 * * *", "2026-01-10 00:00", "2026-01-11 23:59") == [
        "01-10 01:30",
        "01-11 01:30",
    ]
    assert slots("30 2 * * *", "2026-07-10 00:00", "2026-07-11 23:59") == [
        "07-10 00:30",
        "07-11 00:30",
    ]


def test_the_skipped_hour_of_spring_runs_the_daily_slot_once_just_after_it() -> None:
    # 29 March 2026: at 02:00 CET the clocks go to 03:00 CEST, so 02:30 never happens;
    # the slot runs once, at 03:00 CEST (01:00 UTC), as Debian's cron runs it.
    assert slots("30 2 * * *", "2026-03-27 12:00", "2026-03-30 12:00") == [
        "03-28 01:30",
        "03-29 01:00",
        "03-30 00:30",
    ]


def test_the_doubled_hour_of_autumn_runs_the_daily_slot_once() -> None:
    # 25 October 2026: at 03:00 CEST the clocks go back to 02:00 CET, so 02:30 happens
    # twice (00:30 and 01:30 UTC); the slot runs once, at the first.
    assert slots("30 2 * * *", "2026-10-24 12:00", "2026-10-26 12:00") == [
        "10-25 00:30",
        "10-26 01:30",
    ]


def test_an_hourly_slot_runs_every_real_hour_across_both_changes() -> None:
    def hours_of_day(day: str) -> int:
        # The local day in Berlin, from its midnight to the next, in UTC.
        timing = Timing.of({"cron": "0 * * * *", "timezone": BERLIN})
        local_midnight = at(f"{day} 00:00").replace(tzinfo=timing.zone)
        found = timing.between(local_midnight, local_midnight + timedelta(hours=25))
        next_day = (local_midnight + timedelta(days=1)).replace(tzinfo=timing.zone)
        return len([slot for slot in found if slot < next_day])

    assert hours_of_day("2026-03-28") == 24
    assert hours_of_day("2026-03-29") == 23
    assert hours_of_day("2026-10-25") == 25


def test_an_interval_counts_from_the_epoch_so_any_start_finds_the_same_slots() -> None:
    timing = Timing.of({"every": 900})
    first = timing.between(at("2026-03-29 00:07"), at("2026-03-29 01:00"))
    assert [f"{slot:%H:%M}" for slot in first] == ["00:15", "00:30", "00:45", "01:00"]
    # A slot is found from itself (a schedule's next slot is "at or after").
    assert next(timing.from_(at("2026-03-29 00:15"))) == at("2026-03-29 00:15")
    assert next(timing.after(at("2026-03-29 00:15"))) == at("2026-03-29 00:30")


def test_a_slot_key_names_the_schedule_and_the_slot_in_utc() -> None:
    slot = Timing.of({"cron": "30 2 * * *", "timezone": BERLIN}).next(at("2026-03-28 12:00"), 1)
    assert slot_key("digest", slot[0]) == "schedule:digest:2026-03-29T01:00:00Z"


SPEC = {"missed": Missed.SKIP, "max_missed": 2, "tolerance": 300, "every": 3600}


@pytest.mark.parametrize(
    ("policy", "enqueued", "missed"),
    [
        (Missed.SKIP, [], ["02:00", "03:00", "04:00"]),
        (Missed.LATEST, ["04:00"], ["02:00", "03:00"]),
        (Missed.EACH, ["03:00", "04:00"], ["02:00"]),
    ],
)
def test_slots_older_than_the_tolerance_follow_the_policy(
    policy: str, enqueued: list[str], missed: list[str]
) -> None:
    decision = decide({**SPEC, "missed": policy}, at("2026-03-29 02:00"), at("2026-03-29 04:30"))
    assert [f"{slot:%H:%M}" for slot in decision.enqueue] == enqueued
    assert [f"{slot:%H:%M}" for slot in decision.missed] == missed
    assert decision.next_slot == at("2026-03-29 05:00")


def test_a_slot_on_time_covers_the_gap_for_latest_and_runs_under_every_policy() -> None:
    now = at("2026-03-29 04:02")
    for policy in Missed.CHOICES:
        decision = decide({**SPEC, "missed": policy}, at("2026-03-29 02:00"), now)
        assert at("2026-03-29 04:00") in decision.enqueue, policy
    latest = decide({**SPEC, "missed": Missed.LATEST}, at("2026-03-29 02:00"), now)
    assert [f"{slot:%H:%M}" for slot in latest.enqueue] == ["04:00"]


def test_nothing_due_decides_nothing_and_keeps_the_next_slot() -> None:
    decision = decide(SPEC, at("2026-03-29 05:00"), at("2026-03-29 04:30"))
    assert decision.enqueue == decision.missed == ()
    assert decision.next_slot == at("2026-03-29 05:00")


@pytest.mark.parametrize(
    ("options", "field", "rule"),
    [
        ({"name": "Bad Name", "every": timedelta(minutes=1)}, "name", "format"),
        ({"cron": "0 * * * *", "every": timedelta(minutes=1)}, "cron", "one_of"),
        ({}, "cron", "one_of"),
        ({"cron": "61 * * * *"}, "cron", "format"),
        ({"cron": "0 * * *"}, "cron", "format"),
        ({"cron": "0 2 * * *", "timezone": "Mars/Olympus"}, "timezone", "known"),
        ({"every": timedelta(milliseconds=500)}, "every", "range"),
        ({"every": timedelta(minutes=1), "missed": "sometimes"}, "missed", "choice"),
        ({"every": timedelta(minutes=1), "max_missed": 0}, "max_missed", "range"),
        ({"every": timedelta(minutes=1), "tolerance": timedelta(days=8)}, "tolerance", "range"),
        (
            {"every": timedelta(minutes=1), "payload": {"slot": 1}, "slot_field": "slot"},
            "slot_field",
            "free",
        ),
    ],
)
def test_a_declaration_that_cannot_run_is_refused_naming_the_field(
    options: dict[str, object], field: str, rule: str
) -> None:
    declared = {"name": "test.refused", "workflow": "demo.noop", **options}
    with pytest.raises(InvalidInput) as refused:
        Schedule(**declared)  # type: ignore[arg-type]
    assert (refused.value.field, refused.value.rule) == (field, rule)
