"""The horizon and faults cells (10. and 11. in docs/performance.md, "How it is
measured"), once per harness run after the scale cells, for US, PROC c10 and PGQ b10 in a
shuffled order, each with 2 worker processes and a producer at a fixed rate:

- ``horizon``: steady load, then the same load with a transaction idle on its snapshot,
  with REPEATABLE READ scans of the hot tables in a loop, with (up to) 300 idle
  connections held, then high load and the recovery from it;
- ``faults``: steady load with an external effect per job, through every worker SIGKILLed
  and restarted (repeatedly), PostgreSQL restarted and the workers' backends terminated at
  a steady rate; then the producer stops and, after a bounded settle time, the jobs lost,
  run more than once, and effects applied more than once are counted.

Every phase samples once a second (quick: every 0.5 s) what finished, the queue's depth and
the hot tables' dead tuples (``bench/horizon_run.py``); the figures are worked out by
``bench/horizon_phases.py``.
"""

from __future__ import annotations

import functools
import json
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench import fake_remote, horizon_phases
from bench.cells import Bench, measure_once
from bench.disturbances import Workers
from bench.horizon_report import FAULTS, HORIZON, WARMUP, brief
from bench.horizon_run import (
    CellRun,
    Connections,
    IdleInTransaction,
    Kill,
    Phase,
    PostgresRestart,
    Readers,
    Recovery,
    Terminations,
    play,
    settle,
)
from bench.horizon_systems import FAULT_SYSTEMS, QUEUES, SYSTEMS, Lease, horizon_system
from bench.procs import ProcessGroup
from bench.scale_cells import SCALE_MODES
from bench.systems import System

WORKERS = 2


@dataclass(frozen=True)
class HorizonMode:
    """How long each phase lasts in a mode, and the rates."""

    rate: float  # the horizon cell's steady rate, jobs a second
    high_rate: float  # during the high load
    faults_rate: float  # the faults cell's (its job costs more: an effect, then 5 ms of work)
    warmup_s: float  # each cell's first seconds, at its steady rate, in no phase's figures
    steady_s: float
    phase_s: float  # each of idle-in-transaction, active readers, idle connections
    burst_s: float
    recovery_s: float
    idle_connections: int  # asked for; the server's free slots less ``spare`` bound it
    spare_connections: int
    interval: float  # seconds between samples
    window: float  # the trailing window of a recovered completion rate
    lease: float  # every system's time before a dead worker's jobs run again
    every: float  # how often that is looked at
    baseline_s: float
    kills: int
    kill_s: float  # each kill's phase: the kill, then its recovery
    restart_s: float
    terminate_s: float
    terminate_active_s: float  # of which backends are terminated
    terminate_every: float
    settle_s: float
    budget: float  # seconds past the scale cells' budget after which these are skipped


HORIZON_MODES = {
    "quick": HorizonMode(
        rate=100, high_rate=500, faults_rate=50, warmup_s=1.5,
        steady_s=1.5, phase_s=1.5, burst_s=1.5, recovery_s=3,
        idle_connections=300, spare_connections=30, interval=0.5, window=1.0,
        lease=3, every=1, baseline_s=1.5, kills=1, kill_s=7, restart_s=6,
        terminate_s=5, terminate_active_s=1.5, terminate_every=0.5, settle_s=10, budget=300,
    ),
    "full": HorizonMode(
        rate=100, high_rate=500, faults_rate=50, warmup_s=5,
        steady_s=15, phase_s=12, burst_s=10, recovery_s=15,
        idle_connections=300, spare_connections=30, interval=1.0, window=2.0,
        lease=10, every=2, baseline_s=10, kills=3, kill_s=20, restart_s=20,
        terminate_s=20, terminate_active_s=10, terminate_every=1.0, settle_s=20, budget=1_200,
    ),
}  # fmt: skip


def select(systems: list[str]) -> list[str]:
    """The systems these cells run for: US, PROC c10 and PGQ b10, of those the run has."""
    return [key for key in systems if key in SYSTEMS]


def seconds_per_system(hmode: HorizonMode) -> float:
    horizon = hmode.steady_s + 3 * hmode.phase_s + hmode.burst_s + hmode.recovery_s
    faults = hmode.baseline_s + hmode.kills * hmode.kill_s + hmode.restart_s + hmode.terminate_s
    return 2 * hmode.warmup_s + horizon + faults + 2 * hmode.settle_s


def alarm_allowance(mode_name: str, systems: int) -> int:
    """Seconds the harness's last-resort alarm allows for these cells (each cell's phases,
    its settle time, and a generous margin for boots, producers and checks)."""
    return int(systems * (seconds_per_system(HORIZON_MODES[mode_name]) + 300))


def run(
    bench: Bench,
    keys: list[str],
    wanted: set[str],
    seed: int,
    reconnect_server: Callable[[], None],
    unavailable: dict[str, str] | None = None,
) -> tuple[list[dict[str, Any]], list[str]]:
    """Both cells for each of ``keys`` in an order shuffled with ``seed``: the horizon cells
    first, then the faults cells. A failure is kept in its cell (what it left running is
    stopped, what it left queued emptied); returns the cells and the order."""
    unavailable = unavailable or {}
    hmode = HORIZON_MODES[bench.mode.name]
    order = list(keys)
    rng = random.Random(seed)
    rng.shuffle(order)
    budget = bench.mode.budget + SCALE_MODES[bench.mode.name].budget + hmode.budget
    measures = {HORIZON: horizon, FAULTS: faults}
    cells: list[dict[str, Any]] = []
    for name in (HORIZON, FAULTS):
        if name not in wanted:
            continue
        for key in order:
            cell: dict[str, Any] = {
                "run": bench.mode.runs,
                "system": key,
                "cell": name,
                "workers": WORKERS,
            }
            label = f"{name:<11} {key:<8}"
            skipped = unavailable.get(key)
            if time.monotonic() - bench.started > budget:
                skipped = "time budget"
            cells.append(
                measure_once(
                    cell,
                    label,
                    skipped=skipped,
                    measure=functools.partial(
                        measures[name], bench, key, hmode, reconnect_server, rng
                    ),
                    reset=horizon_system(bench.ctx, key).reset,
                    brief=brief,
                )
            )
    return cells, order


def horizon(
    bench: Bench,
    key: str,
    hmode: HorizonMode,
    reconnect_server: Callable[[], None],
    rng: random.Random,
) -> dict[str, Any]:
    rate = hmode.rate
    phases = [
        Phase(WARMUP, hmode.warmup_s, rate),
        Phase("steady", hmode.steady_s, rate),
        IdleInTransaction("idle_in_tx", hmode.phase_s, rate),
        Readers("active_readers", hmode.phase_s, rate),
        Connections(
            "idle_connections", hmode.phase_s, rate, hmode.idle_connections, hmode.spare_connections
        ),
        Phase("high_load", hmode.burst_s, hmode.high_rate),
        Recovery("recovery", hmode.recovery_s, rate),
    ]
    system = horizon_system(bench.ctx, key)
    out = observe(
        bench, system, phases, hmode, reconnect_server, rng, rate=rate, effect=False, level="steady"
    )
    out["high_rate"] = hmode.high_rate
    return out


def faults(
    bench: Bench,
    key: str,
    hmode: HorizonMode,
    reconnect_server: Callable[[], None],
    rng: random.Random,
) -> dict[str, Any]:
    rate = hmode.faults_rate
    phases = [
        Phase(WARMUP, hmode.warmup_s, rate),
        Phase("baseline", hmode.baseline_s, rate),
        *(Kill(f"kill_{n}", hmode.kill_s, rate) for n in range(1, hmode.kills + 1)),
        PostgresRestart("pg_restart", hmode.restart_s, rate),
        Terminations(
            "terminations",
            hmode.terminate_s,
            rate,
            hmode.terminate_active_s,
            hmode.terminate_every,
        ),
    ]
    system = FAULT_SYSTEMS[key](bench.ctx, Lease(hmode.lease, hmode.every))
    out = observe(
        bench,
        system,
        phases,
        hmode,
        reconnect_server,
        rng,
        rate=rate,
        effect=True,
        level="baseline",
    )
    out.update(lease_s=hmode.lease, every_s=hmode.every, kills=hmode.kills)
    return out


def observe(
    bench: Bench,
    system: System,
    phases: list[Phase],
    hmode: HorizonMode,
    reconnect_server: Callable[[], None],
    rng: random.Random,
    *,
    rate: float,
    effect: bool,
    level: str,
) -> dict[str, Any]:
    """From empty tables: the workers started (and, for the faults cell, US's sweeper),
    then the producer, the phases played, the producer's end awaited, the settle time;
    then every job's start read and each phase worked out, a recovery measured against
    the depth the phase named ``level`` saw."""
    ctx = bench.ctx
    system.reset()
    workers = Workers(system, WORKERS)
    helpers: list[ProcessGroup] = []
    producer: ProcessGroup | None = None
    cell_run: CellRun | None = None
    windows = [
        horizon_phases.Window(p.name, 0.0, p.seconds, p.rate) for p in phases
    ]  # durations only: the schedule
    schedule = horizon_phases.segments(_laid_out(windows))
    try:
        start_helpers = getattr(system, "start_helpers", None)
        if effect and start_helpers is not None:
            helpers = start_helpers()
        workers.start(wait=True)
        producer, started, out_file = _start_producer(bench, system.key, schedule, effect=effect)
        t0 = _clock_start(producer, started)
        cell_run = CellRun(ctx.dsn, system, QUEUES[system.key], workers, t0, reconnect_server, rng)
        windows = play(cell_run, phases, hmode.interval)
        produced = _finished(producer, out_file, timeout=sum(s for _, s in schedule) + 120)
        cell_run.backlog = None
        settled = settle(cell_run, hmode.settle_s, hmode.interval)
        end = cell_run.samples[-1]
        with ctx.connect() as conn:
            failures = QUEUES[system.key].failed_by_kind(conn)
            ids = [int(r[0]) for r in produced["records"]]
            starts = {
                ident: began - t0
                for chunk in range(0, len(ids), 5_000)
                for ident, began in system.start_times(conn, ids[chunk : chunk + 5_000]).items()
            }
        samples = cell_run.samples
    finally:
        workers.stop()
        for group in helpers:
            group.stop()
        if producer is not None:
            producer.stop(timeout=5)
        if cell_run is not None:
            cell_run.close()

    records = [(int(r[0]), float(r[1]) - t0, float(r[2]) - t0) for r in produced["records"]]
    send_errors = [float(e[0]) for e in produced["errors"]]
    out: dict[str, Any] = {
        "rate": rate,
        "interval_s": hmode.interval,
        "producer": {
            "count": produced["count"],
            "sent": produced["sent"],
            "error_count": produced["error_count"],
            "error_sample": [e[1] for e in produced["errors"][:3]],
        },
        "settle_s": settled,
        "settle_limit_s": hmode.settle_s,
        "lost": end.get("depth"),
        "failed": end.get("failed"),
        "failed_by_kind": failures,
        "finished": end.get("done"),
        "worker_kills": workers.kills,
        "worker_restarts": workers.restarts,
        "samples": samples,
    }
    steady = next(w for w in windows if w.name == level)
    steady_samples = horizon_phases.within(samples, steady.start, steady.end)
    depth = horizon_phases.depth_level(horizon_phases.highest(steady_samples, "depth") or 0, rate)
    out["depth_level"] = depth
    out["phases"] = []
    for phase, window in zip(phases, windows, strict=True):
        figures = horizon_phases.summarize(window, samples, records, starts, send_errors)
        figures.update(phase.notes)
        if phase.since is not None:
            figures["since"] = phase.since
            figures["recovered_s"] = horizon_phases.recovery_seconds(
                samples,
                phase.since,
                window.end,
                rate=rate,
                level=depth,
                window=hmode.window,
                after=phase.after,
            )
        out["phases"].append(figures)
    if effect:
        applied = fake_remote.read(ctx.rds, ctx.live_prefix, fake_remote.REMOTE_LIST)
        ran = fake_remote.read(ctx.rds, ctx.live_prefix, fake_remote.RUNS_LIST)
        out.update(
            effects_applied=len(applied),
            effects_twice=fake_remote.more_than_once(applied),
            runs=len(ran),
            ran_more_than_once=fake_remote.more_than_once(ran),
        )
    if out["lost"] or out["worker_restarts"]:
        out["worker_log_tail"] = "\n".join(workers.logs)[-3000:]
    system.reset()
    return out


def _laid_out(windows: list[horizon_phases.Window]) -> list[horizon_phases.Window]:
    """The phases one after the other from 0."""
    out, start = [], 0.0
    for window in windows:
        seconds = window.end - window.start
        out.append(horizon_phases.Window(window.name, start, start + seconds, window.rate))
        start += seconds
    return out


def _start_producer(
    bench: Bench, key: str, schedule: list[tuple[float, float]], *, effect: bool
) -> tuple[ProcessGroup, Path, Path]:
    ctx = bench.ctx
    group = ctx.new_group(f"{key}-phase-producer")
    started, out = group.folder / "started", group.folder / "result.json"
    argv = [ctx.python, "-m", "bench.phase_producer", key]
    argv += ["--segments", ",".join(f"{rate:g}:{seconds:g}" for rate, seconds in schedule)]
    argv += ["--senders", str(bench.mode.senders), "--started", str(started), "--out", str(out)]
    group.spawn([*argv, *(["--effect"] if effect else [])], ctx.producer_env(staged=False))
    return group, started, out


def _clock_start(producer: ProcessGroup, started: Path, timeout: float = 90) -> float:
    """When the producer's clock started (it writes it once its senders are connected)."""
    deadline = time.monotonic() + timeout
    while not started.exists() or not started.read_text().strip():
        if producer.exited():
            raise RuntimeError(f"the producer exited before its clock started\n{producer.tail()}")
        if time.monotonic() > deadline:
            raise TimeoutError(f"the producer's clock did not start in {timeout:g} s")
        time.sleep(0.02)
    return float(started.read_text())


def _finished(producer: ProcessGroup, out: Path, timeout: float) -> dict[str, Any]:
    process = producer.processes[0]
    process.wait(timeout=timeout)
    if process.returncode != 0 or not out.exists():
        raise RuntimeError(f"the producer exited {process.returncode}\n{producer.tail()}")
    result: dict[str, Any] = json.loads(out.read_text())
    return result
