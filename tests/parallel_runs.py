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

_worker = os.environ.get("PYTEST_XDIST_WORKER", "")
if _worker:
    _run = os.environ.get("TASKS_BROKER_PREFIX") or "test:"
    os.environ["TASKS_BROKER_PREFIX"] = f"{_run}{_worker}:"
