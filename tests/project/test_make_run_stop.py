"""Ctrl-C on `make run`: web, worker and beat stop within a deadline, the worker warm.

The Procfile.dev processes are started as `make run` starts them (its process manager,
its environment, a port of the test's own) on the embedded default with a TASKS_VAR_DIR
of the test's own, and SIGINT goes to the manager's process group, as a terminal sends it.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from pathlib import Path

import pytest

from tests.e2e_support import PYTHON, ROOT, TROUBLE, manage, spare_port, wait_for


def run_env(var_dir: Path, port: int) -> dict[str, str]:
    """What `make run PORT=port` hands honcho (the Makefile's exports)."""
    # Neither DATABASE_URL nor REDIS_URL: SQLite and the file-system broker in var_dir.
    services = ("DATABASE_URL", "REDIS_URL", "TASKS_BROKER_PREFIX")
    env = {k: v for k, v in os.environ.items() if k not in services}
    env["TASKS_VAR_DIR"] = str(var_dir)
    base = f"http://127.0.0.1:{port}"
    env.update(
        HOST="127.0.0.1",
        PORT=str(port),
        WEB_PORT=str(port),
        PUBLISH_URL=f"{base}/fake/publish/",
        MAIL_URL=f"{base}/fake/mail/",
        CONSOLE_BASE_URL=base,
        TASKS_FAKE_REMOTES="1",
    )
    return env


def left_running(var_dir: Path) -> list[int]:
    """The processes still running with this test's TASKS_VAR_DIR (Linux's /proc)."""
    mark = f"TASKS_VAR_DIR={var_dir}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and mark in (entry / "environ").read_bytes().split(b"\0"):
                found.append(int(entry.name))
        except OSError:
            continue
    return found


@pytest.mark.e2e
@pytest.mark.timeout(180)
@pytest.mark.skipif(not Path("/proc/self/environ").exists(), reason="reads /proc")
def test_ctrl_c_stops_every_process_and_the_worker_warm(tmp_path: Path) -> None:
    var_dir = tmp_path / "var"
    env = run_env(var_dir, spare_port())
    manage("migrate", "--noinput", env=env, timeout=90)
    log_path = tmp_path / "run.log"
    with log_path.open("w") as log:
        manager = subprocess.Popen(
            [PYTHON, "scripts/dev_processes.py", "-f", "Procfile.dev", "start"],
            cwd=ROOT,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        wait_for(
            lambda: " ready." in log_path.read_text() and "beat: Starting" in log_path.read_text(),
            timeout=90,
            what=lambda: log_path.read_text()[-2000:],
        )
        os.killpg(manager.pid, signal.SIGINT)
        manager.wait(timeout=40)
        output = log_path.read_text()
        wait_for(lambda: not left_running(var_dir), timeout=10, what="every process to exit")
    finally:
        for pid in [manager.pid, *left_running(var_dir)]:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    assert "Warm shutdown" in output
    for name in ("web.1", "worker.1", "beat.1"):
        assert f"{name} stopped" in output, output[-3000:]
    assert "SIGKILL" not in output, output[-3000:]
    trouble = [line for line in output.splitlines() if TROUBLE.search(line)]
    assert not trouble, trouble
