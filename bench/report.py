"""Turning cell results into medians, ratios, targets and a Markdown table."""

from __future__ import annotations

import re
import statistics
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench import horizon_report, tracing_cell
from bench.horizon_report import EFFECTS_TWICE, HORIZON_CELLS, LOST

# Every system's column, in the table's order; a run shows the columns of the systems it
# ran (PROC c1 and RAW only when --systems names them).
SYSTEM_LABELS = {
    "us": "US",
    "procfile": "US/PF",
    "uslimited": "US/LIM",
    "celery": "CELERY",
    "proc": "PROC c1",
    "proc10": "PROC c10",
    "pgq": "PGQ b10",
    "pgq100": "PGQ b100",
    "dbos": "DBOS",
    "dtdb": "DTDB",
    "raw": "RAW",
}
# A peer run in several configurations is compared at its best: per metric, the better of
# its variants that ran (add_best), under a key of its own.
BEST_PROC = "proc_best"
BEST_PGQ = "pgq_best"
FAMILIES = {BEST_PROC: ("proc", "proc10"), BEST_PGQ: ("pgq", "pgq100")}
# Variants that differ from another system only in their workers: no enqueue cell.
SHARED_PRODUCER = {"procfile": "us", "proc": "proc10", "pgq100": "pgq"}
# The systems US is compared with in ratio columns, and their headings.
COMPARED = {
    "celery": "US/CELERY",
    BEST_PROC: "US/PROC (better)",
    BEST_PGQ: "US/PGQ (better)",
    "raw": "US/RAW",
}

TIMES = "\u00d7"  # the multiplication sign of "2x"
DASH = "\u2013"  # the en dash of "min-max" and of an empty cell

# The console cells: page key -> what the tables call it.
CONSOLE_PAGES = {
    "overview": "Overview (`GET /`)",
    "tasks": "Tasks, first page (`GET /tasks/`)",
    "metrics": "Metrics (`GET /metrics`)",
    "workflows": "Workflows (`GET /workflows/`)",
    "workflow": "One workflow (`GET /workflows/demo.flaky/`)",
    "dead_groups": "Dead letters by cause (`GET /dead/groups/`)",
}
CONSOLE_BOUND = 1.5  # the large set's time over the small set's, per page

# The scale cells (bench/scale_cells.py), once per harness run: their own tables.
BURNDOWN = "burndown"
HELD_SNAPSHOT = "held_snapshot"
SCALE_CELLS = (BURNDOWN, HELD_SNAPSHOT)
# Cells with tables of their own, outside the metric table (the horizon and faults cells'
# are bench/horizon_report.py's, the tracing cell's bench/tracing_cell.py's).
OWN_TABLES = (*SCALE_CELLS, *HORIZON_CELLS, tracing_cell.TRACING)

START_MARK = "<!-- bench:start -->"
END_MARK = "<!-- bench:end -->"


def percentile(values: list[float], pct: float) -> float:
    """Nearest-rank percentile of ``values`` (not empty)."""
    ordered = sorted(values)
    rank = max(1, -(-len(ordered) * pct // 100))  # ceil(n * pct / 100), at least 1
    return ordered[int(min(rank, len(ordered))) - 1]


@dataclass(frozen=True)
class Metric:
    key: str
    title: str
    unit: str
    higher_is_better: bool
    fmt: Callable[[float], str]
    # Systems a ratio makes no sense against (CELERY writes nothing to PostgreSQL).
    no_ratio: frozenset[str] = frozenset()


def _int(value: float) -> str:
    return f"{value:,.0f}"


def _one(value: float) -> str:
    return f"{value:,.1f}" if value < 100 else f"{value:,.0f}"


def _two(value: float) -> str:
    return f"{value:.2f}"


def metrics(mode: dict[str, Any]) -> list[Metric]:
    out = [
        Metric(
            "enqueue_single",
            f"enqueue, single calls ({mode['single_n']:,})",
            "tasks/s",
            True,
            _int,
        ),
        Metric(
            "enqueue_bulk",
            f"enqueue, bulk ({mode['bulk_n']:,} in batches of {mode['batch']:,})",
            "tasks/s",
            True,
            _int,
        ),
    ]
    for n in mode["workers"]:
        plural = "es" if n > 1 else ""
        out.append(
            Metric(
                f"drain_c{n}",
                f"drain {mode['drain_n']:,} pre-filled, {n} worker process{plural}",
                "tasks/s",
                True,
                _int,
            )
        )
    for rate in mode["rates"]:
        for pct in ("p50", "p99"):
            out.append(
                Metric(
                    f"latency_{pct}_{rate}",
                    f"enqueue→start {pct} at {rate}/s",
                    "ms",
                    False,
                    _one,
                )
            )
        out.append(
            Metric(
                f"lag_p99_{rate}",
                f"of which sending: scheduled→sent p99 at {rate}/s",
                "ms",
                False,
                _one,
            )
        )
    out += [
        Metric(
            "commits_per_step",
            "commits per executed step (2 workers)",
            "",
            False,
            _two,
            frozenset({"celery"}),
        ),
        Metric(
            "row_writes_per_step",
            "rows written per executed step (2 workers; inserts, updates, deletes)",
            "",
            False,
            _two,
            frozenset({"celery"}),
        ),
        Metric(
            "execution_row_writes_per_step",
            "of which the executions' (counters' flush and heartbeats, written on a clock, apart)",
            "",
            False,
            _two,
            frozenset({"celery"}),
        ),
        Metric(
            "enqueue_rows",
            "rows written per task enqueued (the drain's pre-fill, in batches)",
            "",
            False,
            _two,
            frozenset({"celery"}),
        ),
        Metric(
            "wal_per_step",
            "WAL bytes per executed step (2 workers)",
            "B",
            False,
            _int,
            frozenset({"celery"}),
        ),
        Metric(
            "own_wal_per_step",
            "of which the bench database's (pg_walinspect)",
            "B",
            False,
            _int,
            frozenset({"celery"}),
        ),
        Metric(
            "db_cpu_per_step",
            "PostgreSQL server CPU per executed step (2 workers)",
            "µs",
            False,
            _int,
            frozenset({"celery"}),
        ),
        Metric(
            "worker_cpu_per_step",
            "workers' CPU per executed step (2 workers)",
            "µs",
            False,
            _int,
        ),
        Metric(
            "cpu_per_step",
            "CPU per executed step, server and workers (2 workers)",
            "µs",
            False,
            _int,
            frozenset({"celery"}),
        ),
        Metric("rss_mib", "RSS per task-running process (2 workers)", "MiB", False, _one),
        Metric("pss_mib", "PSS per task-running process (2 workers)", "MiB", False, _one),
    ]
    return out


def collect(cells: Iterable[dict[str, Any]]) -> dict[str, dict[str, list[float]]]:
    """metric -> system -> the value of each run."""
    out: dict[str, dict[str, list[float]]] = {}

    def add(metric: str, system: str, value: Any) -> None:
        if isinstance(value, int | float):
            out.setdefault(metric, {}).setdefault(system, []).append(float(value))

    for cell in cells:
        if cell.get("error") or cell.get("skipped"):
            continue
        system = cell["system"]
        if cell["cell"] == "enqueue":
            add("enqueue_single", system, cell.get("single", {}).get("rate"))
            add("enqueue_bulk", system, cell.get("bulk", {}).get("rate"))
        elif cell["cell"] == "drain":
            n = cell["workers"]
            add(f"drain_c{n}", system, cell.get("throughput"))
            if n == 2:
                add("commits_per_step", system, cell.get("commits_per_step"))
                add("row_writes_per_step", system, cell.get("row_writes_per_step"))
                add("enqueue_rows", system, cell.get("enqueue_row_writes_per_task"))
                add(
                    "execution_row_writes_per_step",
                    system,
                    cell.get("execution_row_writes_per_step"),
                )
                add("wal_per_step", system, cell.get("wal_bytes_per_step"))
                add("own_wal_per_step", system, cell.get("own_wal_bytes_per_step"))
                add("db_cpu_per_step", system, cell.get("db_cpu_us_per_step"))
                add("worker_cpu_per_step", system, cell.get("worker_cpu_us_per_step"))
                database, workers = (
                    cell.get("db_cpu_us_per_step"),
                    cell.get("worker_cpu_us_per_step"),
                )
                if database is not None and workers is not None:
                    add("cpu_per_step", system, database + workers)
                add("rss_mib", system, cell.get("rss_mib"))
                add("pss_mib", system, cell.get("pss_mib"))
        elif cell["cell"] == "console":
            page = cell["page"]
            add(f"console_{page}_small", system, cell.get("small_ms"))
            add(f"console_{page}_large", system, cell.get("large_ms"))
            add(f"console_{page}_ratio", system, cell.get("ratio"))
        elif cell["cell"] == horizon_report.FAULTS:
            add(LOST, system, cell.get("lost"))
            add(EFFECTS_TWICE, system, cell.get("effects_twice"))
        elif cell["cell"] == "latency":
            for rate, result in cell.get("rates", {}).items():
                if result.get("error"):
                    continue
                add(f"latency_p50_{rate}", system, result.get("p50_ms"))
                add(f"latency_p99_{rate}", system, result.get("p99_ms"))
                add(f"lag_p99_{rate}", system, result.get("producer_lag_p99_ms"))
    return out


def summarize(values: dict[str, dict[str, list[float]]]) -> dict[str, dict[str, dict[str, Any]]]:
    return {
        metric: {
            system: {
                "median": statistics.median(runs),
                "min": min(runs),
                "max": max(runs),
                "runs": runs,
            }
            for system, runs in by_system.items()
            if runs
        }
        for metric, by_system in values.items()
    }


def add_best(summary: dict[str, dict[str, dict[str, Any]]], mode: dict[str, Any]) -> None:
    """Add each family's best (``FAMILIES``) to every metric one of its variants measured:
    the better of the variants' medians (higher or lower, as the metric says), naming
    which (``of``)."""
    for metric in metrics(mode):
        by_system = summary.get(metric.key, {})
        pick = max if metric.higher_is_better else min
        for best_key, variants in FAMILIES.items():
            measured = [(key, by_system[key]) for key in variants if key in by_system]
            if measured:
                key, best = pick(measured, key=lambda item: item[1]["median"])
                by_system[best_key] = {**best, "of": key}


def _ran(compared: str, systems: Iterable[str]) -> bool:
    """Whether a column's system (or one of a family's variants) was in the run."""
    return bool(set(FAMILIES.get(compared, (compared,))) & set(systems))


@dataclass(frozen=True)
class Target:
    text: str
    metric: str
    other: str | None  # None: an absolute bound on US's value
    bound: float
    at_least: bool  # ratio (or value) must be >= bound; else <=
    ratio: bool = False  # an absolute bound on a ratio US's cell measured (shown as one)
    ours: str = "us"  # the system measured against ``other``
    digits: int = 2  # decimals shown


TARGETS = [
    Target(f"drain, 2 workers: US ≥ 10{TIMES} CELERY", "drain_c2", "celery", 10.0, True),
    Target(f"drain, 2 workers: US ≥ 10{TIMES} PROC (better)", "drain_c2", BEST_PROC, 10.0, True),
    Target(f"drain, 2 workers: US ≥ 1.0{TIMES} PGQ b100", "drain_c2", "pgq100", 1.0, True),
    Target(f"drain, 2 workers: US ≥ 2.5{TIMES} PGQ b10", "drain_c2", "pgq", 2.5, True),
    Target(f"drain, 2 workers: US ≥ 10{TIMES} DBOS", "drain_c2", "dbos", 10.0, True),
    Target(f"drain, 2 workers: US ≥ 10{TIMES} DTDB", "drain_c2", "dtdb", 10.0, True),
    *[
        Target(
            f"drain, {n} worker{'s' * (n > 1)}: the Procfile's worker (US/PF) ≥ 0.9{TIMES} US",
            f"drain_c{n}",
            "us",
            0.9,
            True,
            ours="procfile",
        )
        for n in (1, 2, 4)
    ],
    # What the limits' bookkeeping costs a drain whose limits never bind: at most 10%.
    Target(
        f"drain, 2 workers: under limits far above the machine (US/LIM) ≥ 0.9{TIMES} US",
        "drain_c2",
        "us",
        0.9,
        True,
        ours="uslimited",
    ),
    Target(f"single enqueue: US ≥ 1{TIMES} PGQ", "enqueue_single", BEST_PGQ, 1.0, True),
    Target(f"bulk enqueue: US ≥ 0.8{TIMES} PGQ", "enqueue_bulk", BEST_PGQ, 0.8, True),
    *[
        Target(
            f"p99 enqueue→start at {rate}/s: US ≤ 2{TIMES} CELERY",
            f"latency_p99_{rate}",
            "celery",
            2.0,
            False,
        )
        for rate in (200, 500)
    ],
    Target("commits per executed step: US ≤ 2", "commits_per_step", None, 2.0, False),
    Target("rows written per task enqueued: US ≤ 3", "enqueue_rows", None, 3.0, False),
    Target(
        "rows the executions write per step (rows written on a clock apart): US ≤ 4",
        "execution_row_writes_per_step",
        None,
        4.0,
        False,
    ),
    Target(
        f"WAL per executed step: US ≤ 1.3{TIMES} PGQ (better)", "wal_per_step", BEST_PGQ, 1.3, False
    ),
    Target(
        f"CPU per executed step, server and workers: US ≤ 1.2{TIMES} PGQ (better)",
        "cpu_per_step",
        BEST_PGQ,
        1.2,
        False,
    ),
    Target(f"worker memory (RSS): US ≤ 1.2{TIMES} CELERY child", "rss_mib", "celery", 1.2, False),
    *[
        Target(
            f"console {title}: time at {{large}} ÷ at {{small}} tasks ≤ {CONSOLE_BOUND:g}",
            f"console_{page}_ratio",
            None,
            CONSOLE_BOUND,
            False,
            ratio=True,
        )
        for page, title in CONSOLE_PAGES.items()
    ],
    Target(
        "effects applied twice after repeated kills (faults cell): US = 0",
        EFFECTS_TWICE,
        None,
        0.0,
        False,
        digits=0,
    ),
    Target("jobs lost (faults cell): US = 0", LOST, None, 0.0, False, digits=0),
]


def _sizes(mode: dict[str, Any] | None) -> dict[str, str]:
    small, large = (mode or {}).get("console_sizes") or (0, 0)
    return {"small": f"{small:,}", "large": f"{large:,}"}


def evaluate(
    summary: dict[str, dict[str, dict[str, Any]]], mode: dict[str, Any] | None = None
) -> list[dict[str, Any]]:
    out = []
    for target in TARGETS:
        by_system = summary.get(target.metric, {})
        ours = by_system.get(target.ours, {}).get("median")
        value: float | None = None
        if ours is not None:
            if target.other is None:
                value = ours
            else:
                theirs = by_system.get(target.other, {}).get("median")
                if theirs:
                    value = ours / theirs
        ok = None
        if value is not None:
            ok = value >= target.bound if target.at_least else value <= target.bound
        out.append(
            {
                "target": target.text.format(**_sizes(mode)),
                "metric": target.metric,
                "against": target.other,
                "bound": target.bound,
                "value": value,
                "ok": ok,
                "ratio": target.ratio,
                "digits": target.digits,
            }
        )
    return out


def _cell(summary: dict[str, Any] | None, metric: Metric) -> str:
    if not summary:
        return DASH
    median = metric.fmt(summary["median"])
    if len(summary["runs"]) > 1:
        return f"{median} ({metric.fmt(summary['min'])}{DASH}{metric.fmt(summary['max'])})"
    return median


def _ratio(ours: dict[str, Any] | None, theirs: dict[str, Any] | None) -> str:
    if not ours or not theirs or not theirs["median"]:
        return DASH
    return f"{ours['median'] / theirs['median']:.2f}{TIMES}"


def markdown(result: dict[str, Any]) -> str:
    meta = result["meta"]
    mode = meta["mode"]
    summary = result["summary"]
    runs = mode["runs"]
    # A run of the console cells alone (or of none of them) leaves out the other's rows;
    # a run of the scale cells alone leaves out both, and the targets; the horizon and
    # faults cells' targets show when those cells ran.
    kinds = {
        cell["cell"] == "console" for cell in result["cells"] if cell["cell"] not in OWN_TABLES
    } or (set() if result["cells"] else {True, False})
    horizon_ran = not result["cells"] or any(
        cell["cell"] in HORIZON_CELLS for cell in result["cells"]
    )
    lines = [
        f"**{mode['name']} run** of {meta['started']} ({meta['duration_s']:.0f} s, "
        f"{runs} run{'s' if runs > 1 else ''}"
        + (f", median (min{DASH}max)" if runs > 1 else "")
        + "; ratios are US ÷ other: above 1 is faster for throughput, below 1 is better "
        "for latency, commits, WAL and memory)",
    ]
    ran = meta.get("systems") or list(SYSTEM_LABELS)
    columns = [system for system in SYSTEM_LABELS if system in ran]
    compared = [other for other in COMPARED if _ran(other, ran)]
    if False in kinds:
        lines += [
            "",
            "| metric | "
            + " | ".join([*(SYSTEM_LABELS[s] for s in columns), *(COMPARED[c] for c in compared)])
            + " |",
            "|---|" + "--:|" * (len(columns) + len(compared)),
        ]
    for metric in metrics(mode) if False in kinds else []:
        by_system = summary.get(metric.key, {})
        if not any(system in by_system for system in columns):
            continue  # a cell the run left out (--cells), or one no system measured
        unit = f" ({metric.unit})" if metric.unit else ""
        row = [f"{metric.title}{unit}"]
        row += [_cell(by_system.get(system), metric) for system in columns]
        row += [
            DASH if other in metric.no_ratio else _ratio(by_system.get("us"), by_system.get(other))
            for other in compared
        ]
        lines.append("| " + " | ".join(row) + " |")
    if False in kinds:
        lines += footnotes(result, columns)

    lines += console_table(result)
    lines += scale_tables(result)
    lines += horizon_report.tables(result, SYSTEM_LABELS)
    lines += tracing_cell.table(result)
    shown_targets = [
        target
        for target in result["targets"]
        if (
            horizon_ran
            if target["metric"] in (LOST, EFFECTS_TWICE)
            else target["metric"].startswith("console_") in kinds
        )
    ]
    if shown_targets:
        lines += ["", "| target (same run) | measured | |", "|---|--:|:-:|"]
    for target in shown_targets:
        value = target["value"]
        if value is None:
            shown, mark = DASH, "?"
        else:
            times = target["against"] is not None or target.get("ratio")
            shown = f"{value:.{target.get('digits', 2)}f}" + (TIMES if times else "")
            mark = "✓" if target["ok"] else "✗"
        lines.append(f"| {target['target']} | {shown} | {mark} |")

    problems = [
        cell
        for cell in result["cells"]
        if cell.get("error") or cell.get("skipped") or cell.get("capped")
    ]
    for cell in result["cells"]:
        for rate, res in cell.get("rates", {}).items():
            if res.get("error") or res.get("missing") or res.get("producer_errors"):
                problems.append({**cell, "rate": rate, "detail": res})
    changed = meta.get("code_at_start") != meta.get("code_at_end")
    if problems or changed:
        lines += ["", "Problems in this run:", ""]
    if changed:
        lines.append(
            f"- the code changed during the run ({meta.get('code_at_start')} at the start, "
            f"{meta.get('code_at_end')} at the end): later cells measured other code"
        )
    not_installed: set[str] = set()
    for cell in problems:
        if str(cell.get("skipped", "")).startswith("not installed"):
            # Every cell of a system that could not be installed: one line for them all.
            if cell["system"] not in not_installed:
                not_installed.add(cell["system"])
                lines.append(
                    f"- {SYSTEM_LABELS[cell['system']]}: every cell skipped, {cell['skipped']}"
                )
            continue
        where = f"run {cell['run']} {SYSTEM_LABELS[cell['system']]} {cell['cell']}"
        if cell.get("workers"):
            where += f" c{cell['workers']}"
        if cell.get("page"):
            where += f" {cell['page']}"
        if "rate" in cell:
            detail = cell["detail"]
            text = (
                str(detail["error"]).strip().splitlines()[0][:300]
                if detail.get("error")
                else f"{detail.get('missing', 0)} of {detail.get('sent', 0)} never started, "
                f"{detail.get('producer_errors', 0)} send errors"
            )
            where += f" at {cell['rate']}/s"
        elif cell.get("skipped"):
            text = f"skipped: {cell['skipped']}"
        elif cell.get("capped"):
            text = (
                f"stopped at the cell's time limit with {cell.get('done')} of "
                f"{cell.get('total')} done (throughput from what finished)"
            )
        else:
            # A console page's answer: its status and the first 300 characters of its body.
            limit = 420 if cell["cell"] == "console" else 300
            text = str(cell["error"]).strip().splitlines()[-1][:limit]
        lines.append(f"- {where}: {text}")

    env = meta["environment"]
    versions = ", ".join(f"{name} {version}" for name, version in env["versions"].items())
    pg = ", ".join(f"{k}={v}" for k, v in env["postgresql_settings"].items())
    rd = ", ".join(
        f"{k}={v!r}" if v == "" else f"{k}={v}" for k, v in env["redis_settings"].items()
    )
    sizes = (
        f"single {mode['single_n']:,}; bulk {mode['bulk_n']:,} in batches of {mode['batch']:,}; "
        f"drain {mode['drain_n']:,} with {', '.join(map(str, mode['workers']))} worker "
        f"processes; latency {mode['latency_seconds']:g} s at each of "
        f"{', '.join(map(str, mode['rates']))} tasks/s with {mode['senders']} sender threads"
    )
    if mode.get("console_sizes"):
        small, large = mode["console_sizes"]
        sizes += (
            f"; console pages: median of {mode['console_gets']} GETs after "
            f"{mode['console_warmup']} at {small:,} and at {large:,} tasks"
        )
    lines += [
        "",
        f"- machine: {env['cpu_model']}, {env['cpus']} CPUs, {env['memory_gib']:.0f} GiB",
        f"- versions: {versions}",
        f"- PostgreSQL: {pg}",
        f"- Redis: {rd}",
        f"- sizes: {sizes}",
        f"- code: {meta['git']}; system order per run: "
        + "; ".join(" ".join(SYSTEM_LABELS[s] for s in order) for order in meta["orders"])
        + f" (seed {meta['seed']})",
    ]
    return "\n".join(lines) + "\n"


def footnotes(result: dict[str, Any], columns: list[str]) -> list[str]:
    """What the table's empty cells and the systems' durability are: the enqueue cell's
    variants, the systems without a batch API, every system's tables as they run, and
    which drains were checked for exactly-once execution."""
    meta = result["meta"]
    lines = [""]
    shared = [(variant, base) for variant, base in SHARED_PRODUCER.items() if variant in columns]
    if shared:
        lines.append(
            "- no enqueue rows of their own: "
            + ", ".join(
                f"{SYSTEM_LABELS[v]} (the producer of {SYSTEM_LABELS[b]})" for v, b in shared
            )
        )
    if "uslimited" in columns:
        lines.append(
            "- US/LIM: US's drain of 2 workers with its step under limits set far above the "
            "machine (`bench/limited_workflow.py`), so that only their bookkeeping costs; "
            "no enqueue rows and no other drain of its own"
        )
    no_bulk: dict[str, str] = {}
    unchecked: set[str] = set()
    checked: set[str] = set()
    for cell in result["cells"]:
        reason = cell.get("bulk", {}).get("none") if cell.get("cell") == "enqueue" else None
        if reason:
            no_bulk[cell["system"]] = reason
        if cell.get("cell") == "drain" and "exactly_once" in cell:
            if str(cell["exactly_once"]).startswith("not"):
                unchecked.add(cell["system"])
            else:
                checked.add(cell["system"])
    if no_bulk:
        lines.append(
            "- no bulk enqueue figure: "
            + "; ".join(f"{SYSTEM_LABELS[key]}, {why}" for key, why in no_bulk.items())
        )
    durability = meta.get("durability") or {}
    if durability.get("systems"):
        # Systems on the same tables (a variant and its base) share one entry.
        grouped: dict[str, tuple[str, list[str]]] = {}
        for key in columns:
            tables = durability["systems"].get(key)
            if tables:
                kinds = ", ".join(
                    f"{len(names)} {kind}" + (f" ({', '.join(names)})" if kind != "logged" else "")
                    for kind, names in sorted(tables.items())
                )
                grouped.setdefault(repr(sorted(tables.items())), (kinds, []))[1].append(
                    SYSTEM_LABELS[key]
                )
        parts = [f"{' and '.join(labels)} {kinds}" for kinds, labels in grouped.values()]
        lines.append(
            f"- durability as run: synchronous_commit={durability.get('synchronous_commit')} "
            "for every system (none sets its own); tables: "
            + "; ".join(parts)
            + ("; CELERY keeps its messages in Redis only" if "celery" in columns else "")
        )
    if checked or unchecked:
        text = "- exactly once: every drain's tasks checked in the database afterwards (each ran "
        text += "once, none left), for " + ", ".join(
            SYSTEM_LABELS[key] for key in SYSTEM_LABELS if key in checked
        )
        if unchecked:
            text += "; not for " + ", ".join(
                SYSTEM_LABELS[key] for key in SYSTEM_LABELS if key in unchecked
            )
            text += " (no record of its runs)"
        lines.append(text)
    return lines


def console_table(result: dict[str, Any]) -> list[str]:
    """The console cells: each page's median time at both sizes and their ratio (the
    median of the runs, with min and max when there are several)."""
    summary = result["summary"]
    mode = result["meta"]["mode"]
    if not mode.get("console_sizes") or not any(
        cell["cell"] == "console" for cell in result["cells"]
    ):
        return []
    small, large = mode["console_sizes"]
    ms = Metric("", "", "ms", False, _one)
    ratio = Metric("", "", "", False, lambda value: f"{value:.2f}{TIMES}")
    lines = [
        "",
        f"| console page, US (median of {mode['console_gets']} GETs, ms) | {small:,} tasks "
        f"| {large:,} tasks | {large:,} ÷ {small:,} |",
        "|---|--:|--:|--:|",
    ]
    for page, title in CONSOLE_PAGES.items():
        row = [title]
        for key, metric in (("small", ms), ("large", ms), ("ratio", ratio)):
            row.append(_cell(summary.get(f"console_{page}_{key}", {}).get("us"), metric))
        lines.append("| " + " | ".join(row) + " |")
    # Where a page missed its bound: the slowest query at the large size (last run).
    notes = []
    for page, title in CONSOLE_PAGES.items():
        ratio_summary = summary.get(f"console_{page}_ratio", {}).get("us")
        measured = [
            cell
            for cell in result["cells"]
            if cell["cell"] == "console" and cell.get("page") == page and "sizes" in cell
        ]
        if not ratio_summary or ratio_summary["median"] <= CONSOLE_BOUND or not measured:
            continue
        at_large = measured[-1]["sizes"].get(str(large), {})
        slowest = at_large.get("slowest") or [{}]
        sql = " ".join(str(slowest[0].get("sql", "?")).split())
        notes.append(
            f"- {title} at {large:,} tasks: {at_large.get('queries', '?')} queries, the slowest "
            f"{slowest[0].get('ms', 0):.0f} ms: `{sql[:240]}{'…' if len(sql) > 240 else ''}` "
            "(its EXPLAIN ANALYZE is in the results JSON)"
        )
    if notes:
        lines += ["", *notes]
    return lines


def scale_tables(result: dict[str, Any]) -> list[str]:
    """The scale cells, a row per system: the burn-down's rates over time with its tables'
    growth and autovacuum, and the drain with a snapshot held open beside the drain as is
    (one measurement each: the cells run once per harness run)."""
    cells = [cell for cell in result["cells"] if cell["cell"] in SCALE_CELLS]
    lines: list[str] = []
    burns = [cell for cell in cells if cell["cell"] == BURNDOWN]
    if burns:
        n, window = burns[0].get("total", 0), burns[0].get("window_s", 0)
        lines += [
            "",
            f"| burn-down of {n:,} pre-filled tasks, 2 worker processes | tasks/s | first 10% "
            f"| last 10% | last ÷ first | worst {window:g} s window | time | tables and indexes, "
            "start → end | dead rows at most | autovacuum during it |",
            "|---|--:|--:|--:|--:|--:|--:|--:|--:|---|",
        ]
    for cell in burns:
        row = [SYSTEM_LABELS.get(cell["system"], cell["system"])]
        if "throughput" not in cell:
            lines.append("| " + " | ".join([*row, *[DASH] * 9]) + " |")
            continue
        capped = f" (capped: {cell['done']:,} of {cell['total']:,})" if cell.get("capped") else ""
        sizes = cell["sizes"]
        row += [
            _int(cell["throughput"]) + capped,
            *(
                DASH if cell.get(key) is None else _int(cell[key])
                for key in ("first_10pct_rate", "last_10pct_rate")
            ),
            DASH
            if cell.get("last_over_first") is None
            else f"{cell['last_over_first']:.2f}{TIMES}",
            DASH if cell.get("worst_window_rate") is None else _int(cell["worst_window_rate"]),
            f"{cell['elapsed']:,.0f} s" if cell["elapsed"] >= 10 else f"{cell['elapsed']:.1f} s",
            f"{_bytes(sizes['start_bytes'])} → {_bytes(sizes['end_bytes'])}",
            _int(cell["dead_rows_max"]),
            _autovacuum(cell["autovacuum"]),
        ]
        lines.append("| " + " | ".join(row) + " |")

    held = [cell for cell in cells if cell["cell"] == HELD_SNAPSHOT]
    if held:
        n = held[0].get("total", 0)
        lines += [
            "",
            f"| drain of {n:,} pre-filled tasks, 2 worker processes (tasks/s) | as is "
            "| a snapshot held open | held ÷ as is | dead rows left, as is → held |",
            "|---|--:|--:|--:|--:|",
        ]
    for cell in held:
        row = [SYSTEM_LABELS.get(cell["system"], cell["system"])]
        if "throughput" not in cell:
            lines.append("| " + " | ".join([*row, *[DASH] * 4]) + " |")
            continue
        row += [
            _int(cell["baseline_throughput"]),
            _int(cell["throughput"]) + (" (capped)" if cell.get("capped") else ""),
            DASH if cell.get("ratio") is None else f"{cell['ratio']:.2f}{TIMES}",
            f"{_int(cell['baseline']['dead_rows_end'])} → {_int(cell['held']['dead_rows_end'])}",
        ]
        lines.append("| " + " | ".join(row) + " |")
    return lines


def _bytes(value: float) -> str:
    if value >= 1 << 30:
        return f"{value / (1 << 30):.2f} GiB"
    return f"{value / (1 << 20):,.0f} MiB" if value >= 10 << 20 else f"{value / (1 << 20):.1f} MiB"


def _autovacuum(vacuum: dict[str, Any]) -> str:
    """Whether autovacuum ran on the system's tables during the burn-down, and where."""
    if not vacuum.get("enabled", True):
        return "no: off on the server"
    if not vacuum.get("ran"):
        return "no"
    finished = vacuum.get("finished", {})
    where = [f"{table} {TIMES}{count}" for table, count in finished.items()]
    where += [f"{t} (running)" for t in vacuum.get("seen_running", []) if t not in finished]
    return "yes: " + ", ".join(where)


def update_docs(path: Path, table: str, source: str) -> None:
    """Put ``table`` between the markers of ``path``, leaving the rest as written."""
    note = f"<!-- generated by `make bench` from {source}; edit outside the markers -->"
    block = f"{START_MARK}\n{note}\n\n{table}\n{END_MARK}"
    text = path.read_text() if path.exists() else "# Performance\n\n"
    pattern = re.compile(re.escape(START_MARK) + r".*?" + re.escape(END_MARK), re.DOTALL)
    if pattern.search(text):
        text = pattern.sub(lambda _: block, text, count=1)
    else:
        text = text.rstrip("\n") + "\n\n" + block + "\n"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
