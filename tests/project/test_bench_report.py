"""The benchmark's report and harness logic that needs no server: a peer compared at its
best over its variants, the targets, the table's columns and notes, and the systems whose
package is missing (their cells skipped, the harness going on)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from bench import cli, report
from bench.systems import Ctx, NotExactlyOnce, System
from tests.bench_support import bench_result

MODE: dict[str, Any] = {
    "name": "quick",
    "runs": 1,
    "single_n": 500,
    "bulk_n": 5_000,
    "batch": 1_000,
    "drain_n": 1_000,
    "workers": [1, 2, 4],
    "rates": [50, 200, 500],
    "latency_seconds": 3.0,
    "senders": 4,
    "console_sizes": [2_000, 20_000],
    "console_gets": 20,
    "console_warmup": 5,
}


def drain(system: str, workers: int, throughput: float, **more: Any) -> dict[str, Any]:
    return {
        "run": 1,
        "system": system,
        "cell": "drain",
        "workers": workers,
        "throughput": throughput,
        **more,
    }


def enqueue(system: str, single: float, bulk: float | None) -> dict[str, Any]:
    return {
        "run": 1,
        "system": system,
        "cell": "enqueue",
        "single": {"rate": single},
        "bulk": {"rate": bulk} if bulk is not None else {"none": "no batch enqueue"},
    }


def result(cells: list[dict[str, Any]], systems: list[str], **meta: Any) -> dict[str, Any]:
    return bench_result(cells, MODE, systems, **meta)


def target(out: dict[str, Any], text: str) -> dict[str, Any]:
    matches: list[dict[str, Any]] = [t for t in out["targets"] if t["target"] == text]
    assert len(matches) == 1, text
    return matches[0]


def test_each_family_is_compared_at_its_best_metric_by_metric() -> None:
    cells = [
        drain("pgq", 2, 2_000.0, wal_bytes_per_step=1_800.0, rss_mib=50.0),
        drain("pgq100", 2, 4_000.0, wal_bytes_per_step=1_900.0, rss_mib=52.0),
        drain("proc", 2, 700.0, wal_bytes_per_step=2_000.0),
        drain("proc10", 2, 900.0, wal_bytes_per_step=1_950.0),
        enqueue("pgq", 500.0, 26_000.0),
    ]
    summary = report.summarize(report.collect(cells))
    report.add_best(summary, MODE)

    # Throughput: the higher; WAL and memory: the lower, whichever variant that is.
    assert summary["drain_c2"][report.BEST_PGQ]["median"] == 4_000.0
    assert summary["drain_c2"][report.BEST_PGQ]["of"] == "pgq100"
    assert summary["wal_per_step"][report.BEST_PGQ]["median"] == 1_800.0
    assert summary["wal_per_step"][report.BEST_PGQ]["of"] == "pgq"
    assert summary["rss_mib"][report.BEST_PGQ]["of"] == "pgq"
    assert summary["drain_c2"][report.BEST_PROC]["of"] == "proc10"
    assert summary["wal_per_step"][report.BEST_PROC]["of"] == "proc10"
    # A metric only one variant measured (the enqueue cell is PGQ b10's) is that one's.
    assert summary["enqueue_single"][report.BEST_PGQ]["of"] == "pgq"
    # No family's best where none of its variants measured the metric.
    assert report.BEST_PROC not in summary["enqueue_single"]


def test_one_variant_alone_is_its_family_at_its_best() -> None:
    summary = report.summarize(report.collect([drain("proc10", 2, 900.0)]))
    report.add_best(summary, MODE)
    assert summary["drain_c2"][report.BEST_PROC] == {
        **summary["drain_c2"]["proc10"],
        "of": "proc10",
    }


def test_the_targets_of_this_round() -> None:
    texts = {t.text: (t.metric, t.other, t.bound, t.at_least) for t in report.TARGETS}
    times = report.TIMES
    # PgQueuer at each batch size, as the table sets them.
    assert texts[f"drain, 2 workers: US ≥ 1.0{times} PGQ b100"] == ("drain_c2", "pgq100", 1.0, True)
    assert texts[f"drain, 2 workers: US ≥ 2.5{times} PGQ b10"] == ("drain_c2", "pgq", 2.5, True)
    for other, name in (("dbos", "DBOS"), ("dtdb", "DTDB"), ("celery", "CELERY")):
        assert texts[f"drain, 2 workers: US ≥ 10{times} {name}"] == ("drain_c2", other, 10.0, True)
    assert texts[f"drain, 2 workers: US ≥ 10{times} PROC (better)"][1:] == (
        report.BEST_PROC,
        10.0,
        True,
    )
    assert texts[f"single enqueue: US ≥ 1{times} PGQ"][1:] == (report.BEST_PGQ, 1.0, True)
    assert texts[f"bulk enqueue: US ≥ 0.8{times} PGQ"][1:] == (report.BEST_PGQ, 0.8, True)
    assert texts[f"CPU per executed step, server and workers: US ≤ 1.2{times} PGQ (better)"] == (
        "cpu_per_step",
        report.BEST_PGQ,
        1.2,
        False,
    )
    assert texts[f"WAL per executed step: US ≤ 1.3{times} PGQ (better)"] == (
        "wal_per_step",
        report.BEST_PGQ,
        1.3,
        False,
    )
    # The limits' bookkeeping, in a drain whose limits never bind, costs at most 10%.
    [limited] = [t for t in report.TARGETS if t.ours == "uslimited"]
    assert (limited.metric, limited.other, limited.bound, limited.at_least) == (
        "drain_c2",
        "us",
        0.9,
        True,
    )
    assert texts["commits per executed step: US ≤ 2"][1:] == (None, 2.0, False)
    assert texts["rows written per task enqueued: US ≤ 3"] == ("enqueue_rows", None, 3.0, False)
    # Rule 11's four row versions: the executions' own, rows written on a clock apart.
    assert texts["rows the executions write per step (rows written on a clock apart): US ≤ 4"] == (
        "execution_row_writes_per_step",
        None,
        4.0,
        False,
    )
    # The older peer targets are gone: none against RAW, none for enqueue or WAL vs PROC.
    assert not [t for t in report.TARGETS if t.other == "raw"]
    assert not [
        t
        for t in report.TARGETS
        if t.other == report.BEST_PROC
        and t.metric in {"enqueue_single", "enqueue_bulk", "wal_per_step"}
    ]


def test_the_drain_is_held_against_each_pgq_batch_size_and_the_wal_against_its_better() -> None:
    out = result(
        [
            drain("us", 2, 6_000.0, wal_bytes_per_step=4_000.0, commits_per_step=0.04),
            drain("pgq", 2, 2_000.0, wal_bytes_per_step=1_700.0),
            drain("pgq100", 2, 4_000.0, wal_bytes_per_step=1_800.0),
            drain("dbos", 2, 500.0),
            drain("dtdb", 2, 700.0),
        ],
        ["us", "pgq", "pgq100", "dbos", "dtdb"],
    )
    times = report.TIMES
    b100 = target(out, f"drain, 2 workers: US ≥ 1.0{times} PGQ b100")
    assert b100["value"] == pytest.approx(1.5)
    assert b100["ok"] is True
    b10 = target(out, f"drain, 2 workers: US ≥ 2.5{times} PGQ b10")
    assert b10["value"] == pytest.approx(3.0)
    assert b10["ok"] is True
    assert target(out, f"drain, 2 workers: US ≥ 10{times} DBOS")["ok"] is True
    dtdb = target(out, f"drain, 2 workers: US ≥ 10{times} DTDB")
    assert dtdb["value"] == pytest.approx(6_000 / 700)
    assert dtdb["ok"] is False
    wal = target(out, f"WAL per executed step: US ≤ 1.3{times} PGQ (better)")
    assert wal["value"] == pytest.approx(4_000 / 1_700)
    assert wal["ok"] is False
    assert target(out, "commits per executed step: US ≤ 2")["ok"] is True
    # Nothing measured against CELERY in this run: unknown, not failed.
    assert target(out, f"drain, 2 workers: US ≥ 10{times} CELERY")["ok"] is None


def test_the_table_has_a_column_per_system_run_and_says_what_its_dashes_mean() -> None:
    cells = [
        enqueue("us", 1_200.0, 16_000.0),
        enqueue("pgq", 2_000.0, 45_000.0),
        enqueue("dbos", 800.0, None),
        drain("us", 2, 6_000.0, exactly_once="tasks = 1000"),
        drain("pgq", 2, 2_000.0, exactly_once="jobs enqueued = 1000"),
        drain("pgq100", 2, 4_000.0, exactly_once="jobs enqueued = 1000"),
        drain("dbos", 2, 250.0, exactly_once="workflows = 1000"),
        drain("celery", 2, 1_200.0, exactly_once="not checked"),
    ]
    durability = {
        "synchronous_commit": "on",
        "systems": {
            "us": {"logged": ["tasks_app_task"]},
            "pgq": {"logged": ["pgqueuer", "pgqueuer_log", "pgqueuer_statistics"]},
            "pgq100": {"logged": ["pgqueuer", "pgqueuer_log", "pgqueuer_statistics"]},
            "dbos": {"logged": ["dbos.workflow_status"], "unlogged": ["dbos.streams"]},
        },
    }
    systems = ["us", "celery", "pgq", "pgq100", "dbos"]
    times = report.TIMES
    table = report.markdown(result(cells, systems, durability=durability))
    header = next(line for line in table.splitlines() if line.startswith("| metric |"))
    assert header == (
        "| metric | US | CELERY | PGQ b10 | PGQ b100 | DBOS | US/CELERY | US/PGQ (better) |"
    )
    drain_row = next(line for line in table.splitlines() if "2 worker processes" in line)
    # US ÷ the better PGQ (4,000/s with batches of 100).
    assert drain_row.endswith(f"| 5.00{times} | 1.50{times} |")
    bulk_row = next(line for line in table.splitlines() if line.startswith("| enqueue, bulk"))
    # PGQ b100 shares b10's producer; DBOS has no batch API.
    assert f"| 45,000 | {report.DASH} | {report.DASH} |" in bulk_row
    assert "- no enqueue rows of their own: PGQ b100 (the producer of PGQ b10)" in table
    assert "- no bulk enqueue figure: DBOS, no batch enqueue" in table
    assert "synchronous_commit=on for every system" in table
    assert "PGQ b10 and PGQ b100 3 logged;" in table
    assert "DBOS 1 logged, 1 unlogged (dbos.streams)" in table
    assert "CELERY keeps its messages in Redis only" in table
    assert "for US, PGQ b10, PGQ b100, DBOS; not for CELERY (no record of its runs)" in table
    # Rows of cells nobody ran (no latency cell here) are left out.
    assert "| enqueue→start p50" not in table


def test_a_system_that_could_not_be_installed_is_one_line_of_problems() -> None:
    reason = "not installed: No module named 'dbos'"
    cells = [
        drain("us", 2, 6_000.0),
        *(
            {"run": 1, "system": "dbos", "cell": name, "skipped": reason}
            for name in ("enqueue", "drain", "latency")
        ),
    ]
    table = report.markdown(result(cells, ["us", "dbos"]))
    assert table.count(reason) == 1
    assert f"- DBOS: every cell skipped, {reason}" in table


class _Broken(System):
    key = "broken"
    label = "BROKEN"
    install_key = "shared"

    def install(self) -> None:
        raise ModuleNotFoundError("No module named 'broken_peer'")


class _BrokenVariant(_Broken):
    key = "broken2"
    label = "BROKEN2"


class _Fine(System):
    key = "fine"
    label = "FINE"
    installed = 0

    def install(self) -> None:
        type(self).installed += 1


def test_a_package_that_fails_to_import_skips_its_systems(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(
        cli,
        "SYSTEMS",
        {"broken": _Broken, "broken2": _BrokenVariant, "fine": _Fine},
    )
    ctx = Ctx(
        dsn="postgres://nobody@127.0.0.1:1/none",
        admin_dsn="postgres://nobody@127.0.0.1:1/postgres",
        db_name="none",
        redis_url="redis://127.0.0.1:1/0",
        live_prefix="x:",
        stage_prefix="y:",
        work_dir=tmp_path,
        env={},
    )
    unavailable = cli.install_systems(ctx, ["broken", "broken2", "fine"])
    assert unavailable == {
        "broken": "not installed: No module named 'broken_peer'",
        "broken2": "not installed: No module named 'broken_peer'",
    }
    assert _Fine.installed == 1


def test_the_default_run_and_the_systems_only_run_when_named() -> None:
    assert cli.ORDER == [
        "us",
        "procfile",
        "uslimited",
        "celery",
        "proc10",
        "pgq",
        "pgq100",
        "dbos",
        "dtdb",
    ]
    assert {"proc", "raw"} <= set(cli.SYSTEMS) - set(cli.ORDER)
    assert set(cli.SYSTEMS) <= set(report.SYSTEM_LABELS)
    options = cli.parse_args(["--systems", "us,pgq,pgq100", "--cells", "drain"])
    assert options.systems == ["us", "pgq", "pgq100"]
    assert options.partial


class _Row:
    """A connection whose one query returns ``row``."""

    def __init__(self, row: tuple[int, ...]) -> None:
        self.row = row

    def execute(self, sql: str) -> _Row:
        return self

    def fetchone(self) -> tuple[int, ...]:
        return self.row


def test_a_task_run_twice_or_not_at_all_fails_the_drain(tmp_path: Path) -> None:
    system = _Fine.__new__(_Fine)
    checks = {"tasks": 1_000, "succeeded": 1_000, "claimed more than once": 0}
    ok = system._expect(_Row((1_000, 1_000, 0)), "SELECT", checks)  # type: ignore[arg-type]
    assert ok == "tasks = 1000; succeeded = 1000; claimed more than once = 0"
    with pytest.raises(NotExactlyOnce, match="succeeded: 999, expected 1000; claimed more"):
        system._expect(_Row((1_000, 999, 1)), "SELECT", checks)  # type: ignore[arg-type]


def test_cpu_per_step_is_the_servers_and_the_workers_together() -> None:
    cells = [
        drain("us", 2, 9000.0, db_cpu_us_per_step=90.0, worker_cpu_us_per_step=60.0),
        drain("pgq100", 2, 19000.0, db_cpu_us_per_step=50.0, worker_cpu_us_per_step=40.0),
        # A run whose workers' CPU could not be read has no total.
        drain("pgq", 2, 6000.0, db_cpu_us_per_step=140.0),
    ]
    summary = report.summarize(report.collect(cells))
    report.add_best(summary, MODE)

    assert summary["cpu_per_step"]["us"]["median"] == 150.0
    assert summary["cpu_per_step"]["pgq_best"]["median"] == 90.0
    assert "pgq" not in summary["cpu_per_step"]
    out = report.evaluate(summary, MODE)
    row = next(r for r in out if r["metric"] == "cpu_per_step")
    assert row["value"] == pytest.approx(150.0 / 90.0)
    assert row["ok"] is False
