"""A web process as the Procfile's ``web`` line runs it (gunicorn, its worker class, threads),
on the test's database, for the tests and drills that need real threads and real
connections; small HTTP helpers to time its answers; and a way to have each of its threads
serve one request at once (the task table held by another session until every thread
waits on it), so each thread's kept connection is the one tried."""

from __future__ import annotations

import contextlib
import shlex
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping
from concurrent import futures
from pathlib import Path
from typing import Any

import psycopg
from honcho.environ import parse_procfile

from tests.e2e_support import PYTHON, ROOT, spare_port, wait_for


def procfile_web_options() -> list[str]:
    """The options of the Procfile's ``web`` line that say how requests are served (its
    worker class), without those a test sets itself (address, workers, threads)."""
    line = parse_procfile((ROOT / "Procfile").read_text()).processes["web"]
    words = shlex.split(line)
    options = []
    for index, word in enumerate(words):
        if word in ("--worker-class", "-k"):
            options += [word, words[index + 1]]
    return options


@contextlib.contextmanager
def web_process(
    env: Mapping[str, str], log: Path, *, threads: int, workers: int = 1
) -> Iterator[str]:
    """gunicorn as the Procfile runs it, with ``threads`` threads; yields its base URL."""
    port = spare_port()
    with log.open("w") as output:
        process = subprocess.Popen(
            [
                str(Path(PYTHON).parent / "gunicorn"),
                "config.wsgi",
                *procfile_web_options(),
                *("--bind", f"127.0.0.1:{port}", "--workers", str(workers)),
                *("--threads", str(threads)),
            ],
            cwd=ROOT,
            env=dict(env),
            stdout=output,
            stderr=subprocess.STDOUT,
        )
        url = f"http://127.0.0.1:{port}"
        try:
            wait_for(
                lambda: answers(url),
                timeout=60,
                what=lambda: f"the web process to answer:\n{log.read_text()[-3000:]}",
            )
            yield url
        finally:
            process.terminate()
            process.wait(timeout=30)


def status(url: str, *, timeout: float = 30, cookie: str = "") -> int:
    request = urllib.request.Request(url, headers={"Cookie": cookie} if cookie else {})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return int(response.status)
    except urllib.error.HTTPError as error:
        return int(error.code)


def answers(url: str) -> bool:
    try:
        return status(f"{url}/healthz", timeout=2) == 200
    except OSError:
        return False


def timed(url: str, *, timeout: float = 30, cookie: str = "") -> tuple[int, float]:
    """The status of a GET of ``url`` and the seconds it took (status 0: no answer)."""
    started = time.monotonic()
    try:
        code = status(url, timeout=timeout, cookie=cookie)
    except OSError:
        code = 0
    return code, round(time.monotonic() - started, 2)


def cookie_for(client_cookies: Any, name: str) -> str:
    """The ``Cookie`` header carrying a test client's session cookie ``name``."""
    return f"{name}={client_cookies[name].value}"


def waiting_on_locks(dsn: str, database: str) -> int:
    """Sessions on ``database`` waiting for a lock now."""
    with psycopg.connect(dsn, autocommit=True) as probe:
        row = probe.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = %s AND wait_event_type = 'Lock'",
            [database],
        ).fetchone()
    return int(row[0]) if row else 0


def every_thread_serves_one(
    url: str, *, cookie: str, threads: int, dsn: str, database: str
) -> list[tuple[int, float]]:
    """``threads`` GETs of the overview at once, each on a thread of its own: the task
    table is held until all of them wait on it (or one answered without waiting), then
    released. Returns each answer's status and seconds."""
    with futures.ThreadPoolExecutor(max_workers=threads) as pool:
        with psycopg.connect(dsn) as other:
            other.execute("LOCK TABLE tasks_app_task IN ACCESS EXCLUSIVE MODE NOWAIT")
            pages = [
                pool.submit(timed, f"{url}/", cookie=cookie, timeout=60) for _ in range(threads)
            ]
            wait_for(
                lambda: (
                    waiting_on_locks(dsn, database) >= threads or any(page.done() for page in pages)
                ),
                timeout=30,
                what="every thread to wait on the table",
            )
            other.rollback()
        return [page.result() for page in pages]
