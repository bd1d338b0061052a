"""The run's databases on the bench's PostgreSQL server: where the server is, the
maintenance connection that holds the run's lock and creates and drops the run's databases
(the bench database and the console data sets'), and how a database gets its schema."""

from __future__ import annotations

import contextlib
import getpass
import os
import subprocess
import time
from urllib.parse import urlsplit, urlunsplit

import psycopg

from bench.common import ROOT, scalar
from bench.systems import Ctx

LOCK_KEY = 7_311_003  # pg advisory lock: one bench run per server at a time
# The console cells' data sets: one database per size, "bench_console_<tasks>".
CONSOLE_DB = "bench_console_{}"
CONSOLE_DB_PATTERN = r"^bench_console_[0-9]+$"


def discover() -> tuple[str, str]:
    """``DATABASE_URL`` and ``REDIS_URL``, or the loopback defaults of with-services.sh."""
    user = os.environ.get("PGUSER") or getpass.getuser()
    database_url = (
        os.environ.get("DATABASE_URL") or f"postgres://{user}@127.0.0.1:5432/task_console"
    )
    redis_url = os.environ.get("REDIS_URL") or "redis://127.0.0.1:6379/0"
    return database_url, redis_url


def with_database(url: str, name: str) -> str:
    parts = urlsplit(url)
    return urlunsplit((parts.scheme, parts.netloc, "/" + name, parts.query, parts.fragment))


class LockLost(BaseException):
    """Another run took the bench lock while PostgreSQL restarted: the bench database is
    now that run's, so this one stops at once, touching nothing of it (a BaseException, so
    no cell keeps it as its failure and goes on)."""


class Server:
    """The maintenance connection: holds the bench lock, creates and drops the bench
    database and the console data sets' (a database cannot be created or dropped from a
    connection to itself)."""

    def __init__(self, admin_dsn: str, db_name: str) -> None:
        self.db_name = db_name
        self.others: list[str] = []  # the console data sets' databases
        self.admin_dsn = admin_dsn
        self.locked = False
        self.conn = psycopg.connect(admin_dsn, autocommit=True, connect_timeout=5)

    def lock(self) -> bool:
        self.locked = bool(scalar(self.conn, "SELECT pg_try_advisory_lock(%s)", LOCK_KEY))
        return self.locked

    def relock(self, timeout: float = 120) -> None:
        """After the server restarted (the faults cell): a new maintenance connection and
        the run's lock again, tried every few milliseconds from the moment the server takes
        connections, so a run waiting for the lock has next to no chance to take it first;
        ``LockLost`` if one did."""
        self.close()
        self.locked = False
        deadline = time.monotonic() + timeout
        while True:
            try:
                self.conn = psycopg.connect(self.admin_dsn, autocommit=True, connect_timeout=1)
                break
            except psycopg.OperationalError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.005)
        if not self.lock():
            raise LockLost("another benchmark run took the lock while PostgreSQL restarted")

    def create(self) -> None:
        self.drop()
        self._create(self.db_name)

    def drop(self) -> None:
        if not self.locked:
            return  # not this run's to drop (the lock was lost)
        self.conn.execute(f'DROP DATABASE IF EXISTS "{self.db_name}" WITH (FORCE)')

    def create_other(self, name: str) -> None:
        """Another database of this run (a console data set), dropped by ``drop_others``."""
        self.conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        self.others.append(name)
        self._create(name)

    def _create(self, name: str) -> None:
        """A disposable database: the history's triggers let it be truncated between
        cells only because the database itself allows it (tasks_app migration 0019), as
        the test suite's databases do."""
        self.conn.execute(f'CREATE DATABASE "{name}"')
        self.conn.execute(f"ALTER DATABASE \"{name}\" SET tasks_app.allow_truncate = 'on'")

    def drop_others(self) -> None:
        """This run's other databases, and any a killed run left behind (we hold the
        lock: no other run is using them)."""
        if not self.locked:
            return
        rows = self.conn.execute(
            "SELECT datname FROM pg_database WHERE datname ~ %s", (CONSOLE_DB_PATTERN,)
        ).fetchall()
        for name in {*self.others, *(str(row[0]) for row in rows)}:
            self.conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        self.others = []

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.conn.close()


def migrate(python: str, env: dict[str, str], dsn: str) -> float:
    """``manage.py migrate`` against ``dsn``; returns the seconds it took."""
    began = time.monotonic()
    done = subprocess.run(  # noqa: S603
        [python, "manage.py", "migrate", "--noinput"],
        cwd=ROOT,
        env={**env, "DATABASE_URL": dsn},
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(f"migrate failed:\n{done.stdout[-2000:]}\n{done.stderr[-4000:]}")
    return time.monotonic() - began


def prepare_database(ctx: Ctx) -> bool:
    """The bench database's own schema: the project's migrations (the other systems
    install theirs, ``System.install``); then pg_walinspect, where it can be installed.
    Returns whether it was."""
    migrate(ctx.python, ctx.env, ctx.dsn)
    with ctx.connect() as conn:
        try:
            conn.execute("CREATE EXTENSION IF NOT EXISTS pg_walinspect")
        except psycopg.Error:
            return False  # not a superuser, or the contrib module is missing
    return True
