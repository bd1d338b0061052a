"""`make run` for real: Ctrl-C stops web, worker and beat within a deadline, the worker
warm; on another port, the approvals' mail links to that port.

The Procfile.dev processes are started as `make run` starts them (its process manager,
its environment, a port of the test's own) on the embedded default with a TASKS_VAR_DIR
of the test's own, and SIGINT goes to the manager's process group, as a terminal sends it.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
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


DEV_PROCESSES = [PYTHON, "scripts/dev_processes.py", "-f", "Procfile.dev", "start"]


def start(
    env: dict[str, str], log_path: Path, command: list[str] = DEV_PROCESSES
) -> subprocess.Popen[bytes]:
    """The processes of Procfile.dev, started as `make run` starts them (or ``command``),
    in a process group of their own (a terminal's foreground group), logging to
    ``log_path``."""
    with log_path.open("w") as log:
        return subprocess.Popen(
            command,
            cwd=ROOT,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


def end(manager: subprocess.Popen[bytes], var_dir: Path) -> None:
    for pid in [manager.pid, *left_running(var_dir)]:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    manager.wait(timeout=10)


@pytest.mark.e2e
@pytest.mark.timeout(180)
@pytest.mark.skipif(not Path("/proc/self/environ").exists(), reason="reads /proc")
def test_ctrl_c_stops_every_process_and_the_worker_warm(tmp_path: Path) -> None:
    var_dir = tmp_path / "var"
    env = run_env(var_dir, spare_port())
    manage("migrate", "--noinput", env=env, timeout=90)
    log_path = tmp_path / "run.log"
    manager = start(env, log_path)
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
        end(manager, var_dir)
    assert "Warm shutdown" in output
    for name in ("web.1", "worker.1", "beat.1"):
        assert f"{name} stopped" in output, output[-3000:]
    assert "SIGKILL" not in output, output[-3000:]
    trouble = [line for line in output.splitlines() if TROUBLE.search(line)]
    assert not trouble, trouble


@pytest.mark.e2e
@pytest.mark.timeout(300)
@pytest.mark.skipif(not Path("/proc/self/environ").exists(), reason="reads /proc")
def test_on_another_port_the_approval_mail_links_to_that_port(tmp_path: Path) -> None:
    var_dir = tmp_path / "var"
    port = spare_port()
    # `make run PORT=port` itself (it migrates, seeds the editors the notice goes to and
    # starts the processes), with nothing but the Makefile naming the port to them.
    env = run_env(var_dir, port)
    for name in ("HOST", "PORT", "WEB_PORT", "PUBLISH_URL", "MAIL_URL", "CONSOLE_BASE_URL"):
        env.pop(name)
    env.pop("TASKS_FAKE_REMOTES")
    log_path = tmp_path / "run.log"
    venv = Path(PYTHON).parent.parent
    manager = start(
        env, log_path, ["make", "--no-print-directory", "run", f"VENV={venv}", f"PORT={port}"]
    )
    title = f"Ports follow make run {port}"
    try:
        wait_for(lambda: " ready." in log_path.read_text(), timeout=180)
        payload = json.dumps({"article_id": "port-check", "title": title, "brief": "b"})
        manage("enqueue", "publish_article", "--payload", payload, "--key", "port", env=env)

        def notice() -> str | None:
            mail = manage("mailbox", "--last", "50", env=env)
            found = [m for m in mail.split("-" * 72) if title in m]
            return found[0] if found else None

        body = wait_for(notice, timeout=90, interval=0.5, what=lambda: log_path.read_text()[-3000:])
    finally:
        end(manager, var_dir)
    links = re.findall(r"https?://\S+", body)
    assert links, body
    assert all(link.startswith(f"http://127.0.0.1:{port}/") for link in links), links
