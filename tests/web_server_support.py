"""A web process as the Procfile's ``web`` line runs it (gunicorn, its worker class, threads),
on the test's database, for the tests and drills that need real threads and real
connections; and small HTTP helpers to time its answers."""

from __future__ import annotations

import contextlib
import shlex
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping
from pathlib import Path

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
