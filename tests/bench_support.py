"""A results document as the bench harness writes it (``bench/cli.py``), for the report's
tests: the cells given, summarised and judged against the targets."""

from __future__ import annotations

from typing import Any

from bench import report

# The full mode's sizes, as bench/cells.py's MODES gives them to a results document.
FULL_MODE: dict[str, Any] = {
    "name": "full",
    "runs": 3,
    "single_n": 5_000,
    "bulk_n": 50_000,
    "batch": 1_000,
    "drain_n": 10_000,
    "workers": [1, 2, 4],
    "rates": [50, 200, 500],
    "latency_seconds": 6.0,
    "senders": 4,
    "console_sizes": [10_000, 1_000_000],
    "console_gets": 20,
    "console_warmup": 5,
}


def bench_result(
    cells: list[dict[str, Any]],
    mode: dict[str, Any],
    systems: list[str],
    *,
    duration_s: float = 60.0,
    **meta: Any,
) -> dict[str, Any]:
    summary = report.summarize(report.collect(cells))
    report.add_best(summary, mode)
    return {
        "meta": {
            "started": "2026-12-01T00:00:00+00:00",
            "duration_s": duration_s,
            "mode": mode,
            "systems": systems,
            "seed": 1,
            "orders": [systems],
            "git": "abc1234",
            "code_at_start": "same",
            "code_at_end": "same",
            "environment": {
                "versions": {"python": "3.13"},
                "postgresql_settings": {"synchronous_commit": "on"},
                "redis_settings": {"save": ""},
                "cpu_model": "test",
                "cpus": 2,
                "memory_gib": 24.0,
            },
            **meta,
        },
        "cells": cells,
        "summary": summary,
        "targets": report.evaluate(summary, mode),
    }
