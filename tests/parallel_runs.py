"""The suite run in parallel (``pytest -n``, pytest-xdist): each process has Redis keys of
its own, as pytest-django gives each its own test database (``test_<name>_gw0``).

Loaded with ``-p`` (pyproject's addopts), so it runs before Django reads its settings:
the broker's key prefix (``TASKS_BROKER_PREFIX``) is read once, at import, by the settings,
by the worker processes the e2e tests start and by the tests that look into the queues.
Each process adds its worker id to the run's prefix, so no process sees (or purges) the
doorbells of another. A run without ``-n`` is left as it is.

The Makefile hands out whole files (``--dist loadfile``): a module's module-scoped fixtures
(a Celery worker, a browser) start once, and the pages of tests/docs run once each, as in
one process.
"""

from __future__ import annotations

import os

import pytest

_worker = os.environ.get("PYTEST_XDIST_WORKER", "")
if _worker:
    _run = os.environ.get("TASKS_BROKER_PREFIX") or "test:"
    os.environ["TASKS_BROKER_PREFIX"] = f"{_run}{_worker}:"


# What a test costs, roughly, in seconds: one that starts worker processes or a browser
# (e2e, browser) far more than the rest; and files known to take long as a whole.
SLOW_MARKS = ("e2e", "browser")
SLOW_FILES = {
    "tests/core/test_state_model.py": 40.0,  # about 1,600 rules, each checked after
    "tests/docs/test_code_blocks.py": 60.0,  # each page's commands in a copy of the project
}


def _cost(item: pytest.Item) -> float:
    return 5.0 if any(item.get_closest_marker(mark) for mark in SLOW_MARKS) else 0.2


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Under ``-n``, the costliest files first (``--no-loadscope-reorder`` keeps this order):
    the last files handed out are short ones, so no process waits long on another at the
    end. The order within a file stays as it was."""
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        return
    cost = dict(SLOW_FILES)
    for item in items:
        path = item.nodeid.split("::")[0]
        cost[path] = cost.get(path, 0.0) + _cost(item)
    items.sort(key=lambda item: -cost[item.nodeid.split("::")[0]])
