"""One run of the horizon or faults cell: its phases played one after the other on the
producer's clock, a sample every interval, and what each phase does to the system while it
lasts (``enter``, ``tick`` at each sample, ``leave``), undone in every case.

A phase that injects a fault notes when (``since``) and which jobs were unfinished then
(the backlog, counted again at every sample until the next fault), so its recovery can be
timed from its samples (``bench.horizon_phases.recovery_seconds``).
"""

from __future__ import annotations

import contextlib
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import psycopg

from bench import disturbances
from bench.disturbances import ActiveReaders, IdleConnections, Workers
from bench.horizon_phases import Window
from bench.horizon_systems import Queue
from bench.scale_cells import HeldSnapshot
from bench.systems import System

DEAD_TUPLES = (
    "SELECT coalesce(sum(n_dead_tup), 0) FROM pg_stat_user_tables WHERE relid = ANY(%s::regclass[])"
)


@dataclass
class CellRun:
    """What the phases of one cell share: the system, its queue and workers, the
    harness's observing session, the producer's clock start and the samples so far."""

    dsn: str
    system: System
    queue: Queue
    workers: Workers
    t0: float
    # After a PostgreSQL restart: the harness's maintenance connection made again.
    reconnect_server: Callable[[], None]
    rng: random.Random
    samples: list[dict[str, Any]] = field(default_factory=list)
    backlog: list[int] | None = None
    _observer: psycopg.Connection[Any] | None = None

    def now(self) -> float:
        return time.time() - self.t0

    def observer(self) -> psycopg.Connection[Any]:
        if self._observer is None or self._observer.closed:
            self._observer = psycopg.connect(self.dsn, autocommit=True, connect_timeout=2)
        return self._observer

    def drop_observer(self) -> None:
        if self._observer is not None:
            with contextlib.suppress(Exception):
                self._observer.close()
        self._observer = None

    def sample(self) -> dict[str, Any]:
        """Jobs finished, the depth, the hot tables' dead tuples and the backlog, now; or
        the error when the database cannot be read (the observer reconnects next time)."""
        t = self.now()
        try:
            conn = self.observer()
            progress = self.system.progress(conn, 0)
            row = conn.execute(self.queue.depth()).fetchone()
            dead = conn.execute(DEAD_TUPLES, (list(self.system.tables),)).fetchone()
            out: dict[str, Any] = {
                "t": t,
                "done": progress.done,
                "failed": progress.failed,
                "depth": int(row[0]) if row else 0,
                "dead": int(dead[0]) if dead else 0,
            }
            if self.backlog is not None:
                out["backlog"] = self.queue.still_unfinished(conn, self.backlog)
        except psycopg.Error as exc:
            self.drop_observer()
            out = {"t": t, "error": " ".join(str(exc).split())[:200]}
        self.samples.append(out)
        return out

    def mark_fault(self) -> float:
        """The jobs unfinished now become the backlog a recovery must clear; returns now."""
        self.backlog = self.queue.ids(self.observer())
        return self.now()

    def close(self) -> None:
        self.drop_observer()


class Phase:
    """A phase that only produces at its rate."""

    def __init__(self, name: str, seconds: float, rate: float) -> None:
        self.name = name
        self.seconds = seconds
        self.rate = rate
        self.since: float | None = None  # when its fault happened, on the producer's clock
        self.after: float | None = None  # when a lasting fault ended (the server back up)
        self.notes: dict[str, Any] = {}

    def enter(self, run: CellRun) -> None:
        pass

    def tick(self, run: CellRun) -> None:
        pass

    def leave(self, run: CellRun) -> None:
        pass


class IdleInTransaction(Phase):
    def enter(self, run: CellRun) -> None:
        self.held = HeldSnapshot(run.dsn, run.system.tables[0])

    def leave(self, run: CellRun) -> None:
        self.notes["held_at_end"] = self.held.describe(run.observer())
        self.held.close()


class Readers(Phase):
    def enter(self, run: CellRun) -> None:
        self.readers = ActiveReaders(run.dsn, list(run.system.tables))

    def leave(self, run: CellRun) -> None:
        self.readers.close()
        self.notes.update(rounds=self.readers.rounds, reader_errors=self.readers.errors[:3])


class Connections(Phase):
    def __init__(self, name: str, seconds: float, rate: float, wanted: int, spare: int) -> None:
        super().__init__(name, seconds, rate)
        self.wanted, self.spare = wanted, spare

    def enter(self, run: CellRun) -> None:
        self.idle = IdleConnections(run.dsn, self.wanted, self.spare)
        self.notes.update(wanted=self.wanted, held=len(self.idle.conns))

    def leave(self, run: CellRun) -> None:
        self.idle.close()


class Recovery(Phase):
    """Back to the steady rate after a burst: timed from its start."""

    def enter(self, run: CellRun) -> None:
        self.since = run.mark_fault()


class Kill(Phase):
    """Every worker process SIGKILLed, then started again."""

    def enter(self, run: CellRun) -> None:
        self.since = run.mark_fault()
        run.workers.kill()


class PostgresRestart(Phase):
    """The server restarted in a thread of its own, so the samples go on through it (they
    fail while it is down); an error of the restart (the run's lock lost among them) is
    raised at the next sample, and at the latest when the phase ends."""

    def enter(self, run: CellRun) -> None:
        self.thread: threading.Thread | None = None
        self.failure: BaseException | None = None
        command, why_not = disturbances.restart_command(run.dsn)
        if command is None:
            self.notes["skipped"] = why_not
            return
        self.since = run.mark_fault()
        run.drop_observer()

        def restart() -> None:
            try:
                self.notes["restart_s"] = disturbances.restart_postgresql(
                    run.dsn, command, run.reconnect_server
                )
                self.after = run.now()
            except BaseException as exc:
                self.failure = exc

        self.thread = threading.Thread(target=restart, daemon=True)
        self.thread.start()

    def tick(self, run: CellRun) -> None:
        if self.failure is not None:
            raise self.failure

    def leave(self, run: CellRun) -> None:
        if self.thread is not None:
            # restart_postgresql bounds each of its waits.
            self.thread.join(timeout=400)
        if self.failure is not None:
            raise self.failure


class Terminations(Phase):
    """A backend of the workers terminated every ``every`` seconds for ``active`` seconds;
    the recovery is timed from the end of that."""

    def __init__(self, name: str, seconds: float, rate: float, active: float, every: float) -> None:
        super().__init__(name, seconds, rate)
        self.active, self.every = active, every
        self.terminated = 0
        self.start = 0.0
        self.next_at = 0.0

    def enter(self, run: CellRun) -> None:
        self.start = self.next_at = run.now()

    def tick(self, run: CellRun) -> None:
        now = run.now()
        if now - self.start >= self.active:
            if self.since is None:
                self.since = run.mark_fault()
            return
        if now < self.next_at:
            return
        self.next_at += self.every
        with contextlib.suppress(psycopg.Error):  # the sample says what went wrong
            conn = run.observer()
            backends = disturbances.worker_backends(conn, run.workers.pids())
            if backends:
                victim = run.rng.choice(backends)
                conn.execute("SELECT pg_terminate_backend(%s)", (victim,))
                self.terminated += 1

    def leave(self, run: CellRun) -> None:
        self.notes.update(terminated=self.terminated, every_s=self.every, active_s=self.active)


def play(run: CellRun, phases: list[Phase], interval: float) -> list[Window]:
    """Each phase in turn on the producer's clock (the first starts at its start), a sample
    every ``interval`` seconds; the workers are checked at each sample and started again
    when they exited. Returns where each phase lay."""
    windows = []
    next_sample = 0.0
    start = 0.0
    for phase in phases:
        end = start + phase.seconds
        _sleep_until(run, start)
        phase.enter(run)  # cleans up after itself when it fails
        try:
            while run.now() < end:
                if run.now() >= next_sample:
                    run.workers.check()
                    phase.tick(run)
                    run.sample()
                    while next_sample <= run.now():
                        next_sample += interval
                _sleep_until(run, min(next_sample, end))
        finally:
            phase.leave(run)
        windows.append(Window(phase.name, start, end, phase.rate))
        start = end
    return windows


def settle(run: CellRun, seconds: float, interval: float) -> float:
    """After the producer stopped: sample until nothing is unfinished or ``seconds`` have
    passed; returns how long it took."""
    began = run.now()
    while True:
        run.workers.check()
        sample = run.sample()
        if sample.get("depth") == 0 and not sample.get("backlog"):
            return run.now() - began
        if run.now() - began >= seconds:
            return run.now() - began
        time.sleep(interval)


def _sleep_until(run: CellRun, at: float) -> None:
    left = at - run.now()
    if left > 0:
        time.sleep(left)
