"""The system cells: enqueue, drain and latency, one system at a time, each from empty
tables and queues (the numbers refer to docs/performance.md, "How it is measured"); and the
modes, which set how big every cell is.

Every cell runs its producer as a subprocess (``bench/producer.py``) and its workers as a
process group (``bench/procs.py``); a cell stops what it started, also when it fails.
"""

from __future__ import annotations

import contextlib
import json
import statistics
import subprocess
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from bench import report
from bench.common import ROOT, wait_for
from bench.procs import ProcessGroup, cpu_seconds, cpu_used, named, stop_all
from bench.server_stats import CountingConnection, ServerStats
from bench.systems import Ctx, Progress, System


@dataclass(frozen=True)
class Mode:
    """How big every cell is, how many runs, and the time they all get."""

    name: str
    runs: int
    single_n: int
    bulk_n: int
    batch: int
    drain_n: int
    workers: tuple[int, ...]
    rates: tuple[int, ...]
    latency_seconds: float
    senders: int
    drain_timeout: float  # a drain cell stops here and reports what finished
    budget: float  # seconds for all cells; later cells are skipped past it
    console_sizes: tuple[int, int]  # tasks in the console cells' small and large data sets
    console_gets: int  # timed GETs per page and size (after console_warmup untimed ones)
    console_warmup: int


MODES = {
    "quick": Mode(
        "quick", 1, 500, 5_000, 1_000, 1_000, (1, 2, 4), (50, 200, 500), 3.0, 4, 45, 420,
        console_sizes=(2_000, 20_000), console_gets=20, console_warmup=5,
    ),
    "full": Mode(
        "full", 3, 5_000, 50_000, 1_000, 10_000, (1, 2, 4), (50, 200, 500), 6.0, 4, 100, 60 * 60,
        console_sizes=(10_000, 1_000_000), console_gets=20, console_warmup=5,
    ),
}  # fmt: skip


class Bench:
    """The system cells of a harness run, and the run's time budget, counted from the
    moment the harness is set up."""

    def __init__(self, ctx: Ctx, stats: ServerStats, mode: Mode) -> None:
        self.ctx = ctx
        self.stats = stats
        self.mode = mode
        self.started = time.monotonic()

    def over_budget(self) -> bool:
        return time.monotonic() - self.started > self.mode.budget

    def producer(
        self, system: System, mode: str, *, staged: bool, timeout: float, **options: Any
    ) -> dict[str, Any]:
        out = self.ctx.work_dir / f"producer-{time.monotonic_ns()}.json"
        argv = [self.ctx.python, "-m", "bench.producer", system.key, mode, "--out", str(out)]
        for name, value in options.items():
            flag = "--" + name.replace("_", "-")
            if value is True:
                argv.append(flag)
            elif value is not False:
                argv += [flag, str(value)]
        done = subprocess.run(  # noqa: S603
            argv,
            cwd=ROOT,
            env=self.ctx.producer_env(staged=staged),
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
        if done.returncode != 0 or not out.exists():
            raise RuntimeError(
                f"producer {system.key} {mode} exited {done.returncode}\n"
                f"{done.stdout[-2000:]}\n{done.stderr[-4000:]}"
            )
        result: dict[str, Any] = json.loads(out.read_text())
        out.unlink()
        return result

    # 1. enqueue/s from one producer

    def enqueue(self, system: System) -> dict[str, Any]:
        mode = self.mode
        system.reset()
        single = self.producer(
            system, "single", staged=True, timeout=max(60, mode.single_n / 40), n=mode.single_n
        )
        system.reset()
        if system.no_bulk:
            return {"single": single, "bulk": {"none": system.no_bulk}}
        bulk = self.producer(
            system,
            "bulk",
            staged=True,
            timeout=max(60, mode.bulk_n / 150),
            n=mode.bulk_n,
            batch=mode.batch,
        )
        system.reset()
        return {"single": single, "bulk": bulk}

    # 2, 4, 5. drain a pre-filled queue; commits, WAL and memory around it

    def prefill(self, system: System, total: int) -> dict[str, Any]:
        """Empty the system's tables and queues, then enqueue ``total`` tasks with no worker
        running (its bulk call; staged where its messages would reach a worker); checks
        they are all there and returns the producer's result."""
        system.reset()
        filled = self.producer(
            system,
            "bulk",
            staged=True,
            # A system without a batch API is pre-filled one call at a time.
            timeout=max(60, total / (30 if system.no_bulk else 150)),
            n=total,
            batch=self.mode.batch,
            no_warmup=True,
        )
        staged = system.staged_count()
        if staged != total:
            raise RuntimeError(f"pre-filled {staged} tasks, expected {total}")
        return filled

    def drain(self, system: System, workers: int) -> dict[str, Any]:
        mode, ctx, stats = self.mode, self.ctx, self.stats
        total = mode.drain_n
        filling = stats.table_writes(ctx.dsn)  # the pre-fill empties the tables first
        self.prefill(system, total)
        with ctx.connect() as conn:
            conn.execute("ANALYZE")
        stats.quiesce()
        tables_before = stats.table_writes(ctx.dsn)
        # What the pre-fill's enqueues wrote per task, the rows written on a clock apart.
        enqueue_rows = sum(
            writes - filling.get(name, 0)
            for name, writes in tables_before.items()
            if name not in system.clock_tables
        )
        stats.checkpoint()
        before = stats.counters()

        booting = time.monotonic()
        group = system.start_workers(workers, barrier=True)
        observer: CountingConnection | None = None
        out: dict[str, Any] = {
            "total": total,
            "enqueue_row_writes_per_task": enqueue_rows / total,
        }
        try:
            group.wait_ready(system.expected_ready(workers), timeout=90)
            out["worker_boot_s"] = time.monotonic() - booting
            observer = CountingConnection.connect(ctx.dsn, autocommit=True, connect_timeout=10)
            cpu_before = self._cpu(system, group)
            released = system.release(group)
            deadline = released + mode.drain_timeout
            progress = Progress(0, 0)
            while True:
                progress = system.progress(observer, total)
                if progress.done + progress.failed >= total:
                    break
                if time.time() > deadline:
                    out["capped"] = True
                    break
                if group.exited():
                    raise RuntimeError(f"a worker exited during the drain\n{group.tail()}")
                time.sleep(system.poll_interval)
            observed_end = time.time()
            cpu_after = self._cpu(system, group)
            end = system.last_completion(observer) if not out.get("capped") else None
            first = system.first_start(observer)
            memory = system.memory(group)
        finally:
            out["worker_stop_s"] = group.stop()
            if observer is not None:
                observer.close()
        stats.quiesce()
        after = stats.counters()
        # Its own backend, read after the window's last reading: outside what is counted.
        tables_after = stats.table_writes(ctx.dsn)
        by_table = {
            name: writes - tables_before.get(name, 0)
            for name, writes in sorted(tables_after.items())
            if writes != tables_before.get(name, 0)
        }
        on_a_clock = sum(by_table.get(name, 0) for name in system.clock_tables)
        if not out.get("capped") and not progress.failed:
            # Outside the counted window: the check's reads add no commit to it.
            with ctx.connect() as conn:
                out["exactly_once"] = system.verify_once(conn, total) or "not checked"

        # A worker that found work before the release (it polled the database on its
        # own) is timed from its first start instead.
        began = min(released, first) if first is not None else released
        end = end if end is not None and end >= began else observed_end
        elapsed = max(end - began, 1e-6)
        if first is not None and end > first:
            out["first_start_to_finish_s"] = end - first
            out["throughput_from_first_start"] = max(progress.done, 0) / (end - first)
        done = max(progress.done, 0)
        commits = after["commits"] - before["commits"] - (observer.statements if observer else 0)
        wal = stats.wal_bytes(before["lsn"], after["lsn"])
        own_wal = stats.own_wal_bytes(ctx.dsn, before["lsn"], after["lsn"])
        executing = memory["executing"]
        cpu = {
            side: cpu_used(cpu_before[side], cpu_after[side]) / done if done else None
            for side in ("database", "workers")
        }
        if not cpu_before["database"]:
            cpu["database"] = None  # the server is not on this machine
        out.update(
            {
                "done": done,
                "failed": progress.failed,
                "elapsed": elapsed,
                "throughput": done / elapsed,
                "first_start_delay": (first - released) if first is not None else None,
                "started_before_release": first is not None and first < released,
                "commits": commits,
                "rollbacks": after["rollbacks"] - before["rollbacks"],
                "commits_per_step": commits / done if done else None,
                "row_writes": after["row_writes"] - before["row_writes"],
                "row_writes_per_step": (
                    (after["row_writes"] - before["row_writes"]) / done if done else None
                ),
                # What the executions wrote, without the rows written on a clock (a few
                # a second per process: the counters' flush, the heartbeats), not per step.
                "row_writes_by_table": by_table,
                "clock_row_writes": on_a_clock,
                "execution_row_writes_per_step": (
                    (after["row_writes"] - before["row_writes"] - on_a_clock) / done
                    if done
                    else None
                ),
                "wal_bytes": wal,
                "wal_bytes_per_step": wal / done if done else None,
                "own_wal_bytes": own_wal,
                "own_wal_error": stats.wal_error or None,
                "own_wal_bytes_per_step": own_wal / done if done and own_wal is not None else None,
                "checkpointed": stats.can_checkpoint,
                "memory_kib": memory,
                "rss_mib": _median_mib(executing, "rss"),
                "pss_mib": _median_mib(executing, "pss"),
                "uss_mib": _median_mib(executing, "uss"),
                # CPU per executed step, in microseconds: the PostgreSQL server's processes
                # on this machine (the harness's progress polls among them) and the workers'
                "db_cpu_us_per_step": cpu["database"] * 1e6 if cpu["database"] else None,
                "worker_cpu_us_per_step": cpu["workers"] * 1e6 if cpu["workers"] else None,
            }
        )
        if progress.failed:
            out["note"] = f"{progress.failed} tasks failed"
        if progress.failed or out.get("capped"):
            out["worker_log_tail"] = group.tail(15)[-3000:]
        system.reset()
        return out

    @staticmethod
    def _cpu(system: System, group: ProcessGroup) -> dict[str, dict[int, float]]:
        workers = [*group.pids, *system.executing_pids(group)]
        return {
            "database": cpu_seconds(named("postgres")),
            "workers": cpu_seconds(sorted(set(workers))),
        }

    # 3. enqueue -> start latency under an open-loop producer

    def latency(self, system: System) -> dict[str, Any]:
        mode, ctx = self.mode, self.ctx
        system.reset()
        group = system.start_workers(2, barrier=False)
        rates: dict[str, Any] = {}
        try:
            group.wait_ready(system.expected_ready(2), timeout=90)
            with ctx.connect() as conn:
                # Warm-up: connections opened, code paths hot, then nothing left behind.
                self.producer(system, "single", staged=False, timeout=60, n=10)
                wait_for(lambda: not system.busy(conn), timeout=60, what="the warm-up")
            for rate in mode.rates:
                if self.over_budget():
                    rates[str(rate)] = {"error": "skipped: time budget"}
                    continue
                try:
                    rates[str(rate)] = self._latency_at(system, group.exited, rate)
                except Exception as exc:
                    rates[str(rate)] = {"error": f"{exc}"[:2000]}
                    if group.exited():
                        raise
        finally:
            stopped = group.stop()
        system.reset()
        return {"workers": 2, "rates": rates, "worker_stop_s": stopped}

    def _latency_at(
        self, system: System, exited: Callable[[], list[int]], rate: int
    ) -> dict[str, Any]:
        mode, ctx = self.mode, self.ctx
        system.clear_queues()
        result = self.producer(
            system,
            "openloop",
            staged=False,
            timeout=mode.latency_seconds * 4 + 60,
            rate=rate,
            duration=mode.latency_seconds,
            senders=mode.senders,
        )
        records = [(int(r[0]), float(r[1]), float(r[2])) for r in result["records"]]
        ids = [record[0] for record in records]
        with ctx.connect() as conn:
            starts: dict[int, float] = {}
            deadline = time.monotonic() + 30
            while True:
                starts = system.start_times(conn, ids)
                if len(starts) >= len(ids) or time.monotonic() > deadline or exited():
                    break
                time.sleep(0.25)
            with contextlib.suppress(TimeoutError):
                wait_for(lambda: not system.busy(conn), timeout=30, what="the queue to empty")
        latencies = [(starts[i] - due) * 1000 for i, due, _ in records if i in starts]
        lags = [(sent - due) * 1000 for _, due, sent in records]
        out: dict[str, Any] = {
            "sent": len(records),
            "scheduled": result["count"],
            "started": len(latencies),
            "missing": len(records) - len(latencies),
            "producer_errors": result["error_count"],
        }
        if result["errors"]:
            out["producer_error_sample"] = result["errors"][:3]
        if latencies:
            out.update(
                {
                    "p50_ms": report.percentile(latencies, 50),
                    "p99_ms": report.percentile(latencies, 99),
                    "max_ms": max(latencies),
                    "producer_lag_p50_ms": report.percentile(lags, 50),
                    "producer_lag_p99_ms": report.percentile(lags, 99),
                }
            )
        else:
            out["error"] = "no task started"
        return out


def _median_mib(processes: list[dict[str, int]], field: str) -> float | None:
    values = [p[field] for p in processes if field in p]
    return statistics.median(values) / 1024 if values else None


def measure_once(
    cell: dict[str, Any],
    label: str,
    *,
    skipped: str | None,
    measure: Callable[[], dict[str, Any]],
    reset: Callable[[], None],
    brief: Callable[[dict[str, Any]], str],
) -> dict[str, Any]:
    """One cell of those run once per harness run (the scale, horizon and faults cells):
    ``skipped`` with its reason, or measured; a failure is kept in the cell, its processes
    stopped and its system ``reset``, and the run goes on. Prints one line either way."""
    if skipped:
        cell["skipped"] = skipped
        print(f"{label}: skipped ({skipped[:120]})", flush=True)
        return cell
    began = time.monotonic()
    try:
        cell.update(measure())
    except Exception as exc:
        cell["error"] = "".join(traceback.format_exception(exc))[-6000:]
        stop_all()
        with contextlib.suppress(Exception):
            reset()
    cell["seconds"] = time.monotonic() - began
    print(f"{label}: {brief(cell)} ({cell['seconds']:.1f} s)", flush=True)
    return cell
