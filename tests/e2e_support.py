"""Helpers for the end-to-end tests: real worker processes, management commands in
subprocesses, and polling with a deadline (never a fixed sleep)."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import quote

ROOT = Path(__file__).resolve().parent.parent
# The interpreter running the tests is the project's virtualenv; its scripts sit beside it.
PYTHON = sys.executable
CELERY = str(Path(sys.executable).with_name("celery"))

READY = re.compile(r"\S+@\S+ ready\.")
BEAT_READY = re.compile(r"beat: Starting\.\.\.")
# Lines a healthy worker never writes: an error logged by Celery or by our code.
TROUBLE = re.compile(r"\b(ERROR|CRITICAL)\b|Traceback")


def wait_for[T](
    probe: Callable[[], T | None],
    *,
    timeout: float,
    interval: float = 0.1,
    what: str | Callable[[], str] = "a condition",
) -> T:
    """Call ``probe`` until it returns something truthy, and return that; fail with
    ``what`` (a text, or a callable giving one, such as a log tail) at the deadline."""
    deadline = time.monotonic() + timeout
    while True:
        value = probe()
        if value:
            return value
        if time.monotonic() >= deadline:
            detail = what() if callable(what) else what
            raise AssertionError(f"timed out after {timeout:g}s waiting for {detail}")
        time.sleep(min(interval, max(deadline - time.monotonic(), 0)))


def spare_port() -> int:
    """A TCP port nothing listens on now (for a server a test starts, or a primary that
    does not exist)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def beat_process(env: Mapping[str, str], folder: Path) -> Worker:
    """``celery beat`` with its schedule and its log in ``folder``; not waited for."""
    return Worker(
        ["--loglevel", "INFO", "--schedule", str(folder / "beat-schedule")],
        env=env,
        log_path=folder / "beat.log",
        command="beat",
        ready=BEAT_READY,
    )


def database_url(settings_dict: Mapping[str, Any]) -> str:
    """A ``DATABASE_URL`` naming the same PostgreSQL database as ``settings_dict``."""
    user = quote(settings_dict.get("USER") or "", safe="")
    password = settings_dict.get("PASSWORD") or ""
    auth = f"{user}:{quote(password, safe='')}" if password else user
    # A socket directory as host is percent-encoded, which dj-database-url understands.
    host = quote(settings_dict.get("HOST") or "", safe="")
    port = settings_dict.get("PORT") or ""
    location = f"{host}:{port}" if port else host
    name = quote(settings_dict["NAME"], safe="")
    return f"postgres://{auth}@{location}/{name}"


def manage(*args: str, env: Mapping[str, str], timeout: float = 60) -> str:
    """Run ``manage.py`` with ``args`` and return its stdout; fail with its output."""
    done = subprocess.run(
        [PYTHON, "manage.py", *args],
        cwd=ROOT,
        env=dict(env),
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    if done.returncode != 0:
        raise AssertionError(
            f"manage.py {' '.join(args)} exited with {done.returncode}\n"
            f"--- stdout\n{done.stdout}\n--- stderr\n{done.stderr}"
        )
    return done.stdout


class Worker:
    """A ``celery -A config worker`` subprocess (or ``beat``, by ``command``) in its own
    session, logging to a file.

    The file (not a pipe) takes its output, so a chatty worker never blocks on a full
    pipe, and the tests read it to see when the worker is ready and what it did.
    """

    def __init__(
        self,
        args: Sequence[str],
        *,
        env: Mapping[str, str],
        log_path: Path,
        command: str = "worker",
        ready: re.Pattern[str] = READY,
    ) -> None:
        self.log_path = log_path
        self.ready = ready
        self._log = log_path.open("wb")
        self.process = subprocess.Popen(
            [CELERY, "-A", "config", command, *args],
            cwd=ROOT,
            # The tests follow single messages through Celery's own log lines.
            env={"TASKS_LOG_MESSAGES": "1", **env, "PYTHONUNBUFFERED": "1"},
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    @property
    def pid(self) -> int:
        return self.process.pid

    def output(self, since: int = 0) -> str:
        with self.log_path.open("rb") as log:
            log.seek(since)
            return log.read().decode("utf-8", errors="replace")

    def mark(self) -> int:
        """Where the log ends now, to read only what a test made the worker do."""
        return self.log_path.stat().st_size

    def tail(self, lines: int = 60) -> str:
        return "worker output (last lines):\n" + "\n".join(self.output().splitlines()[-lines:])

    def wait_ready(self, timeout: float = 60) -> None:
        def ready() -> bool:
            if self._leader_exited():
                raise AssertionError("the worker exited before it was ready\n" + self.tail())
            return bool(self.ready.search(self.output()))

        wait_for(ready, timeout=timeout, what=lambda: "the worker to be ready\n" + self.tail())

    def count(self, pattern: str, since: int = 0) -> int:
        return len(re.findall(pattern, self.output(since)))

    def assert_quiet(self, since: int = 0) -> None:
        """No error or traceback in what the worker logged since ``since``."""
        trouble = [line for line in self.output(since).splitlines() if TROUBLE.search(line)]
        assert not trouble, "the worker logged errors:\n" + self.output(since)[-6000:]

    def is_pool_child(self, pid: int) -> bool:
        """Whether ``pid`` is a process this worker forked (read from /proc)."""
        try:
            status = Path(f"/proc/{pid}/status").read_text()
        except OSError:
            return False
        ppid = re.search(r"^PPid:\s*(\d+)$", status, re.MULTILINE)
        return ppid is not None and int(ppid.group(1)) == self.pid

    def _leader_exited(self) -> bool:
        # WNOWAIT leaves the exited main process a zombie: its pid, which names the process
        # group, cannot be reused before the group is killed below.
        try:
            return os.waitid(os.P_PID, self.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None
        except ChildProcessError:
            return True  # reaped already

    def stop(self, timeout: float = 20) -> None:
        """Warm shutdown: SIGTERM to the main process, which stops its pool and beat; once
        it is gone, or after ``timeout``, SIGKILL to whatever is left of its group."""
        if self.process.returncode is None and not self._leader_exited():
            os.kill(self.pid, signal.SIGTERM)
            with contextlib.suppress(AssertionError):  # still running: killed below
                wait_for(self._leader_exited, timeout=timeout, what="the worker to stop")
        if self.process.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.pid, signal.SIGKILL)
        self.process.wait()
        self._log.close()


@contextlib.contextmanager
def worker_on_test_database(
    folder: Path,
    remotes: tuple[Any, Any],
    *,
    what: str,
    env: Mapping[str, str] | None = None,
    **settings_env: str,
) -> Iterator[Worker]:
    """A prefork worker with beat (so the sweeper runs), on the PostgreSQL test database
    and this run's Redis keys, calling ``remotes`` (publishing, mail); ready when yielded,
    stopped after. ``settings_env`` adds environment settings (``TASKS_LEASE_SECONDS``)."""
    from django.conf import settings
    from django.db import connection

    if connection.vendor != "postgresql" or not settings.REDIS_URL:
        raise AssertionError(f"{what} need PostgreSQL and Redis: run `make test`")
    worker_env = {
        **(os.environ if env is None else env),
        "DATABASE_URL": database_url(connection.settings_dict),
        "REDIS_URL": settings.REDIS_URL,
        "TASKS_BROKER_PREFIX": os.environ.get("TASKS_BROKER_PREFIX", ""),
        # A busy sweeper: due steps are rung again (duplicate doorbells) after a second.
        "TASKS_SWEEP_SECONDS": "1",
        "TASKS_REDISPATCH_SECONDS": "1",
        # Beat's schedule file goes here; the folder does not exist yet (beat makes it).
        "TASKS_VAR_DIR": str(folder / "var"),
        "PUBLISH_URL": remotes[0].url,
        "MAIL_URL": remotes[1].url,
        **settings_env,
    }
    process = Worker(
        ["-c", "2", "-B", "--loglevel=INFO"], env=worker_env, log_path=folder / "worker.log"
    )
    try:
        process.wait_ready(timeout=60)
        yield process
    finally:
        process.stop()
