"""A deployment under fault, and the checker run after every drill.

:class:`Cluster` runs the processes the Procfile runs (step workers, the maintenance worker
that runs the sweeper, beat) on the drill's own PostgreSQL and Redis, with short leases.
A drill enqueues a bounded workload, injects its fault, waits for the drain with a deadline
and calls :func:`assert_nothing_lost_or_done_twice`.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import re
import signal
import subprocess
import time
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from django.conf import settings
from django.db import connection

from tasks_app import services
from tasks_app.models import Effect, Lease, Step, StepStatus, Task, TaskStatus
from tasks_app.observability import invariants
from tests.e2e_support import PYTHON, ROOT, Worker, beat_process, database_url, wait_for
from tests.remotes import LoopbackRemote

LEASE_SECONDS = 3
# The publishing remote (honours idempotency keys) and the mail remote (does not).
Remotes = tuple[LoopbackRemote, LoopbackRemote]
# pytest's ``record_property``: what a drill measured, shown after the run.
Record = Callable[[str, object], None]
SETTLED = frozenset({TaskStatus.SUCCEEDED, TaskStatus.DEAD, TaskStatus.CANCELLED})
# A write cut between reaching a remote without idempotency keys and being recorded waits
# for a person as this (DESIGN rule 6); any other dead letter in a drill is a failure.
OUTCOME_UNKNOWN = "tasks_app.exceptions.OutcomeUnknown"


class Cluster:
    """Step workers, a maintenance worker and beat, as ``Procfile`` runs them."""

    def __init__(self, folder: Path, remotes: Remotes) -> None:
        self.folder = folder
        self.env: dict[str, str] = {
            **os.environ,
            "DATABASE_URL": database_url(connection.settings_dict),
            "REDIS_URL": settings.REDIS_URL or "",
            "TASKS_LEASE_SECONDS": str(LEASE_SECONDS),
            "TASKS_SWEEP_SECONDS": "1",
            "TASKS_REDISPATCH_SECONDS": "2",
            "TASKS_VAR_DIR": str(folder / "var"),
            "PUBLISH_URL": remotes[0].url,
            "MAIL_URL": remotes[1].url,
            "REMOTE_TIMEOUT_SECONDS": "2",
        }
        self.workers: list[Worker] = []
        self.processes: list[Worker] = []
        self.beat: Worker | None = None
        self._names = itertools.count(1)

    def start(self, *, workers: int = 1, concurrency: int = 2) -> Cluster:
        maintenance = self._spawn("maintenance", ["--queues", "maintenance", "--concurrency", "1"])
        beat = beat_process(self.env, self.folder)
        self.processes.append(beat)
        self.beat = beat
        started = [self.add_worker(concurrency, wait=False) for _ in range(workers)]
        for process in (maintenance, beat, *started):
            process.wait_ready(timeout=90)
        return self

    def add_worker(
        self, concurrency: int = 2, *, wait: bool = True, env: dict[str, str] | None = None
    ) -> Worker:
        """Another step worker; ``env`` adds to the cluster's environment."""
        worker = self._spawn(
            f"worker{next(self._names)}",
            ["--queues", "default", "--concurrency", str(concurrency)],
            env,
        )
        self.workers.append(worker)
        if wait:
            worker.wait_ready(timeout=90)
        return worker

    def _spawn(self, name: str, args: list[str], env: dict[str, str] | None = None) -> Worker:
        process = Worker(
            [
                *args,
                *("--loglevel", "INFO", "-n", f"{name}@%h"),
                *("--without-gossip", "--without-mingle", "--without-heartbeat"),
            ],
            env={**self.env, **(env or {})},
            log_path=self.folder / f"{name}.log",
        )
        self.processes.append(process)
        return process

    def signal(self, worker: Worker, signum: int, *, whole_group: bool = False) -> None:
        """Send ``signum`` to the worker's main process, or to it and its children."""
        if whole_group:
            os.killpg(worker.pid, signum)
        else:
            os.kill(worker.pid, signum)

    def kill(self, worker: Worker) -> None:
        """SIGKILL the worker and its children at once, as a lost machine would."""
        self.signal(worker, signal.SIGKILL, whole_group=True)
        worker.process.wait(timeout=30)
        self.workers.remove(worker)

    def held(self, by: Worker | None = None) -> dict[int, dict[int, int]]:
        """What each live pool process (of ``by``, if given) holds now: by its pid, the
        token of each step it holds a lease on."""
        held: dict[int, dict[int, int]] = {}
        workers = self.workers if by is None else [by]
        # A running step holds its live lease, which names the pool process.
        for step_id, token, worker_id in Step.objects.filter(status=StepStatus.RUNNING).values_list(
            "pk", "fencing_token", "lease_worker"
        ):
            pid = int(worker_id.rsplit(":", 1)[1])
            if any(worker.is_pool_child(pid) for worker in workers):
                held.setdefault(pid, {})[step_id] = token
        return held

    def wait_until_held(
        self, *, by: Worker | None = None, besides: Iterable[int] = ()
    ) -> tuple[int, dict[int, int]]:
        """Wait until a pool process (of ``by``, if given; not one in ``besides``) holds a
        step; returns its pid and the tokens it holds."""
        skip = set(besides)

        def holder() -> tuple[int, dict[int, int]] | None:
            return next(((pid, t) for pid, t in self.held(by).items() if pid not in skip), None)

        return wait_for(holder, timeout=60, what=lambda: "a worker to hold a step\n" + self.tails())

    def held_by(self, worker: Worker) -> dict[int, int]:
        """The token of each step ``worker``'s pool processes hold a lease on now."""
        return {step: token for held in self.held(worker).values() for step, token in held.items()}

    def tails(self, lines: int = 25) -> str:
        return "\n".join(
            f"--- {process.log_path.name}\n" + "\n".join(process.output().splitlines()[-lines:])
            for process in self.processes
        )

    def stop(self) -> None:
        for process in self.processes:
            if process.process.returncode is None:
                # A paused process takes no SIGTERM until it runs again.
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(process.pid, signal.SIGCONT)
            process.stop(timeout=10)


# --- the workload ----------------------------------------------------------------------------


def enqueue_workload(count: int, *, label: str, sleep: float = 0.2) -> list[int]:
    """``count`` tasks, a third of each kind: ``demo.flaky`` sleeping ``sleep`` seconds,
    and ``demo.deliver`` to the publishing remote (idempotency keys) and to the mail remote
    (none), each sleeping half of ``sleep`` before its write and half after it, so a fault
    lands on either side of a write. Returns the task ids."""
    half = sleep / 2
    shapes: list[tuple[str, dict[str, Any]]] = [
        ("demo.flaky", {"sleep": sleep}),
        ("demo.deliver", {"remote": "publish", "sleep": half, "linger": half}),
        ("demo.deliver", {"remote": "mail", "sleep": half, "linger": half}),
    ]
    ids: list[int] = []
    for start in range(0, count, 500):
        items = [
            {
                "workflow": shapes[n % 3][0],
                "payload": shapes[n % 3][1],
                "idempotency_key": f"{label}-{n}",
            }
            for n in range(start, min(start + 500, count))
        ]
        ids.extend(result.task.pk for result in services.enqueue_many(items, actor="test:chaos"))
    return ids


def unsettled(ids: Sequence[int]) -> Counter[str]:
    return Counter(
        Task.objects.filter(pk__in=ids).exclude(status__in=SETTLED).values_list("status", flat=True)
    )


def wait_for_drain(ids: Sequence[int], cluster: Cluster, *, timeout: float = 120) -> float:
    """Wait until every task in ``ids`` has settled; returns when (``time.monotonic``)."""
    wait_for(
        lambda: not unsettled(ids),
        timeout=timeout,
        interval=0.2,
        what=lambda: (
            f"{len(ids)} tasks to settle, still {dict(unsettled(ids))}\n" + cluster.tails()
        ),
    )
    return time.monotonic()


# --- the checker -----------------------------------------------------------------------------


def assert_nothing_lost_or_done_twice(
    ids: Sequence[int], remotes: Remotes, *, dead_as: Iterable[str] = (OUTCOME_UNKNOWN,)
) -> Counter[str]:
    """The drill's verdict; returns the tasks' statuses.

    - no accepted task lost: each exists and ended succeeded, dead or cancelled (the
      workloads have no approval step, so none waits for a person on purpose);
    - the only dead letters are writes whose outcome is unknown (or what ``dead_as``
      names);
    - the checker (``tasks_app.observability.invariants``, ``manage.py check_invariants``) finds
      nothing over every task: each folds to its stored state, histories start with
      ``enqueued``, tokens rise, every claim is answered, a run ends once, no step runs
      past its lease;
    - no effect applied twice: no remote applied a key twice, every write a remote
      applied has its ledger row, every recorded effect reached its remote, and every
      succeeded write's effect is recorded.
    """
    tasks = Task.objects.filter(pk__in=ids)
    assert tasks.count() == len(ids), "accepted tasks are missing"
    statuses = Counter(tasks.values_list("status", flat=True))
    assert set(statuses) <= SETTLED, f"tasks left unsettled: {dict(statuses)}"
    dead = Counter(
        Step.objects.filter(task__in=ids, status=StepStatus.DEAD).values_list(
            "error_class", flat=True
        )
    )
    assert set(dead) <= set(dead_as), f"unexpected dead letters: {dict(dead)}"

    report = invariants.check(since=None)
    assert report.ok, "the checker found:\n" + "\n".join(map(str, report.findings))
    assert not Step.objects.filter(status=StepStatus.RUNNING).exists()

    applied: Counter[str] = Counter()
    for remote in remotes:
        applied.update(write["key"] for write in remote.applied)
    twice = {key: count for key, count in applied.items() if count > 1}
    assert not twice, f"writes applied more than once: {twice}"
    ledger = dict(Effect.objects.values_list("key", "status"))
    assert set(applied) <= set(ledger), "a remote applied a write the ledger never started"
    done = {key for key, status in ledger.items() if status == Effect.Status.DONE}
    assert done <= set(applied), "the ledger records writes no remote applied"
    delivered = Step.objects.filter(task__in=ids, kind="deliver", status=StepStatus.SUCCEEDED)
    recorded = Effect.objects.filter(step__in=delivered, status=Effect.Status.DONE)
    assert recorded.count() == delivered.count(), "a succeeded write has no recorded effect"
    return statuses


# How a lease ends when its worker goes before the step's outcome is recorded: it runs out
# (or is ended at once, for the step that was running), or it is handed back uncharged.
CUT_SHORT = frozenset({Lease.Outcome.EXPIRED, Lease.Outcome.RELEASED})


@dataclass(frozen=True)
class Cut:
    steps: int
    # From the fault until the last step it cut short had finished, in seconds.
    recovery: float


def assert_cut_steps_ran_again(tokens: dict[int, int], fault_at: datetime) -> Cut:
    """Of the steps a fault (at ``fault_at``, the database's clock) hit while they held
    ``tokens`` (step -> token), those whose lease then expired or was released (the rest
    finished just before it) ran again under a higher token, or are writes whose outcome
    is unknown. At least one must have been cut."""
    cut: list[Step] = []
    for step in Step.objects.filter(pk__in=list(tokens)):
        token = tokens[step.pk]
        if step.leases.get(token=token).outcome not in CUT_SHORT:
            continue
        cut.append(step)
        if step.status == StepStatus.DEAD:
            assert step.error_class == OUTCOME_UNKNOWN, (step.pk, step.error_class)
        else:
            assert step.status == StepStatus.SUCCEEDED, (step.pk, step.status)
            assert step.fencing_token > token
    assert cut, f"the fault cut no step short (held: {tokens})"
    last = max(step.finished_at for step in cut if step.finished_at is not None)
    return Cut(len(cut), round((last - fault_at).total_seconds(), 1))


def record_cut(record_property: Record, cut: Cut) -> None:
    record_property("steps_cut", cut.steps)
    record_property("recovery_s", cut.recovery)


def resumed_after(moment: datetime) -> float:
    """Seconds from ``moment`` (the database's clock) until a worker next claimed a step:
    how soon work flowed again once a fault ended (steps already running may finish
    without the broker)."""
    # A claim's start is its step's (an attempt still running has no Lease row yet).
    ended = Lease.objects.filter(acquired_at__gt=moment).values_list("acquired_at", flat=True)
    running = Step.objects.filter(started_at__gt=moment).values_list("started_at", flat=True)
    starts = [start for start in (*ended, *running) if start is not None]
    assert starts, "no step was claimed afterwards"
    return round((min(starts) - moment).total_seconds(), 1)


# Holds back the processes of :func:`at_once` until all of them are waiting.
BARRIER_KEY = 811_011
BARRIER = f"""
from django.db import connection
with connection.cursor() as cursor:
    cursor.execute("SELECT pg_advisory_lock_shared({BARRIER_KEY})")
    cursor.execute("SELECT pg_advisory_unlock_shared({BARRIER_KEY})")
"""


def at_once(cluster: Cluster, scripts: Sequence[str]) -> list[str]:
    """Run each script in a ``manage.py shell`` process of its own, all released together
    once every one is waiting at a barrier (a PostgreSQL advisory lock this process
    holds); returns what each printed. Each must exit with status 0."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_advisory_lock(%s)", [BARRIER_KEY])
    processes = [
        subprocess.Popen(
            [PYTHON, "manage.py", "shell", "-v", "0", "-c", BARRIER + script],
            cwd=ROOT,
            env=cluster.env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for script in scripts
    ]
    try:
        wait_for(lambda: _waiting_at_barrier() == len(scripts), timeout=60, what="the processes")
    finally:
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_advisory_unlock(%s)", [BARRIER_KEY])
    outputs = []
    for process in processes:
        out, err = process.communicate(timeout=60)
        assert process.returncode == 0, err
        outputs.append(out.strip())
    return outputs


def _waiting_at_barrier() -> int:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND objid = %s "
            "AND NOT granted",
            [BARRIER_KEY],
        )
        row = cursor.fetchone()
    return int(row[0]) if row else 0


RECEIVED = re.compile(r"Task tasks_app\.tasks\.run_step\[([0-9a-f-]+)\] received")
