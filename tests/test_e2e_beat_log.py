"""End to end: a real beat whose broker refuses its sends (a Redis of the test's own, made
read-only as a failover leaves the old primary) logs one line when the refusals start and
one when sends work again, never an ERROR or a traceback per refused send."""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import cast

import pytest
import redis
from django.db import connection

from .e2e_support import BEAT_READY, Worker, database_url, wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120), pytest.mark.django_db]


def spare_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@pytest.fixture
def own_redis(tmp_path: Path) -> Iterator[redis.Redis]:
    """A Redis server of this test's own, which it may turn read-only."""
    server = shutil.which("redis-server")
    assert server, "the beat log test needs redis-server"
    port = spare_port()
    process = subprocess.Popen(
        [server, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"],
        cwd=tmp_path,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    client = redis.Redis(host="127.0.0.1", port=port, socket_timeout=2)
    try:
        wait_for(lambda: _answers(client), timeout=10, what="the test's Redis to answer")
        yield client
    finally:
        process.terminate()
        process.wait(timeout=10)


def _answers(client: redis.Redis) -> bool:
    try:
        return bool(client.ping())
    except redis.RedisError:
        return False


def test_beat_logs_a_streak_of_refused_sends_once(own_redis: redis.Redis, tmp_path: Path) -> None:
    port = own_redis.connection_pool.connection_kwargs["port"]
    beat = Worker(
        ["--loglevel", "INFO", "--schedule", str(tmp_path / "beat-schedule")],
        env={
            **os.environ,
            "DATABASE_URL": database_url(connection.settings_dict),
            "REDIS_URL": f"redis://127.0.0.1:{port}/0",
            "TASKS_BROKER_PREFIX": "",  # its own server: no prefix
            "TASKS_SWEEP_SECONDS": "1",
            "TASKS_VAR_DIR": str(tmp_path / "var"),
            # One line per send, refused or not: the test counts the refused ones by them.
            "TASKS_LOG_MESSAGES": "1",
        },
        log_path=tmp_path / "beat.log",
        command="beat",
        ready=BEAT_READY,
    )
    try:
        beat.wait_ready(timeout=60)
        wait_for(lambda: cast(int, own_redis.llen("maintenance")) >= 1, timeout=30, what=beat.tail)
        own_redis.replicaof("127.0.0.1", spare_port())  # read-only: every send is refused
        wait_for(
            lambda: re.search(r"beat: cannot send sweep \(.*read only replica", beat.output()),
            timeout=30,
            what=beat.tail,
        )
        refused_from = beat.mark()
        # Let several more sends be refused before the broker takes writes again.
        wait_for(
            lambda: beat.output(refused_from).count("Sending due task sweep") >= 3,
            timeout=30,
            what=beat.tail,
        )
        own_redis.replicaof("NO", "ONE")
        found = wait_for(
            lambda: re.search(r"beat: sending again after (\d+) refused send\(s\)", beat.output()),
            timeout=30,
            what=beat.tail,
        )
    finally:
        beat.stop()
    logged = beat.output()
    assert int(found.group(1)) >= 3, logged
    assert logged.count("beat: cannot send") == 1, logged
    assert "Traceback" not in logged and "ERROR" not in logged, logged
