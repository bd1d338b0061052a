"""Drills 28 and 29: the web side of a database fault, with the web process as the Procfile
runs it (gunicorn, its worker class, threads) and kept connections on every thread.

35. PostgreSQL hung (every server process SIGSTOPped) while three times as many console
    requests as there are threads arrive at once: each answers 503 within the web deadline
    plus the grace (its thread is free again), and ``/healthz`` answers under a second
    throughout; pages answer again once the server resumes.
36. PostgreSQL restarted: the first requests after it, one on each thread so that every
    thread's kept connection is tried, answer without a 500 (each connection is checked
    before use and replaced).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from concurrent import futures
from pathlib import Path

import pytest
from django.conf import settings
from django.contrib.auth.models import User
from django.db import connection
from django.test import Client

from tests.chaos.harness import Cluster, Record
from tests.chaos.services import OwnPostgres
from tests.e2e_support import database_url, wait_for
from tests.web_server_support import cookie_for, every_thread_serves_one, status, timed, web_process

pytestmark = [pytest.mark.chaos, pytest.mark.timeout(300)]

THREADS = 4
# A request's statements wait 2 s; one unanswered 1 s later has its connection cut.
WEB_MS = 2000
GRACE_SECONDS = 1
# The watchdog looks every 0.5 s, and the answer takes a moment to write.
SLACK_SECONDS = 1.0
DEADLINE = WEB_MS / 1000 + GRACE_SECONDS + SLACK_SECONDS


@pytest.fixture
def web(cluster: Cluster, tmp_path: Path) -> Iterator[str]:
    cluster.env.update(
        TASKS_WEB_STATEMENT_TIMEOUT_MS=str(WEB_MS),
        TASKS_DB_CLIENT_GRACE_SECONDS=str(GRACE_SECONDS),
        # As in production: a failure answers the project's page, not Django's debug page
        # (which reads the request's user, and so the database, again).
        DJANGO_DEBUG="0",
    )
    with web_process(cluster.env, tmp_path / "web.log", threads=THREADS) as url:
        yield url


@pytest.fixture
def cookie(cluster: Cluster) -> str:
    person = User.objects.create_superuser("drill-oncall", password="x")
    client = Client()
    client.force_login(person)
    return cookie_for(client.cookies, settings.SESSION_COOKIE_NAME)


def _serve_one_each(web: str, cookie: str) -> list[tuple[int, float]]:
    return every_thread_serves_one(
        web,
        cookie=cookie,
        threads=THREADS,
        dsn=database_url(connection.settings_dict),
        database=connection.settings_dict["NAME"],
    )


def test_row_28_a_hung_database_frees_every_web_thread_within_its_deadline(
    own_postgres: OwnPostgres, web: str, cookie: str, record_property: Record
) -> None:
    # Every thread holds a kept connection, as a web process in service does.
    assert [code for code, _ in _serve_one_each(web, cookie)] == [200] * THREADS
    connection.close()  # this process's session would hang with the rest

    burst = 3 * THREADS
    probes: list[tuple[int, float]] = []
    stopped = own_postgres.pause()
    try:
        hung_at = time.monotonic()
        with futures.ThreadPoolExecutor(max_workers=burst) as pool:
            pages = [
                pool.submit(timed, f"{web}/", cookie=cookie, timeout=120) for _ in range(burst)
            ]
            # The liveness probe, five times a second while the pages wait.
            while futures.wait(pages, timeout=0.2).not_done:
                probes.append(timed(f"{web}/healthz", timeout=10))
                assert time.monotonic() - hung_at < 90, "the pages did not answer in 90 s"
            answered = [page.result() for page in pages]
        burst_s = round(time.monotonic() - hung_at, 1)
        # Every thread free again while the server still hangs: one more round answers
        # within a deadline.
        again = _threads_at_once(web, cookie)
    finally:
        own_postgres.resume(stopped)
    back_at = time.monotonic()
    wait_for(lambda: status(f"{web}/", cookie=cookie) == 200, timeout=60, what="pages again")

    record_property("pages", len(answered))
    record_property("slowest_page_s", max(seconds for _, seconds in answered))
    record_property("burst_answered_s", burst_s)
    record_property("healthz_probes", len(probes))
    record_property("slowest_healthz_s", max(seconds for _, seconds in probes))
    record_property("pages_again_after_s", round(time.monotonic() - back_at, 1))

    assert {code for code, _ in answered} == {503}, answered
    # Three requests a thread, one after another: each thread's three within three deadlines.
    assert max(seconds for _, seconds in answered) < 3 * DEADLINE, answered
    assert all(code == 503 and seconds < DEADLINE for code, seconds in again), again
    assert probes and all(code == 200 and seconds < 1 for code, seconds in probes), probes


def _threads_at_once(web: str, cookie: str) -> list[tuple[int, float]]:
    with futures.ThreadPoolExecutor(max_workers=THREADS) as pool:
        pages = [pool.submit(timed, f"{web}/", cookie=cookie, timeout=60) for _ in range(THREADS)]
        return [page.result() for page in pages]


def test_row_29_the_first_requests_after_a_postgresql_restart_do_not_fail(
    own_postgres: OwnPostgres, web: str, cookie: str, record_property: Record
) -> None:
    assert [code for code, _ in _serve_one_each(web, cookie)] == [200] * THREADS

    own_postgres.restart(mode="immediate")
    connection.close()  # this process's session was cut too
    after = _serve_one_each(web, cookie)

    record_property("requests", len(after))
    record_property("statuses", sorted(code for code, _ in after))
    assert [code for code, _ in after] == [200] * THREADS, after
