"""The benchmark's scale cells, the parts that need no server: the burn-down's rates over
time, whether autovacuum ran, which systems the cells run for, and their two tables."""

from __future__ import annotations

from typing import Any

import pytest

from bench import cells, report, scale_cells
from tests.bench_support import FULL_MODE, bench_result

MODE = FULL_MODE
PGQ = report.SYSTEM_LABELS["pgq"]
X, D = report.TIMES, report.DASH
OFF = {"enabled": False, "ran": False, "finished": {}, "seen_running": []}


def stats(dead: int, size: int, autovacuums: int = 0, vacuums: Any = ()) -> dict[str, Any]:
    table = {
        "table_bytes": size,
        "index_bytes": 0,
        "live": 0,
        "dead": dead,
        "vacuums": 0,
        "autovacuums": autovacuums,
        "autoanalyzes": 0,
        "last_autovacuum": None,
    }
    return {"tables": {"jobs": table}, "vacuums": list(vacuums)}


def burndown(system: str, **more: Any) -> dict[str, Any]:
    cell = {
        "run": 3,
        "system": system,
        "cell": report.BURNDOWN,
        "workers": 2,
        "total": 1_000_000,
        "done": 1_000_000,
        "window_s": 5.0,
        "elapsed": 250.0,
        "throughput": 4_000.0,
        "first_10pct_rate": 5_000.0,
        "last_10pct_rate": 3_000.0,
        "last_over_first": 0.6,
        "worst_window_rate": 1_234.0,
        "sizes": {"start_bytes": 800 << 20, "end_bytes": 5 << 29},
        "dead_rows_max": 4_000_000,
        "autovacuum": OFF,
    }
    return {**cell, **more}


def held(system: str, baseline: float, throughput: float) -> dict[str, Any]:
    return {
        "run": 3,
        "system": system,
        "cell": report.HELD_SNAPSHOT,
        "workers": 2,
        "total": 10_000,
        "baseline_throughput": baseline,
        "throughput": throughput,
        "ratio": throughput / baseline,
        "baseline": {"dead_rows_end": 40_000},
        "held": {"dead_rows_end": 50_000},
    }


def result(cells: list[dict[str, Any]]) -> dict[str, Any]:
    return bench_result(cells, MODE, ["us", "pgq"], duration_s=600.0)


def test_rates_over_windows_tenths_and_the_worst_full_window() -> None:
    # 1,000 tasks: 400 in the first 2 s window, 100 in the second, 400, then the last 100
    # in a 0.5 s window too short to count as the worst.
    points = [(0.0, 0), (2.0, 400), (4.0, 500), (6.0, 900), (6.5, 1_000)]
    rates = scale_cells.rates(points, window=2.0)
    assert [w["rate"] for w in rates["windows"]] == [200.0, 50.0, 200.0, 200.0]
    # 100 tasks (10%) were done at 0.5 s; 900 (90%) at 6.0 s, 0.5 s before the end.
    assert rates["first_10pct_rate"] == pytest.approx(200.0)
    assert rates["last_10pct_rate"] == pytest.approx(200.0)
    assert rates["last_over_first"] == pytest.approx(1.0)
    assert rates["worst_window_rate"] == 50.0
    assert rates["worst_window_at_s"] == 2.0


def test_rates_of_a_drain_shorter_than_half_a_window() -> None:
    rates = scale_cells.rates([(0.0, 0), (1.0, 1_000)], window=5.0)
    assert rates["first_10pct_rate"] == pytest.approx(1_000.0)
    assert rates["worst_window_rate"] is None


def test_autovacuum_is_seen_running_or_by_its_count() -> None:
    settings = {"autovacuum": "on"}
    before = stats(0, 1, autovacuums=2)
    running = {"table": "jobs", "phase": "scanning heap", "autovacuum": True}
    manual = {"table": "jobs", "phase": "scanning heap", "autovacuum": False}
    seen = scale_cells.autovacuum(settings, before, [stats(9, 1, 2, [running]), stats(0, 1, 2)])
    assert seen["ran"] and seen["seen_running"] == ["jobs"] and seen["finished"] == {}
    counted = scale_cells.autovacuum(settings, before, [stats(9, 1, 2, [manual]), stats(0, 1, 3)])
    assert counted["ran"] and counted["finished"] == {"jobs": 1}
    assert not scale_cells.autovacuum(settings, before, [stats(9, 1, 2)])["ran"]
    assert not scale_cells.autovacuum({"autovacuum": "off"}, before, [])["enabled"]


def test_the_scale_cells_run_for_us_and_pgq_unless_systems_are_named() -> None:
    everything = ["us", "procfile", "celery", "pgq", "pgq100"]
    assert scale_cells.select(everything, everything) == ["us", "pgq"]
    assert scale_cells.select(["celery", "us"], everything) == ["celery", "us"]


def test_a_run_of_the_scale_cells_alone_shows_their_two_tables_only() -> None:
    ran = {
        "enabled": True,
        "ran": True,
        "finished": {"pgqueuer": 2},
        "seen_running": ["pgqueuer", "pgqueuer_log"],
    }
    cells = [
        burndown("us"),
        held("us", 4_000.0, 3_000.0),
        burndown("pgq", autovacuum=ran, capped=True, done=900_000),
        held("pgq", 5_000.0, 2_500.0),
    ]
    text = report.markdown(result(cells))
    lines = text.splitlines()
    assert not any(line.startswith("| metric |") for line in lines)
    assert not any(line.startswith("| target") for line in lines)
    assert any(line.startswith("| burn-down of 1,000,000 pre-filled tasks") for line in lines)
    assert "| worst 5 s window |" in text
    assert (
        f"| US | 4,000 | 5,000 | 3,000 | 0.60{X} | 1,234 | 250 s | 800 MiB → 2.50 GiB "
        "| 4,000,000 | no: off on the server |"
    ) in lines
    pgq = next(line for line in lines if line.startswith(f"| {PGQ} | 4,000"))
    assert "(capped: 900,000 of 1,000,000)" in pgq
    assert pgq.endswith(f"| yes: pgqueuer {X}2, pgqueuer_log (running) |")
    assert f"| US | 4,000 | 3,000 | 0.75{X} | 40,000 → 50,000 |" in lines
    assert f"| {PGQ} | 5,000 | 2,500 | 0.50{X} | 40,000 → 50,000 |" in lines


def test_a_failed_scale_cell_keeps_its_row_and_is_named_among_the_problems() -> None:
    failed = {
        "run": 3,
        "system": "us",
        "cell": report.BURNDOWN,
        "workers": 2,
        "total": 1_000_000,
        "window_s": 5.0,
        "error": "Traceback …\nRuntimeError: a worker exited during the drain",
    }
    text = report.markdown(result([failed, held("us", 4_000.0, 3_000.0)]))
    lines = text.splitlines()
    assert any(line.startswith("| burn-down of 1,000,000 pre-filled") for line in lines)
    assert "| US |" + f" {D} |" * 9 in lines
    assert "RuntimeError: a worker exited during the drain" in text


def test_scale_cells_beside_the_system_cells_leave_their_tables_as_they_were() -> None:
    drain = {"run": 1, "system": "us", "cell": "drain", "workers": 2, "throughput": 8_000.0}
    text = report.markdown(result([drain, burndown("us")]))
    assert any(line.startswith("| metric |") for line in text.splitlines())
    assert any(line.startswith("| target") for line in text.splitlines())
    assert "| burn-down of 1,000,000" in text


def test_a_cell_run_once_is_skipped_measured_or_kept_failed_and_the_run_goes_on(
    capsys: pytest.CaptureFixture[str],
) -> None:
    resets: list[str] = []

    def brief(cell: dict[str, Any]) -> str:
        return "ERROR" if cell.get("error") else f"{cell['rate']}/s"

    def failing() -> dict[str, Any]:
        raise RuntimeError("the workers never came up")

    skipped = cells.measure_once(
        {"cell": "burndown"},
        "scale US burndown",
        skipped="time budget",
        measure=lambda: {"rate": 1.0},
        reset=lambda: resets.append("skipped"),
        brief=brief,
    )
    measured = cells.measure_once(
        {"cell": "burndown"},
        "scale US burndown",
        skipped=None,
        measure=lambda: {"rate": 5898},
        reset=lambda: resets.append("measured"),
        brief=brief,
    )
    failed = cells.measure_once(
        {"cell": "burndown"},
        "scale PGQ burndown",
        skipped=None,
        measure=failing,
        reset=lambda: resets.append("failed"),
        brief=brief,
    )

    assert skipped == {"cell": "burndown", "skipped": "time budget"}
    assert measured["rate"] == 5898 and "error" not in measured and measured["seconds"] >= 0
    assert "RuntimeError: the workers never came up" in failed["error"]
    assert resets == ["failed"]  # only a failure resets its system
    printed = capsys.readouterr().out.splitlines()
    assert printed[0] == "scale US burndown: skipped (time budget)"
    assert printed[1].startswith("scale US burndown: 5898/s (")
    assert printed[2].startswith("scale PGQ burndown: ERROR (")
