"""Drills 21 to 23: the database holding a row, hung, and out of connection slots.

21. A session holds one due step's row (``SELECT … FOR UPDATE``) while a worker is killed
    mid-step and every doorbell is lost: the sweeper skips the held row, reaps the killed
    worker's steps and rings for the rest, and the queue drains around the row.
22. PostgreSQL hung (every server process SIGSTOPped): ``/healthz`` answers at once,
    ``/readyz`` answers 503 within its bound, a producer's ``enqueue`` fails within the
    statement bound instead of waiting for the hang; everything resumes after.
23. Every connection slot taken while steps longer than their lease run: the lease
    keepers renew over the connections they keep, so no lease runs out and no step runs
    twice.
"""

from __future__ import annotations

import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import psycopg
import pytest
from django.db import connection

from tasks_app import services
from tasks_app.db.clock import db_now
from tasks_app.models import Event, EventKind, Lease, Step, StepStatus, Task, TaskStatus
from tests.chaos.harness import (
    LEASE_SECONDS,
    Cluster,
    Record,
    Remotes,
    assert_cut_steps_ran_again,
    assert_nothing_lost_or_done_twice,
    enqueue_workload,
    record_cut,
    unsettled,
    wait_for_drain,
)
from tests.chaos.services import OwnPostgres, OwnRedis
from tests.e2e_support import PYTHON, ROOT, database_url, spare_port, wait_for

pytestmark = [pytest.mark.chaos, pytest.mark.timeout(300)]


def _other_session() -> psycopg.Connection:
    return psycopg.connect(database_url(connection.settings_dict))


# --- 21: one held row ------------------------------------------------------------------------


def test_row_21_a_held_step_row_stalls_neither_the_sweeper_nor_the_queue(
    cluster: Cluster, counting_remotes: Remotes, own_redis: OwnRedis, record_property: Record
) -> None:
    cluster.start(workers=1, concurrency=2)
    ids = enqueue_workload(60, label="row21", sleep=0.5)
    _, tokens = cluster.wait_until_held()
    pending = Step.objects.filter(task__in=ids, status=StepStatus.PENDING).order_by("-pk").first()
    assert pending is not None
    held_task = pending.task_id

    with _other_session() as other:
        other.execute("SELECT id FROM tasks_app_step WHERE id = %s FOR UPDATE", [pending.pk])
        fault_at = db_now()
        cluster.kill(cluster.workers[0])
        own_redis.flush()  # every doorbell lost: only the sweeper rings again
        started = time.monotonic()
        cluster.add_worker()
        rest = [pk for pk in ids if pk != held_task]
        drained = wait_for_drain(rest, cluster, timeout=120)
        # Still held: the held step has not run.
        assert Step.objects.get(pk=pending.pk).status == StepStatus.PENDING
        other.rollback()

    wait_for_drain(ids, cluster, timeout=60)
    assert_nothing_lost_or_done_twice(ids, counting_remotes)
    record_cut(record_property, assert_cut_steps_ran_again(tokens, fault_at))
    record_property("drained_around_the_row_s", round(drained - started, 1))


# --- 22: PostgreSQL hung ---------------------------------------------------------------------


@pytest.fixture
def web(cluster: Cluster, tmp_path: Path) -> Iterator[str]:
    """The web process as the Procfile runs it (gunicorn, threaded workers)."""
    port = spare_port()
    log = (tmp_path / "web.log").open("w")
    process = subprocess.Popen(
        [
            str(Path(PYTHON).parent / "gunicorn"),
            "config.wsgi",
            *("--bind", f"127.0.0.1:{port}", "--workers", "1", "--threads", "4"),
        ],
        cwd=ROOT,
        env=cluster.env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_for(lambda: _answers(url), timeout=60, what="the web process to answer")
        yield url
    finally:
        process.terminate()
        process.wait(timeout=30)
        log.close()


def _status(url: str, timeout: float = 30) -> int:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            return int(response.status)
    except urllib.error.HTTPError as error:
        return int(error.code)


def _answers(url: str) -> bool:
    try:
        return _status(f"{url}/healthz", timeout=2) == 200
    except OSError:
        return False


def _timed_get(url: str) -> tuple[int, float]:
    started = time.monotonic()
    status = _status(url)
    return status, round(time.monotonic() - started, 2)


PRODUCER = """
import sys, time
from tasks_app import services
services.enqueue("demo.noop", {"warm": 1}, idempotency_key="row22-warm")
print("ready", flush=True)
sys.stdin.readline()
started = time.monotonic()
try:
    services.enqueue("demo.noop", {"during": "hang"}, idempotency_key="row22-hung")
    print("enqueued", round(time.monotonic() - started, 2), flush=True)
except Exception as exc:
    print(type(exc).__name__, round(time.monotonic() - started, 2), flush=True)
"""

HANG_SECONDS = 12


def test_row_22_postgresql_hung(
    cluster: Cluster,
    counting_remotes: Remotes,
    own_postgres: OwnPostgres,
    web: str,
    record_property: Record,
) -> None:
    # A statement may take 2 s; one unanswered for 3 s has its connection cut.
    cluster.env.update(TASKS_DB_STATEMENT_TIMEOUT_MS="2000", TASKS_DB_CLIENT_GRACE_SECONDS="1")
    cluster.start(workers=1, concurrency=2)
    ids = enqueue_workload(60, label="row22", sleep=0.2)
    wait_for(
        lambda: Task.objects.filter(pk__in=ids, status=TaskStatus.SUCCEEDED).count() >= 5,
        timeout=60,
        what="5 tasks to finish first",
    )
    assert _status(f"{web}/readyz", timeout=10) == 200
    producer = subprocess.Popen(
        [PYTHON, "manage.py", "shell", "-v", "0", "-c", PRODUCER],
        cwd=ROOT,
        env=cluster.env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert producer.stdout is not None and producer.stdin is not None
    assert producer.stdout.readline().strip() == "ready"
    connection.close()  # this process's session would hang with the rest

    stopped = own_postgres.pause()
    try:
        hung_at = time.monotonic()
        healthz = _timed_get(f"{web}/healthz")
        readyz = _timed_get(f"{web}/readyz")
        producer.stdin.write("go\n")
        producer.stdin.flush()
        outcome, enqueue_s = producer.stdout.readline().split()
        readyz_again = _timed_get(f"{web}/readyz")
        wait_for(
            lambda: time.monotonic() - hung_at >= HANG_SECONDS,
            timeout=HANG_SECONDS + 5,
            interval=0.5,
        )
    finally:
        own_postgres.resume(stopped)
    back_at = time.monotonic()
    producer.communicate(timeout=30)

    assert healthz == (200, healthz[1]) and healthz[1] < 1
    assert readyz[0] == 503 and readyz[1] < 4, readyz
    assert readyz_again[0] == 503 and readyz_again[1] < 4, readyz_again
    assert outcome == "OperationalError" and float(enqueue_s) < 10, (outcome, enqueue_s)
    wait_for(
        lambda: _status(f"{web}/readyz", timeout=10) == 200,
        timeout=60,
        what="readiness again",
    )
    wait_for_drain(ids, cluster, timeout=120)
    assert_nothing_lost_or_done_twice(ids, counting_remotes)
    # The producer was told the outcome is unknown (its commit may have reached the server
    # before the hang); asking again with the same key and payload gives one task.
    again = services.enqueue("demo.noop", {"during": "hang"}, idempotency_key="row22-hung")
    assert Task.objects.filter(idempotency_key="row22-hung").count() == 1
    record_property("hung_enqueue_had_landed", not again.created)
    record_property("healthz_s", healthz[1])
    record_property("readyz_s", max(readyz[1], readyz_again[1]))
    record_property("enqueue_failed_after_s", float(enqueue_s))
    record_property("drained_after_s", round(time.monotonic() - back_at, 1))


# --- 23: out of connection slots -------------------------------------------------------------

LONG_STEP = 3 * LEASE_SECONDS


def test_row_23_out_of_connection_slots_while_long_steps_run(
    cluster: Cluster, counting_remotes: Remotes, own_postgres: OwnPostgres, record_property: Record
) -> None:
    # Kept connections stay kept for the whole drill.
    cluster.env["TASKS_DB_CONN_MAX_AGE_SECONDS"] = "600"
    cluster.start(workers=1, concurrency=2)
    ids = [services.enqueue("demo.flaky", {"sleep": LONG_STEP, "n": n}).task.pk for n in range(6)]
    # Both pool processes run a step, and each one's lease keeper has renewed once.
    wait_for(lambda: len(_renewed_running(ids)) >= 2, timeout=60, what="two renewed leases")

    with own_postgres.every_slot_taken(database_url(connection.settings_dict)) as slots:
        assert slots > 10
        taken_at = time.monotonic()
        wait_for(
            lambda: not unsettled(ids) or time.monotonic() - taken_at > 4 * LONG_STEP,
            timeout=6 * LONG_STEP,
            interval=0.5,
        )

    wait_for_drain(ids, cluster, timeout=120)
    assert_nothing_lost_or_done_twice(ids, counting_remotes)
    expired = Lease.objects.filter(step__task__in=ids, outcome=Lease.Outcome.EXPIRED).count()
    runs = Lease.objects.filter(step__task__in=ids).count()
    lease_events = Event.objects.filter(task_id__in=ids, kind=EventKind.LEASE_EXPIRED).count()
    assert (expired, lease_events, runs) == (0, 0, len(ids))
    record_property("slots_taken", slots)
    record_property("leases_expired", expired)


def _renewed_running(ids: list[int]) -> list[int]:
    """Running steps whose lease was renewed since their claim."""
    renewed = []
    for step in Step.objects.filter(task__in=ids, status=StepStatus.RUNNING):
        # The live lease is the step's own: it began at the claim, ``started_at``.
        longer = timedelta(seconds=LEASE_SECONDS + 0.2)
        expires, began = step.lease_expires_at, step.started_at
        if expires is not None and began is not None and expires - began > longer:
            renewed.append(step.pk)
    return renewed


# --- 24: a long-lived producer across a PostgreSQL restart -----------------------------------

LOOPING_PRODUCER = """
import time
from tasks_app import services
for n in range(400):
    try:
        services.enqueue("demo.noop", {"n": n}, idempotency_key=f"row24-{n}")
        print("ok", n, flush=True)
    except Exception as exc:
        print("failed", n, type(exc).__name__, flush=True)
    time.sleep(0.05)
"""


def test_row_24_a_long_lived_producer_recovers_from_a_postgresql_restart(
    cluster: Cluster, own_postgres: OwnPostgres, record_property: Record
) -> None:
    """A process calling ``enqueue`` in a loop, outside any request, while the server
    restarts: the calls after the restart succeed without restarting the process."""
    producer = subprocess.Popen(
        [PYTHON, "manage.py", "shell", "-v", "0", "-c", LOOPING_PRODUCER],
        cwd=ROOT,
        env=cluster.env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert producer.stdout is not None
    lines: list[str] = []
    while len(lines) < 20:  # it enqueues before the restart
        lines.append(producer.stdout.readline().strip())
    own_postgres.restart(mode="fast")
    connection.close()
    out, err = producer.communicate(timeout=120)
    lines += out.split("\n")
    results = [line.split()[0] for line in lines if line]
    assert producer.returncode == 0, err
    assert len(results) == 400
    failed = results.count("failed")
    # Calls racing the restart may fail (the producer is told); every call after it works.
    last_failure = max((i for i, r in enumerate(results) if r == "failed"), default=-1)
    assert failed <= 10, [line for line in lines if line.startswith("failed")]
    assert results[last_failure + 1 :] == ["ok"] * (len(results) - last_failure - 1)
    assert last_failure < 100
    # A call that failed may still have landed (its commit reached the server): at least
    # every call told "ok" stands.
    assert Task.objects.filter(idempotency_key__startswith="row24-").count() >= results.count("ok")
    record_property("calls_failed", failed)
    record_property("calls_after_the_restart_ok", len(results) - last_failure - 1)
