"""The tracing cell (12. in docs/performance.md, "How it is measured"): what OpenTelemetry
traces cost US's enqueue and drain. Once per harness run, for US only, after the system
cells: one process of the product (``python -m bench.tracing_cell``, Django set up on the
bench database) enqueues N ``demo.noop`` tasks with single calls, then drains them in
process (``runner.drain``, the worker's own loop), with ``TASKS_TRACING`` off and on in
turn, alternating which goes first, for a few rounds. With tracing on, spans go through
the SDK's batch processor to an exporter that drops them (so the figure is the product's
own cost: spans made, context carried, the traceparent stored, not a collector's network).

The figure: the rate with tracing on over the rate with it off (enqueue, drain, and both
together), the median of the rounds; the table reads it as the cost of tracing, in %.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

if TYPE_CHECKING:
    from bench.cells import Bench

TRACING = "tracing"
# The sizes per mode: tasks per round, rounds (each one off and one on).
SIZES = {"quick": (300, 3), "full": (3_000, 5)}
SETTINGS = ("off", "on")


# --- the harness's side -----------------------------------------------------------------


def run(bench: Bench, unavailable: dict[str, str] | None = None) -> list[dict[str, Any]]:
    """The cell, for US: skipped when US could not be installed, or past the time the
    system, scale and horizon cells had between them (it runs after all of them)."""
    # Imported here: the report imports this module for its table, and bench.cells the report.
    from bench.cells import measure_once
    from bench.horizon_cells import HORIZON_MODES
    from bench.scale_cells import SCALE_MODES
    from bench.systems import Us

    mode = bench.mode
    n, rounds = SIZES[mode.name]
    cell: dict[str, Any] = {
        "run": mode.runs,
        "system": "us",
        "cell": TRACING,
        "n": n,
        "rounds": rounds,
    }
    budget = mode.budget + SCALE_MODES[mode.name].budget + HORIZON_MODES[mode.name].budget
    skipped = (unavailable or {}).get("us")
    if skipped is None and time.monotonic() - bench.started > budget:
        skipped = "time budget"
    system = Us(bench.ctx)

    def measure() -> dict[str, Any]:
        # From empty tables (the cells before it leave theirs emptied), and left empty.
        system.reset()
        try:
            return in_a_process(bench.ctx.python, bench.ctx.env, n, rounds)
        finally:
            system.reset()

    return [
        measure_once(
            cell,
            f"tracing     {'US':<8} enqueue+drain off/on",
            skipped=skipped,
            measure=measure,
            reset=system.reset,
            brief=brief,
        )
    ]


def in_a_process(python: str, env: dict[str, str], n: int, rounds: int) -> dict[str, Any]:
    """:func:`measure` in a process of its own on the bench database; its figures."""
    argv = [python, "-m", "bench.tracing_cell", "--n", str(n), "--rounds", str(rounds)]
    done = subprocess.run(  # noqa: S603
        argv, env=env, capture_output=True, text=True, timeout=600, check=False
    )
    if done.returncode != 0:
        raise RuntimeError(f"bench.tracing_cell exited {done.returncode}: {done.stderr[-3000:]}")
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


def brief(cell: dict[str, Any]) -> str:
    if cell.get("error"):
        return "ERROR " + str(cell["error"]).strip().splitlines()[-1][:200]
    off, on = cell["off"], cell["on"]
    return (
        f"{cell['n']:,} tasks x {cell['rounds']}: off {off['rate']:,.0f}/s, on {on['rate']:,.0f}/s "
        f"(cost {cost(cell['ratio']):.1f}%; enqueue {cost(cell['enqueue_ratio']):.1f}%, "
        f"drain {cost(cell['drain_ratio']):.1f}%), {cell['spans_per_task']:.1f} spans/task"
    )


def cost(ratio: float) -> float:
    """The share of throughput tracing takes, in %, from the rate on over the rate off."""
    return (1 - ratio) * 100


def table(result: dict[str, Any]) -> list[str]:
    """The cell's table in the report, when it ran."""
    cells = [c for c in result["cells"] if c["cell"] == TRACING and not c.get("error")]
    cells = [c for c in cells if not c.get("skipped")]
    if not cells:
        return []
    lines = [
        "",
        "| tracing (US, in process) | off | on | cost of tracing |",
        "|---|--:|--:|--:|",
    ]
    for cell in cells:
        for what, key, ratio in (
            ("enqueue (tasks/s)", "enqueue_rate", "enqueue_ratio"),
            ("drain (steps/s)", "drain_rate", "drain_ratio"),
            ("enqueue + drain (tasks/s)", "rate", "ratio"),
        ):
            lines.append(
                f"| {what} | {cell['off'][key]:,.0f} | {cell['on'][key]:,.0f} "
                f"| {cost(cell[ratio]):.1f}% |"
            )
        lines.append(
            f"\n{cell['n']:,} `demo.noop` tasks per round, {cell['rounds']} rounds each way "
            f"(medians; the cost from the rounds' ratios), {cell['spans_per_task']:.1f} spans "
            "a task, exported to nowhere through the batch processor."
        )
    return lines


def summarize(rounds: dict[str, list[dict[str, float]]]) -> dict[str, Any]:
    """The medians of each setting's rounds, and of the ratios on ÷ off round by round (a
    round's two halves ran back to back, so load on the machine falls on both)."""
    out: dict[str, Any] = {}
    for setting in SETTINGS:
        out[setting] = {
            key: statistics.median(r[key] for r in rounds[setting])
            for key in ("enqueue_rate", "drain_rate", "rate")
        }
    pairs = list(zip(rounds["off"], rounds["on"], strict=True))
    for key, ratio in (("enqueue_rate", "enqueue_ratio"), ("drain_rate", "drain_ratio")):
        out[ratio] = statistics.median(on[key] / off[key] for off, on in pairs)
    out["ratio"] = statistics.median(on["rate"] / off["rate"] for off, on in pairs)
    return out


# --- the product's side (in the process ``python -m bench.tracing_cell`` starts) ----------


def measure(n: int, rounds: int) -> dict[str, Any]:
    """Enqueue and drain ``n`` tasks per round, tracing off and on in turn; the figures.
    Django must be set up (its database is the one measured)."""
    from django.test import override_settings
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    from tasks_app.observability import tracing

    results: dict[str, list[dict[str, float]]] = {setting: [] for setting in SETTINGS}
    dropped = _Dropped()
    for number in range(rounds):
        for setting in SETTINGS if number % 2 == 0 else SETTINGS[::-1]:
            with override_settings(TASKS_TRACING=setting == "on"):
                tracing.setup(processors=[BatchSpanProcessor(dropped)])
                try:
                    results[setting].append(_enqueue_and_drain(n, f"{number}-{setting}"))
                finally:
                    tracing.reset()  # the batch processor flushed: its spans counted
    return {
        **summarize(results),
        "rounds_off": results["off"],
        "rounds_on": results["on"],
        "spans_per_task": dropped.spans / (n * rounds),
    }


class _Dropped(SpanExporter):
    """A span exporter that counts the spans it is given and sends them nowhere."""

    def __init__(self) -> None:
        self.spans = 0

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        self.spans += len(spans)
        return SpanExportResult.SUCCESS


def _enqueue_and_drain(n: int, tag: str) -> dict[str, float]:
    from tasks_app import services
    from tasks_app.engine import runner
    from tasks_app.models import Step, Task, TaskStatus

    began = time.perf_counter()
    tasks = [services.enqueue("demo.noop", {"round": tag, "n": i}).task for i in range(n)]
    enqueued = time.perf_counter()
    first = Step.objects.filter(task=tasks[0]).values_list("pk", flat=True).get()
    while runner.drain(first):
        pass
    drained = time.perf_counter()
    done = Task.objects.filter(
        pk__in=[task.pk for task in tasks], status=TaskStatus.SUCCEEDED
    ).count()
    if done != n:
        raise RuntimeError(f"round {tag}: {done} of {n} tasks succeeded")
    return {
        "enqueue_rate": n / (enqueued - began),
        "drain_rate": n / (drained - enqueued),
        "rate": n / (drained - began),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.tracing_cell", description=__doc__)
    parser.add_argument("--n", type=int, required=True)
    parser.add_argument("--rounds", type=int, required=True)
    args = parser.parse_args(argv)
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
    import django

    django.setup()
    print(json.dumps(measure(args.n, args.rounds)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
