"""The benchmark's horizon and faults cells, the parts that need no server: a phase's
figures from its samples and the producer's records, the time to recover from a fault, the
producer's schedule, the counts of things done twice, the workers' sockets, and the
report's tables and targets."""

from __future__ import annotations

import socket
from typing import Any

import pytest

from bench import cli, fake_remote, horizon_cells, horizon_phases, report
from bench.disturbances import socket_ports
from bench.horizon_phases import Window
from bench.horizon_report import FAULTS, HORIZON
from bench.phase_producer import due_times
from tests.bench_support import FULL_MODE, bench_result

MODE = FULL_MODE
US, PROC, PGQ = (report.SYSTEM_LABELS[key] for key in ("us", "proc10", "pgq"))
D = report.DASH
LOST_TARGET = "jobs lost (faults cell): US = 0"
TWICE_TARGET = "effects applied twice after repeated kills (faults cell): US = 0"


def sample(t: float, done: int, depth: int, dead: int = 0, **more: Any) -> dict[str, Any]:
    return {"t": t, "done": done, "failed": 0, "depth": depth, "dead": dead, **more}


def phase(name: str, start: float, seconds: float, **more: Any) -> dict[str, Any]:
    figures = {
        "name": name,
        "start": start,
        "seconds": seconds,
        "rate": 100,
        "sent": int(100 * seconds),
        "completion_rate": 99.6,
        "p50_ms": 4.2,
        "p95_ms": 9.0,
        "p99_ms": 123.4,
        "never_started": 0,
        "max_depth": 12,
        "max_dead": 4_321,
    }
    return {**figures, **more}


def horizon_cell(system: str, **more: Any) -> dict[str, Any]:
    cell = {
        "run": 3,
        "system": system,
        "cell": HORIZON,
        "workers": 2,
        "rate": 100,
        "settle_limit_s": 30,
        "lost": 0,
        "phases": [
            phase("steady", 0, 20),
            phase("idle_connections", 20, 15, wanted=300, held=44),
            phase("high_load", 35, 10, rate=500, sent=4_000),
            phase("recovery", 45, 20, since=45.0, recovered_s=3.25),
        ],
    }
    return {**cell, **more}


def faults_cell(system: str, **more: Any) -> dict[str, Any]:
    cell = {
        "run": 3,
        "system": system,
        "cell": FAULTS,
        "workers": 2,
        "rate": 50,
        "lease_s": 10,
        "kills": 3,
        "settle_limit_s": 30,
        "lost": 0,
        "failed": 0,
        "ran_more_than_once": 35,
        "effects_twice": 0,
        "worker_kills": 3,
        "worker_restarts": 1,
        "producer": {"error_count": 17},
        "phases": [
            phase("baseline", 0, 10),
            phase("kill_1", 10, 20, since=10.0, recovered_s=None),
            phase("pg_restart", 30, 20, since=30.5, recovered_s=4.0),
            phase(
                "terminations",
                50,
                25,
                since=62.0,
                recovered_s=1.5,
                terminated=12,
                every_s=1.0,
                active_s=12,
            ),
        ],
    }
    return {**cell, **more}


def result(cells: list[dict[str, Any]], systems: list[str] | None = None) -> dict[str, Any]:
    return bench_result(cells, MODE, systems or ["us", "proc10", "pgq"], duration_s=900.0)


def target(out: dict[str, Any], text: str) -> dict[str, Any]:
    matches: list[dict[str, Any]] = [t for t in out["targets"] if t["target"] == text]
    assert len(matches) == 1, text
    return matches[0]


# --- the arithmetic ---------------------------------------------------------------------


def test_the_completion_rate_runs_from_the_sample_before_the_phase_to_its_last() -> None:
    samples = [sample(-0.1, 0, 0), sample(1.0, 90, 1), sample(2.0, 200, 1), sample(3.0, 300, 1)]
    assert horizon_phases.completion_rate(samples, 0.0, 2.0) == pytest.approx(200 / 2.1)
    # With no sample before it, from its first.
    assert horizon_phases.completion_rate(samples[1:], 0.0, 3.0) == pytest.approx(105.0)
    assert horizon_phases.completion_rate(samples, 5.0, 6.0) is None


def test_samples_taken_while_the_database_was_away_count_for_nothing() -> None:
    samples = [sample(0.0, 0, 0), {"t": 1.0, "error": "refused"}, sample(2.0, 100, 50)]
    assert horizon_phases.completion_rate(samples, 0.0, 2.0) == pytest.approx(50.0)
    assert horizon_phases.highest(horizon_phases.within(samples, 0, 2), "depth") == 50


def test_pickup_counts_the_jobs_due_in_the_phase_from_their_due_time() -> None:
    # id, due, sent; starts on the same clock. Job 4 never started; job 5 was due later.
    records = [(1, 0.0, 0.001), (2, 0.5, 0.5), (3, 0.9, 0.95), (4, 0.95, 0.96), (5, 1.0, 1.0)]
    starts = {1: 0.004, 2: 0.51, 3: 1.0, 5: 1.002}
    out = horizon_phases.pickup(records, starts, 0.0, 1.0)
    assert (out["sent"], out["started"], out["never_started"]) == (4, 3, 1)
    assert out["p50_ms"] == pytest.approx(10.0)
    assert out["p99_ms"] == pytest.approx(100.0)
    assert out["send_lag_p99_ms"] == pytest.approx(50.0)
    assert horizon_phases.pickup(records, starts, 5.0, 6.0)["p50_ms"] is None


def test_a_system_is_back_once_the_backlog_is_done_the_depth_low_and_the_rate_met() -> None:
    level = horizon_phases.depth_level(steady_max_depth=5, rate=100)
    assert level == 15  # steady's highest plus a tenth of a second's production
    samples = [
        sample(9.0, 900, 5),
        sample(10.0, 1_000, 4, backlog=40),  # the fault
        sample(11.0, 1_000, 140, backlog=40),  # stalled
        sample(12.0, 1_150, 10, backlog=2),  # fast again, two jobs of the dead worker left
        sample(13.0, 1_260, 8, backlog=0),  # back: 110/s over the last second
        sample(14.0, 1_360, 6, backlog=0),
    ]
    assert horizon_phases.recovery_seconds(
        samples, 10.0, 20.0, rate=100, level=level, window=1.0
    ) == pytest.approx(3.0)
    # Not back by the phase's end.
    assert (
        horizon_phases.recovery_seconds(samples, 10.0, 12.5, rate=100, level=level, window=1.0)
        is None
    )
    # A depth still above steady's level keeps it from being back.
    deep = [*samples[:4], sample(13.0, 1_260, 40, backlog=0), sample(14.0, 1_370, 9, backlog=0)]
    assert horizon_phases.recovery_seconds(
        deep, 10.0, 20.0, rate=100, level=level, window=1.0
    ) == pytest.approx(4.0)


def test_the_rate_that_says_back_is_measured_after_the_fault() -> None:
    samples = [
        sample(9.0, 900, 2),
        sample(10.0, 1_000, 2, backlog=0),  # right after the kill: the rate is from before it
        sample(11.0, 1_000, 30, backlog=0),
        sample(12.0, 1_150, 3, backlog=0),
    ]
    assert horizon_phases.recovery_seconds(
        samples, 10.0, 20.0, rate=100, level=15, window=1.0
    ) == pytest.approx(2.0)


def test_a_restart_is_back_only_once_the_server_answered_and_the_rate_followed() -> None:
    samples = [
        sample(10.0, 900, 2, backlog=3),  # the restart begins
        {"t": 11.0, "error": "the database system is shutting down"},
        {"t": 12.0, "error": "connection refused"},
        sample(13.0, 1_200, 4, backlog=0),  # back up at 13 (what finished before it counted)
        sample(14.0, 1_300, 5, backlog=0),
        sample(15.0, 1_400, 3, backlog=0),
    ]
    back = horizon_phases.recovery_seconds(
        samples, 10.0, 20.0, rate=100, level=15, window=1.0, after=13.0
    )
    assert back == pytest.approx(4.0)  # from the restart's start


def test_a_rate_below_the_producers_is_not_back_even_with_an_empty_queue() -> None:
    samples = [sample(0.0, 0, 0), sample(1.0, 50, 0), sample(2.0, 100, 0), sample(3.0, 200, 0)]
    # 50/s for two seconds: below 90% of 100/s; the third second's 100/s is.
    assert horizon_phases.recovery_seconds(
        samples, 0.0, 3.0, rate=100, level=10, window=1.0
    ) == pytest.approx(3.0)
    assert horizon_phases.trailing_rate(samples, 3, 2.0) == pytest.approx(75.0)
    assert horizon_phases.trailing_rate(samples, 0, 1.0) is None


def test_a_phase_summary_names_its_rate_figures_and_failed_sends() -> None:
    samples = [sample(0.0, 0, 1, 10), sample(1.0, 100, 7, 30), sample(2.0, 200, 3, 20)]
    records = [(i, i / 100, i / 100) for i in range(200)]
    starts = {i: i / 100 + 0.005 for i in range(200)}
    out = horizon_phases.summarize(
        Window("steady", 0.0, 2.0, 100), samples, records, starts, [0.5, 3.0]
    )
    assert out["completion_rate"] == pytest.approx(100.0)
    assert (out["max_depth"], out["max_dead"], out["send_errors"]) == (7, 30, 1)
    assert out["p99_ms"] == pytest.approx(5.0)


def test_the_producers_schedule_merges_neighbours_and_lays_out_due_times() -> None:
    windows = [
        Window("steady", 0, 2, 100),
        Window("readers", 2, 3, 100),
        Window("high", 3, 4, 500),
        Window("recovery", 4, 6, 100),
    ]
    schedule = horizon_phases.segments(windows)
    assert schedule == [(100, 3), (500, 1), (100, 2)]
    due = due_times([(2.0, 1.0), (4.0, 0.5)])
    assert due == [0.0, 0.5, 1.0, 1.25]


def test_things_done_twice_are_counted_once_each() -> None:
    items = ["task-1:0:apply", "task-2:0:apply", "task-1:0:apply", "task-1:0:apply", "7", "7"]
    assert fake_remote.more_than_once(items) == 2
    assert fake_remote.more_than_once([]) == 0


def test_a_processs_database_sockets_are_found_by_their_ports() -> None:
    import os

    with socket.socket() as server, socket.socket() as client:
        server.bind(("127.0.0.1", 0))
        server.listen()
        client.connect(server.getsockname())
        ports = socket_ports([os.getpid()])
        assert client.getsockname()[1] in ports
        assert server.getsockname()[1] in ports
    assert socket_ports([]) == set()


def test_the_cells_run_for_us_proc10_and_pgq_and_are_in_a_full_run() -> None:
    assert horizon_cells.select(["us", "celery", "pgq", "pgq100", "proc10"]) == [
        "us",
        "pgq",
        "proc10",
    ]
    assert {"horizon", "faults"} <= set(cli.ALL_CELLS)
    assert cli.parse_args(["--cells", "horizon,faults"]).cells == {"horizon", "faults"}
    full = horizon_cells.HORIZON_MODES["full"]
    # Both cells for three systems add at most about 15 minutes.
    assert 3 * (horizon_cells.seconds_per_system(full) + 60) <= 15 * 60


# --- the report -------------------------------------------------------------------------


def test_the_horizon_table_has_a_row_per_phase_and_system() -> None:
    text = report.markdown(result([horizon_cell("us"), horizon_cell("pgq", lost=3)]))
    lines = text.splitlines()
    assert any(
        line.startswith("| horizon: a producer at 100/s, 2 worker processes |") for line in lines
    )
    assert "| steady, 100/s | US | 100 | 100 | 4.2 / 9.0 / 123 | 12 | 4,321 |  |" in lines
    assert f"|  | {PGQ} | 100 | 100 | 4.2 / 9.0 / 123 | 12 | 4,321 |  |" in lines
    assert "| idle connections held (300 asked) | US (44 held) |" in text
    assert "| high load, 500/s | US | 400 |" in text
    assert text.count("| 3.2 s |") == 2  # back to steady after the high load
    assert (
        f"- jobs lost in it (not finished 30 s after the producer stopped): US 0, {PGQ} 3" in lines
    )
    # No metric table, only the faults targets, which wait for their cell.
    assert not any(line.startswith("| metric |") for line in lines)
    assert f"| {LOST_TARGET} | {D} | ? |" in lines


def test_the_faults_tables_give_recovery_and_what_ran_twice() -> None:
    cells = [faults_cell("us"), faults_cell("proc10", ran_more_than_once=12, effects_twice=12)]
    text = report.markdown(result(cells))
    lines = text.splitlines()
    assert any("a dead worker's jobs run again after 10 s |" in line for line in lines)
    assert "| every worker SIGKILLed and restarted (1 of 3) | US |" in text
    kill = next(line for line in lines if line.startswith("| every worker SIGKILLed"))
    assert kill.endswith("| not within 20 s |")
    assert any(
        line.startswith("| PostgreSQL restarted | US |") and "| 4.0 s |" in line for line in lines
    )
    assert "| a worker backend terminated every 1 s for 12 s | US |" in text
    assert "| US | 0 | 0 | 35 | 0 | 3 / 1 | 12 | 17 |" in lines
    assert f"| {PROC} | 0 | 0 | 12 | 12 | 3 / 1 | 12 | 17 |" in lines
    assert f"| {TWICE_TARGET} | 0 | ✓ |" in lines
    assert f"| {LOST_TARGET} | 0 | ✓ |" in lines


def test_the_targets_judge_us_alone() -> None:
    out = result([faults_cell("us", lost=2, effects_twice=1), faults_cell("pgq", effects_twice=9)])
    assert target(out, LOST_TARGET)["ok"] is False
    assert target(out, TWICE_TARGET)["value"] == 1
    assert target(out, TWICE_TARGET)["ok"] is False
    lines = report.markdown(out).splitlines()
    assert f"| {LOST_TARGET} | 2 | ✗ |" in lines
    fine = result([faults_cell("us"), faults_cell("pgq", lost=40, effects_twice=9)])
    assert target(fine, LOST_TARGET)["ok"] and target(fine, TWICE_TARGET)["ok"]


def test_a_failed_cell_keeps_its_rows_and_is_named_among_the_problems() -> None:
    failed = {
        "run": 3,
        "system": "us",
        "cell": FAULTS,
        "workers": 2,
        "error": "Traceback …\nRuntimeError: the producer exited 1",
    }
    text = report.markdown(result([failed, faults_cell("pgq")]))
    lines = text.splitlines()
    # The table's heading comes from the cell that measured.
    assert any(line.startswith("| faults: a producer at 50/s") for line in lines)
    assert "| failed (see the problems) | US |" + f" {D} |" * 6 in lines
    assert "| US |" + f" {D} |" * 7 in lines
    assert "- run 3 US faults c2: RuntimeError: the producer exited 1" in lines
    assert f"| {LOST_TARGET} | {D} | ? |" in lines


def test_the_system_cells_alone_leave_out_the_faults_targets() -> None:
    drain = {"run": 1, "system": "us", "cell": "drain", "workers": 2, "throughput": 8_000.0}
    text = report.markdown(result([drain], ["us"]))
    assert "| target (same run) |" in text
    assert LOST_TARGET not in text and "| horizon:" not in text
