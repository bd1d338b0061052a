"""Drill 31: every process of a one-host deployment rolled one at a time under load.

The processes the systemd units run (``deploy/systemd``), each through
``deploy/run-process``: two web processes on two ports, two step workers, the maintenance
worker and beat. While a producer enqueues a steady stream, each is stopped as systemd
stops it with ``KillMode=mixed`` (SIGTERM to its main process alone), waited for, started
again and waited for until it is ready. Every task must finish with each step charged one
attempt (no lease ran out: a stopping worker finishes its step and hands back the rest),
and the other web process must answer ``/healthz`` throughout each web roll."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from tasks_app import services
from tasks_app.models import Lease, Step, Task, TaskStatus
from tests.chaos.harness import Cluster, Record, Remotes, assert_nothing_lost_or_done_twice
from tests.e2e_support import BEAT_READY, READY, ROOT, spare_port, wait_for
from tests.web_server_support import answers, timed

pytestmark = [pytest.mark.chaos, pytest.mark.timeout(240)]

RUN_PROCESS = ROOT / "deploy" / "run-process"


class Unit:
    """One process as its unit runs it: ``deploy/run-process NAME`` with the unit's own
    environment (a web instance's PORT), logging to a file per start."""

    def __init__(self, name: str, line: str, env: dict[str, str], folder: Path) -> None:
        self.name, self.line, self.env, self.folder = name, line, env, folder
        self.starts = 0
        self.process: subprocess.Popen[bytes] | None = None
        self.url = f"http://127.0.0.1:{env['PORT']}" if line == "web" else ""

    @property
    def log(self) -> Path:
        return self.folder / f"{self.name}-{self.starts}.log"

    def start(self) -> None:
        self.starts += 1
        with self.log.open("wb") as output:
            self.process = subprocess.Popen(
                [str(RUN_PROCESS), self.line],
                cwd=self.folder,
                env=self.env,
                stdin=subprocess.DEVNULL,
                stdout=output,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def is_ready(self) -> bool:
        assert self.process is not None and self.process.poll() is None, self.tail()
        if self.url:
            return answers(self.url)
        pattern = BEAT_READY if self.line == "beat" else READY
        return bool(pattern.search(self.log.read_text(errors="replace")))

    def stop(self) -> int:
        """SIGTERM to the main process alone, as ``KillMode=mixed`` sends it; its exit status."""
        assert self.process is not None
        self.process.send_signal(signal.SIGTERM)
        return self.process.wait(timeout=60)

    def kill(self) -> None:
        if self.process is not None and self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()

    def tail(self) -> str:
        lines = self.log.read_text(errors="replace").splitlines()[-30:]
        return f"--- {self.log.name}\n" + "\n".join(lines)


class Prober(threading.Thread):
    """GET ``/healthz`` of one web process every 0.1 s until stopped; keeps each failure."""

    def __init__(self, url: str) -> None:
        super().__init__(daemon=True)
        self.url, self.probes, self.failures = url, 0, list[tuple[int, float]]()
        self.done = threading.Event()

    def run(self) -> None:
        while not self.done.wait(0.1):
            code, took = timed(f"{self.url}/healthz", timeout=5)
            self.probes += 1
            if code != 200:
                self.failures.append((code, took))


def test_row_31_every_process_rolled_alone_under_load_costs_no_attempt(
    cluster: Cluster, counting_remotes: Remotes, tmp_path: Path, record_property: Record
) -> None:
    env = {
        **cluster.env,
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
        # Outside production: the remotes are loopback fakes and there is no secret key.
        "DJANGO_PRODUCTION": "0",
        "CELERY_WORKER_CONCURRENCY": "2",
        "WEB_CONCURRENCY": "1",
        "WEB_THREADS": "2",
        "TASKS_CLAIMS_DIR": str(tmp_path / "claims"),
    }
    units = [
        Unit("web-a", "web", {**env, "PORT": str(spare_port())}, tmp_path),
        Unit("web-b", "web", {**env, "PORT": str(spare_port())}, tmp_path),
        Unit("worker-1", "worker", env, tmp_path),
        Unit("worker-2", "worker", env, tmp_path),
        Unit("maintenance", "maintenance", env, tmp_path),
        Unit("beat", "beat", env, tmp_path),
    ]
    ids: list[int] = []
    last_enqueue = [0.0]

    def produce() -> None:
        """The steady stream: a quick and a short sleeping task every 0.1 s."""
        if time.monotonic() - last_enqueue[0] < 0.1:
            return
        last_enqueue[0] = time.monotonic()
        n = len(ids)
        items = [
            {"workflow": "demo.noop", "payload": {}, "idempotency_key": f"roll-{n}"},
            {
                "workflow": "demo.flaky",
                "payload": {"sleep": 0.2},
                "idempotency_key": f"roll-{n + 1}",
            },
        ]
        ids.extend(r.task.pk for r in services.enqueue_many(items, actor="test:chaos"))

    def until(probe_ready: Unit, what: str) -> None:
        def ready() -> bool:
            produce()
            return probe_ready.is_ready()

        wait_for(ready, timeout=90, interval=0.05, what=lambda: what + "\n" + probe_ready.tail())

    try:
        for unit in units:
            unit.start()
        for unit in units:
            until(unit, f"{unit.name} to be ready")
        statuses: dict[str, int] = {}
        probes = 0
        for unit in units:
            other = next((u for u in units if u.url and u is not unit), None) if unit.url else None
            prober = Prober(other.url) if other is not None else None
            if prober is not None:
                prober.start()
            produce()
            statuses[unit.name] = unit.stop()
            unit.start()
            until(unit, f"{unit.name} to be ready again")
            if prober is not None:
                prober.done.set()
                prober.join()
                probes += prober.probes
                assert not prober.failures, f"/healthz of {other}: {prober.failures}"
        assert statuses == dict.fromkeys(statuses, 0), statuses
        wait_for(
            lambda: (
                Task.objects.filter(pk__in=ids, status=TaskStatus.SUCCEEDED).count() == len(ids)
            ),
            timeout=60,
            what=lambda: "every task to succeed\n" + "\n".join(u.tail() for u in units),
        )
    finally:
        for unit in units:
            if unit.process is not None and unit.process.poll() is None:
                unit.stop()
            unit.kill()

    assert_nothing_lost_or_done_twice(ids, counting_remotes)
    steps = Step.objects.filter(task__in=ids)
    assert set(steps.values_list("attempts", flat=True)) == {1}
    assert not Lease.objects.filter(step__in=steps, outcome=Lease.Outcome.EXPIRED).exists()
    handed_back = Lease.objects.filter(step__in=steps, outcome=Lease.Outcome.RELEASED).count()
    record_property("tasks", len(ids))
    record_property("handed_back", handed_back)
    record_property("healthz_probes", probes)
