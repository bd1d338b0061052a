"""A results document as the bench harness writes it (``bench/cli.py``), for the report's
tests: the cells given, summarised and judged against the targets."""

from __future__ import annotations

from typing import Any

from bench import report


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
