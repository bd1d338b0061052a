"""Helpers for the tests of enqueue (test_enqueue_*): the canonical JSON of a payload, the
counters, how many rows of each kind are stored, and what records an enqueue."""

from __future__ import annotations

import json
from typing import Any

from tasks_app.history import timeline
from tasks_app.models import Counter, Event, Lease, Step, Task

# --- helpers ---------------------------------------------------------------------------------


def canonical(payload: Any) -> str:
    """DESIGN §2 rule 4, written out here rather than borrowed from the code under test."""
    return json.dumps(
        payload, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
    )


def counter(name: str) -> int:
    return Counter.objects.filter(name=name).values_list("value", flat=True).first() or 0


def stored() -> dict[str, int]:
    return {
        "tasks": Task.objects.count(),
        "steps": Step.objects.count(),
        "events": Event.objects.count(),
        "leases": Lease.objects.count(),
        "counters": Counter.objects.count(),
    }


NOTHING = {"tasks": 0, "steps": 0, "events": 0, "leases": 0, "counters": 0}


def assert_only_enqueued(*tasks: Task) -> None:
    """Each of ``tasks`` has one enqueue in its history and nothing else, recorded by its
    row and first steps: an enqueue writes no Event row (tasks_app.history.timeline)."""
    for task in tasks:
        assert [entry.kind for entry in timeline.history(task.pk)] == ["enqueued"], task
    assert not Event.objects.filter(task_id__in=[task.pk for task in tasks]).exists()
