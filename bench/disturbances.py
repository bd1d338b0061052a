"""What the horizon and faults cells do to a running system, each undone in every case:
idle connections held, REPEATABLE READ scans in a loop, PostgreSQL restarted (and running
again afterwards, also on error), a worker's backends terminated, and the workers
themselves run under a small supervisor that restarts them when they exit or are killed.

A transaction idle with its snapshot is ``bench.scale_cells.HeldSnapshot``.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import psycopg
from psycopg import sql

from bench.procs import ProcessGroup
from bench.systems import System

CONNECT_TIMEOUT = 5
ENV_PG_RESTART = "BENCH_PG_RESTART"


class IdleConnections:
    """Up to ``wanted`` sessions on the bench database, opened and left idle, leaving
    ``spare`` of the server's connection slots free (a shared server has other clients)."""

    def __init__(self, dsn: str, wanted: int, spare: int) -> None:
        self.conns: list[psycopg.Connection[Any]] = []
        with psycopg.connect(dsn, autocommit=True, connect_timeout=CONNECT_TIMEOUT) as probe:
            row = probe.execute(
                "SELECT current_setting('max_connections')::int"
                " - current_setting('superuser_reserved_connections')::int"
                " - (SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'client backend')"
            ).fetchone()
        free = int(row[0]) if row else 0
        self.wanted = wanted
        self.allowed = max(min(wanted, free - spare), 0)
        try:
            for _ in range(self.allowed):
                self.conns.append(
                    psycopg.connect(
                        dsn,
                        autocommit=True,
                        connect_timeout=CONNECT_TIMEOUT,
                        application_name="bench-idle",
                    )
                )
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        for conn in self.conns:
            with contextlib.suppress(Exception):
                conn.close()
        self.conns = []


class ActiveReaders:
    """A session of its own scanning the system's tables in a loop, each round one
    REPEATABLE READ transaction (``SELECT count(*)`` of every table), as a report or a
    dashboard does; stopped and closed by ``close`` (each scan bounded by a statement
    timeout)."""

    def __init__(self, dsn: str, tables: list[str], statement_timeout_ms: int = 30_000) -> None:
        self.rounds = 0
        self.errors: list[str] = []
        self._stop = threading.Event()
        self.conn = psycopg.connect(
            dsn, autocommit=True, connect_timeout=CONNECT_TIMEOUT, application_name="bench-reader"
        )
        try:
            self.conn.execute(sql.SQL("SET statement_timeout = {}").format(statement_timeout_ms))
        except BaseException:
            self.conn.close()
            raise
        names = [sql.Identifier(*table.split(".")) for table in tables]
        self.scans = [sql.SQL("SELECT count(*) FROM {}").format(name) for name in names]
        self.thread = threading.Thread(target=self._loop, daemon=True)
        self.thread.start()

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                with self.conn.transaction():
                    self.conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
                    for scan in self.scans:
                        self.conn.execute(scan)
                self.rounds += 1
            except psycopg.Error as exc:
                self.errors.append(str(exc)[:200])
                return

    def close(self) -> None:
        self._stop.set()
        self.thread.join(timeout=40)
        with contextlib.suppress(Exception):
            self.conn.close()


# --- PostgreSQL restarted ---------------------------------------------------------------


def restart_command(dsn: str) -> tuple[list[str] | None, str]:
    """How this machine restarts the bench's server (Debian's ``pg_ctlcluster``, as the
    docs' machine has it), or None and why not: the server is not on this machine, cannot
    be restarted from here, or ``BENCH_PG_RESTART=0`` says not to (a server shared with
    someone's tests)."""
    host = urlsplit(dsn).hostname or "localhost"
    versions = sorted(p.name for p in Path("/etc/postgresql").glob("*") if p.is_dir())
    if os.environ.get(ENV_PG_RESTART, "1") == "0":
        return None, f"{ENV_PG_RESTART}=0"
    if host not in {"127.0.0.1", "localhost", "::1"}:
        return None, "the server is not on this machine"
    if len(versions) != 1 or shutil.which("pg_ctlcluster") is None:
        return None, "no pg_ctlcluster cluster to restart on this machine"
    return ["pg_ctlcluster", "--skip-systemctl-redirect", versions[0], "main"], ""


def server_up(dsn: str) -> bool:
    try:
        with psycopg.connect(dsn, connect_timeout=2) as conn:
            conn.execute("SELECT 1")
        return True
    except psycopg.Error:
        return False


def restart_postgresql(
    dsn: str, command: list[str], relock: Callable[[], None], timeout: float = 120
) -> float:
    """``pg_ctlcluster … restart`` (a fast shutdown: every session cut; it returns once the
    server is up again), then at once ``relock`` (the harness's lock, lost with its
    session), then wait until the bench database answers; returns the seconds until it
    did. PostgreSQL is left running whatever happens: when the restart fails or the server
    does not answer, it is started again before the error goes up."""
    began = time.monotonic()
    relocked = False
    try:
        done = subprocess.run(  # noqa: S603 (the harness's own command)
            [*command, "restart"], capture_output=True, text=True, timeout=timeout, check=False
        )
        if done.returncode == 0:
            relock()
            relocked = True
        else:
            raise RuntimeError(f"pg_ctlcluster restart exited {done.returncode}: {done.stderr}")
        deadline = time.monotonic() + timeout
        while not server_up(dsn):
            if time.monotonic() > deadline:
                raise TimeoutError(f"PostgreSQL did not answer within {timeout:g} s")
            time.sleep(0.1)
        return time.monotonic() - began
    finally:
        if not relocked:
            ensure_running(dsn, command)
            relock()


def ensure_running(dsn: str, command: list[str]) -> None:
    """Start the server if it does not answer (after a failed restart), and wait for it."""
    if server_up(dsn):
        return
    with contextlib.suppress(Exception):
        subprocess.run([*command, "start"], capture_output=True, timeout=120, check=False)  # noqa: S603
    deadline = time.monotonic() + 120
    while not server_up(dsn) and time.monotonic() < deadline:
        time.sleep(0.5)


# --- the workers' backends --------------------------------------------------------------


def socket_ports(pids: list[int]) -> set[int]:
    """The local TCP ports of the sockets ``pids`` hold (their end of each database
    connection), from /proc: whatever client library opened them."""
    inodes: set[str] = set()
    for pid in pids:
        with contextlib.suppress(OSError):
            for fd in Path(f"/proc/{pid}/fd").iterdir():
                with contextlib.suppress(OSError):
                    target = os.readlink(fd)
                    if target.startswith("socket:["):
                        inodes.add(target[8:-1])
    ports: set[int] = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(OSError):
            for line in Path(table).read_text().splitlines()[1:]:
                fields = line.split()
                if len(fields) > 9 and fields[9] in inodes:
                    ports.add(int(fields[1].rsplit(":", 1)[1], 16))
    return ports


def worker_backends(conn: psycopg.Connection[Any], pids: list[int]) -> list[int]:
    """The server pids of the bench database's sessions the processes ``pids`` opened."""
    ports = sorted(socket_ports(pids))
    if not ports:
        return []
    rows = conn.execute(
        "SELECT pid FROM pg_stat_activity WHERE datname = current_database()"
        " AND client_port = ANY(%s) AND pid <> pg_backend_pid() ORDER BY pid",
        (ports,),
    ).fetchall()
    return [int(row[0]) for row in rows]


# --- the workers, supervised ------------------------------------------------------------


class Workers:
    """The system's worker processes (2 of them, as in the drain and scale cells), run the
    way a supervisor runs them: a group that exits is started again (``check``), and
    ``kill`` SIGKILLs every process of the group, the pool's children too, then starts a
    new one, as systemd or Kubernetes would after an OOM kill."""

    def __init__(self, system: System, processes: int) -> None:
        self.system = system
        self.processes = processes
        self.group: ProcessGroup | None = None
        self.restarts = 0  # started again after exiting on their own
        self.kills = 0
        self.logs: list[str] = []

    def start(self, *, wait: bool) -> None:
        self.group = self.system.start_workers(self.processes, barrier=False)
        if wait:
            self.group.wait_ready(self.system.expected_ready(self.processes), timeout=90)

    def pids(self) -> list[int]:
        if self.group is None:
            return []
        return sorted({*self.group.pids, *self.system.executing_pids(self.group)})

    def check(self) -> None:
        if self.group is not None and self.group.exited():
            self._replace()
            self.restarts += 1

    def kill(self) -> None:
        if self.group is not None:
            for pid in self.group.pids:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(pid, signal.SIGKILL)
        self._replace()
        self.kills += 1

    def _replace(self) -> None:
        if self.group is not None:
            self.group.stop(timeout=5)
            self.logs.append(self.group.tail(10)[-1500:])
        self.start(wait=False)

    def stop(self) -> None:
        if self.group is not None:
            self.group.stop()
            self.logs.append(self.group.tail(10)[-1500:])
            self.group = None
