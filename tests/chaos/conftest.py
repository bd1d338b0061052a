"""Fixtures of the fault drills (``make chaos``): the run's own servers, the counting
remotes, and a cluster of worker processes per drill; after the run, each drill's result
and recovery time."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from django.conf import settings
from django.db import connection

from tests.chaos.harness import Cluster, Remotes
from tests.chaos.services import NEEDS_OWN_SERVERS, OwnPostgres, OwnRedis
from tests.remotes import loopback_remotes


@pytest.fixture(scope="session")
def own_postgres() -> OwnPostgres:
    server = OwnPostgres.from_env()
    if int(connection.settings_dict.get("PORT") or 0) != server.port:
        raise RuntimeError(
            f"the test database is not on the drills' own PostgreSQL: {NEEDS_OWN_SERVERS}"
        )
    return server


@pytest.fixture(scope="session")
def own_redis() -> OwnRedis:
    server = OwnRedis.from_env()
    if not (settings.REDIS_URL or "").startswith(f"redis://127.0.0.1:{server.port}/"):
        raise RuntimeError(f"REDIS_URL is not the drills' own Redis: {NEEDS_OWN_SERVERS}")
    return server


@pytest.fixture(autouse=True)
def empty_broker(own_redis: OwnRedis, own_postgres: OwnPostgres) -> Iterator[None]:
    """Every drill starts with an empty broker, and leaves both servers running."""
    own_redis.flush()
    yield
    own_redis.resume()


@pytest.fixture
def counting_remotes() -> Iterator[Remotes]:
    """The publishing remote (honours idempotency keys) and the mail remote (does not),
    counting every write they apply."""
    with loopback_remotes() as pair:
        yield pair


@pytest.fixture
def cluster(
    transactional_db: None,
    tmp_path: Path,
    counting_remotes: Remotes,
) -> Iterator[Cluster]:
    """Not started yet: a drill sets its environment, then calls ``start``."""
    processes = Cluster(tmp_path, counting_remotes)
    yield processes
    processes.stop()


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """One line per drill: its result and what it recorded (recovery time, throughput)."""
    reports = [
        report
        for outcome in ("passed", "failed")
        for report in terminalreporter.stats.get(outcome, [])
        if getattr(report, "when", "") == "call" and "tests/chaos/" in report.nodeid
    ]
    if not reports:
        return
    terminalreporter.section("fault drills")
    for report in sorted(reports, key=lambda r: r.nodeid):
        recorded = ", ".join(f"{name} {value}" for name, value in report.user_properties)
        name = report.nodeid.split("::")[-1]
        terminalreporter.write_line(f"{report.outcome:7} {name}  {recorded}")
