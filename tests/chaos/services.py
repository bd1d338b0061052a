"""The PostgreSQL and Redis servers of a fault drill, which it may stop, restart, pause,
kill, or make refuse writes: those ``scripts/with-chaos-services.sh`` started on spare
ports for this run (never the machine's shared servers), described by its ``CHAOS_*``
variables."""

from __future__ import annotations

import contextlib
import os
import shlex
import signal
import socket
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import cast

import psycopg
import pytest
import redis

from tests.e2e_support import spare_port, wait_for

NEEDS_OWN_SERVERS = (
    "the fault drills restart PostgreSQL and Redis, so they run only on servers of their "
    "own: run them with `make chaos` (scripts/with-chaos-services.sh)"
)


def _env(name: str) -> str:
    value = os.environ.get(name)
    if not value:
        raise RuntimeError(f"{name} is not set: {NEEDS_OWN_SERVERS}")
    return value


def _run(command: list[str], timeout: float = 60) -> None:
    done = subprocess.run(command, capture_output=True, text=True, timeout=timeout, check=False)
    if done.returncode != 0:
        raise AssertionError(f"{shlex.join(command)} failed:\n{done.stdout}\n{done.stderr}")


@dataclass(frozen=True)
class OwnPostgres:
    bin: Path
    data: Path
    port: int
    options: str
    log: Path
    run_as: tuple[str, ...]

    @classmethod
    def from_env(cls) -> OwnPostgres:
        return cls(
            bin=Path(_env("CHAOS_PG_BIN")),
            data=Path(_env("CHAOS_PG_DATA")),
            port=int(_env("CHAOS_PG_PORT")),
            options=_env("CHAOS_PG_OPTIONS"),
            log=Path(_env("CHAOS_PG_LOG")),
            run_as=tuple(shlex.split(os.environ.get("CHAOS_PG_AS", ""))),
        )

    def _pg_ctl(self, *args: str) -> None:
        _run([*self.run_as, str(self.bin / "pg_ctl"), "-D", str(self.data), *args])

    def restart(self, mode: str = "immediate") -> None:
        """Stop the server (``immediate``: as if it crashed, every backend cut off) and
        start it again, waiting until it accepts connections."""
        self._pg_ctl("restart", "-m", mode, "-w", "-o", self.options, "-l", str(self.log))

    def processes(self) -> list[int]:
        """The server's processes: the postmaster first, then its children."""
        postmaster = int((self.data / "postmaster.pid").read_text().splitlines()[0])
        children = subprocess.run(
            ["pgrep", "-P", str(postmaster)], capture_output=True, text=True, check=False
        ).stdout.split()
        return [postmaster, *map(int, children)]

    def pause(self) -> list[int]:
        """SIGSTOP the whole server (the postmaster first, so it forks no new backend):
        connections are accepted by the kernel, nothing is answered (hung). Returns the
        processes to resume."""
        stopped: list[int] = []
        # A backend forked just before the postmaster stopped is found by the second look;
        # one that exited between the listing and its signal is gone, not stopped.
        for _ in range(2):
            for pid in self.processes():
                if pid not in stopped:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGSTOP)
                        stopped.append(pid)
        return stopped

    def resume(self, stopped: list[int]) -> None:
        for pid in reversed(stopped):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)

    @contextlib.contextmanager
    def every_slot_taken(self, url: str) -> Iterator[int]:
        """Open sessions on ``url`` until the server refuses one (every connection slot
        taken, the superuser's reserve included when ``url`` names a superuser); yields
        how many it took, and closes them all after."""
        slots: list[psycopg.Connection] = []
        try:
            while True:
                try:
                    slots.append(psycopg.connect(url))
                except psycopg.OperationalError:
                    break
            yield len(slots)
        finally:
            for slot in slots:
                slot.close()

    def terminate_backends(self, dbname: str, *, keep: int | None = None) -> int:
        """``pg_terminate_backend`` for every session on ``dbname`` but ``keep`` (a
        backend pid); returns how many were terminated."""
        with psycopg.connect(
            host="127.0.0.1", port=self.port, user=_pg_user(), dbname="postgres", autocommit=True
        ) as conn:
            rows = conn.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                "WHERE datname = %s AND pid <> pg_backend_pid() AND pid IS DISTINCT FROM %s",
                (dbname, keep),
            ).fetchall()
        return sum(1 for (done,) in rows if done)


def _pg_user() -> str:
    url = _env("DATABASE_URL")
    return url.split("://", 1)[1].split("@", 1)[0].split(":", 1)[0]


# Filler for the out-of-memory fault: more than the limit it sets.
FILLER = "chaos:filler"


@dataclass(frozen=True)
class OwnRedis:
    port: int
    args: tuple[str, ...]
    pidfile: Path

    @classmethod
    def from_env(cls) -> OwnRedis:
        return cls(
            port=int(_env("CHAOS_REDIS_PORT")),
            args=tuple(shlex.split(_env("CHAOS_REDIS_ARGS"))),
            pidfile=Path(_env("CHAOS_DIR")) / "redis.pid",
        )

    def client(self) -> redis.Redis:
        return redis.Redis(host="127.0.0.1", port=self.port, socket_timeout=2)

    def flush(self) -> None:
        self.client().flushall()

    def pid(self) -> int:
        return int(self.pidfile.read_text().strip())

    def stop(self) -> None:
        """Kill the server (SIGKILL: nothing saved, connections cut) and wait until its
        port refuses connections."""
        os.kill(self.pid(), signal.SIGKILL)
        wait_for(lambda: not self._listening(), timeout=10, what="Redis to stop")

    def start(self) -> None:
        """Start it again, empty (no persistence), and wait until it answers."""
        _run(["redis-server", *self.args])
        wait_for(self._answers, timeout=10, what="Redis to start")

    def restart(self) -> None:
        self.stop()
        self.start()

    def pause(self) -> None:
        """SIGSTOP: the port still accepts connections, nothing is answered (hung)."""
        os.kill(self.pid(), signal.SIGSTOP)

    def resume(self) -> None:
        os.kill(self.pid(), signal.SIGCONT)

    @contextlib.contextmanager
    def refusing_writes(self, fault: str) -> Iterator[None]:
        """Make the drill's Redis refuse writes until the block ends, then accept them again
        as before: out of memory (a 1 MB ``maxmemory`` under ``noeviction``, filled past it),
        or read-only (a replica of a primary that does not exist; reads are still served)."""
        client = self.client()
        if fault == "out_of_memory":
            policy = cast(dict[str, str], client.config_get("maxmemory-policy"))["maxmemory-policy"]
            limit = cast(dict[str, str], client.config_get("maxmemory"))["maxmemory"]
            client.config_set("maxmemory-policy", "noeviction")
            client.set(FILLER, b"x" * 4_000_000)
            client.config_set("maxmemory", "1mb")
            try:
                with pytest.raises(redis.exceptions.OutOfMemoryError):
                    client.lpush("chaos:probe", "refused")
                yield
            finally:
                client.delete(FILLER)
                client.config_set("maxmemory", limit)
                client.config_set("maxmemory-policy", policy)
        else:
            if fault == "failed_over":
                # The server comes back empty, as a replica: a reconnecting consumer cannot
                # even declare its queues.
                self.restart()
            client.replicaof("127.0.0.1", spare_port())
            try:
                with pytest.raises(redis.exceptions.ReadOnlyError):
                    client.lpush("chaos:probe", "refused")
                yield
            finally:
                client.replicaof("NO", "ONE")
        client.lpush("chaos:probe", "accepted")
        client.delete("chaos:probe")

    def _listening(self) -> bool:
        # A plain connect: redis-py retries a refused connection with backoff, for seconds.
        try:
            socket.create_connection(("127.0.0.1", self.port), timeout=0.2).close()
        except OSError:
            return False
        return True

    def _answers(self) -> bool:
        try:
            return bool(redis.Redis(host="127.0.0.1", port=self.port, socket_timeout=1).ping())
        except redis.RedisError:
            return False
