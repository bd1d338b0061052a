"""The scale cells (8. and 9. in docs/performance.md, "How it is measured"): a system's
drain when the queue is large, and when another session holds a snapshot open. They run
once per harness run, after the last run's cells, each with 2 worker processes:

- ``burndown``: N tasks pre-filled with the system's bulk enqueue (1,000,000; quick
  20,000), then drained. Every window (5 s; quick 0.5 s) the system's progress query counts
  what finished, and the sizes, live and dead rows and vacuum activity of the system's
  tables are read at the same moment (``pg_stat_user_tables``,
  ``pg_stat_progress_vacuum``).
- ``held_snapshot``: the drain cells' N (10,000; quick 1,000) drained twice, once as is
  and once while another session sits idle in a REPEATABLE READ transaction whose snapshot
  was taken before the release, so no row version the drain leaves behind can be removed.

Both use only the ``System`` interface (start_workers, release, progress, busy,
last_completion, first_start, reset), so any system can run them; a harness run gives them
to US and PgQueuer, or to every system ``--systems`` names.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg import sql

from bench.cells import Bench, measure_once
from bench.report import BURNDOWN, HELD_SNAPSHOT
from bench.systems import Progress, System

WORKERS = 2
# The systems the scale cells run for when --systems names none (each takes minutes).
SCALE_SYSTEMS = ("us", "pgq")
# The server settings a burn-down records: whether autovacuum can run at all, and when.
AUTOVACUUM_SETTINGS = (
    "autovacuum",
    "autovacuum_naptime",
    "autovacuum_vacuum_threshold",
    "autovacuum_vacuum_scale_factor",
    "autovacuum_vacuum_insert_threshold",
    "autovacuum_vacuum_insert_scale_factor",
    "autovacuum_vacuum_cost_delay",
    "autovacuum_vacuum_cost_limit",
)


@dataclass(frozen=True)
class ScaleMode:
    """How big the scale cells are in a mode (the held-snapshot cell takes the mode's
    drain size and time limit)."""

    burndown_n: int
    window: float  # seconds between the burn-down's samples
    hold_window: float  # the same for the held-snapshot cell's two drains
    burndown_timeout: float  # from the release; then the cell reports what finished
    budget: float  # seconds past the system cells' budget after which these are skipped


SCALE_MODES = {
    "quick": ScaleMode(20_000, 0.5, 0.25, 120, 600),
    "full": ScaleMode(1_000_000, 5.0, 0.5, 1_800, 3_600),
}


def select(systems: list[str], everything: list[str]) -> list[str]:
    """The systems the scale cells run for: those of ``SCALE_SYSTEMS`` when the run has
    every system (no ``--systems``), else every system named."""
    if systems == everything:
        return [key for key in systems if key in SCALE_SYSTEMS]
    return list(systems)


def alarm_allowance(mode_name: str, systems: int) -> int:
    """Seconds the harness's last-resort alarm must allow beyond the system cells for the
    scale cells of ``systems`` systems (each: its pre-fill, the burn-down's cap, the two
    drains)."""
    scale = SCALE_MODES[mode_name]
    per_system = scale.burndown_n / 150 + scale.burndown_timeout + 600
    return int(systems * per_system)


def run(
    bench: Bench,
    systems: list[System],
    run_number: int,
    unavailable: dict[str, str] | None = None,
) -> list[dict[str, Any]]:
    """Both scale cells for each of ``systems``, in turn; a failure is kept in its cell
    (and what it left running is stopped, what it left queued emptied), a system that
    could not be installed (``unavailable``: key -> why) has its cells skipped."""
    unavailable = unavailable or {}
    scale = SCALE_MODES[bench.mode.name]
    measures: dict[str, Callable[[Bench, System, ScaleMode], dict[str, Any]]] = {
        BURNDOWN: burn_down,
        HELD_SNAPSHOT: held_snapshot,
    }
    # What each cell sets out to do, in the cell also when it fails or is skipped.
    plans: dict[str, dict[str, Any]] = {
        BURNDOWN: {"total": scale.burndown_n, "window_s": scale.window},
        HELD_SNAPSHOT: {"total": bench.mode.drain_n, "window_s": scale.hold_window},
    }
    cells: list[dict[str, Any]] = []
    for system in systems:
        for name, measure in measures.items():
            cell: dict[str, Any] = {
                "run": run_number,
                "system": system.key,
                "cell": name,
                "workers": WORKERS,
                **plans[name],
            }
            label = f"scale       {system.label:<8} {name}"
            skipped = unavailable.get(system.key)
            if time.monotonic() - bench.started > bench.mode.budget + scale.budget:
                skipped = "time budget"
            cells.append(
                measure_once(
                    cell,
                    label,
                    skipped=skipped,
                    measure=functools.partial(measure, bench, system, scale),
                    reset=system.reset,
                    brief=brief,
                )
            )
    return cells


def brief(cell: dict[str, Any]) -> str:
    if cell.get("error"):
        return "ERROR " + str(cell["error"]).strip().splitlines()[-1][:200]
    capped = f" (capped: {cell['done']:,}/{cell['total']:,})" if cell.get("capped") else ""
    if cell["cell"] == BURNDOWN:
        vacuum = cell["autovacuum"]
        return (
            f"{cell['total']:,} tasks {cell['throughput']:,.0f}/s{capped}, first 10% "
            f"{_rate(cell['first_10pct_rate'])}, last 10% {_rate(cell['last_10pct_rate'])}, "
            f"worst window {_rate(cell['worst_window_rate'])}; autovacuum "
            + ("off" if not vacuum["enabled"] else "ran" if vacuum["ran"] else "did not run")
        )
    return (
        f"{cell['total']:,} tasks as is {cell['baseline_throughput']:,.0f}/s, with a snapshot "
        f"held {cell['throughput']:,.0f}/s ({_ratio(cell['ratio'])}){capped}"
    )


def _rate(value: float | None) -> str:
    return "-" if value is None else f"{value:,.0f}/s"


def _ratio(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}x"


# --- the cells --------------------------------------------------------------------------


def burn_down(bench: Bench, system: System, scale: ScaleMode) -> dict[str, Any]:
    """8. N pre-filled tasks drained by 2 worker processes, sampled every window."""
    # Only the samples ask the database (a large queue makes every question dearer); the
    # end is the system's last completion, found by the first sample after it.
    return drain(
        bench,
        system,
        scale.burndown_n,
        window=scale.window,
        timeout=scale.burndown_timeout,
        poll_between=False,
    )


def held_snapshot(bench: Bench, system: System, scale: ScaleMode) -> dict[str, Any]:
    """9. The drain cells' N drained as is, then with a snapshot held open throughout."""
    n, timeout = bench.mode.drain_n, bench.mode.drain_timeout
    baseline = drain(bench, system, n, window=scale.hold_window, timeout=timeout)
    held = drain(bench, system, n, window=scale.hold_window, timeout=timeout, hold=True)
    out: dict[str, Any] = {
        "total": n,
        "baseline_throughput": baseline["throughput"],
        "throughput": held["throughput"],
        "ratio": held["throughput"] / baseline["throughput"] if baseline["throughput"] else None,
        "baseline": baseline,
        "held": held,
    }
    for part in (baseline, held):
        if part.get("capped"):
            out.update(capped=True, done=part["done"])
    return out


# --- one observed drain -----------------------------------------------------------------


def drain(
    bench: Bench,
    system: System,
    total: int,
    *,
    window: float,
    timeout: float,
    hold: bool = False,
    poll_between: bool = True,
) -> dict[str, Any]:
    """``total`` tasks pre-filled with the system's bulk enqueue, then drained by 2 worker
    processes from their release to the last completion (as the drain cells time it),
    with a sample every ``window``: what finished (the system's progress query) and its
    tables' sizes, dead rows and vacuums; with ``poll_between``, between samples too, as
    often as the drain cells poll, whether anything is still queued or running. With
    ``hold``, another session holds a snapshot open from before the release until the
    workers have stopped."""
    ctx = bench.ctx
    filled = bench.prefill(system, total)
    with ctx.connect() as conn:
        conn.execute("ANALYZE")
        settings = dict(
            conn.execute(
                "SELECT name, setting FROM pg_settings WHERE name = ANY(%s)",
                (list(AUTOVACUUM_SETTINGS),),
            ).fetchall()
        )
    bench.stats.checkpoint()
    tables = list(system.tables)
    out: dict[str, Any] = {
        "total": total,
        "window_s": window,
        "timeout_s": timeout,
        "prefill_s": filled["elapsed"],
        "prefill_rate": filled["rate"],
        "tables": tables,
    }
    samples: list[dict[str, Any]] = []
    booting = time.monotonic()
    group = system.start_workers(WORKERS, barrier=True)
    observer: psycopg.Connection[Any] | None = None
    held: HeldSnapshot | None = None
    polling = 0.0  # seconds the harness spent in its progress and stats queries
    try:
        group.wait_ready(system.expected_ready(WORKERS), timeout=90)
        out["worker_boot_s"] = time.monotonic() - booting
        observer = ctx.connect()
        if hold:
            held = HeldSnapshot(ctx.dsn, tables[0] if tables else "pg_catalog.pg_class")
            out["held_session"] = held.describe(observer)
        start_stats = observe(observer, tables)
        released = system.release(group)
        samples.append({"t": 0.0, "done": 0, "failed": 0, **start_stats})
        deadline = released + timeout
        next_sample = released + window
        final: Progress | None = None
        while True:
            asked = time.time()
            if asked >= next_sample:
                progress = system.progress(observer, total)
                samples.append(
                    {
                        "t": asked - released,
                        "done": progress.done,
                        "failed": progress.failed,
                        **observe(observer, tables),
                    }
                )
                while next_sample <= time.time():
                    next_sample += window
                finished = progress.done + progress.failed >= total
                final = progress
            elif poll_between:
                # Between samples, the cheaper question: is anything still queued or running?
                finished = not system.busy(observer)
                final = None
            else:
                finished = False
            polling += time.time() - asked
            if finished:
                break
            if time.time() > deadline:
                out["capped"] = True
                break
            if group.exited():
                raise RuntimeError(f"a worker exited during the drain\n{group.tail()}")
            pause = system.poll_interval if poll_between else window
            time.sleep(max(min(pause, next_sample - time.time()), 0))
        observed_end = time.time()
        if final is None:
            final = system.progress(observer, total)
        end = system.last_completion(observer) if not out.get("capped") else None
        first = system.first_start(observer)
        if held is not None:
            out["held_session_at_end"] = state = held.describe(observer)
            if state.get("state") != "idle in transaction" or state.get("xmin_age") is None:
                raise RuntimeError(f"the held snapshot did not last the drain: {state}")
    finally:
        out["worker_stop_s"] = group.stop()
        if held is not None:
            held.close()
        if observer is not None:
            observer.close()
    # The workers' backends report their last statistics as they exit.
    with contextlib.suppress(TimeoutError):
        bench.stats.quiesce()
    with ctx.connect() as conn:
        end_stats = observe(conn, tables)
        if not out.get("capped") and not final.failed:
            out["exactly_once"] = system.verify_once(conn, total) or "not checked"

    began = min(released, first) if first is not None else released
    end = end if end is not None and end >= began else observed_end
    elapsed = max(end - began, 1e-6)
    done = final.done
    shift = released - began
    points = [(0.0, 0)]
    points += [
        (sample["t"] + shift, sample["done"])
        for sample in samples[1:]
        if 0 < sample["t"] + shift < elapsed and sample["done"] <= done
    ]
    points.append((elapsed, done))
    out.update(
        {
            "done": done,
            "failed": final.failed,
            "elapsed": elapsed,
            "throughput": done / elapsed,
            "started_before_release": first is not None and first < released,
            "polling_s": polling,
            **rates(points, window),
            "samples": samples,
            "end_stats": end_stats,
            "sizes": {
                "start_bytes": _size(start_stats),
                "end_bytes": _size(end_stats),
            },
            "dead_rows_max": max(_dead(s) for s in [*samples, {"tables": end_stats["tables"]}]),
            "dead_rows_end": _dead(end_stats),
            **server_activity(start_stats, end_stats, done),
            "autovacuum": autovacuum(settings, start_stats, [*samples[1:], end_stats]),
        }
    )
    if final.failed:
        out["note"] = f"{final.failed} tasks failed"
    if final.failed or out.get("capped"):
        out["worker_log_tail"] = group.tail(15)[-3000:]
    system.reset()
    return out


class HeldSnapshot:
    """A session of its own on the bench database, idle in a REPEATABLE READ transaction
    whose snapshot it took when opened, as a forgotten ``psql``, a long report or a stuck
    client holds one: the server keeps every row version that snapshot may see."""

    def __init__(self, dsn: str, table: str) -> None:
        self.conn = psycopg.connect(
            dsn, autocommit=True, connect_timeout=10, application_name="bench-held-snapshot"
        )
        try:
            # This is not a session of the project's (its timeouts are set on its own
            # connections); none of the server's may end it either.
            self.conn.execute("SET idle_in_transaction_session_timeout = 0")
            self.conn.execute("SET statement_timeout = 0")
            self.conn.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
            table_id = sql.Identifier(*table.split("."))
            self.conn.execute(sql.SQL("SELECT 1 FROM {} LIMIT 1").format(table_id))
        except BaseException:
            self.conn.close()
            raise
        self.pid = self.conn.info.backend_pid

    def describe(self, observer: psycopg.Connection[Any]) -> dict[str, Any]:
        """The session as the server sees it: its state and its snapshot's age in
        transactions."""
        row = observer.execute(
            "SELECT state, age(backend_xmin) FROM pg_stat_activity WHERE pid = %s",
            (self.pid,),
        ).fetchone()
        if row is None:
            return {"pid": self.pid, "state": None, "xmin_age": None}
        return {"pid": self.pid, "state": row[0], "xmin_age": row[1]}

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.conn.execute("ROLLBACK")
        with contextlib.suppress(Exception):
            self.conn.close()


# --- what is read from the server -------------------------------------------------------

TABLE_STATS = """
SELECT t.name, pg_table_size(c.oid), pg_indexes_size(c.oid), s.n_live_tup, s.n_dead_tup,
       s.vacuum_count, s.autovacuum_count, s.autoanalyze_count,
       extract(epoch FROM s.last_autovacuum)
FROM unnest(%s::text[]) WITH ORDINALITY AS t(name, i)
JOIN pg_class c ON c.oid = to_regclass(t.name)
LEFT JOIN pg_stat_user_tables s ON s.relid = c.oid
ORDER BY t.i
"""
SERVER = """
SELECT pg_current_wal_lsn() - '0/0'::pg_lsn, checkpoints_timed + checkpoints_req
FROM pg_stat_bgwriter
"""
VACUUMS = """
SELECT p.relid::regclass::text, p.phase, a.backend_type = 'autovacuum worker',
       p.heap_blks_scanned, p.heap_blks_total, p.index_vacuum_count
FROM pg_stat_progress_vacuum p LEFT JOIN pg_stat_activity a ON a.pid = p.pid
WHERE p.datname = current_database()
"""


def observe(conn: psycopg.Connection[Any], tables: list[str]) -> dict[str, Any]:
    """The system's tables now: sizes in bytes (heap with TOAST, and indexes), live and
    dead rows, vacuum counts; every vacuum running in the database; the server's WAL
    position and checkpoint count, and this machine's load average."""
    out: dict[str, Any] = {"tables": {}, "vacuums": [], "load_1m": os.getloadavg()[0]}
    with contextlib.suppress(psycopg.Error):  # the columns moved in PostgreSQL 17
        row = conn.execute(SERVER).fetchone()
        if row is not None:
            out.update(wal_lsn=int(row[0]), checkpoints=int(row[1]))
    if tables:
        for row in conn.execute(TABLE_STATS, (tables,)).fetchall():
            out["tables"][row[0]] = {
                "table_bytes": int(row[1]),
                "index_bytes": int(row[2]),
                "live": _int(row[3]),
                "dead": _int(row[4]),
                "vacuums": _int(row[5]),
                "autovacuums": _int(row[6]),
                "autoanalyzes": _int(row[7]),
                "last_autovacuum": float(row[8]) if row[8] is not None else None,
            }
    for row in conn.execute(VACUUMS).fetchall():
        out["vacuums"].append(
            {
                "table": row[0],
                "phase": row[1],
                "autovacuum": bool(row[2]),
                "heap_blks_scanned": _int(row[3]),
                "heap_blks_total": _int(row[4]),
                "index_vacuum_count": _int(row[5]),
            }
        )
    return out


def _int(value: Any) -> int:
    return int(value) if value is not None else 0


def _size(stats: dict[str, Any]) -> int:
    return sum(t["table_bytes"] + t["index_bytes"] for t in stats["tables"].values())


def _dead(stats: dict[str, Any]) -> int:
    return sum(t["dead"] for t in stats["tables"].values())


def server_activity(before: dict[str, Any], after: dict[str, Any], done: int) -> dict[str, Any]:
    """The WAL the whole server wrote from the release until the workers stopped, per task
    done, and the checkpoints it started meanwhile (both None where unread)."""
    out: dict[str, Any] = {"wal_bytes": None, "wal_bytes_per_task": None, "checkpoints": None}
    if "wal_lsn" in before and "wal_lsn" in after:
        out["wal_bytes"] = after["wal_lsn"] - before["wal_lsn"]
        out["wal_bytes_per_task"] = out["wal_bytes"] / done if done else None
        out["checkpoints"] = after["checkpoints"] - before["checkpoints"]
    return out


def autovacuum(
    settings: dict[str, str], before: dict[str, Any], after: list[dict[str, Any]]
) -> dict[str, Any]:
    """Whether autovacuum ran on the system's tables between ``before`` (the release) and
    the last of ``after``: a worker seen at a sample, or a table's count of finished
    autovacuums grown."""
    runs: dict[str, int] = {}
    if after:
        last = after[-1]["tables"]
        for name, table in last.items():
            grown = table["autovacuums"] - before["tables"].get(name, {}).get("autovacuums", 0)
            if grown > 0:
                runs[name] = grown
    seen = sorted(
        {
            vacuum["table"]
            for sample in after
            for vacuum in sample["vacuums"]
            if vacuum["autovacuum"]
        }
    )
    return {
        "enabled": settings.get("autovacuum", "on") == "on",
        "settings": settings,
        "ran": bool(runs or seen),
        "finished": runs,
        "seen_running": seen,
    }


# --- rates over time --------------------------------------------------------------------


def rates(points: list[tuple[float, int]], window: float) -> dict[str, Any]:
    """Rates from ``points``, (seconds since the start, tasks done) from (0, 0) to the last
    completion: each window's, the first and the last 10% of the tasks' (the time at a
    count interpolated between samples), and the worst of the windows at least half a
    window long (the last is usually shorter)."""
    windows = [
        {"t": t0, "s": t1 - t0, "done": d1 - d0, "rate": (d1 - d0) / (t1 - t0)}
        for (t0, d0), (t1, d1) in itertools.pairwise(points)
        if t1 > t0
    ]
    total = points[-1][1]
    elapsed = points[-1][0]
    out: dict[str, Any] = {
        "windows": windows,
        "first_10pct_rate": None,
        "last_10pct_rate": None,
        "last_over_first": None,
        "worst_window_rate": None,
        "worst_window_at_s": None,
        "first_window_rate": windows[0]["rate"] if windows else None,
        "last_window_rate": windows[-1]["rate"] if windows else None,
    }
    if total > 0:
        tenth = total / 10
        first = _time_at(points, tenth)
        last = elapsed - _time_at(points, total - tenth)
        out["first_10pct_rate"] = tenth / first if first > 0 else None
        out["last_10pct_rate"] = tenth / last if last > 0 else None
        if out["first_10pct_rate"] and out["last_10pct_rate"]:
            out["last_over_first"] = out["last_10pct_rate"] / out["first_10pct_rate"]
    full = [w for w in windows if w["s"] >= window / 2]
    if full:
        worst = min(full, key=lambda w: w["rate"])
        out["worst_window_rate"] = worst["rate"]
        out["worst_window_at_s"] = worst["t"]
    return out


def _time_at(points: list[tuple[float, int]], count: float) -> float:
    """When ``count`` tasks were done, interpolated between the samples around it."""
    for (t0, d0), (t1, d1) in itertools.pairwise(points):
        if d1 >= count:
            if d1 == d0:
                return t1
            return t0 + (count - d0) / (d1 - d0) * (t1 - t0)
    return points[-1][0]
