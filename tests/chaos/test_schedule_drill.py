"""The schedule drill: five schedules of ``demo.noop`` every 2 s, four with a tolerance of
1.5 s, one per missed-run policy (``skip``, ``latest``, ``each`` with room for the whole
outage, ``each`` capped at 2), and a ``latest`` without tolerance (every slot is late when
decided, so no slot on time ever covers the newest late one), ticked by the sweeper of two
maintenance workers fed by two beats, so two ticks race for the same slots all through the
run. Once every schedule has enqueued two slots ticked within 1.5 s, both maintenance
workers are SIGKILLed with their pools and, 12 s of slots later, two new ones are started;
the drill waits until every schedule has caught up and enqueued two more slots ticked in
time, then stops the ticking and waits for the tasks to drain.

From the database, for every schedule:

- each slot from its first (the first after the sync) to its last decided has one run, in
  order, no gap; its stored next slot is the one after, its missed count the missed runs;
- nothing ticked while no maintenance worker ran, and each decision came after the one
  before it (two racing ticks never decided a slot twice or out of turn);
- the enqueued slots and the tasks keyed ``schedule:<name>:`` are the same, one task each,
  with the slot in its payload, every one succeeded; no task for a missed slot;
- every decision follows the policy, read from its ``decided_at`` as ``decide`` reads its
  clock: a slot older than the tolerance then is late, the others are on time and
  enqueued; late slots are missed (``skip``), the newest enqueued unless a slot on time
  covers it (``latest``), the newest ``max_missed`` enqueued (``each``);
- the first decision after the restart holds every slot since the last one before the
  kill, every slot from the kill to the restart less the tolerance among its late ones (at
  least 5), and: ``skip`` enqueued none of its late slots, either ``latest`` one slot (its
  newest), ``each`` all, the capped ``each`` its newest 2;
- the checker finds nothing (:func:`assert_nothing_lost_or_done_twice`).

What it measured is recorded (``record_property``) and shown after the run.
"""

from __future__ import annotations

import os
import re
import signal
import time
from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import pytest
from django.conf import settings

from tasks_app.db.clock import db_now
from tasks_app.engine.schedules import Missed, Schedule, ScheduleRegistry, slot_key, slot_text
from tasks_app.models import RunOutcome, ScheduleRun, StoredSchedule, Task, TaskStatus
from tasks_app.operations import schedule_sync
from tests.chaos.harness import (
    Cluster,
    Record,
    Remotes,
    assert_nothing_lost_or_done_twice,
    wait_for_drain,
)
from tests.e2e_support import Worker, beat_process, wait_for

pytestmark = [pytest.mark.chaos, pytest.mark.timeout(240)]

EVERY = timedelta(seconds=2)
# Above the sweep's period (1 s; two beats send one each), below the interval: a slot
# ticked in time is on time, and a decision holds at most one slot on time.
TOLERANCE = timedelta(seconds=1.5)
# While no maintenance worker runs: slots from the kill to the restart less the tolerance,
# 5 at least, are late when the new workers tick, however the 2 s grid falls.
OUTAGE_SECONDS = 12
LATE_AT_LEAST = 5
CAP = 2
# Slots ticked within TOLERANCE and enqueued before the kill, and after the catch-up, by
# every schedule.
IN_TIME = 2
PAYLOAD = {"drill": "schedules"}


def declared(
    name: str, missed: str, *, max_missed: int = 100, tolerance: timedelta = TOLERANCE
) -> Schedule:
    return Schedule(
        name=name,
        workflow="demo.noop",
        every=EVERY,
        payload=PAYLOAD,
        slot_field="slot",
        missed=missed,
        max_missed=max_missed,
        tolerance=tolerance,
    )


SCHEDULES = (
    declared("drill.skip", Missed.SKIP),
    declared("drill.latest", Missed.LATEST),
    declared("drill.each", Missed.EACH),
    declared("drill.each-capped", Missed.EACH, max_missed=CAP),
    declared("drill.latest-strict", Missed.LATEST, tolerance=timedelta(0)),
)


@dataclass(frozen=True)
class Run:
    slot: datetime
    outcome: str
    decided_at: datetime
    task_id: int | None

    def late(self, schedule: Schedule) -> bool:
        """Older than the schedule's tolerance when it was decided: ``decide``'s rule, its
        ``now`` being the ``decided_at`` stored."""
        return self.decided_at - self.slot > schedule.tolerance


def runs_of(name: str) -> list[Run]:
    """The slots ``name`` decided, oldest first (every outcome but "run now")."""
    rows = (
        ScheduleRun.objects.filter(schedule=name)
        .exclude(outcome=RunOutcome.RUN_NOW)
        .order_by("slot", "pk")
        .values_list("slot", "outcome", "decided_at", "task_id")
    )
    return [Run(*row) for row in rows]


def decisions(runs: Sequence[Run]) -> dict[datetime, list[Run]]:
    """The runs by the tick that decided them (its clock), in the order decided."""
    found: dict[datetime, list[Run]] = defaultdict(list)
    for run in runs:
        found[run.decided_at].append(run)
    return dict(sorted(found.items()))


def expected(schedule: Schedule, slots: Sequence[datetime], at: datetime) -> dict[datetime, str]:
    """What a decision at ``at`` makes of ``slots`` (oldest first) by the schedule's policy,
    written out from ``Missed``'s rules, apart from ``decide``."""
    late = [slot for slot in slots if at - slot > schedule.tolerance]
    on_time = [slot for slot in slots if at - slot <= schedule.tolerance]
    caught: list[datetime] = []
    if schedule.missed == Missed.LATEST and not on_time:
        caught = late[-1:]
    elif schedule.missed == Missed.EACH:
        caught = late[-schedule.max_missed :]
    run = set(caught + on_time)
    return {slot: RunOutcome.ENQUEUED if slot in run else RunOutcome.MISSED for slot in slots}


def in_time(runs: Sequence[Run], after: datetime | None = None) -> int:
    """How many slots (decided after ``after``) were enqueued by a tick within
    :data:`TOLERANCE` of their time: the ticking as it goes with nothing down."""
    return sum(
        1
        for run in runs
        if run.outcome == RunOutcome.ENQUEUED
        and run.decided_at - run.slot <= TOLERANCE
        and (after is None or run.decided_at > after)
    )


def tasks_of(name: str) -> dict[str, tuple[int, str, Any]]:
    """The tasks keyed as ``name``'s slots: by key, their id, status and payload; each key
    once."""
    rows = Task.objects.filter(idempotency_key__startswith=f"schedule:{name}:").values_list(
        "idempotency_key", "pk", "status", "payload"
    )
    found = {str(key): (pk, status, payload) for key, pk, status, payload in rows}
    assert len(found) == len(rows), f"{name}: a slot's key on two tasks"
    return found


def caught_up(restart: datetime) -> dict[str, datetime] | None:
    """Each schedule's first decision after ``restart``, once every one has also enqueued
    :data:`IN_TIME` slots in time after it."""
    first: dict[str, datetime] = {}
    for schedule in SCHEDULES:
        runs = [run for run in runs_of(schedule.name) if run.decided_at > restart]
        if not runs:
            return None
        first[schedule.name] = min(run.decided_at for run in runs)
        if in_time(runs, after=first[schedule.name]) < IN_TIME:
            return None
    return first


def maintenance_worker(cluster: Cluster, name: str) -> Worker:
    """A maintenance worker as ``Cluster.start`` runs one (the sweeper's queue, one pool
    process); not waited for."""
    worker = Worker(
        [
            *("--queues", settings.TASKS_MAINTENANCE_QUEUE, "--concurrency", "1"),
            *("--loglevel", "INFO", "-n", f"{name}@%h"),
            *("--without-gossip", "--without-mingle", "--without-heartbeat"),
        ],
        env=cluster.env,
        log_path=cluster.folder / f"{name}.log",
    )
    cluster.processes.append(worker)
    return worker


def beat(cluster: Cluster, name: str) -> Worker:
    """A beat with a schedule file and a log of its own; not waited for."""
    folder = cluster.folder / name
    folder.mkdir()
    process = beat_process(cluster.env, folder)
    cluster.processes.append(process)
    return process


def kill(worker: Worker) -> None:
    """SIGKILL the worker and its pool at once, as a lost machine would."""
    os.killpg(worker.pid, signal.SIGKILL)
    worker.process.wait(timeout=30)


# The tick's log line: what it decided, and for which schedules.
TICKED = re.compile(r"schedules: \d+ enqueued, \d+ missed, \d+ refused \(([^)]*)\)")


def decided_by(process: Worker) -> int:
    """How many schedules' decisions ``process`` logged."""
    return sum(len(names.split(", ")) for names in TICKED.findall(process.output()))


def test_schedules_keep_their_slots_through_the_maintenance_workers_killed_for_12_s(
    cluster: Cluster, counting_remotes: Remotes, record_property: Record
) -> None:
    began = time.monotonic()
    cluster.add_worker(concurrency=2, wait=False)
    ticking = [maintenance_worker(cluster, f"maintenance{n}") for n in (1, 2)]
    beats = [beat(cluster, "beat1"), beat(cluster, "beat2")]
    for process in [*cluster.workers, *ticking, *beats]:
        process.wait_ready(timeout=90)

    registry = ScheduleRegistry()
    for schedule in SCHEDULES:
        registry.register(schedule)
    sync_began = db_now()
    schedule_sync.sync(actor="test:chaos", registry=registry)
    sync_ended = db_now()
    first_slot = {row.name: row.next_slot for row in StoredSchedule.objects.all()}
    assert set(first_slot) == {schedule.name for schedule in SCHEDULES}
    # Each starts at the first slot from the sync: nothing before it runs.
    assert all(sync_began <= slot < sync_ended + EVERY for slot in first_slot.values())

    wait_for(
        lambda: all(in_time(runs_of(s.name)) >= IN_TIME for s in SCHEDULES),
        timeout=40,
        interval=0.2,
        what=lambda: f"{IN_TIME} slots in time from every schedule\n" + cluster.tails(),
    )
    for worker in ticking:
        kill(worker)
    kill_at = db_now()
    # The slots are real time: the outage is time passing with nothing to tick them.
    time.sleep(OUTAGE_SECONDS)
    restart_at = db_now()
    ticking = [maintenance_worker(cluster, f"maintenance{n}") for n in (3, 4)]
    for worker in ticking:
        worker.wait_ready(timeout=90)
    first_after = wait_for(
        lambda: caught_up(restart_at),
        timeout=60,
        interval=0.2,
        what=lambda: f"every schedule to catch up and run {IN_TIME} slots\n" + cluster.tails(),
    )
    # Nothing more is decided from here on: what the database holds is the whole run.
    for process in [*beats, *ticking]:
        process.stop()

    ids = list(
        Task.objects.filter(idempotency_key__startswith="schedule:drill.").values_list(
            "pk", flat=True
        )
    )
    wait_for_drain(ids, cluster, timeout=60)

    late_after_restart: dict[str, int] = {}
    # Whether the slot each ``latest`` caught up with was late, or on time and so covering
    # the late ones.
    newest: dict[str, str] = {}
    for schedule in SCHEDULES:
        name = schedule.name
        runs = runs_of(name)
        slots = [run.slot for run in runs]

        # Every slot once, from the first after the sync to the last decided, no gap.
        assert not [s for s, n in Counter(slots).items() if n > 1], f"{name}: a slot twice"
        assert slots == [first_slot[name] + EVERY * n for n in range(len(slots))], (
            f"{name}: slots missing or out of place: {[slot_text(s) for s in slots]}"
        )
        assert {run.outcome for run in runs} <= {RunOutcome.ENQUEUED, RunOutcome.MISSED}, name
        row = StoredSchedule.objects.get(name=name)
        assert row.next_slot == slots[-1] + EVERY, name
        assert row.missed_total == sum(run.outcome == RunOutcome.MISSED for run in runs), name

        # Decisions follow one another along the slots, none while nothing ran.
        by_tick = decisions(runs)
        order = [run.decided_at for run in runs]
        assert order == sorted(order), f"{name}: a slot decided before an earlier one"
        during = [slot_text(run.slot) for run in runs if kill_at <= run.decided_at <= restart_at]
        assert not during, f"{name}: slots decided while no maintenance worker ran: {during}"

        # One succeeded task per enqueued slot, under its key, and none for a missed one.
        enqueued = {
            slot_key(name, run.slot): run for run in runs if run.outcome == RunOutcome.ENQUEUED
        }
        found = tasks_of(name)
        assert set(found) == set(enqueued), (
            f"{name}: tasks without an enqueued slot {sorted(set(found) - set(enqueued))}, "
            f"enqueued slots without a task {sorted(set(enqueued) - set(found))}"
        )
        for key, run in enqueued.items():
            pk, status, payload = found[key]
            assert run.task_id == pk, (key, run.task_id, pk)
            assert status == TaskStatus.SUCCEEDED, (key, status)
            assert payload == {**PAYLOAD, "slot": slot_text(run.slot)}, (key, payload)

        # Every decision as the policy says, by the clock it was taken at.
        for at, decided in by_tick.items():
            made = {run.slot: run.outcome for run in decided}
            assert made == expected(schedule, [run.slot for run in decided], at), (
                f"{name}: the decision at {at:%H:%M:%S.%f} made "
                f"{ {slot_text(s): o for s, o in made.items()} }"
            )

        # Before the kill and after the catch-up: slots ticked in time, enqueued.
        before = [run for run in runs if run.decided_at < kill_at]
        catch_up_at = first_after[name]
        assert in_time(before) >= IN_TIME, name
        assert in_time(runs, after=catch_up_at) >= IN_TIME, name

        # The catch-up: every slot since the last decided before the kill, in one decision;
        # those from the kill to the restart less the tolerance among its late ones.
        catch_up = by_tick[catch_up_at]
        assert catch_up[0].slot == before[-1].slot + EVERY, name
        late = [run for run in catch_up if run.late(schedule)]
        certainly_late = {
            slot for slot in slots if kill_at < slot and slot <= restart_at - schedule.tolerance
        }
        assert len(certainly_late) >= LATE_AT_LEAST, (name, kill_at, restart_at)
        assert certainly_late <= {run.slot for run in late}, (
            f"{name}: slots of the outage not decided late by the first tick after it"
        )
        ran = [run.slot for run in catch_up if run.outcome == RunOutcome.ENQUEUED]
        ran_late = [run.slot for run in late if run.outcome == RunOutcome.ENQUEUED]
        if schedule.missed == Missed.SKIP:
            assert not ran_late, f"{name}: late slots enqueued {ran_late}"
        elif schedule.missed == Missed.LATEST:
            assert ran == [catch_up[-1].slot], f"{name}: the catch-up enqueued {ran}"
            newest[name] = "late" if catch_up[-1].late(schedule) else "on time"
        elif schedule.max_missed >= len(late):
            assert ran == [run.slot for run in catch_up], f"{name}: the catch-up enqueued {ran}"
        else:
            assert ran_late == [run.slot for run in late[-CAP:]], f"{name}: enqueued {ran_late}"
        late_after_restart[name] = len(late)

    statuses = assert_nothing_lost_or_done_twice(ids, counting_remotes, dead_as=())
    assert statuses == Counter({TaskStatus.SUCCEEDED: len(ids)})

    # The decisions each maintenance worker took: the sweeps of both beats go to either
    # worker, and a schedule the other's tick holds is skipped, so they share the slots.
    decisions_by = {
        process.log_path.stem: decided_by(process)
        for process in cluster.processes
        if process.log_path.name.startswith("maintenance")
    }
    record_property("drill_s", round(time.monotonic() - began, 1))
    record_property("outage_s", round((restart_at - kill_at).total_seconds(), 1))
    # From the restart (the new workers' start included) until the first tick decided.
    record_property("resumed_s", round((min(first_after.values()) - restart_at).total_seconds(), 1))
    record_property("late_slots", late_after_restart)
    record_property("latest_ran", newest)
    record_property("tasks", len(ids))
    record_property("decisions_by_process", decisions_by)
