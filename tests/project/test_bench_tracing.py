"""The benchmark's tracing cell (``bench/tracing_cell.py``): its figures from the rounds, its
line and its table in the report, and the measurement itself, run in this process at a
tiny size on the test database (the harness runs it in a process of its own)."""

from __future__ import annotations

from typing import Any

import pytest

from bench import report, tracing_cell
from tasks_app.engine import tracing_hooks
from tasks_app.models import Task, TaskStatus
from tests.bench_support import FULL_MODE, bench_result


def rounds(*rates: tuple[float, float]) -> list[dict[str, float]]:
    """Rounds of (enqueue, drain) rates, each with the rate of both together."""
    return [{"enqueue_rate": e, "drain_rate": d, "rate": 1 / (1 / e + 1 / d)} for e, d in rates]


def cell(**figures: Any) -> dict[str, Any]:
    measured = tracing_cell.summarize(
        {
            "off": rounds((1_000, 2_000), (800, 2_000), (1_000, 1_000)),
            "on": rounds((900, 1_800), (800, 1_600), (950, 1_000)),
        }
    )
    return {
        "run": 1,
        "system": "us",
        "cell": tracing_cell.TRACING,
        "n": 3_000,
        "rounds": 3,
        "spans_per_task": 2.0,
        **measured,
        **figures,
    }


def test_the_cost_is_the_median_of_the_rounds_ratios() -> None:
    measured = cell()
    assert measured["off"]["enqueue_rate"] == 1_000
    assert measured["on"]["drain_rate"] == 1_600
    # Enqueue on/off per round: 0.9, 1.0, 0.95; drain: 0.9, 0.8, 1.0.
    assert measured["enqueue_ratio"] == pytest.approx(0.95)
    assert measured["drain_ratio"] == pytest.approx(0.9)
    assert tracing_cell.cost(measured["drain_ratio"]) == pytest.approx(10.0)


def test_its_line_and_its_table_say_the_cost_of_tracing() -> None:
    measured = cell()
    line = tracing_cell.brief(measured)
    assert line.startswith("3,000 tasks x 3: off ")
    assert "drain 10.0%" in line and "2.0 spans/task" in line

    table = report.markdown(bench_result([measured], FULL_MODE, ["us"]))
    assert "| tracing (US, in process) | off | on | cost of tracing |" in table
    assert "| drain (steps/s) | 2,000 | 1,600 | 10.0% |" in table
    assert "| enqueue (tasks/s) | 1,000 | 900 | 5.0% |" in table
    # Its own table only: no metric table, no targets.
    assert "| metric |" not in table and "| target" not in table


def test_a_failed_tracing_cell_is_a_problem_of_the_run_not_a_table() -> None:
    failed = {"run": 1, "system": "us", "cell": tracing_cell.TRACING, "error": "boom\nit broke"}
    table = report.markdown(bench_result([failed], FULL_MODE, ["us"]))
    assert "cost of tracing" not in table
    assert "- run 1 US tracing: it broke" in table


@pytest.mark.django_db
def test_the_cell_measures_enqueue_and_drain_with_tracing_off_and_on() -> None:
    measured = tracing_cell.measure(20, 1)
    for setting in ("off", "on"):
        assert measured[setting]["enqueue_rate"] > 0 and measured[setting]["drain_rate"] > 0
        assert len(measured[f"rounds_{setting}"]) == 1
    assert measured["ratio"] > 0
    # An enqueue span and an attempt's span per task, all of them through the processor.
    assert measured["spans_per_task"] == 2.0
    assert Task.objects.filter(status=TaskStatus.SUCCEEDED).count() == 40
    assert Task.objects.exclude(traceparent=None).count() == 20
    # Tracing is off again afterwards.
    assert tracing_hooks.effect("k", "n") is tracing_hooks.OFF
