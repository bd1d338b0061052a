"""The benchmark run: ``python -m bench.run --mode quick|full`` (``make bench-quick`` /
``make bench``).

It finds PostgreSQL and Redis as ``scripts/with-services.sh`` does (``DATABASE_URL`` /
``REDIS_URL``, else 127.0.0.1), creates a database of its own (``task_console_bench``,
dropped at the end) and uses Redis keys under a prefix of its own (deleted at the end),
runs every cell for every system in a shuffled order per run, then the console cells
(``bench/pages.py``: two pages timed over two data sets, ``bench/dataset.py``, each in a
database of its own, ``bench_console_<tasks>``, built in the first run, dropped at the
end), after the last run the scale cells once (``bench/scale_cells.py``), then the horizon
and faults cells once (``bench/horizon_cells.py``), then the tracing cell once
(``bench/tracing_cell.py``), and writes
``bench/results/<timestamp>[-quick].{json,md}`` (and, in full mode, the table into
``docs/performance.md``). Every process it starts is stopped, also on error; every wait
has a deadline, and the whole run has a time budget after which cells are skipped.

Exit status: 0 when the harness ran (cells that failed are reported in the table),
2 when the services cannot be reached or another bench run holds the lock, 1 on a crash.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import shutil
import signal
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from functools import partial
from pathlib import Path
from types import FrameType
from typing import Any

import psycopg
import redis

from bench import horizon_cells, report, scale_cells, tracing_cell
from bench.cells import MODES, Bench, Mode
from bench.common import BENCH_DIR, ROOT, scalar
from bench.console_cells import CONSOLE_PAGES, Console
from bench.databases import LockLost, Server, discover, prepare_database, with_database
from bench.environment import code_fingerprint, environment, git_state
from bench.peers import Dbos, Dtdb, Pgq, Pgq100
from bench.procs import stop_all
from bench.server_stats import ServerStats, table_persistence
from bench.systems import (
    Ctx,
    PlainCelery,
    Proc,
    Proc10,
    Raw,
    System,
    Us,
    UsLimited,
    UsProcfile,
)

BENCH_DB = "task_console_bench"
# Every system by key, and those a run takes unless --systems names others: PROC c1 (the
# weaker of procrastinate's two concurrencies in every drain) and RAW (no target is
# measured against it) only run when named.
SYSTEMS: dict[str, type[System]] = {
    cls.key: cls
    for cls in (Us, UsProcfile, UsLimited, PlainCelery, Proc10, Proc, Pgq, Pgq100, Dbos, Dtdb, Raw)
}
ORDER = ["us", "procfile", "uslimited", "celery", "proc10", "pgq", "pgq100", "dbos", "dtdb"]
ALL_CELLS = ("enqueue", "drain", "latency", "console", "scale", "horizon", "faults", "tracing")
RESULTS_DIR = BENCH_DIR / "results"
DOCS = ROOT / "docs" / "performance.md"


class Interrupted(BaseException):
    """SIGTERM: unwind through every ``finally`` so processes and data are cleaned up."""


def _on_sigterm(signum: int, frame: FrameType | None) -> None:
    raise Interrupted(f"signal {signum}")


# --- the command line -------------------------------------------------------------------


@dataclass(frozen=True)
class Options:
    mode: Mode
    systems: list[str]
    cells: set[str]
    seed: int
    partial: bool  # not every system, cell or the mode's sizes: results named "-partial"
    write_docs: bool


def parse_args(argv: list[str] | None) -> Options:
    parser = argparse.ArgumentParser(prog="python -m bench.run", description=__doc__)
    parser.add_argument("--mode", choices=sorted(MODES), default="quick")
    parser.add_argument("--runs", type=int, help="override the mode's number of runs")
    parser.add_argument("--systems", default=",".join(ORDER), help="comma-separated subset")
    parser.add_argument("--seed", type=int, help="seed of the per-run system order")
    parser.add_argument(
        "--cells",
        default=",".join(ALL_CELLS),
        help="comma-separated subset of the cells (console: only with the system us; "
        "scale: once per harness run, for us and pgq unless --systems names others; "
        "horizon and faults: once per harness run, for us, proc10 and pgq of those named; "
        "tracing: once per harness run, for us)",
    )
    parser.add_argument("--senders", type=int, help="override the open loop's sender threads")
    parser.add_argument(
        "--workers", help="override the drain cells' worker processes, comma-separated (1,2,4,8)"
    )
    parser.add_argument(
        "--docs",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="write the table into docs/performance.md (default: in full mode only)",
    )
    args = parser.parse_args(argv)
    mode = MODES[args.mode]
    if args.runs:
        mode = Mode(**{**asdict(mode), "runs": args.runs})
    if args.senders:
        mode = Mode(**{**asdict(mode), "senders": args.senders})
    if args.workers:
        try:
            workers = tuple(int(n) for n in args.workers.split(",") if n.strip())
        except ValueError:
            workers = ()
        if not workers or min(workers) < 1:
            parser.error("--workers takes positive whole numbers, comma-separated")
        mode = Mode(**{**asdict(mode), "workers": workers})
    cells = {c.strip() for c in args.cells.split(",") if c.strip()}
    if not cells or cells - set(ALL_CELLS):
        parser.error(f"--cells takes {', '.join(ALL_CELLS)}")
    systems = [s.strip() for s in args.systems.split(",") if s.strip()]
    unknown = [s for s in systems if s not in SYSTEMS]
    if unknown:
        parser.error(f"unknown systems: {', '.join(unknown)}")
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(1 << 30)
    partial = systems != ORDER or cells != set(ALL_CELLS) or mode != MODES[args.mode]
    write_docs = args.docs if args.docs is not None else (mode.name == "full" and not partial)
    return Options(mode, systems, cells, seed, partial, write_docs)


# --- the run ----------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    options = parse_args(argv)
    mode = options.mode
    signal.signal(signal.SIGTERM, _on_sigterm)
    # A last resort past the budget and the longest cell: unwind and clean up.
    signal.signal(signal.SIGALRM, _on_sigterm)
    scale_keys = scale_cells.select(options.systems, ORDER) if "scale" in options.cells else []
    horizon_keys = (
        horizon_cells.select(options.systems) if {"horizon", "faults"} & options.cells else []
    )
    signal.alarm(
        int(mode.budget)
        + 900
        + scale_cells.alarm_allowance(mode.name, len(scale_keys))
        + horizon_cells.alarm_allowance(mode.name, len(horizon_keys))
    )
    database_url, redis_url = discover()
    bench_url = with_database(database_url, BENCH_DB)
    admin_url = with_database(database_url, "postgres")
    try:
        server = Server(admin_url, BENCH_DB)
        rds = redis.Redis.from_url(redis_url, socket_connect_timeout=3, socket_timeout=10)
        rds.ping()
    except (psycopg.Error, redis.RedisError) as exc:
        print(
            f"bench: PostgreSQL ({database_url}) or Redis ({redis_url}) is unreachable: {exc}\n"
            "Start them as `make test` says, or point DATABASE_URL / REDIS_URL at them.",
            file=sys.stderr,
        )
        return 2
    if not server.lock():
        print("bench: another benchmark run holds the lock on this server", file=sys.stderr)
        server.close()
        return 2

    # Keys a killed run left behind (we hold the lock: no other run is using them).
    for stale in ("bench-*", "benchstage-*"):
        for key in rds.scan_iter(match=stale, count=1000):
            rds.delete(key)
    token = f"{int(time.time())}-{os.getpid()}"
    work_dir = Path(tempfile.mkdtemp(prefix="task-console-bench-"))
    ctx = Ctx(
        dsn=bench_url,
        admin_dsn=admin_url,
        db_name=BENCH_DB,
        redis_url=redis_url,
        live_prefix=f"bench-{token}:",
        stage_prefix=f"benchstage-{token}:",
        work_dir=work_dir,
        env=subprocess_env(bench_url, redis_url, f"bench-{token}:", work_dir),
    )
    started_at = datetime.now(UTC)
    began = time.monotonic()
    print(
        f"bench: {mode.name} mode, {mode.runs} run(s), systems {', '.join(options.systems)}, "
        f"seed {options.seed}; database {BENCH_DB}, Redis prefix {ctx.live_prefix}",
        flush=True,
    )
    code_at_start = code_fingerprint()
    horizon_order: list[str] = []
    try:
        server.drop_others()
        server.create()
        walinspect = prepare_database(ctx)
        unavailable = install_systems(ctx, options.systems)
        durability = system_durability(
            ctx, [key for key in options.systems if key not in unavailable]
        )
        stats = ServerStats(server.conn, BENCH_DB, walinspect=walinspect)
        env_info = environment(stats, rds)
        bench = Bench(ctx, stats, mode)
        console = Console(ctx, server, mode)
        results, orders = run_cells(
            bench, console, options.systems, options.seed, options.cells, unavailable
        )
        # Once per harness run, after the last run's cells (each takes minutes at full size).
        scale_systems = [SYSTEMS[key](ctx) for key in scale_keys]
        results += scale_cells.run(bench, scale_systems, mode.runs, unavailable)

        def reconnect_server() -> None:
            """After the faults cell restarted PostgreSQL: the maintenance connection (and
            the run's lock it holds) made again."""
            server.relock()
            stats.conn = server.conn

        horizon_results, horizon_order = horizon_cells.run(
            bench, horizon_keys, options.cells, options.seed, reconnect_server, unavailable
        )
        results += horizon_results
        # The cost of tracing: once per harness run, for US, in a process of its own.
        if "tracing" in options.cells and "us" in options.systems:
            results += tracing_cell.run(bench, unavailable)
    except LockLost as exc:
        print(f"bench: {exc}; stopped, leaving its database alone", file=sys.stderr)
        return 2
    finally:
        clean_up(server, ctx)

    summary = report.summarize(report.collect(results))
    result: dict[str, Any] = {
        "meta": {
            "started": started_at.isoformat(timespec="seconds"),
            "duration_s": time.monotonic() - began,
            "mode": {
                **asdict(mode),
                "workers": list(mode.workers),
                "rates": list(mode.rates),
                "console_sizes": list(mode.console_sizes),
            },
            "systems": options.systems,
            "seed": options.seed,
            "orders": orders,
            "horizon_order": horizon_order,
            "git": git_state(),
            "code_at_start": code_at_start,
            "code_at_end": code_fingerprint(),
            "environment": env_info,
            "console_data": console.data,
            "unavailable": unavailable,
            "durability": durability,
        },
        "cells": results,
        "summary": summary,
    }
    report.add_best(summary, result["meta"]["mode"])
    result["targets"] = report.evaluate(summary, result["meta"]["mode"])
    write_results(result, started_at, options)
    print(f"bench: took {time.monotonic() - began:.0f} s")
    return 0


def install_systems(ctx: Ctx, keys: list[str]) -> dict[str, str]:
    """Each system's schema, once per schema; returns the systems that could not be
    installed (their package missing or broken) with the reason: their cells are
    skipped, the run goes on."""
    unavailable: dict[str, str] = {}
    failed: dict[str, str] = {}
    done: set[str] = set()
    for key in keys:
        system = SYSTEMS[key](ctx)
        schema = system.install_key or key
        if schema not in done and schema not in failed:
            try:
                system.install()
                done.add(schema)
            except Exception as exc:
                failed[schema] = " ".join(f"{exc}".split())[-400:] or type(exc).__name__
        if schema in failed:
            unavailable[key] = f"not installed: {failed[schema]}"
            print(f"bench: {system.label} skipped: {unavailable[key]}", flush=True)
    return unavailable


def system_durability(ctx: Ctx, keys: list[str]) -> dict[str, Any]:
    """How durably each system's tables are written as it runs: logged or unlogged, and
    the bench database's synchronous_commit (none of the systems changes it for its own
    sessions)."""
    with ctx.connect() as conn:
        setting = str(scalar(conn, "SHOW synchronous_commit"))
        out: dict[str, Any] = {"synchronous_commit": setting, "systems": {}}
        for key in keys:
            tables = SYSTEMS[key].tables
            if tables:
                out["systems"][key] = table_persistence(conn, list(tables))
    return out


def subprocess_env(bench_url: str, redis_url: str, prefix: str, work_dir: Path) -> dict[str, str]:
    """The environment of every process the harness starts: this one's, less what would
    point it elsewhere, plus the bench database and Redis under the run's prefix."""
    env = {
        key: value
        for key, value in os.environ.items()
        if key not in {"DJANGO_PRODUCTION", "TASKS_QUEUES", "DJANGO_SETTINGS_MODULE"}
    }
    env.update(
        {
            "DJANGO_SETTINGS_MODULE": "config.settings",
            "DATABASE_URL": bench_url,
            "BENCH_DSN": bench_url,
            "REDIS_URL": redis_url,
            "TASKS_BROKER_PREFIX": prefix,
            "TASKS_VAR_DIR": str(work_dir / "var"),
            # Production-like: DEBUG would make Django keep every query in memory.
            "DJANGO_DEBUG": "0",
            "TASKS_LOG_LEVEL": "WARNING",
            "PYTHONUNBUFFERED": "1",
            "PYTHONDONTWRITEBYTECODE": "1",
        }
    )
    return env


def clean_up(server: Server, ctx: Ctx) -> None:
    """Everything the run made, also after a failure: its processes, its databases (and
    any a killed run left behind), its Redis keys and its scratch folder."""
    stop_all()
    with contextlib.suppress(Exception):
        server.drop()
    with contextlib.suppress(Exception):
        server.drop_others()
    with contextlib.suppress(Exception):
        ctx.purge_keys(ctx.live_prefix)
        ctx.purge_keys(ctx.stage_prefix)
    server.close()
    shutil.rmtree(ctx.work_dir, ignore_errors=True)


def write_results(result: dict[str, Any], started_at: datetime, options: Options) -> None:
    """The JSON and the Markdown table under ``bench/results/``, the table into the docs
    when asked, and the table on stdout."""
    mode = options.mode
    stamp = started_at.strftime("%Y%m%dT%H%M%SZ")
    table = report.markdown(result)
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    suffix = "-partial" if options.partial else ("" if mode.name == "full" else f"-{mode.name}")
    json_path = RESULTS_DIR / f"{stamp}{suffix}.json"
    md_path = RESULTS_DIR / f"{stamp}{suffix}.md"
    json_path.write_text(json.dumps(result, indent=1, default=str) + "\n")
    md_path.write_text(f"# Benchmark {stamp} ({mode.name})\n\n{table}")
    if options.write_docs:
        report.update_docs(DOCS, table, f"bench/results/{md_path.name}")
    print("\n" + table)
    print(
        f"bench: wrote {json_path.relative_to(ROOT)} and {md_path.relative_to(ROOT)}"
        + (f" and {DOCS.relative_to(ROOT)}" if options.write_docs else "")
    )


# --- the runs ---------------------------------------------------------------------------


def run_cells(
    bench: Bench,
    console: Console,
    systems: list[str],
    seed: int,
    wanted: set[str],
    unavailable: dict[str, str] | None = None,
) -> tuple[list[dict[str, Any]], list[list[str]]]:
    """Every run: the systems in an order of its own, each system's cells in turn, then
    the console cells (after the system cells, so the large data set's build lands in
    none of them). A system that could not be installed has its cells skipped."""
    unavailable = unavailable or {}
    mode = bench.mode
    rng = random.Random(seed)
    cells: list[dict[str, Any]] = []
    orders: list[list[str]] = []
    for run in range(1, mode.runs + 1):
        order = list(systems)
        rng.shuffle(order)
        orders.append(order)
        for key in order:
            system = SYSTEMS[key](bench.ctx)
            plan: list[tuple[str, int | None]] = [("enqueue", None)]
            plan += [
                ("drain", n)
                for n in mode.workers
                if system.drain_workers is None or n in system.drain_workers
            ]
            plan.append(("latency", None))
            plan = [step for step in plan if step[0] in wanted and step[0] in system.cells]
            for cell_name, workers in plan:
                cell: dict[str, Any] = {"run": run, "system": key, "cell": cell_name}
                if workers is not None:
                    cell["workers"] = workers
                label = f"run {run}/{mode.runs} {system.label:<8} {cell_name}" + (
                    f" c{workers}" if workers else ""
                )
                if key in unavailable:
                    cell["skipped"] = unavailable[key]
                    print(f"{label}: skipped ({unavailable[key][:120]})", flush=True)
                    cells.append(cell)
                    continue
                measure = partial(_system_cell, bench, system, cell_name, workers)
                cells.append(_measured(bench, cell, label, measure, partial(_recover, system)))
        if "console" in wanted and "us" in systems:
            for page in CONSOLE_PAGES:
                cell = {"run": run, "system": "us", "cell": "console", "page": page}
                label = f"run {run}/{mode.runs} US       console {page}"
                cells.append(_measured(bench, cell, label, partial(console.page, page)))
    return cells, orders


def _system_cell(
    bench: Bench, system: System, cell_name: str, workers: int | None
) -> dict[str, Any]:
    if cell_name == "enqueue":
        return bench.enqueue(system)
    if cell_name == "drain":
        assert workers is not None
        return bench.drain(system, workers)
    return bench.latency(system)


def _recover(system: System) -> None:
    """After a system cell failed: stop what it left running, empty what it left queued."""
    stop_all()
    with contextlib.suppress(Exception):
        system.reset()


def _measured(
    bench: Bench,
    cell: dict[str, Any],
    label: str,
    measure: Callable[[], dict[str, Any]],
    recover: Callable[[], None] | None = None,
) -> dict[str, Any]:
    """One cell: skipped past the budget, else measured and timed, a failure kept in the
    cell (the run goes on); its line printed either way."""
    if bench.over_budget():
        cell["skipped"] = "time budget"
        print(f"{label}: skipped (time budget)", flush=True)
        return cell
    began = time.monotonic()
    try:
        cell.update(measure())
    except Exception as exc:
        cell["error"] = "".join(traceback.format_exception(exc))[-6000:]
        if recover is not None:
            recover()
    cell["seconds"] = time.monotonic() - began
    print(f"{label}: {_brief(cell)} ({cell['seconds']:.1f} s)", flush=True)
    return cell


def _brief(cell: dict[str, Any]) -> str:
    if cell.get("error"):
        return "ERROR " + str(cell["error"]).strip().splitlines()[-1][:200]
    if cell["cell"] == "console":
        return (
            f"{cell['small']:,} tasks {cell['small_ms']:.1f} ms, {cell['large']:,} tasks "
            f"{cell['large_ms']:.1f} ms, ratio {cell['ratio']:.2f}"
        )
    if cell["cell"] == "enqueue":
        bulk = cell["bulk"]
        text = f"{bulk['rate']:,.0f}/s" if "rate" in bulk else "none (no batch API)"
        return f"single {cell['single']['rate']:,.0f}/s, bulk {text}"
    if cell["cell"] == "drain":
        text = f"{cell['throughput']:,.0f}/s"
        if cell.get("commits_per_step") is not None:
            text += f", {cell['commits_per_step']:.2f} commits/step"
        if cell.get("row_writes_per_step") is not None:
            text += f", {cell['row_writes_per_step']:.2f} rows/step"
            if cell.get("clock_row_writes"):
                executions = cell["execution_row_writes_per_step"]
                text += f" ({executions:.2f} without those written on a clock)"
        if cell.get("wal_bytes_per_step") is not None:
            text += f", {cell['wal_bytes_per_step']:,.0f} WAL B/step"
        if cell.get("enqueue_row_writes_per_task") is not None:
            text += f", pre-fill {cell['enqueue_row_writes_per_task']:.2f} rows/task"
        if cell.get("rss_mib") is not None:
            text += f", RSS {cell['rss_mib']:.1f} MiB"
        if str(cell.get("exactly_once", "")).startswith("not"):
            text += ", exactly-once not checked"
        if cell.get("capped"):
            text += f" (capped: {cell['done']}/{cell['total']})"
        return text
    parts = []
    for rate, res in cell["rates"].items():
        if "p99_ms" in res:
            parts.append(f"{rate}/s p50 {res['p50_ms']:.1f} p99 {res['p99_ms']:.1f} ms")
        else:
            parts.append(f"{rate}/s {res.get('error', '?')}")
    return "; ".join(parts)
