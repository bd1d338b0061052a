"""Loaded into the benchmark's Celery workers with ``-I``: tells the harness when the
worker consumes (``worker_ready``), and nothing else. Both Celery-based systems load it,
so neither pays for something the other does not."""

from __future__ import annotations

from typing import Any

from celery.signals import worker_ready

from bench.common import mark_ready


@worker_ready.connect
def _ready(**_: Any) -> None:
    mark_ready()
