"""A Redis server of a test's own (``redis-server`` on a spare port), which the test may
fill past its memory or turn read-only without touching the run's shared Redis."""

from __future__ import annotations

import contextlib
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import pytest
import redis

from tests.e2e_support import spare_port, wait_for


class PrivateRedis:
    """A ``redis-server`` this test started, which it may fill or demote at will."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.url = f"redis://127.0.0.1:{port}/0"
        self.client = redis.Redis(host="127.0.0.1", port=port, socket_timeout=2)

    @contextlib.contextmanager
    def out_of_memory(self) -> Iterator[None]:
        """Full under ``noeviction``: every write that may take memory is refused."""
        self.client.config_set("maxmemory-policy", "noeviction")
        self.client.set("filler", b"x" * 4_000_000)
        self.client.config_set("maxmemory", "1mb")
        try:
            yield
        finally:
            self.client.delete("filler")
            self.client.config_set("maxmemory", "0")

    @contextlib.contextmanager
    def read_only(self) -> Iterator[None]:
        """A replica of a primary that does not exist: reads served, writes refused."""
        self.client.replicaof("127.0.0.1", spare_port())
        try:
            yield
        finally:
            self.client.replicaof("NO", "ONE")

    def refused_reads(self) -> int:
        """How many ``BRPOP`` calls Redis has refused so far."""
        stats = cast(dict[str, Any], self.client.info("commandstats")).get("cmdstat_brpop", {})
        return int(stats.get("rejected_calls", 0)) + int(stats.get("failed_calls", 0))

    def answers(self) -> bool:
        try:
            return bool(self.client.ping())
        except redis.RedisError:
            return False


@pytest.fixture
def private_redis(tmp_path: Path) -> Iterator[PrivateRedis]:
    server = shutil.which("redis-server")
    assert server, "these tests start a Redis of their own: they need redis-server on PATH"
    port = spare_port()
    options = ["--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--dir", str(tmp_path)]
    process = subprocess.Popen(
        [server, "--port", str(port), *options],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    own = PrivateRedis(port)
    try:
        wait_for(own.answers, timeout=10, what="the test's redis-server to answer")
        yield own
    finally:
        process.terminate()
        process.wait(timeout=10)
